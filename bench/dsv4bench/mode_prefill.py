"""prefill: time to first token for long prompts (spec/SERVING.md §8.9, §3.5).

For each target size (default 8K, 32K, 100K tokens, capped at the server's
max_model_len from /v1/models less one output token and a small margin) the
prompt is the prefill.json template around a document built from filler.txt.
Each request begins with a fresh random run tag so a prefix cache cannot serve
it (cached tokens, if the server reports them, are printed). Two calibration
requests measure the server's tokens per character (this tokenizer's, from
usage.prompt_tokens), so the sizes are hit within a few percent whatever the
tokenizer; the size reported is always usage.prompt_tokens. One output token;
streaming, so TTFT is the arrival of the first output chunk. Prefill tok/s =
prompt tokens / TTFT.
"""
import os

from dsv4bench import common, report, stats
from dsv4bench.client import BenchError

COLS = ["target_tokens", "rep", "prompt_tokens", "cached_tokens", "ttft_s", "wall_s",
        "prefill_tok_s", "capped", "error"]
MARGIN = 16


def make_prompt(spec, filler, n_chars):
    tag = os.urandom(6).hex()
    text = spec["template"].format(tag=tag, document=common.build_document(filler, n_chars))
    return [{"role": "user", "content": text}]


def measure(ctx, spec, filler, n_chars):
    body = ctx.body(make_prompt(spec, filler, n_chars), 1, 0.0)
    return ctx.client.chat(body, stream=True)


def calibrate(ctx, spec, filler, smallest):
    """(chars0, tokens0, tokens per char) from two sizes of the same construction.

    The larger calibration prompt is about 4 characters per token of the
    smallest target (at most 16000 characters) and at most 0.8 characters per
    token of max_model_len, so it fits any context and any tokenizer."""
    hi = min(16000, 4 * smallest)
    if ctx.max_model_len:
        hi = min(hi, int(0.8 * ctx.max_model_len))
    hi = max(hi, 64)
    pts = []
    for n in (hi // 4, hi):
        r = measure(ctx, spec, filler, n)
        if r.error or not r.prompt_tokens:
            raise BenchError(r.status, f"prefill calibration failed: {r.error or 'no usage.prompt_tokens'}")
        text_len = len(make_prompt(spec, filler, n)[0]["content"])
        pts.append((text_len, r.prompt_tokens))
    (c0, t0), (c1, t1) = pts
    if t1 <= t0:
        raise BenchError(0, f"prefill calibration: {c1 - c0} more characters gave {t1 - t0} more tokens")
    return c0, t0, (t1 - t0) / (c1 - c0)


def run(ctx):
    a = ctx.args
    spec = common.load_prompts("prefill.json", ctx.prompts_dir)
    filler = common.read_text(spec["filler"], ctx.prompts_dir)
    common.warmup(ctx)
    c0, t0, tpc = calibrate(ctx, spec, filler, min(a.sizes))
    overhead = len(make_prompt(spec, filler, 0)[0]["content"])
    print(f"prefill: calibration {tpc * 1000:.1f} tokens per 1000 characters; "
          f"max_model_len {ctx.max_model_len or 'unknown'}")
    rows = []
    for target in a.sizes:
        cap = None
        goal = target
        if ctx.max_model_len and target > ctx.max_model_len - 1 - MARGIN:
            goal = ctx.max_model_len - 1 - MARGIN
            cap = ctx.max_model_len
        for rep in range(a.repeats):
            n_chars = max(0, int(c0 + (goal - t0) / tpc) - overhead)
            r = measure(ctx, spec, filler, n_chars)
            if r.error and r.status == 400 and cap:  # a few tokens over: shrink 2 % once
                r = measure(ctx, spec, filler, int(n_chars * 0.98))
            rows.append({"target_tokens": target, "rep": rep, "prompt_tokens": r.prompt_tokens,
                         "cached_tokens": r.cached_tokens, "ttft_s": r.ttft, "wall_s": r.wall,
                         "prefill_tok_s": stats.ratio(r.prompt_tokens, r.ttft) if not r.error else None,
                         "capped": f"at max_model_len {cap}" if cap else "", "error": r.error})
            print(f"  target {target}: prompt {report.fmt(r.prompt_tokens)} tokens, "
                  f"TTFT {report.fmt(r.ttft, 3)} s{' (capped)' if cap else ''}"
                  f"{' ERROR ' + r.error if r.error else ''}")
    report.write_csv(ctx.path("prefill.csv"), rows, COLS)
    plot(rows, ctx.path("prefill.png"), f"prefill, {ctx.model}")
    report.print_table(f"prefill ({ctx.model}, 1 output token, streaming TTFT)", rows,
                       ["target_tokens", "rep", "prompt_tokens", "cached_tokens", "ttft_s",
                        "prefill_tok_s", "capped", "error"],
                       headers=["target", "rep", "prompt tok", "cached", "TTFT s", "prefill tok/s",
                                "capped", "error"], nd={"ttft_s": 3, "prefill_tok_s": 0})
    return 0 if all(not r["error"] for r in rows) else 1


def plot(rows, path, title):
    plt = report.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    ok = [r for r in rows if not r["error"] and r["ttft_s"] is not None]
    xs = [r["prompt_tokens"] for r in ok]
    a1.plot(xs, [r["ttft_s"] for r in ok], "o-")
    a1.set_xlabel("prompt tokens (usage)")
    a1.set_ylabel("time to first token (s)")
    a1.set_title(title, fontsize=9)
    a2.plot(xs, [r["prefill_tok_s"] for r in ok], "s-", color="#dd8452")
    a2.set_xlabel("prompt tokens (usage)")
    a2.set_ylabel("prefill tok/s")
    return report.save(fig, path)
