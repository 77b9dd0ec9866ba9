"""The HTTP front end over real sockets (spec/SERVING.md §3.1, §3.2, §3.8).

No engine exists yet, so these tests cover what must hold before one is
attached: binding, auth, routes, body limits, error shapes, model names, and
an honest 503 from /health and the generation routes.
"""
import json
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

from conftest import DSV4


def request(base, method, path, body=None, headers=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_health_is_503_without_engine(server_factory, tmp_path):
    s = server_factory(str(tmp_path))
    status, body = request(s.base, "GET", "/health")
    assert status == 503
    assert body["error"]["type"] == "ServiceUnavailableError"
    assert "engine" in body["error"]["message"]


def test_models_and_names(server_factory, tmp_path):
    s = server_factory(str(tmp_path), "--served-model-name", "dsv4-a", "dsv4-b", "--max-model-len", "32768")
    status, body = request(s.base, "GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["dsv4-a", "dsv4-b"]
    assert all(m["max_model_len"] == 32768 for m in body["data"])
    status, body = request(s.base, "POST", "/v1/chat/completions",
                           {"model": "deepseek-ai/DeepSeek-V4-Flash", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404
    assert "Available: dsv4-a, dsv4-b" in body["error"]["message"]


def test_api_keys_guard_all_but_health(server_factory, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("sk-file\n")
    s = server_factory(str(tmp_path), "--api-key", "sk-a", "--api-key-file", str(keyfile),
                       env={"DSV4_API_KEYS": "sk-env"})
    assert request(s.base, "GET", "/health")[0] == 503  # open, just not ready
    assert request(s.base, "GET", "/v1/models")[0] == 401
    for k in ("sk-a", "sk-file", "sk-env"):
        assert request(s.base, "GET", "/v1/models", headers={"Authorization": f"Bearer {k}"})[0] == 200
    assert request(s.base, "GET", "/v1/models", headers={"Authorization": "Bearer sk-b"})[0] == 401


def test_errors_have_openai_shape(server_factory, tmp_path):
    s = server_factory(str(tmp_path))
    status, body = request(s.base, "POST", "/v1/chat/completions", b'{"messages": [}',
                           headers={"Content-Type": "application/json"})
    assert status == 400 and "invalid JSON" in body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    status, body = request(s.base, "POST", "/v1/chat/completions", b'{"model":"\xc3\x28"}')
    assert status == 400 and "UTF-8" in body["error"]["message"]
    status, body = request(s.base, "GET", "/nope")
    assert status == 404
    status, body = request(s.base, "DELETE", "/v1/models")
    assert status == 405


def test_body_limit_413(server_factory, tmp_path):
    s = server_factory(str(tmp_path))
    big = b'{"prompt":"' + b"a" * (65 << 20) + b'"}'
    try:
        status, body = request(s.base, "POST", "/v1/completions", big)
    except (ConnectionError, urllib.error.URLError) as e:
        pytest.fail(f"server dropped the connection instead of answering 413: {e}")
    assert status == 413
    assert body["error"]["type"] == "RequestEntityTooLargeError"


def test_openai_sdk_sees_typed_errors(server_factory, tmp_path):
    s = server_factory(str(tmp_path), "--api-key", "sk-x")
    bad = openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=s.base + "/v1", api_key="sk-x", max_retries=0)
    assert [m.id for m in good.models.list().data] == ["deepseek-v4-flash-dspark"]
    with pytest.raises(openai.NotFoundError) as ei:
        good.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "does not exist" in str(ei.value)
    with pytest.raises(openai.InternalServerError):  # 503 until an engine is attached
        good.chat.completions.create(model="deepseek-v4-flash-dspark",
                                     messages=[{"role": "user", "content": "hi"}])


def test_cli_errors(tmp_path):
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--bogus-flag"], capture_output=True, text=True)
    assert r.returncode == 2 and "--bogus-flag" in r.stderr
    r = subprocess.run([DSV4, "serve", str(tmp_path / "missing")], capture_output=True, text=True)
    assert r.returncode == 1 and "not found" in r.stderr
