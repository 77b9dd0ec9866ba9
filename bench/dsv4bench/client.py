"""A small blocking client for OpenAI-compatible servers (standard library only).

Why not the `openai` package: the benchmark needs the wall time of each
request, the arrival time of every SSE event (TTFT, inter-chunk gaps) and the
raw `/metrics` text, and it must behave the same against dsv4, vLLM, SGLang
and llama.cpp. A plain http.client connection per request gives exactly that
with no hidden retries, pooling or timeouts (spec/SERVING.md §3.4, §3.5).

Every request goes to the one base URL given by the user; nothing else is
ever contacted.
"""
import http.client
import json
import time
import urllib.parse


class BenchError(Exception):
    """A request failed: HTTP status (or 0 for a transport error) and message."""

    def __init__(self, status, message):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message


class Result:
    """One chat completion as measured by the client.

    Times are seconds from `time.perf_counter()`. Tokens come only from the
    server's `usage` (never from counting SSE chunks, which count engine
    steps under speculative decoding: spec/DSPARK.md §5.7).
    """

    def __init__(self):
        self.t_start = 0.0
        self.t_end = 0.0
        self.t_first = None          # first event carrying text or tool-call bytes
        self.chunk_times = []        # arrival time of each event carrying output
        self.content = ""
        self.reasoning = ""
        self.tool_calls = []         # [{"name":..., "arguments": str}]
        self.finish_reason = None
        self.usage = None            # dict from the server, or None if it sent none
        self.error = None            # str when the request failed
        self.status = 200
        self.content_null = True     # non-streaming: message.content was null/absent

    @property
    def wall(self):
        return self.t_end - self.t_start

    @property
    def ttft(self):
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def completion_tokens(self):
        if not self.usage:
            return None
        return self.usage.get("completion_tokens")

    @property
    def prompt_tokens(self):
        if not self.usage:
            return None
        return self.usage.get("prompt_tokens")

    @property
    def cached_tokens(self):
        if not self.usage:
            return None
        d = self.usage.get("prompt_tokens_details") or {}
        return d.get("cached_tokens")

    def chunk_gaps(self):
        """Gaps between consecutive output-carrying events (seconds)."""
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]


