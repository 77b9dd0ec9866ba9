"""What every mode shares: prompt files, request bodies, warm-up and the cold check."""
import json
import os
import time

from dsv4bench import stats
from dsv4bench.client import BenchError, Client

PKG_DIR = os.path.dirname(os.path.abspath(__file__))
PROMPTS_DIR = os.path.join(os.path.dirname(PKG_DIR), "prompts")
DEFAULT_OUT = os.path.join(os.path.dirname(PKG_DIR), "out")

# A first request this much slower per token than the later ones means the
# server was not warm (spec/SERVING.md §8.5; spec/DSPARK.md §5.7: ≈30 % cold
# penalty on the reference runtime).
COLD_RATIO = 1.25
# ...and at least this much slower in absolute terms, so scheduling noise on a
# very fast server (a few ms per request) is not reported as a cold start.
COLD_MIN_EXTRA_S = 0.05


def load_prompts(name, prompts_dir=None):
    """Parse bench/prompts/<name> (JSON)."""
    path = os.path.join(prompts_dir or PROMPTS_DIR, name)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_text(name, prompts_dir=None):
    with open(os.path.join(prompts_dir or PROMPTS_DIR, name), encoding="utf-8") as f:
        return f.read()


def build_document(filler, n_chars):
    """A document of at most n_chars characters: the filler's paragraphs in
    order, each prefixed "[§k]" with a running section number, repeated as
    needed; the last one is cut at a word boundary."""
    paras = [p.strip() for p in filler.split("\n\n") if p.strip()]
    out, size, k = [], 0, 0
    while size < n_chars:
        p = f"[§{k + 1}] {paras[k % len(paras)]}"
        out.append(p)
        size += len(p) + 2
        k += 1
    doc = "\n\n".join(out)
    if len(doc) > n_chars:
        doc = doc[:n_chars].rsplit(" ", 1)[0]
    return doc


class Ctx:
    """The state of one benchmark invocation (client, model, output folder, flags)."""

    def __init__(self, args):
        self.args = args
        self.client = Client(args.base_url, api_key=args.api_key, timeout=args.timeout)
        self.prompts_dir = args.prompts_dir
        self.model, self.max_model_len = self._pick_model(args.model)
        if args.max_model_len:
            self.max_model_len = args.max_model_len
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = args.out or os.path.join(DEFAULT_OUT, f"{args.mode}-{stamp}")
        os.makedirs(self.out, exist_ok=True)
        self.meta = {"base_url": self.client.base_url, "model": self.model,
                     "max_model_len": self.max_model_len, "mode": args.mode,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "args": {k: v for k, v in vars(args).items() if k != "api_key"}}

    def _pick_model(self, want):
        models = self.client.models()
        if not models:
            raise BenchError(200, "/v1/models lists no model")
        pick = None
        if want:
            pick = next((m for m in models if m.get("id") == want), None)
            if pick is None:
                # Still send the requested name: some servers accept any name.
                return want, None
        else:
            pick = models[0]
        mml = pick.get("max_model_len") or pick.get("context_length")
        if mml is None:  # llama.cpp puts n_ctx under meta
            mml = (pick.get("meta") or {}).get("n_ctx_train")
        return pick["id"], int(mml) if mml else None

    def body(self, messages, max_tokens, temperature=0.0, thinking="default", **extra):
        """A chat request body. thinking: "on"/"off" sends
        chat_template_kwargs.thinking (SERVING.md §2); "default" sends nothing."""
        b = {"model": self.model, "messages": messages, "max_tokens": int(max_tokens),
             "temperature": float(temperature)}
        t = self.args.thinking if thinking == "default" else thinking
        if t in ("on", "off"):
            b["chat_template_kwargs"] = {"thinking": t == "on"}
        if self.args.ignore_eos:
            b["ignore_eos"] = True
        b.update(extra)
        return b

    def budget(self, prompt, fallback=2048):
        """A prompt's max_tokens, capped by --max-tokens when given."""
        n = prompt.get("max_tokens", fallback)
        cap = getattr(self.args, "max_tokens", None)
        return min(n, cap) if cap else n

    def path(self, name):
        return os.path.join(self.out, name)


def per_token(res):
    """Seconds per completion token of a Result (None without usage)."""
    t = res.completion_tokens
    return res.wall / t if t else None


def cold_check(spt, tokens=None):
    """Cold-server check on seconds-per-token samples in arrival order.

    tokens: the first request's completion tokens; when given, the first
    request must also be COLD_MIN_EXTRA_S slower in total to count as cold.
    Returns {"first": s, "later_median": s, "ratio": first/later, "cold": bool};
    ratio is None with fewer than 2 samples.
    """
    spt = [x for x in spt if x]
    if len(spt) < 2:
        return {"first": spt[0] if spt else None, "later_median": None, "ratio": None, "cold": False}
    later = stats.median(spt[1:])
    r = spt[0] / later if later else None
    cold = bool(r and r > COLD_RATIO)
    if cold and tokens:
        cold = (spt[0] - later) * tokens >= COLD_MIN_EXTRA_S
    return {"first": spt[0], "later_median": later, "ratio": r, "cold": cold}


def describe_cold(c, what):
    if c["ratio"] is None:
        return f"{what}: too few requests to check for a cold server"
    if c["cold"]:
        return (f"{what}: COLD SERVER — the first request took {c['ratio']:.2f}x longer per token "
                f"than the later ones ({c['first'] * 1e3:.1f} vs {c['later_median'] * 1e3:.1f} ms/token)")
    if c["ratio"] > COLD_RATIO:
        return (f"{what}: warm (first/later per-token time {c['ratio']:.2f}x, but under "
                f"{COLD_MIN_EXTRA_S * 1e3:.0f} ms in total: noise)")
    return f"{what}: warm (first/later per-token time {c['ratio']:.2f}x)"


def warmup(ctx):
    """Send the warm-up prompt --warmup times (non-streaming, temperature 0)
    and report whether the server looked cold. Returns the cold_check dict."""
    n = ctx.args.warmup
    if n <= 0:
        print("warmup: skipped (--warmup 0); numbers may include a cold-start penalty")
        ctx.meta["warmup"] = {"requests": 0}
        return None
    w = load_prompts("warmup.json", ctx.prompts_dir)
    if ctx.args.warmup_max_tokens:
        w["max_tokens"] = ctx.args.warmup_max_tokens
    spt, walls, first_tokens = [], [], None
    for _ in range(n):
        r = ctx.client.chat(ctx.body(w["messages"], w["max_tokens"], 0.0))
        if r.error:
            raise BenchError(r.status, f"warm-up request failed: {r.error}")
        spt.append(per_token(r))
        walls.append(r.wall)
        if first_tokens is None:
            first_tokens = r.completion_tokens
    c = cold_check(spt, first_tokens)
    print(f"warmup: {n} requests of up to {w['max_tokens']} tokens, "
          f"{', '.join(f'{x:.2f}' for x in walls)} s")
    print(describe_cold(c, "warmup"))
    ctx.meta["warmup"] = {"requests": n, "walls_s": walls, **c}
    return c
