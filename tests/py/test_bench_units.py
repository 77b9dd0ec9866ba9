"""Unit tests of dsv4bench helpers: /metrics parsing and derived spec stats,
percentiles, the prefill document builder, base-URL handling."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from dsv4bench import common, promtext, stats  # noqa: E402
from dsv4bench.client import Client  # noqa: E402


def metrics(drafts, drafted, accepted, per_pos, model="m", other=True):
    lab = f'model_name="{model}",engine="0"'
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts_total counter",
             f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
             f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {drafted}",
             f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}",
             f"vllm:generation_tokens_total{{{lab}}} 1.0e3",
             f'vllm:time_to_first_token_seconds_bucket{{{lab},le="0.1"}} 4']
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
              for i, v in enumerate(per_pos)]
    if other:  # a second served model must not be summed in
        lines.append('vllm:spec_decode_num_drafts_total{model_name="other",engine="0"} 999')
    return "\n".join(lines) + "\n"


def test_parse_labels_and_values():
    s = promtext.parse('a_total{x="1",y="q\\"uote"} 2.5\nb 3 1700000000\n# c 4\nbad line\n')
    assert s["a_total"] == [({"x": "1", "y": 'q\\"uote'}, 2.5)]
    assert s["b"] == [({}, 3.0)]
    assert "c" not in s


def test_spec_delta_matches_dspark_identity():
    """spec/DSPARK.md §5.7 sanity identity: survivals 0.826/0.725/0.572/0.471/0.399
    give tok/step 1 + Σ s_i = 3.993 and acceptance Σ s_i / 5 = 59.9 %."""
    surv = [0.826, 0.725, 0.572, 0.471, 0.399]
    drafts = 1000
    pos0 = [5, 5, 4, 3, 3]
    before = promtext.spec_counters(metrics(10, 50, 20, pos0), "m")
    after = promtext.spec_counters(metrics(10 + drafts, 50 + 5 * drafts, 20 + sum(surv) * drafts,
                                           [p + s * drafts for p, s in zip(pos0, surv)]), "m")
    assert before["drafts"] == 10 and before["gen_tokens"] == 1000.0
    d = promtext.delta(before, after)
    dv = promtext.derive(d)
    assert dv["mean_accept_len"] == pytest.approx(3.993)
    assert dv["acceptance_rate"] == pytest.approx(0.5986)
    assert [round(v, 3) for v in dv["per_pos_accept"].values()] == surv


def test_spec_counters_absent():
    c = promtext.spec_counters("vllm:num_requests_running 0\n")
    assert c["drafts"] is None and c["per_pos"] == {}
    dv = promtext.derive(promtext.delta(c, c))
    assert dv["acceptance_rate"] is None and dv["mean_accept_len"] is None


def test_percentile():
    assert stats.percentile([], 50) is None
    assert stats.percentile([3], 99) == 3
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert stats.percentile([4, 1, 3, 2, None], 100) == 4
    assert stats.percentile(list(range(101)), 90) == 90


def test_build_document_bounded_and_numbered():
    filler = common.read_text("filler.txt")
    for n in (0, 100, 5000, 50000):
        d = common.build_document(filler, n)
        assert len(d) <= n
        assert len(d) >= n - 100
    d = common.build_document(filler, 50000)
    assert d.startswith("[§1] ") and "[§11] " in d  # the ten paragraphs repeat with new numbers


def test_base_url_forms():
    c = Client("http://127.0.0.1:8888/v1/")
    assert (c.host, c.port, c.prefix, c.base_url) == ("127.0.0.1", 8888, "", "http://127.0.0.1:8888")
    c = Client("https://example.test/proxy/v1")
    assert (c.port, c.prefix) == (443, "/proxy")
    with pytest.raises(ValueError):
        Client("127.0.0.1:8888")


def test_cold_check():
    assert common.cold_check([0.02, 0.01, 0.01], tokens=64)["cold"] is True
    assert common.cold_check([0.0105, 0.01, 0.01], tokens=64)["cold"] is False
    # 3x slower per token but only 2 ms in total: noise, not a cold server.
    assert common.cold_check([0.0003, 0.0001, 0.0001], tokens=10)["cold"] is False
    assert common.cold_check([0.02])["ratio"] is None