class Client:
    """Talks to one OpenAI-compatible server at `base_url`.

    base_url: "http://host:port" (a trailing "/v1" is accepted and removed).
    api_key: sent as "Authorization: Bearer <key>" when given.
    timeout: socket timeout per read, seconds (a stalled server fails the
    request rather than hanging the benchmark).
    """

    def __init__(self, base_url, api_key=None, timeout=600.0):
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base URL must be http(s)://host[:port]: {base_url!r}")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        path = u.path
        if path.endswith("/v1"):
            path = path[:-3]
        self.prefix = path.rstrip("/")
        self.base_url = f"{u.scheme}://{u.netloc}{self.prefix}"
        self.api_key = api_key
        self.timeout = timeout

    # -- plumbing -----------------------------------------------------------
    def _conn(self):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def _headers(self, body=False):
        h = {"Accept": "application/json"}
        if body:
            h["Content-Type"] = "application/json"
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def get(self, path):
        """GET path; returns (status, body bytes). Transport errors raise BenchError(0, ...)."""
        conn = self._conn()
        try:
            conn.request("GET", self.prefix + path, headers=self._headers())
            r = conn.getresponse()
            return r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            raise BenchError(0, f"GET {path}: {e}") from e
        finally:
            conn.close()

    # -- endpoints ----------------------------------------------------------
    def models(self):
        """GET /v1/models -> list of model objects (spec/SERVING.md §3.2)."""
        status, body = self.get("/v1/models")
        if status != 200:
            raise BenchError(status, f"/v1/models: {body[:300].decode('utf-8', 'replace')}")
        try:
            return json.loads(body)["data"]
        except (ValueError, KeyError, TypeError) as e:
            raise BenchError(status, f"/v1/models: not a model list: {e}") from e

    def metrics_text(self):
        """GET /metrics as text, or None when the server has no metrics endpoint."""
        try:
            status, body = self.get("/metrics")
        except BenchError:
            return None
        if status != 200:
            return None
        return body.decode("utf-8", "replace")

    def chat(self, body, stream=False):
        """POST /v1/chat/completions and measure it.

        body: the request object (model, messages, ...); "stream" and, for
        streaming, stream_options.include_usage are set here.
        Returns a Result; a failed request has Result.error set (never raises).
        """
        body = dict(body)
        body["stream"] = bool(stream)
        if stream:
            so = dict(body.get("stream_options") or {})
            so["include_usage"] = True
            body["stream_options"] = so
        data = json.dumps(body).encode()
        res = Result()
        conn = self._conn()
        res.t_start = time.perf_counter()
        try:
            conn.request("POST", self.prefix + "/v1/chat/completions", body=data,
                         headers=self._headers(body=True))
            r = conn.getresponse()
            res.status = r.status
            if r.status != 200:
                msg = r.read()[:500].decode("utf-8", "replace")
                res.error = f"HTTP {r.status}: {msg}"
            elif stream:
                self._read_sse(r, res)
            else:
                raw = r.read()
                res.t_end = time.perf_counter()
                self._parse_full(raw, res)
        except (OSError, http.client.HTTPException) as e:
            res.error = f"transport: {type(e).__name__}: {e}"
            res.status = 0
        finally:
            if not res.t_end:
                res.t_end = time.perf_counter()
            conn.close()
        return res

    # -- response parsing ---------------------------------------------------
    @staticmethod
    def _parse_full(raw, res):
        try:
            obj = json.loads(raw)
        except ValueError:
            res.error = "response is not JSON"
            return
        if "error" in obj and not obj.get("choices"):
            res.error = f"error object: {json.dumps(obj['error'])[:300]}"
            return
        res.usage = obj.get("usage")
        ch = (obj.get("choices") or [{}])[0]
        msg = ch.get("message") or {}
        c = msg.get("content")
        res.content_null = c is None
        res.content = c or ""
        res.reasoning = msg.get("reasoning") or msg.get("reasoning_content") or ""
        for tc in msg.get("tool_calls") or []:
            f = tc.get("function") or {}
            res.tool_calls.append({"name": f.get("name"), "arguments": f.get("arguments") or ""})
        res.finish_reason = ch.get("finish_reason")
        res.t_first = res.t_end  # the whole answer arrives at once

    @staticmethod
    def _read_sse(r, res):
        calls = {}
        content_parts, reasoning_parts = [], []
        done = False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line or line.startswith(b":"):
                continue  # blank separator or keep-alive comment (SERVING.md §3.5)
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            try:
                ev = json.loads(payload)
            except ValueError:
                res.error = "SSE event is not JSON"
                continue
            if "error" in ev and not ev.get("choices"):
                res.error = f"stream error: {json.dumps(ev['error'])[:300]}"
                continue
            if ev.get("usage"):
                res.usage = ev["usage"]  # last one wins (cumulative with continuous_usage_stats)
            carried = False
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                c = d.get("content")
                if c:
                    content_parts.append(c)
                    carried = True
                rz = d.get("reasoning") or d.get("reasoning_content")
                if rz:
                    reasoning_parts.append(rz)
                    carried = True
                for tc in d.get("tool_calls") or []:
                    i = tc.get("index", 0)
                    slot = calls.setdefault(i, {"name": None, "arguments": ""})
                    f = tc.get("function") or {}
                    if f.get("name"):
                        slot["name"] = f["name"]
                    if f.get("arguments"):
                        slot["arguments"] += f["arguments"]
                    carried = True
                if ch.get("finish_reason"):
                    res.finish_reason = ch["finish_reason"]
            if carried:
                res.chunk_times.append(now)
                if res.t_first is None:
                    res.t_first = now
        res.t_end = time.perf_counter()
        res.content = "".join(content_parts)
        res.content_null = not content_parts
        res.reasoning = "".join(reasoning_parts)
        res.tool_calls = [calls[k] for k in sorted(calls)]
        if not done and res.error is None:
            res.error = "stream ended without [DONE]"
