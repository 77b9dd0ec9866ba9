"""soak: mixed agent traffic for a bounded time, every response classified.

--workers threads each loop: take the next request number, pick a soak.json
entry and one of its temperatures and token budgets with a generator seeded
by (--seed, request number) so a run is reproducible, send it (streaming for
a --stream-fraction of requests, to exercise both paths), and classify the
answer (classify.py: errors, empty content with real tokens by
(finish_reason, </think>), loops, CJK drift, markup leakage, bad JSON, bad
tool arguments). No new request starts after --duration-s or
--max-requests. Throughput per --window-s window spreads each request's
usage.completion_tokens evenly over its lifetime.
"""
import random
import threading
import time
from collections import Counter

from dsv4bench import classify, common, report, stats

REQ_COLS = ["n", "worker", "entry", "kind", "temperature", "max_tokens", "stream", "start_s",
            "end_s", "wall_s", "prompt_tokens", "completion_tokens", "finish_reason", "labels",
            "error"]
WIN_COLS = ["window", "start_s", "end_s", "tok_s", "requests_done", "unhealthy", "errors"]


def build_requests(ctx, spec, document):
    """Expand soak.json into per-entry request templates (tools resolved, document inserted)."""
    out = []
    for e in spec["entries"]:
        msgs = []
        for m in e["messages"]:
            m = dict(m)
            if isinstance(m.get("content"), str) and "{document}" in m["content"]:
                m["content"] = m["content"].replace("{document}", document)
            msgs.append(m)
        out.append({**e, "messages": msgs,
                    "tool_defs": [spec["tools"][t] for t in e.get("tools", [])]})
    return out


def pick(v, rng):
    return rng.choice(v) if isinstance(v, list) else v


def one_request(ctx, n, entries):
    a = ctx.args
    rng = random.Random(f"{a.seed}:{n}")
    e = entries[rng.randrange(len(entries))]
    temp = pick(e.get("temperature", 0.6), rng)
    max_tokens = pick(e.get("max_tokens", 1024), rng)
    if a.max_tokens:
        max_tokens = min(max_tokens, a.max_tokens)
    stream = rng.random() < a.stream_fraction
    th = e.get("thinking")
    extra = {}
    if e["tool_defs"]:
        extra["tools"] = e["tool_defs"]
    if e.get("response_format"):
        extra["response_format"] = e["response_format"]
    body = ctx.body(e["messages"], max_tokens, temp,
                    thinking="default" if th is None else ("on" if th else "off"), **extra)
    return e, temp, max_tokens, stream, ctx.client.chat(body, stream=stream)


