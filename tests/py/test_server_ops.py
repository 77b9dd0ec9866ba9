"""Operator-facing routes (spec/SERVING.md §3.7, §3.9, §8.5): /version and the
/metrics counters, which must not include the start-up warm-up."""
import json
import subprocess
import urllib.request

from conftest import DEFAULT_MODEL, ROOT
from test_server_http import _metric, _metrics, request

SPEC = '{"method":"dspark","num_speculative_tokens":3}'


def test_version_has_build_facts(default_server):
    st, v = request(default_server.base, "GET", "/version")
    assert st == 200
    assert isinstance(v["version"], str) and v["version"]
    assert v["reasoning_effort_profile"] in ("preview", "0731")
    assert isinstance(v["cuda"], bool)
    assert v["checkpoint"] == DEFAULT_MODEL
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    # the commit the build was configured at (an ancestor of, or equal to, HEAD)
    assert v["git_commit"] and head
    assert subprocess.run(["git", "-C", ROOT, "merge-base", "--is-ancestor", v["git_commit"], head]).returncode == 0
    assert v["git_commit"] in v["build"]


COUNTERS = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
            "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "vllm:prefix_cache_queries_total", "vllm:e2e_request_latency_seconds_count",
            "vllm:request_prompt_tokens_count", "vllm:time_to_first_token_seconds_count"]


def test_warm_up_not_counted(server_factory):
    s = server_factory(DEFAULT_MODEL, "--max-model-len", "256", "--max-num-seqs", "2", "--speculative-config", SPEC,
                       ready=True)
    m = _metrics(s.base)
    for name in COUNTERS:
        assert any(n == name for n, _ in m), name  # exported ...
        assert _metric(m, name) == 0, name        # ... and zero: the warm-up ran but is not shown
    st, body = request(s.base, "POST", "/v1/completions",
                       {"prompt": "One two three", "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert st == 200, body
    m = _metrics(s.base)
    # prefill tokens processed: the prompt less what a kept slot state covered (§3.9)
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert _metric(m, "vllm:prompt_tokens_total") == body["usage"]["prompt_tokens"] - cached
    assert _metric(m, "vllm:prompt_tokens_cached_total") == cached
    assert _metric(m, "vllm:generation_tokens_total") == body["usage"]["completion_tokens"] == 5
    assert _metric(m, "vllm:request_success_total") == 1
    assert _metric(m, "vllm:e2e_request_latency_seconds_count") == 1
    drafts = _metric(m, "vllm:spec_decode_num_drafts_total")
    assert _metric(m, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    assert _metric(m, "vllm:spec_decode_num_accepted_tokens_total") <= 3 * drafts


def _raw_get(base, path, extra_header_bytes):
    """GET with one X-Pad header of the given size over a raw socket: (status, headers, body)."""
    import http.client
    import urllib.parse
    u = urllib.parse.urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        c.putrequest("GET", path)
        c.putheader("X-Pad", "a" * extra_header_bytes)
        c.endheaders()
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        c.close()


def test_large_headers_answered_in_json(default_server):
    # over libmicrohttpd's default 32 KiB pool but under our 64 KiB limit: served
    st, ctype, body = _raw_get(default_server.base, "/v1/models", 40 << 10)
    assert st == 200 and json.loads(body)["object"] == "list"
    # over our limit: a 431 in OpenAI's error shape, not libmicrohttpd's HTML (§3.8)
    st, ctype, body = _raw_get(default_server.base, "/v1/models", 200 << 10)
    err = json.loads(body)["error"]
    assert st == 431 and ctype == "application/json"
    assert err["code"] == 431 and err["type"] == "RequestHeaderFieldsTooLargeError" and "limit" in err["message"]
    assert request(default_server.base, "GET", "/health")[0] == 200
