"""JSON-valued serve flags refuse text after the object instead of silently using the
first object alone (cJSON_Parse stops after one value: '{"num_speculative_tokens": 3} x'
used to start with k=3 and drop the rest). Each case must exit at start with a message
naming the flag, before any model load (seconds)."""
import socket
import subprocess

import pytest

from conftest import DEFAULT_MODEL, DSV4


@pytest.mark.parametrize("flag,value", [
    ("--speculative-config", '{"method": "dspark", "num_speculative_tokens": 3} {"num_speculative_tokens": 5}'),
    ("--default-chat-template-kwargs", '{"thinking": false} trailing'),
    ("--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}, {"cudagraph_mode": "NONE"}'),
    ("--hf-overrides", '{"num_hidden_layers": 4} x'),
])
def test_trailing_text_after_json_is_refused(flag, value):
    with socket.socket() as s:  # a free port: some of these are read after the server listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([DSV4, "serve", DEFAULT_MODEL, "--device", "cpu", "--port", str(port), flag, value],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    try:
        for ln in p.stderr:  # until it exits, or says it is ready (the bug: it started anyway)
            lines.append(ln.decode(errors="replace"))
            if "ready:" in lines[-1]:
                break
    finally:
        if p.poll() is None:
            p.kill()
        rc = p.wait(timeout=60)
        p.stderr.close()
    err = "".join(lines)
    assert "ready:" not in err, err
    assert rc != 0, err
    assert flag in err, err
