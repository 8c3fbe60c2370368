"""Pure metrics: percentiles, TPOT, goodput, summary and sweep knee, on hand-made timings."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speedlimit.artifacts import RequestRecord
from speedlimit.bench.metrics import (
    SLO_KEYS,
    distribution,
    find_knee,
    meets_slo,
    parse_duration_s,
    parse_slo,
    request_itl_p99_s,
    run_warnings,
    summarize,
    token_gaps_s,
)
from speedlimit.errors import SpeedlimitError


def record(index, ttft, itl, *, tokens=None, error=None, prompt=10, source="usage"):
    e2e = ttft + sum(itl) + 0.001
    return RequestRecord(index=index, ttft_s=ttft, itl_s=list(itl), e2e_s=e2e, prompt_tokens=prompt,
                         output_tokens=tokens if tokens is not None else len(itl) + 1, output_chunks=len(itl) + 1,
                         token_count_source=source, prompt_token_source="tokenizer", error_kind=error)


def test_distribution_matches_hand_computed_percentiles():
    stats = distribution([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert stats.mean == pytest.approx(5.5)
    assert stats.p50 == pytest.approx(5.5)
    assert stats.p90 == pytest.approx(9.1)  # linear interpolation: 1 + 0.9 * 9
    assert stats.p99 == pytest.approx(9.91)
    assert (stats.min, stats.max, stats.n) == (1.0, 10.0, 10)


def test_distribution_of_nothing_is_all_none():
    stats = distribution([])
    assert stats.n == 0 and stats.mean is None and stats.p99 is None


@given(st.lists(st.floats(min_value=0, max_value=1e3), min_size=1, max_size=50))
def test_percentiles_are_ordered_and_bounded(values):
    stats = distribution(values)
    assert stats.min <= stats.p50 <= stats.p90 <= stats.p95 <= stats.p99 <= stats.max
    assert stats.min - 1e-9 <= stats.mean <= stats.max + 1e-9


def test_tpot_spreads_decode_time_over_tokens_after_the_first():
    r = RequestRecord(index=0, ttft_s=0.2, e2e_s=1.2, output_tokens=11)
    assert r.tpot_s == pytest.approx(0.1)
    assert RequestRecord(index=1, ttft_s=0.2, e2e_s=0.3, output_tokens=1).tpot_s is None


def test_summary_counts_errors_by_kind_and_only_completed_in_latency():
    records = [
        record(0, 0.1, [0.01, 0.02]),
        record(1, 0.3, [0.03, 0.04]),
        RequestRecord(index=2, error_kind="http_429", e2e_s=0.01),
        RequestRecord(index=3, error_kind="timeout", e2e_s=5.0),
        RequestRecord(index=4, error_kind="http_429", e2e_s=0.01),
    ]
    summary = summarize(records, duration_s=2.0)
    assert summary.requests == 5 and summary.completed == 2 and summary.failed == 3
    assert summary.errors == {"http_429": 2, "timeout": 1}
    assert summary.ttft_s.mean == pytest.approx(0.2)
    assert summary.itl_s.n == 4 and summary.itl_s.mean == pytest.approx(0.025)
    assert summary.output_tokens == 6 and summary.output_tok_s == pytest.approx(3.0)
    assert summary.prompt_tokens == 20 and summary.total_tok_s == pytest.approx(13.0)
    assert summary.request_s == pytest.approx(1.0)
    assert summary.goodput_request_s == pytest.approx(1.0)  # no SLO: every completed request counts
    assert summary.token_count_source == "usage"
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        assert {"mean", "p50", "p90", "p99"} <= set(getattr(summary, key).model_dump())


def test_token_count_source_says_mixed_when_requests_differ():
    summary = summarize([record(0, 0.1, [0.01], source="usage"), record(1, 0.1, [0.01], source="chunks")], 1.0)
    assert summary.token_count_source == "mixed"
    assert summary.token_count_sources == {"usage": 1, "chunks": 1}


def test_goodput_counts_only_requests_meeting_every_slo():
    fast = record(0, 0.1, [0.01] * 10)
    slow_start = record(1, 0.9, [0.01] * 10)
    stuttering = record(2, 0.1, [0.01] * 9 + [0.5])
    failed = RequestRecord(index=3, error_kind="disconnect")
    slo = parse_slo("ttft=500ms,itl=100ms")
    assert [meets_slo(r, slo) for r in (fast, slow_start, stuttering, failed)] == [True, False, False, False]
    summary = summarize([fast, slow_start, stuttering, failed], duration_s=4.0, slo=slo)
    assert summary.goodput_requests == 1
    assert summary.goodput_request_s == pytest.approx(0.25)


def test_parse_slo_and_durations():
    assert parse_slo("ttft=0.5,itl=50ms,e2e=2s,tpot=800us") == pytest.approx(
        {"ttft": 0.5, "itl": 0.05, "e2e": 2.0, "tpot": 0.0008})
    assert parse_duration_s("1.5") == 1.5
    for bad in ("speed=1", "ttft", "ttft=fast"):
        with pytest.raises(SpeedlimitError):
            parse_slo(bad)


def test_knee_is_lowest_load_reaching_the_fraction_of_saturation():
    loads = [1, 2, 4, 8, 16]
    tok_s = [100.0, 190.0, 330.0, 360.0, 355.0]
    knee = find_knee(loads, tok_s, fraction=0.9)
    assert knee["saturation_output_tok_s"] == 360.0 and knee["saturation_load"] == 8
    assert knee["knee_load"] == 4  # 330 >= 0.9 * 360 = 324, 190 is not
    assert find_knee(loads, tok_s, fraction=1.0)["knee_load"] == 8


def test_knee_handles_unsorted_input_and_rejects_nonsense():
    assert find_knee([4, 1, 2], [30.0, 10.0, 29.0], 0.9)["knee_load"] == 2
    with pytest.raises(SpeedlimitError):
        find_knee([], [])
    with pytest.raises(SpeedlimitError):
        find_knee([1], [1.0], fraction=0)


def test_record_json_row_leaves_out_text_but_keeps_tpot():
    r = record(0, 0.1, [0.01, 0.01])
    r.output_text = "abc"
    row = r.to_json_dict()
    assert "output_text" not in row and row["output_chars"] == 3
    assert math.isclose(row["tpot_s"], r.tpot_s)
    assert np.isclose(row["e2e_s"], 0.121)


def chunky(index, gaps, tokens_per_chunk, *, source="usage", finish="length"):
    """A request whose every chunk carries `tokens_per_chunk` tokens."""
    r = record(index, 0.1, gaps, tokens=(len(gaps) + 1) * tokens_per_chunk, source=source)
    r.finish_reason = finish
    return r


def test_itl_per_token_divides_each_chunk_gap_by_tokens_per_chunk():
    four = chunky(0, [0.12] * 3, 4)
    assert token_gaps_s(four) == pytest.approx([0.03] * 3)
    summary = summarize([four], duration_s=1.0)
    assert summary.itl_s.mean == pytest.approx(0.12)  # per chunk, as sent
    assert summary.itl_token_s.mean == pytest.approx(0.03)
    one = record(1, 0.1, [0.02, 0.04])
    assert summarize([one], 1.0).itl_token_s == summarize([one], 1.0).itl_s  # one token per chunk: the same


def test_itl_slo_judges_per_token_gaps_not_chunks():
    """120 ms between 4-token chunks is 30 ms per token: it meets itl=50ms (the issue's 0/16 goodput)."""
    slo = parse_slo("itl=50ms")
    assert meets_slo(chunky(0, [0.12] * 10, 4), slo)
    assert not meets_slo(chunky(1, [0.12] * 10, 1), slo)


def test_itl_slo_p99_is_nearest_rank_so_the_max_below_100_gaps():
    gaps = [0.01] * 98 + [0.02, 0.5]  # 100 gaps: nearest-rank p99 is the 99th smallest
    assert request_itl_p99_s(record(0, 0.1, gaps)) == pytest.approx(0.02)
    assert request_itl_p99_s(record(1, 0.1, [0.01] * 50 + [0.3])) == pytest.approx(0.3)  # < 100 gaps: the max
    assert "max when < 100 gaps" in SLO_KEYS["itl"]
    gaps = [0.01] * 197 + [0.2, 0.3, 0.4]  # 200 gaps: ceil(198) -> the third largest
    assert request_itl_p99_s(record(2, 0.1, gaps)) == pytest.approx(0.2)


def test_chunk_counts_that_contradict_forced_output_warn_loudly():
    records = [chunky(i, [0.1] * 3, 1, source="chunks") for i in range(4)]  # 4 chunks each for 16 asked
    (warning,) = run_warnings(records, requested_output_tokens=16, forced_output=True)
    assert "contradict" in warning and "~4.0 tokens per chunk" in warning and "--tokenizer" in warning
    (quiet,) = run_warnings(records, requested_output_tokens=16, forced_output=False)
    assert "counted as stream chunks" in quiet and "--tokenizer" in quiet
    assert run_warnings([record(0, 0.1, [0.1] * 15)], 16, True) == []  # usage: nothing to say


def test_all_failed_warns_but_an_interruption_alone_does_not():
    failed = [RequestRecord(index=i, error_kind="http_404") for i in range(3)]
    (warning,) = run_warnings(failed)
    assert "every request failed (http_404 3)" in warning
    assert run_warnings([RequestRecord(index=0, error_kind="cancelled")]) == []
