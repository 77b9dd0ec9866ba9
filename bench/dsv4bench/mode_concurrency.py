"""concurrency: c simultaneous streams, static and staggered arrivals.

For each level c (default 1,2,4,6,8,16) and arrival pattern:
  static     all c streaming requests start together;
  staggered  stream i starts i * --stagger-s seconds after the first, so new
             requests prefill while others decode (the "Keys" pattern in
             spec/DSPARK.md §6).
Tokens per stream come from the usage chunk (stream_options.include_usage),
never from counting chunks. Aggregate tok/s = total completion tokens / span
from the first start to the last end; per-stream tok/s = tokens / that
stream's wall time. TTFT is the first chunk carrying output. ITL is reported
twice: the gap between output chunks (what a client sees; one chunk per engine
step, so several tokens under speculation) and the time per output token
((end - first token) / (tokens - 1), from usage).
"""
import threading
import time

from dsv4bench import common, report, stats

COLS = ["pattern", "concurrency", "requests", "errors", "total_tokens", "span_s", "agg_tok_s",
        "stream_tok_s_mean", "stream_tok_s_min", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
        "itl_chunk_p50_ms", "itl_chunk_p90_ms", "itl_chunk_p99_ms", "tpot_p50_ms", "tpot_p90_ms"]
STREAM_COLS = ["pattern", "concurrency", "round", "stream", "prompt", "start_s", "ttft_s", "wall_s",
               "completion_tokens", "chunks", "tok_s", "tpot_ms", "finish_reason", "error"]


def run_level(ctx, prompts, c, pattern, stagger, max_tokens):
    """One round at concurrency c; returns the per-stream rows."""
    results = [None] * c
    t0 = time.perf_counter()

    def worker(i):
        if pattern == "staggered":
            delay = t0 + i * stagger - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        p = prompts[i % len(prompts)]
        results[i] = (p, ctx.client.chat(ctx.body(p["messages"], max_tokens, ctx.args.temperature), stream=True))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = []
    for i, (p, r) in enumerate(results):
        toks = r.completion_tokens
        tpot = None
        if toks and toks > 1 and r.t_first is not None:
            tpot = (r.t_end - r.t_first) / (toks - 1)
        err = r.error
        if not err and toks is None:
            err = "stream carried no usage (stream_options.include_usage unsupported?)"
        rows.append({"pattern": pattern, "concurrency": c, "stream": i, "prompt": p["id"],
                     "start_s": r.t_start - t0, "ttft_s": r.ttft, "wall_s": r.wall,
                     "completion_tokens": toks, "chunks": len(r.chunk_times),
                     "tok_s": stats.ratio(toks, r.wall) if not err else None,
                     "tpot_ms": tpot * 1e3 if tpot is not None else None,
                     "finish_reason": r.finish_reason, "error": err,
                     "_t0": r.t_start, "_t1": r.t_end, "_gaps": r.chunk_gaps()})
    return rows


def summarise(rows, pattern, c):
    ok = [r for r in rows if not r["error"]]
    span = (max(r["_t1"] for r in rows) - min(r["_t0"] for r in rows)) if rows else None
    total = sum(r["completion_tokens"] for r in ok)
    gaps = [g * 1e3 for r in ok for g in r["_gaps"]]
    ttft = [r["ttft_s"] for r in ok]
    tpot = [r["tpot_ms"] for r in ok]
    st = [r["tok_s"] for r in ok]
    return {"pattern": pattern, "concurrency": c, "requests": len(rows), "errors": len(rows) - len(ok),
            "total_tokens": total, "span_s": span, "agg_tok_s": stats.ratio(total, span),
            "stream_tok_s_mean": stats.mean(st), "stream_tok_s_min": min(st) if st else None,
            "ttft_p50_s": stats.percentile(ttft, 50), "ttft_p90_s": stats.percentile(ttft, 90),
            "ttft_p99_s": stats.percentile(ttft, 99),
            "itl_chunk_p50_ms": stats.percentile(gaps, 50), "itl_chunk_p90_ms": stats.percentile(gaps, 90),
            "itl_chunk_p99_ms": stats.percentile(gaps, 99),
            "tpot_p50_ms": stats.percentile(tpot, 50), "tpot_p90_ms": stats.percentile(tpot, 90)}


