"""Short run of the random-request fuzz (tests/py/fuzz_server.py; spec/SERVING.md
§9 item 7): about 100 requests with tools, stops, streaming, n, logprobs and
special-token logit bias, part of them with DSpark speculation; no 5xx, every
answer well formed, the server healthy at the end. The soak is the same
script with --requests 10000."""
import os

from conftest import DEFAULT_MODEL, Server
from fuzz_server import Fuzzer

TOKENIZER = os.path.join(DEFAULT_MODEL, "tokenizer.json")


def test_fuzz_plain(default_server):
    f = Fuzzer(default_server.base, TOKENIZER, seed=11, max_tokens=8)
    failures = f.run(60, concurrency=4)
    assert not failures, "\n".join(failures[:10])
    assert f.stats["ok"] > 30 and f.stats["streams"] > 10


def test_fuzz_speculative():
    s = Server(DEFAULT_MODEL, "--max-model-len", "512", "--max-num-seqs", "4", "--speculative-config",
               '{"method":"dspark","num_speculative_tokens":3}', ready=True)
    try:
        f = Fuzzer(s.base, TOKENIZER, seed=12, max_tokens=8)
        failures = f.run(40, concurrency=4)
    finally:
        s.stop()
    assert not failures, "\n".join(failures[:10])
    assert f.stats["ok"] > 20
