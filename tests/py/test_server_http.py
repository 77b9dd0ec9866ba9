"""The HTTP front end over real sockets (spec/SERVING.md §3.1, §3.2, §3.8):
binding, auth, routes, body limits, error shapes, model names."""
import json
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

from conftest import DEFAULT_MODEL, DSV4, free_port


def request(base, method, path, body=None, headers=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_health_and_models(default_server):
    s = default_server
    assert request(s.base, "GET", "/health") == (200, {"status": "ok"})
    status, body = request(s.base, "GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["deepseek-v4-flash-dspark"]
    assert body["data"][0]["max_model_len"] == 512


def test_unknown_model_lists_names(server_factory):
    s = server_factory(DEFAULT_MODEL, "--served-model-name", "dsv4-a", "dsv4-b", "--max-model-len", "256",
                       "--max-num-seqs", "2", ready=True)
    status, body = request(s.base, "GET", "/v1/models")
    assert [m["id"] for m in body["data"]] == ["dsv4-a", "dsv4-b"]
    assert all(m["max_model_len"] == 256 for m in body["data"])
    status, body = request(s.base, "POST", "/v1/chat/completions",
                           {"model": "deepseek-ai/DeepSeek-V4-Flash", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404
    assert "Available: dsv4-a, dsv4-b" in body["error"]["message"]
    status, body = request(s.base, "POST", "/v1/chat/completions",
                           {"model": "dsv4-b", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["model"] == "dsv4-a"  # the canonical name


def test_api_keys_guard_all_but_health(server_factory, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("sk-file\n")
    s = server_factory(DEFAULT_MODEL, "--max-model-len", "256", "--max-num-seqs", "2", "--api-key", "sk-a",
                       "--api-key-file", str(keyfile), env={"DSV4_API_KEYS": "sk-env"}, ready=True)
    assert request(s.base, "GET", "/health")[0] == 200
    assert request(s.base, "GET", "/v1/models")[0] == 401
    assert request(s.base, "POST", "/tokenize", {"prompt": "x"})[0] == 401
    for k in ("sk-a", "sk-file", "sk-env"):
        assert request(s.base, "GET", "/v1/models", headers={"Authorization": f"Bearer {k}"})[0] == 200
    assert request(s.base, "GET", "/v1/models", headers={"Authorization": "Bearer sk-b"})[0] == 401
    bad = openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_errors_have_openai_shape(default_server):
    s = default_server
    status, body = request(s.base, "POST", "/v1/chat/completions", b'{"messages": [}',
                           headers={"Content-Type": "application/json"})
    assert status == 400 and "invalid JSON" in body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    status, body = request(s.base, "POST", "/v1/chat/completions", b'{"model":"\xc3\x28"}')
    assert status == 400 and "UTF-8" in body["error"]["message"]
    assert request(s.base, "GET", "/nope")[0] == 404
    assert request(s.base, "DELETE", "/v1/models")[0] == 405


def test_body_limit_413(default_server):
    big = b'{"prompt":"' + b"a" * (65 << 20) + b'"}'
    try:
        status, body = request(default_server.base, "POST", "/v1/completions", big)
    except (ConnectionError, urllib.error.URLError) as e:
        pytest.fail(f"server dropped the connection instead of answering 413: {e}")
    assert status == 413
    assert body["error"]["type"] == "RequestEntityTooLargeError"


def test_cli_errors(tmp_path):
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--bogus-flag"], capture_output=True, text=True)
    assert r.returncode == 2 and "--bogus-flag" in r.stderr
    r = subprocess.run([DSV4, "serve", str(tmp_path / "missing")], capture_output=True, text=True)
    assert r.returncode == 1 and "not found" in r.stderr
    # an empty directory is not a checkpoint: a clear error naming what is missing, no crash
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--port", str(free_port())], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and str(tmp_path) in r.stderr


def test_cli_errors_before_any_load(tmp_path):
    """Mistakes a launcher makes are refused at once, naming the fix (new-user pass, session 3)."""
    import os
    import shutil
    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "deepseek-v4-flash-0731", "config.json")
    shutil.copy(cfg, tmp_path / "config.json")
    # a config-only directory without --load-format dummy: no weights, and says how to get random ones
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--port", str(free_port())], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "no weights" in r.stderr and "--load-format dummy" in r.stderr
    # --hf-overrides that is not JSON: where it breaks, exit 2 like any bad flag
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--load-format", "dummy", "--hf-overrides",
                        '{"num_hidden_layers": x}'], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not valid JSON at character 22" in r.stderr
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--load-format", "dummy", "--hf-overrides", "[4]"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not a JSON object" in r.stderr
    # node 0 of two nodes with -tp not a multiple of --nnodes (-tp is the total, -tp / --nnodes ranks per
    # node, as in vLLM): refused before waiting for the other node
    r = subprocess.run([DSV4, "serve", DEFAULT_MODEL, "--nnodes", "2", "--node-rank", "0", "--master-addr",
                        "127.0.0.1", "--master-port", str(free_port()), "-tp", "3", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "give a multiple of 2 (e.g. -tp 2)" in r.stderr


def test_ctrl_c_while_loading_exits_at_once(tmp_path):
    """SIGINT during a long load ends the process then (it used to finish loading, say ready, then stop)."""
    import os
    import shutil
    import signal
    import time
    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "deepseek-v4-flash-0731", "config.json")
    shutil.copy(cfg, tmp_path / "config.json")
    big = ('{"num_hidden_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "n_routed_experts": 64, '
           '"moe_intermediate_size": 1024, "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 0, 0, 0], '
           '"dspark_target_layer_ids": [5, 6, 7]}')
    p = subprocess.Popen([DSV4, "serve", str(tmp_path), "--load-format", "dummy", "--device", "cpu", "--port",
                          str(free_port()), "--hf-overrides", big], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 30
        log = ""
        # the "listening ...; loading" line: "; loading", since tmp_path's name ("test_ctrl_c_while_loading...")
        # is in the earlier dummy-weights lines, printed before the handler is installed
        while "; loading" not in log and time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            log += line
        assert "; loading" in log
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=20)
        out = log + p.stdout.read()
        assert rc == 128 + signal.SIGINT
        assert "interrupted while loading" in out and "ready:" not in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_token_ids_must_be_integers(default_server):
    """1.5 is not a token id: refused with 400 (vLLM's list[int]), never truncated to 1."""
    s = default_server
    cases = [("/v1/completions", {"prompt": [1.5], "max_tokens": 1}, "prompt"),
             ("/v1/completions", {"prompt": [19923, 0.5], "max_tokens": 1}, "prompt"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                       "stop_token_ids": [1.5]}, "stop_token_ids"),
             ("/detokenize", {"tokens": [19923, 1.5]}, "tokens")]
    for path, body, param in cases:
        status, r = request(s.base, "POST", path, body)
        assert status == 400, (path, body, r)
        assert r["error"]["param"] == param
    # integral numbers written as floats are still ids
    status, r = request(s.base, "POST", "/detokenize", {"tokens": [19923.0]})
    assert status == 200 and r["prompt"] == "Hello"


def _metrics(base):
    """/metrics as {(name, labels): value}."""
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            key, _, val = ln.rpartition(" ")
            name, _, lab = key.partition("{")
            out[(name, lab)] = float(val)
    return out


def _metric(m, name, label=""):
    """Sum of the samples of `name` whose labels contain `label`."""
    return sum(v for (n, lab), v in m.items() if n == name and label in lab)


def test_non_streaming_client_hang_up_aborts(default_server):
    """A non-streaming client that closes its socket while waiting: the request is
    cancelled (counted as finished with reason "abort" and generating far fewer than
    its max_tokens), not run to the end for nobody (SERVING.md §3.5)."""
    import socket
    import time
    s = default_server
    m0 = _metrics(s.base)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400,
                       "temperature": 0, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(1.0)
    sock.close()
    deadline = time.time() + 120  # a guard against hanging, not a speed bound
    while time.time() < deadline:
        m1 = _metrics(s.base)
        if _metric(m1, "vllm:num_requests_running") == 0 and _metric(m1, "vllm:num_requests_waiting") == 0:
            break
        time.sleep(0.2)
    abort = 'finished_reason="abort"'
    assert _metric(m1, "vllm:request_success_total", abort) - _metric(m0, "vllm:request_success_total", abort) == 1
    gen = _metric(m1, "vllm:generation_tokens_total") - _metric(m0, "vllm:generation_tokens_total")
    assert gen < 200, gen
    # the server still answers
    status, r = request(s.base, "POST", "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert status == 200


def test_streaming_client_hang_up_cancels_and_logs(default_server):
    """A streaming client that closes its socket mid-stream: the request is
    cancelled (no request left running, its KV pages back in the pool, counted
    as finished with reason "abort"), and the log has one INFO line naming the
    request id and the tokens generated so far (SERVING.md §3.5)."""
    import re
    import socket
    import time
    s = default_server
    m0 = _metrics(s.base)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "stream": True,
                       "temperature": 0, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while got.count(b"data: ") < 3:  # the role chunk and two with tokens
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    rid = re.search(rb'"id":"(chatcmpl-[0-9a-f]+)"', got).group(1).decode()
    sock.close()
    deadline = time.time() + 120  # a guard against hanging, not a speed bound
    while time.time() < deadline:
        m1 = _metrics(s.base)
        if _metric(m1, "vllm:num_requests_running") == 0 and _metric(m1, "vllm:num_requests_waiting") == 0:
            break
        time.sleep(0.2)
    assert _metric(m1, "vllm:num_requests_running") == 0
    assert _metric(m1, "vllm:kv_cache_usage_perc") == 0
    abort = 'finished_reason="abort"'
    assert _metric(m1, "vllm:request_success_total", abort) - _metric(m0, "vllm:request_success_total", abort) == 1
    gen = _metric(m1, "vllm:generation_tokens_total") - _metric(m0, "vllm:generation_tokens_total")
    assert 2 <= gen < 400, gen
    deadline = time.time() + 30  # the line follows the abort count by a moment; a guard only
    while True:
        s.log.seek(0)
        lines = [ln for ln in s.log.read().decode(errors="replace").splitlines() if rid in ln]
        if lines or time.time() > deadline:
            break
        time.sleep(0.1)
    assert len(lines) == 1, lines
    assert "INFO" in lines[0] and "client disconnected" in lines[0], lines[0]
    n = int(re.search(r"after (\d+) generated tokens", lines[0]).group(1))
    assert n == gen, (lines[0], gen)
    # the server still answers
    status, r = request(s.base, "POST", "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert status == 200


def test_streaming_client_hang_up_during_prefill_cancels_before_any_token(server_factory):
    """A streaming client that closes its socket while its prompt is still being
    prefilled (a cancelled agent call): nothing has been written yet, so no failed
    write tells the server; it must notice the hang-up itself and cancel the request
    before its first token (SERVING.md §3.5), not prefill the whole prompt for nobody.
    The prompt is prefilled in 188 chunks of 8 tokens; the server checks every 50 ms."""
    import re
    import socket
    import time
    s = server_factory(DEFAULT_MODEL, "--max-model-len", "4096", "--max-num-batched-tokens", "8",
                       "--max-num-seqs", "4", "--no-enable-prefix-caching", ready=True)
    m0 = _metrics(s.base)
    body = json.dumps({"prompt": [19923] * 1500, "max_tokens": 20, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sock.close()
    deadline = time.time() + 120  # a guard against hanging, not a speed bound
    m1 = m0
    while time.time() < deadline:
        m1 = _metrics(s.base)
        if _metric(m1, "vllm:request_success_total") > _metric(m0, "vllm:request_success_total"):
            break
        time.sleep(0.05)
    abort = 'finished_reason="abort"'
    assert _metric(m1, "vllm:request_success_total", abort) - _metric(m0, "vllm:request_success_total", abort) == 1
    assert _metric(m1, "vllm:generation_tokens_total") == _metric(m0, "vllm:generation_tokens_total")
    deadline = time.time() + 30
    while True:
        s.log.seek(0)
        lines = [ln for ln in s.log.read().decode(errors="replace").splitlines() if "client disconnected" in ln]
        if lines or time.time() > deadline:
            break
        time.sleep(0.1)
    assert len(lines) == 1, lines
    assert "during the stream" in lines[0] and re.search(r"after 0 generated tokens", lines[0]), lines[0]
    # nothing left running, every page back, and the server still answers
    m2 = _metrics(s.base)
    assert _metric(m2, "vllm:num_requests_running") == 0 and _metric(m2, "vllm:kv_cache_usage_perc") == 0
    status, r = request(s.base, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    assert status == 200, r


def test_streaming_client_that_half_closes_still_gets_its_stream(default_server):
    """A streaming client that shuts down only its sending side after the request
    (shutdown(SHUT_WR)) and keeps reading is not a hang-up: the server sees EOF, sends one
    keep-alive comment to tell it from a closed socket (which answers with a reset), and
    the whole stream arrives, ending with [DONE]; nothing is aborted."""
    import socket
    import time
    s = default_server
    m0 = _metrics(s.base)
    body = json.dumps({"prompt": "Hi", "max_tokens": 4, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(120)  # a guard against hanging, not a speed bound
    got = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    sock.close()
    assert b"data: [DONE]" in got, got[-200:]
    assert got.count(b'"text"') >= 4, got
    deadline = time.time() + 30
    while time.time() < deadline:
        m1 = _metrics(s.base)
        if _metric(m1, "vllm:request_success_total") > _metric(m0, "vllm:request_success_total"):
            break
        time.sleep(0.05)
    abort = 'finished_reason="abort"'
    assert _metric(m1, "vllm:request_success_total", abort) == _metric(m0, "vllm:request_success_total", abort)
    assert _metric(m1, "vllm:generation_tokens_total") - _metric(m0, "vllm:generation_tokens_total") == 4


def test_half_open_connection_flood_does_not_lock_out_clients(default_server):
    """~1000 clients that send half a request and wait must not lock others out
    (select() stopped at FD_SETSIZE=1024 and the soft fd limit was 1024)."""
    import resource
    import socket
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2200:
        pytest.skip(f"open-file hard limit {hard} too low for this test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (2200, hard))
    socks = []
    try:
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", default_server.port))
            s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        assert request(default_server.base, "GET", "/v1/models")[0] == 200
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert request(default_server.base, "GET", "/health")[0] == 200
