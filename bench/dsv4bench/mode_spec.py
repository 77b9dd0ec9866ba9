"""spec: speculative-decoding statistics by content type from /metrics deltas.

For each decode.json prompt: scrape /metrics, run it --repeats times at
temperature 0 (one stream, stream:false), scrape again, and derive from the
counter deltas (names of spec/SERVING.md §3.9, formulas of spec/DSPARK.md §5.7):
  acceptance rate      = Δaccepted / Δdraft_tokens
  mean accepted length = tok/step = 1 + Δaccepted / Δdrafts (includes the bonus token)
  per-position         = Δaccepted_per_pos[i] / Δdrafts
  steps/s              = Δdrafts / wall time of the prompt's requests
  tok/s                = Σ usage.completion_tokens / wall time
The server must be otherwise idle: the counters are global.
Sanity identity printed too: usage tokens / Δdrafts ≈ tok/step (they differ
by the non-speculative steps, e.g. the prefill's first token).
"""
from dsv4bench import common, promtext, report, stats
from dsv4bench.client import BenchError

COLS = ["prompt", "content_type", "requests", "errors", "completion_tokens", "wall_s", "tok_s", "drafts",
        "draft_tokens", "accepted", "acceptance_rate", "mean_accept_len", "steps_s",
        "usage_tok_per_draft", "per_pos"]


def run(ctx):
    a = ctx.args
    prompts = common.load_prompts("decode.json", ctx.prompts_dir)["prompts"]
    if a.only:
        prompts = [p for p in prompts if p["id"] in a.only]
    text = ctx.client.metrics_text()
    if text is None:
        raise BenchError(0, f"{ctx.client.base_url}/metrics is not available; spec mode needs it")
    if promtext.spec_counters(text, ctx.model)["drafts"] is None:
        raise BenchError(0, f"/metrics has no {promtext.DRAFTS}: is speculative decoding exported?")
    common.warmup(ctx)
    rows = []
    for p in prompts:
        before = promtext.spec_counters(ctx.client.metrics_text(), ctx.model)
        toks, wall, errs = 0, 0.0, 0
        for _ in range(a.repeats):
            r = ctx.client.chat(ctx.body(p["messages"], ctx.budget(p), 0.0))
            wall += r.wall
            if r.error or r.completion_tokens is None:
                errs += 1
            else:
                toks += r.completion_tokens
        after = promtext.spec_counters(ctx.client.metrics_text(), ctx.model)
        d = promtext.delta(before, after)
        dv = promtext.derive(d)
        rows.append({"prompt": p["id"], "content_type": p.get("content_type", p["id"]),
                     "requests": a.repeats, "errors": errs, "completion_tokens": toks, "wall_s": wall,
                     "tok_s": stats.ratio(toks, wall), "drafts": d["drafts"],
                     "draft_tokens": d["draft_tokens"], "accepted": d["accepted"],
                     "acceptance_rate": dv["acceptance_rate"], "mean_accept_len": dv["mean_accept_len"],
                     "steps_s": stats.ratio(d["drafts"], wall),
                     "usage_tok_per_draft": stats.ratio(toks, d["drafts"]),
                     "per_pos": " ".join(f"{v:.3f}" for _, v in sorted(dv["per_pos_accept"].items())),
                     "_pp": dv["per_pos_accept"]})
    # Pooled over all prompts.
    pooled = {"drafts": sum(r["drafts"] or 0 for r in rows), "draft_tokens": sum(r["draft_tokens"] or 0 for r in rows),
              "accepted": sum(r["accepted"] or 0 for r in rows), "per_pos": {}}
    for r in rows:
        for i, v in r["_pp"].items():
            pooled["per_pos"][i] = pooled["per_pos"].get(i, 0.0) + v * (r["drafts"] or 0)
    pd = promtext.derive(pooled)
    toks = sum(r["completion_tokens"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    rows.append({"prompt": "ALL", "content_type": "all (pooled)", "requests": sum(r["requests"] for r in rows),
                 "errors": sum(r["errors"] for r in rows), "completion_tokens": toks, "wall_s": wall,
                 "tok_s": stats.ratio(toks, wall), "drafts": pooled["drafts"],
                 "draft_tokens": pooled["draft_tokens"], "accepted": pooled["accepted"],
                 "acceptance_rate": pd["acceptance_rate"], "mean_accept_len": pd["mean_accept_len"],
                 "steps_s": stats.ratio(pooled["drafts"], wall),
                 "usage_tok_per_draft": stats.ratio(toks, pooled["drafts"]),
                 "per_pos": " ".join(f"{v:.3f}" for _, v in sorted(pd["per_pos_accept"].items())),
                 "_pp": pd["per_pos_accept"]})
    report.write_csv(ctx.path("spec.csv"), rows, COLS)
    plot(rows, ctx.path("spec.png"), f"spec decode, {ctx.model}, T=0")
    report.print_table(f"spec ({ctx.model}, temperature 0, {a.repeats} request(s) per prompt, /metrics deltas)",
                       rows, ["content_type", "tok_s", "acceptance_rate", "mean_accept_len", "steps_s",
                              "usage_tok_per_draft", "per_pos", "errors"],
                       headers=["content", "tok/s", "accept", "tok/step", "steps/s", "usage tok/draft",
                                "per-position acceptance", "errors"],
                       nd={"tok_s": 1, "acceptance_rate": 3, "mean_accept_len": 2, "steps_s": 1})
    if not pooled["drafts"]:
        print("spec: no drafts were counted — speculative decoding is off or not exported")
    return 0 if all(r["errors"] == 0 for r in rows) else 1


def plot(rows, path, title):
    plt = report.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    names = [r["content_type"] for r in rows]
    xs = range(len(rows))
    a1.bar(xs, [r["mean_accept_len"] or 0 for r in rows], color="#55a868")
    for x, r in zip(xs, rows):
        if r["acceptance_rate"] is not None:
            a1.annotate(f"{r['acceptance_rate'] * 100:.0f}%", (x, r["mean_accept_len"] or 0),
                        ha="center", va="bottom", fontsize=8)
    a1.set_xticks(list(xs))
    a1.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    a1.set_ylabel("tok/step (1 + accepted/drafts); label: acceptance")
    a1.set_title(title, fontsize=9)
    a1.margins(y=0.15)
    for r in rows:
        pp = r["_pp"]
        if pp:
            a2.plot([i + 1 for i in sorted(pp)], [pp[i] for i in sorted(pp)], "o-", label=r["content_type"])
    a2.set_xlabel("draft position")
    a2.set_ylabel("accepted / drafts")
    a2.set_ylim(0, 1.05)
    a2.legend(fontsize=7)
    return report.save(fig, path)
