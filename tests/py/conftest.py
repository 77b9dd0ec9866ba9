"""Shared pytest fixtures: paths to the built binary and a running server."""
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DSV4 = os.environ.get("DSV4_BIN", os.path.join(ROOT, "build", "dsv4"))  # DSV4_BIN: e.g. an ASan build
DEFAULT_MODEL = os.path.join(ROOT, "models", "default")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mem_available():
    """MemAvailable of /proc/meminfo in bytes (0 when absent): what the CPU KV pool is bounded by."""
    with open("/proc/meminfo") as f:
        for ln in f:
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1]) * 1024
    return 0


def multinode_env():
    """The environment of a `dsv4 serve|run --nnodes` process in a test: passive OpenMP waits (as Server),
    and a 20 s rendezvous timeout, so that a node whose peer never comes fails the test instead of waiting."""
    e = dict(os.environ)
    e.setdefault("OMP_WAIT_POLICY", "passive")
    e["DSV4_RDV_TIMEOUT_S"] = "20"
    return e


def free_master_port(groups=1):
    """A free loopback --master-port whose next `groups` ports are free too (a node group's TCP communicator
    listens on the master port + 1, the next group's on + 2, ...)."""
    for _ in range(50):
        p = free_port()
        if p + groups > 65535:
            continue
        socks = []
        try:
            for g in range(1, groups + 1):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", p + g))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free master port with %d free port(s) after it" % groups)


def node_flags(mport, rank, nnodes=2, addr="127.0.0.1"):
    """The flags that make a `dsv4 serve|run` node `rank` of `nnodes` reaching node 0 at addr:mport (addr None:
    no --master-addr, the default)."""
    return ("--nnodes", str(nnodes), "--node-rank", str(rank), *(("--master-addr", addr) if addr else ()),
            "--master-port", str(mport))


class Server:
    """A `dsv4 serve` process on a free loopback port; stopped on exit."""

    def __init__(self, *args, env=None, ready=False):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        e = dict(os.environ)
        # OpenMP threads that spin at barriers cost the CPU reference ~5x per step on a loaded
        # 2-core machine (measured); results do not depend on it.
        e.setdefault("OMP_WAIT_POLICY", "passive")
        e.update(env or {})
        # The log goes to a file: a pipe nobody drains would block the server once full.
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([DSV4, "serve", *args, "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=e)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError("dsv4 serve exited: " + self.log.read().decode(errors="replace"))
            try:
                urllib.request.urlopen(self.base + "/health", timeout=1)
                break
            except urllib.error.HTTPError:
                if not ready:
                    break  # answering (503 while loading counts as up)
                time.sleep(0.1)
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("dsv4 serve did not become " + ("ready" if ready else "reachable"))

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

    def make(*args, env=None, ready=False):
        s = Server(*args, env=env, ready=ready)
        started.append(s)
        return s

    yield make
    for s in started:
        if s.proc.poll() is None:
            s.stop()


@pytest.fixture(scope="module")
def default_server():
    """`dsv4 serve` on the embedded default model, ready (loaded and warmed up)."""
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail("models/default is missing: run ./scripts/setup.sh")
    s = Server(DEFAULT_MODEL, "--max-model-len", "512", "--max-num-seqs", "8", ready=True)
    yield s
    s.stop()


def post(base, path, body):
    """POST a JSON body; (status, parsed JSON reply) for success and HTTP errors alike."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