def plot(summary, path, title):
    plt = report.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for pattern, style in (("static", "o-"), ("staggered", "s--")):
        s = [x for x in summary if x["pattern"] == pattern]
        if not s:
            continue
        cs = [x["concurrency"] for x in s]
        a1.plot(cs, [x["agg_tok_s"] or 0 for x in s], style, label=f"{pattern} aggregate")
        a1.plot(cs, [x["stream_tok_s_mean"] or 0 for x in s], style, alpha=0.5, label=f"{pattern} per stream")
        a2.plot(cs, [x["ttft_p50_s"] or 0 for x in s], style, label=f"{pattern} TTFT p50")
        a2.plot(cs, [x["ttft_p90_s"] or 0 for x in s], style, alpha=0.5, label=f"{pattern} TTFT p90")
    a1.set_xlabel("concurrent streams")
    a1.set_ylabel("tok/s (usage)")
    a1.legend(fontsize=8)
    a1.set_title(title, fontsize=9)
    a2.set_xlabel("concurrent streams")
    a2.set_ylabel("time to first token (s)")
    a2.legend(fontsize=8)
    return report.save(fig, path)


def run(ctx):
    a = ctx.args
    prompts = common.load_prompts("concurrency.json", ctx.prompts_dir)["prompts"]
    common.warmup(ctx)
    patterns = ["static", "staggered"] if a.pattern == "both" else [a.pattern]
    streams, summary = [], []
    for pattern in patterns:
        for c in a.levels:
            rows = []
            for rnd in range(a.rounds):
                rs = run_level(ctx, prompts, c, pattern, a.stagger_s, a.max_tokens)
                for r in rs:
                    r["round"] = rnd
                rows += rs
            s = summarise(rows, pattern, c)
            summary.append(s)
            streams += rows
            print(f"  {pattern:9s} c={c:<3d} agg {report.fmt(s['agg_tok_s'], 1)} tok/s, "
                  f"per stream {report.fmt(s['stream_tok_s_mean'], 1)}, errors {s['errors']}")
    report.write_csv(ctx.path("concurrency_streams.csv"), streams, STREAM_COLS)
    report.write_csv(ctx.path("concurrency.csv"), summary, COLS)
    plot(summary, ctx.path("concurrency.png"), f"concurrency, {ctx.model}, max_tokens {a.max_tokens}")
    report.print_table(f"concurrency ({ctx.model}, T={a.temperature}, max_tokens {a.max_tokens}, "
                       f"{a.rounds} round(s), stagger {a.stagger_s} s)", summary,
                       ["pattern", "concurrency", "agg_tok_s", "stream_tok_s_mean", "total_tokens",
                        "span_s", "ttft_p50_s", "ttft_p99_s", "itl_chunk_p50_ms", "itl_chunk_p99_ms",
                        "tpot_p50_ms", "errors"],
                       headers=["arrivals", "c", "agg tok/s", "tok/s/stream", "tokens", "seconds",
                                "TTFT p50", "TTFT p99", "ITL p50 ms", "ITL p99 ms", "TPOT ms", "errors"],
                       nd={"agg_tok_s": 1, "stream_tok_s_mean": 1, "span_s": 2, "ttft_p50_s": 3,
                           "ttft_p99_s": 3, "itl_chunk_p50_ms": 1, "itl_chunk_p99_ms": 1, "tpot_p50_ms": 1})
    for e in dict.fromkeys(r["error"] for r in streams if r["error"]):
        print(f"error: {e}")
    return 0 if all(s["errors"] == 0 for s in summary) else 1
