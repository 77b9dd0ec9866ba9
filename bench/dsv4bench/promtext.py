"""Prometheus text parsing and the speculative-decoding counters.

Names follow spec/SERVING.md §3.9 (vLLM's): counters end in `_total`; the
per-position counter carries a `position` label. Derived values follow
spec/DSPARK.md §5.7: acceptance rate = accepted / drafted; mean acceptance
length (tok/step) = 1 + accepted / drafts; per-position acceptance =
accepted_per_pos[i] / drafts.
"""
import re

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GEN_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"


def parse(text):
    """Prometheus text -> {metric name: [(labels dict, float value), ...]}."""
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, v))
    return out


def _sum(series, name, model):
    tot, seen = 0.0, False
    for labels, v in series.get(name, []):
        if model and "model_name" in labels and labels["model_name"] != model:
            continue
        tot += v
        seen = True
    return tot if seen else None


def spec_counters(text, model=None):
    """The counters a spec run needs, summed over label sets of `model`.

    Returns {"drafts", "draft_tokens", "accepted", "gen_tokens",
    "prompt_tokens": float or None, "per_pos": {position: float}}; None
    values mean the server does not export that counter.
    """
    s = parse(text)
    per_pos = {}
    for labels, v in s.get(PER_POS, []):
        if model and "model_name" in labels and labels["model_name"] != model:
            continue
        try:
            i = int(labels.get("position", ""))
        except ValueError:
            continue
        per_pos[i] = per_pos.get(i, 0.0) + v
    return {
        "drafts": _sum(s, DRAFTS, model),
        "draft_tokens": _sum(s, DRAFT_TOKENS, model),
        "accepted": _sum(s, ACCEPTED, model),
        "gen_tokens": _sum(s, GEN_TOKENS, model),
        "prompt_tokens": _sum(s, PROMPT_TOKENS, model),
        "per_pos": per_pos,
    }


def delta(before, after):
    """after - before for each counter (None when either side lacks it)."""
    d = {}
    for k in ("drafts", "draft_tokens", "accepted", "gen_tokens", "prompt_tokens"):
        a, b = after.get(k), before.get(k)
        d[k] = None if a is None or b is None else a - b
    d["per_pos"] = {i: v - before["per_pos"].get(i, 0.0) for i, v in after["per_pos"].items()}
    return d


def derive(d):
    """Acceptance rate, mean acceptance length and per-position acceptance from a delta."""
    drafts, drafted, acc = d.get("drafts"), d.get("draft_tokens"), d.get("accepted")
    out = {"acceptance_rate": None, "mean_accept_len": None, "per_pos_accept": {}}
    if drafted:
        out["acceptance_rate"] = acc / drafted if acc is not None else None
    if drafts:
        if acc is not None:
            out["mean_accept_len"] = 1.0 + acc / drafts
        out["per_pos_accept"] = {i: v / drafts for i, v in sorted(d["per_pos"].items())}
    return out
