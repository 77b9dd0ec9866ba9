"""decode: single-stream decode speed per content type (spec/DSPARK.md §5.7, §6).

Each prompt of decode.json runs --repeats times at temperature 0 with
stream:false after the warm-up; tok/s = usage.completion_tokens / wall time
of the request (never SSE chunks: those count speculative steps). Best-of-N
is the headline (the least disturbed run), the median is printed beside it,
and tokens and seconds are shown too because a short answer is dominated by
fixed per-request overhead (prompt processing, HTTP).
"""
from dsv4bench import common, report, stats

RUN_COLS = ["prompt", "content_type", "rep", "completion_tokens", "prompt_tokens", "wall_s",
            "tok_s", "finish_reason", "error"]
SUM_COLS = ["prompt", "content_type", "best_tok_s", "median_tok_s", "tokens", "seconds",
            "finish_reason", "runs", "errors"]


def run_prompts(ctx, prompts, repeats, on_each=None):
    """Run each prompt `repeats` times (non-streaming); returns the per-run rows."""
    rows = []
    for p in prompts:
        for rep in range(repeats):
            if on_each:
                on_each("before", p, rep)
            r = ctx.client.chat(ctx.body(p["messages"], ctx.budget(p), 0.0))
            toks = r.completion_tokens
            row = {"prompt": p["id"], "content_type": p.get("content_type", p["id"]), "rep": rep,
                   "completion_tokens": toks, "prompt_tokens": r.prompt_tokens, "wall_s": r.wall,
                   "tok_s": stats.ratio(toks, r.wall) if not r.error else None,
                   "finish_reason": r.finish_reason, "error": r.error}
            if not r.error and toks is None:
                row["error"] = "response has no usage.completion_tokens"
            rows.append(row)
            if on_each:
                on_each("after", p, rep, row)
    return rows


def summarise(rows):
    out = []
    for pid in dict.fromkeys(r["prompt"] for r in rows):
        rs = [r for r in rows if r["prompt"] == pid]
        ok = [r for r in rs if r["tok_s"] is not None]
        best = max(ok, key=lambda r: r["tok_s"]) if ok else {}
        out.append({"prompt": pid, "content_type": rs[0]["content_type"],
                    "best_tok_s": best.get("tok_s"), "median_tok_s": stats.median([r["tok_s"] for r in ok]),
                    "tokens": best.get("completion_tokens"), "seconds": best.get("wall_s"),
                    "finish_reason": best.get("finish_reason"), "runs": len(rs),
                    "errors": len(rs) - len(ok)})
    return out


def plot(summary, path, title):
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [s["content_type"] for s in summary]
    best = [s["best_tok_s"] or 0 for s in summary]
    med = [s["median_tok_s"] or 0 for s in summary]
    xs = range(len(names))
    ax.bar(xs, best, color="#4c72b0", label="best of N")
    ax.scatter(xs, med, color="black", zorder=3, label="median", marker="_", s=400)
    for x, s in zip(xs, summary):
        if s["tokens"]:
            ax.annotate(f"{s['tokens']} tok\n{s['seconds']:.2f} s", (x, s["best_tok_s"] or 0),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tok/s (usage.completion_tokens / wall)")
    ax.set_title(title)
    ax.margins(y=0.2)
    ax.legend()
    return report.save(fig, path)


def run(ctx):
    a = ctx.args
    prompts = common.load_prompts("decode.json", ctx.prompts_dir)["prompts"]
    if a.only:
        prompts = [p for p in prompts if p["id"] in a.only]
    common.warmup(ctx)
    rows = run_prompts(ctx, prompts, a.repeats)
    summary = summarise(rows)
    # First repetition vs the rest, per prompt: a server that only warms up
    # under the benchmark shows a slow first run.
    first = [r for r in rows if r["rep"] == 0 and r["tok_s"]]
    if a.repeats > 1 and first:
        later = [r for r in rows if r["rep"] > 0 and r["tok_s"] and r["prompt"] == first[0]["prompt"]]
        c = common.cold_check([1 / first[0]["tok_s"]] + [1 / r["tok_s"] for r in later],
                              first[0]["completion_tokens"])
        print(common.describe_cold(c, f"decode ({first[0]['prompt']}, rep 0 vs later)"))
        ctx.meta["decode_cold_check"] = c
    report.write_csv(ctx.path("decode_runs.csv"), rows, RUN_COLS)
    report.write_csv(ctx.path("decode.csv"), summary, SUM_COLS)
    plot(summary, ctx.path("decode.png"), f"decode, {ctx.model}, T=0, best of {a.repeats}")
    report.print_table(f"decode ({ctx.model}, temperature 0, stream:false, best of {a.repeats})",
                       summary, ["content_type", "best_tok_s", "median_tok_s", "tokens", "seconds",
                                 "finish_reason", "errors"],
                       headers=["content", "tok/s", "median", "tokens", "seconds", "finish", "errors"],
                       nd={"best_tok_s": 1, "median_tok_s": 1, "seconds": 3})
    errs = sum(s["errors"] for s in summary)
    for e in dict.fromkeys(r["error"] for r in rows if r["error"]):
        print(f"error: {e}")
    return 0 if errs == 0 else 1