def run(ctx):
    a = ctx.args
    spec = common.load_prompts("soak.json", ctx.prompts_dir)
    filler = common.read_text("filler.txt", ctx.prompts_dir)
    document = common.build_document(filler, int(a.long_context_tokens * 4))
    entries = build_requests(ctx, spec, document)
    common.warmup(ctx)
    lock = threading.Lock()
    state = {"next": 0}
    shared = []  # rows appended by the workers
    t0 = time.perf_counter()
    deadline = t0 + a.duration_s

    def worker(wid):
        while True:
            with lock:
                if state["next"] >= a.max_requests or time.perf_counter() >= deadline:
                    return
                n = state["next"]
                state["next"] += 1
            e, temp, mt, stream, r = one_request(ctx, n, entries)
            labels = classify.classify(
                {"error": r.error, "content": r.content, "reasoning": r.reasoning,
                 "tool_calls": r.tool_calls, "finish_reason": r.finish_reason,
                 "completion_tokens": r.completion_tokens},
                expect_english=True, expect_json=bool(e.get("expect_json")))
            if not r.error and r.completion_tokens is None:
                labels.append("error")  # no usage: the run cannot be measured honestly
                r.error = "response has no usage"
            row = {"n": n, "worker": wid, "entry": e["id"], "kind": e["kind"], "temperature": temp,
                   "max_tokens": mt, "stream": int(stream), "start_s": r.t_start - t0,
                   "end_s": r.t_end - t0, "wall_s": r.wall, "prompt_tokens": r.prompt_tokens,
                   "completion_tokens": r.completion_tokens, "finish_reason": r.finish_reason,
                   "labels": ";".join(labels), "error": r.error}
            with lock:
                shared.append(row)
                if labels and a.verbose:
                    print(f"  #{n} {e['id']}: {', '.join(labels)}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.workers)]
    for t in threads:
        t.start()
    hard = deadline + a.grace_s
    for t in threads:
        t.join(max(0.0, hard - time.perf_counter()))
    with lock:  # requests still running now are abandoned (daemon threads) and count as errors
        rows = list(shared)
        abandoned = state["next"] - len(rows)
    if abandoned:
        print(f"soak: {abandoned} request(s) still running {a.grace_s:.0f} s after the deadline; "
              f"counted as errors")
    rows.sort(key=lambda r: r["n"])
    elapsed = time.perf_counter() - t0
    windows = make_windows(rows, a.window_s, elapsed)
    fam = Counter()
    sub = Counter()
    for r in rows:
        for lb in filter(None, r["labels"].split(";")):
            sub[lb] += 1
        for f in {classify.family(lb) for lb in filter(None, r["labels"].split(";"))}:
            fam[f] += 1
    report.write_csv(ctx.path("soak_requests.csv"), rows, REQ_COLS)
    report.write_csv(ctx.path("soak.csv"), windows, WIN_COLS)
    fam["error"] += abandoned
    if abandoned:
        sub["error:abandoned"] = abandoned
    counts = [{"class": f, "responses": fam.get(f, 0)} for f in classify.FAMILIES]
    counts += [{"class": "  " + lb, "responses": n} for lb, n in sorted(sub.items())
               if lb != classify.family(lb)]
    report.write_csv(ctx.path("soak_classes.csv"), counts, ["class", "responses"])
    plot(windows, rows, ctx.path("soak.png"), f"soak, {ctx.model}, {a.workers} workers")
    toks = sum(r["completion_tokens"] or 0 for r in rows)
    report.print_table(f"soak throughput ({len(rows)} requests, {a.workers} workers, {elapsed:.1f} s, "
                       f"{toks} tokens, {report.fmt(stats.ratio(toks, elapsed), 1)} tok/s overall)",
                       windows, ["window", "start_s", "end_s", "tok_s", "requests_done", "unhealthy", "errors"],
                       nd={"start_s": 1, "end_s": 1, "tok_s": 1})
    by_kind = []
    for k in dict.fromkeys(r["kind"] for r in rows):
        rs = [r for r in rows if r["kind"] == k]
        by_kind.append({"kind": k, "requests": len(rs), "unhealthy": sum(1 for r in rs if r["labels"]),
                        "tokens": sum(r["completion_tokens"] or 0 for r in rs),
                        "median_wall_s": stats.median([r["wall_s"] for r in rs])})
    report.print_table("soak by kind", by_kind, ["kind", "requests", "unhealthy", "tokens", "median_wall_s"])
    report.print_table("soak response classes (a clean run is zero in every row)", counts,
                       ["class", "responses"])
    unhealthy = sum(1 for r in rows if r["labels"]) + abandoned
    print(f"\nsoak: {len(rows)} responses, {unhealthy} unhealthy"
          f"{' — CLEAN' if unhealthy == 0 else ''}")
    ctx.meta["soak"] = {"requests": len(rows), "unhealthy": unhealthy, "classes": dict(sub),
                        "elapsed_s": elapsed}
    return 0 if unhealthy == 0 else 1


def make_windows(rows, window_s, elapsed):
    n = max(1, int(elapsed // window_s) + (1 if elapsed % window_s > 1e-9 else 0))
    wins = [{"window": i, "start_s": i * window_s, "end_s": (i + 1) * window_s, "_tok": 0.0,
             "requests_done": 0, "unhealthy": 0, "errors": 0} for i in range(n)]
    for r in rows:
        s, e, t = r["start_s"], r["end_s"], r["completion_tokens"] or 0
        dur = max(e - s, 1e-9)
        for w in wins:
            ov = min(e, w["end_s"]) - max(s, w["start_s"])
            if ov > 0:
                w["_tok"] += t * ov / dur
        w = wins[min(int(e // window_s), n - 1)]
        w["requests_done"] += 1
        w["unhealthy"] += 1 if r["labels"] else 0
        w["errors"] += 1 if r["error"] else 0
    for w in wins:
        span = min(w["end_s"], elapsed) - w["start_s"]
        w["tok_s"] = w["_tok"] / span if span > 0 else None
    return wins


def plot(windows, rows, path, title):
    plt = report.pyplot()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    mids = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
    a1.plot(mids, [w["tok_s"] or 0 for w in windows], "o-")
    a1.set_ylabel("tok/s (usage)")
    a1.set_title(title, fontsize=9)
    width = (windows[0]["end_s"] - windows[0]["start_s"]) * 0.8 if windows else 1
    a2.bar(mids, [w["requests_done"] for w in windows], width=width, color="#8fbc8f", label="done")
    a2.bar(mids, [w["unhealthy"] for w in windows], width=width, color="#c44e52", label="unhealthy")
    a2.set_xlabel("seconds since start")
    a2.set_ylabel("responses per window")
    a2.legend(fontsize=8)
    return report.save(fig, path)
