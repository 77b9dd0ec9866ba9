"""Shared pytest fixtures: paths to the built binary and a running server."""
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DSV4 = os.path.join(ROOT, "build", "dsv4")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `dsv4 serve` process on a free loopback port; stopped on exit."""

    def __init__(self, *args, env=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([DSV4, "serve", *args, "--port", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=e)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("dsv4 serve exited: " + self.proc.stdout.read().decode())
            try:
                urllib.request.urlopen(self.base + "/health", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # answering (503 while not ready counts as up)
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("dsv4 serve did not start listening")

    def stop(self):
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture
def server_factory():
    started = []

    def make(*args, env=None):
        s = Server(*args, env=env)
        started.append(s)
        return s

    yield make
    for s in started:
        if s.proc.poll() is None:
            s.stop()
