"""bench's self-checks: arrival lag, client CPU and loop lag, TTFT vs the server's, output length; and request ids,
server metrics and self-checks end to end against the fake server (404, garbage and hanging /metrics included)."""

from __future__ import annotations

import json
import uuid

import pytest

from speedlimit.artifacts import (Distribution, RequestRecord, RunSummary, ServerHistogram, ServerMetrics,
                                  WorkerInfo, WorkersInfo)
from speedlimit.bench.selfcheck import (CPU_SATURATED, LATE_THRESHOLD_S, arrival_check, check_warnings, client_check,
                                        output_length_check, self_checks, ttft_check)


def record(i: int, **fields) -> RequestRecord:
    base = {"index": i, "start_ns": 1_000_000_000 + i, "end_ns": 2_000_000_000, "ttft_s": 0.1, "e2e_s": 1.0,
            "output_tokens": 16, "max_tokens": 16, "token_count_source": "usage", "finish_reason": "length"}
    return RequestRecord(**{**base, **fields})


def test_arrival_lag_and_late_count():
    on_time = [record(i, scheduled_ns=1_000_000_000 + i - 1000) for i in range(90)]  # 1 us late
    late = [record(90 + i, scheduled_ns=1_000_000_000 + 90 + i - 50_000_000) for i in range(10)]  # 50 ms late
    check = arrival_check(on_time + late)
    assert check.requests == 100 and check.late == 10
    assert check.lag_p50_s == pytest.approx(1e-6) and check.lag_max_s == pytest.approx(0.05)
    assert arrival_check([record(0)]) is None  # closed loop: no schedule
    warnings = check_warnings(self_checks(on_time + late, wall_s=1, cpu_s=0.1, lags_s=[0.0],
                                          client_ttft=Distribution(), server=None), forced_output=True)
    assert any("10 of 100 requests left more than 10 ms late" in w for w in warnings)
    assert LATE_THRESHOLD_S == 0.010


def test_client_cpu_and_loop_lag_flag_the_bottleneck_loudly():
    calm = client_check(wall_s=10, cpu_s=2, lags_s=[0.0005] * 100)
    assert not calm.bottleneck and calm.cpu_fraction == pytest.approx(0.2)
    busy = client_check(wall_s=10, cpu_s=9.5, lags_s=[0.0005] * 100)
    assert busy.bottleneck and busy.cpu_fraction >= CPU_SATURATED
    laggy = client_check(wall_s=10, cpu_s=1, lags_s=[0.001] * 90 + [0.05] * 10)
    assert laggy.bottleneck and laggy.loop_lag_p99_s == pytest.approx(0.05)
    workers = WorkersInfo(mode="processes", count=2, workers=[WorkerInfo(worker=0, cpu_s=9.8),
                                                             WorkerInfo(worker=1, cpu_s=3.0)])
    spread = client_check(wall_s=10, cpu_s=0.5, lags_s=[0.0], workers=workers)
    assert spread.bottleneck and spread.processes == 2 and spread.cpu_s == pytest.approx(13.3)
    starved = WorkersInfo(mode="processes", count=2, workers=[WorkerInfo(worker=0, cpu_s=2.0, loop_lag_p99_s=0.001),
                                                              WorkerInfo(worker=1, cpu_s=2.0, loop_lag_p99_s=0.3)])
    lagging = client_check(wall_s=10, cpu_s=0.5, lags_s=[0.001] * 100, workers=starved)
    assert lagging.bottleneck and lagging.worker_loop_lag_p99_s == 0.3
    assert not client_check(wall_s=0.5, cpu_s=0.5, lags_s=[0.3] * 10).bottleneck  # under 1 s: not judged
    from speedlimit.artifacts import SelfChecks

    (line,) = check_warnings(SelfChecks(client=busy), forced_output=False)
    assert line.startswith("THE CLIENT MAY BE THE BOTTLENECK") and "95% of a core" in line
    assert check_warnings(SelfChecks(client=calm), forced_output=False) == []


def test_output_length_requested_vs_received():
    rows = [record(0), record(1, output_tokens=10, finish_reason="stop"), record(2, output_tokens=20),
            record(3, output_tokens=3, token_count_source="chunks"), record(4, error_kind="timeout")]
    check = output_length_check(rows)
    assert (check.checked, check.exact, check.fewer, check.more) == (3, 1, 1, 1)
    assert check.mean_received_over_requested == pytest.approx((1 + 10 / 16 + 20 / 16) / 3)
    assert check.finish_reasons == {"length": 3, "stop": 1}
    from speedlimit.artifacts import SelfChecks

    forced = check_warnings(SelfChecks(output_length=check), forced_output=True)
    assert len(forced) == 2 and "MORE output tokens" in forced[0] and "fewer" in forced[1]
    assert len(check_warnings(SelfChecks(output_length=check), forced_output=False)) == 1  # EOS is allowed then
    assert output_length_check([record(0, token_count_source="chunks")]) is None


def test_client_ttft_minus_server_ttft():
    server = ServerMetrics(engine="vllm", histograms={"ttft_s": ServerHistogram(
        metric="vllm:time_to_first_token_seconds", n=10, mean=0.040, p50=0.035)})
    check = ttft_check(Distribution(mean=0.050, p50=0.041, n=10), server)
    assert check.mean_diff_s == pytest.approx(0.010) and check.p50_diff_s == pytest.approx(0.006)
    assert ttft_check(Distribution(mean=0.05, n=1), ServerMetrics(engine="llamacpp")) is None
    assert ttft_check(Distribution(mean=0.05, n=1), None) is None


# --- end to end against the fake server ---------------------------------------------------------------------------


def bench(run_cli, url: str, out, *extra: str):
    code, stdout, stderr = run_cli(["bench", "--url", url, "--requests", "12", "--concurrency", "4",
                                    "--output-tokens", "16", "--prompt-tokens", "8", "--no-progress",
                                    "--out", str(out), *extra])
    return code, stdout, stderr


def test_request_ids_are_sent_recorded_and_joined_with_the_servers(faulty_server, run_cli, tmp_path):
    before = len(faulty_server.request_ids)
    code, _, stderr = bench(run_cli, faulty_server.url("echo_id"), tmp_path / "run")
    assert code == 0, stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    sent = faulty_server.request_ids[before:]
    assert sorted(r["request_id"] for r in rows) == sorted(sent) and len(set(sent)) == 12
    assert all(uuid.UUID(r["request_id"]).version == 4 for r in rows)
    assert all(r["server_request_id"] == "server-" + r["request_id"] for r in rows)  # the header wins
    assert all(r["max_tokens"] == 16 for r in rows)
    code, _, _ = bench(run_cli, faulty_server.url("ok"), tmp_path / "ok")
    rows = [json.loads(line) for line in (tmp_path / "ok" / "requests.jsonl").read_text().splitlines()]
    assert {r["server_request_id"] for r in rows} == {"fake"}  # no header: the chunks' OpenAI id


def test_server_metrics_series_and_block_from_a_vllm_format_endpoint(faulty_server, run_cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, stderr = bench(run_cli, faulty_server.url("metrics"), out, "--metrics-interval", "0.05")
    assert code == 0, stderr
    rows = [json.loads(line) for line in (out / "server_metrics.jsonl").read_text().splitlines()]
    assert rows[0]["phase"] == "before" and rows[-1]["phase"] == "after" and len(rows) >= 3
    summary = RunSummary.load(out / "summary.json")
    server = summary.server
    assert server.engine == "vllm" and server.url.endswith("/metrics/metrics")
    assert server.counters["generation_tokens"] == 12 * 16 and server.counters["prompt_tokens"] == 12 * 7
    assert server.histograms["ttft_s"].n == 12
    assert summary.self_checks.ttft_vs_server.server_metric == "vllm:time_to_first_token_seconds"
    assert summary.self_checks.ttft_vs_server.mean_diff_s is not None
    assert summary.self_checks.output_length.exact == 12
    assert not any("server metrics" in w for w in summary.warnings)
    assert "server metrics" in stdout and "vllm" in stdout and "output length" in stdout


@pytest.mark.parametrize("mode, kind, why", [("ok", "note", "HTTP 404"),
                                             ("metrics_garbage", "warning", "no Prometheus metrics"),
                                             ("metrics_hang", "warning", "did not answer within")])
def test_a_broken_metrics_endpoint_never_fails_the_run(faulty_server, run_cli, tmp_path, monkeypatch, mode, kind,
                                                        why):
    monkeypatch.setattr("speedlimit.bench.server_metrics.SCRAPE_TIMEOUT_S", 0.5)
    out = tmp_path / "run"
    code, stdout, stderr = bench(run_cli, faulty_server.url(mode), out)
    assert code == 0, stderr
    summary = RunSummary.load(out / "summary.json")
    assert summary.completed == 12 and summary.server is None
    lines = [line for line in stderr.splitlines() if "server metrics" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{kind}: server metrics:") and why in lines[0]
    stored = summary.notes if kind == "note" else summary.warnings
    assert [w for w in stored if "server metrics" in w] == [lines[0].removeprefix(f"{kind}: ")]
    assert summary.self_checks.client is not None


def test_no_server_metrics_skips_scraping_and_open_loop_reports_arrival_lag(faulty_server, run_cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(["bench", "--url", faulty_server.url("metrics"), "--requests", "20", "--rate", "200",
                                    "--output-tokens", "4", "--no-progress", "--no-server-metrics", "--out", str(out)])
    assert code == 0, stderr
    assert not (out / "server_metrics.jsonl").exists()
    summary = RunSummary.load(out / "summary.json")
    assert summary.server is None
    arrivals = summary.self_checks.arrivals
    assert arrivals.requests == 20 and arrivals.lag_p50_s is not None and arrivals.lag_p50_s > -0.002
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    # uvloop's (libuv's) timers have 1 ms granularity: a request may leave up to ~1 ms before its time
    assert all(r["scheduled_ns"] is not None and r["start_ns"] >= r["scheduled_ns"] - 2_000_000 for r in rows)
    assert "arrival lag" in stdout


@pytest.mark.parametrize("flag, value", [("--metrics-interval", "0"), ("--metrics-interval", "nan"),
                                         ("--metrics-url", "ftp://x/metrics")])
def test_bad_metrics_flags_are_one_line_errors(run_cli, flag, value):
    code, _, stderr = run_cli(["bench", "--url", "http://127.0.0.1:9/v1", flag, value, "--no-progress"])
    assert code == 2 and "Traceback" not in stderr and stderr.strip().count("\n") == 0
    assert flag in stderr


def test_workers_map_the_schedule_onto_the_run_clock(faulty_server, run_cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(["bench", "--url", faulty_server.url("ok"), "--requests", "16", "--rate", "100",
                                    "--output-tokens", "4", "--workers", "2", "--no-progress", "--out", str(out)])
    assert code == 0, stderr
    summary = RunSummary.load(out / "summary.json")
    arrivals, client = summary.self_checks.arrivals, summary.self_checks.client
    assert arrivals.requests == 16 and client.processes == 2
    assert all(w.loop_lag_p99_s is not None for w in summary.workers.workers)
    # on one machine the offsets are ~0: a lag far from 0 would be a schedule left on the worker's clock
    assert -0.002 < arrivals.lag_p50_s < 0.5
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["worker"] for r in rows} == {0, 1} and all(r["request_id"] for r in rows)


def test_a_sweep_prints_each_levels_self_check(faulty_server, run_cli, tmp_path):
    code, stdout, stderr = run_cli(["bench", "--url", faulty_server.url("ok"), "--sweep", "concurrency=1,2",
                                    "--requests", "6", "--output-tokens", "4", "--no-progress",
                                    "--out", str(tmp_path / "sweep")])
    assert code == 0, stderr
    import re

    assert len(re.findall(r"│ ok\s+│", stdout)) == 2  # the self-check column: one verdict per level
    from speedlimit.artifacts import SweepSummary

    sweep = SweepSummary.load(tmp_path / "sweep" / "summary.json")
    assert all(point.self_checks is not None and point.self_checks.output_length.exact == 6 for point in sweep.points)
    assert (tmp_path / "sweep" / "concurrency_1" / "requests.jsonl").is_file()


def test_a_prefix_cache_answering_most_prompt_tokens_is_flagged_unless_the_prompts_share_a_prefix():
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.selfcheck import CACHED_PROMPT_SHARE_BAD, prefix_cache_warning

    hot = ServerMetrics(engine="llamacpp", prefix_cache_hit_rate=0.93)
    warning = prefix_cache_warning(hot, shared_prefix=False)
    assert warning and warning.startswith("the server answered 93% of the prompt tokens from its prefix cache")
    assert prefix_cache_warning(hot, shared_prefix=True) is None  # --prefix-tokens / a dataset: hits are the point
    cool = ServerMetrics(engine="llamacpp", prefix_cache_hit_rate=CACHED_PROMPT_SHARE_BAD - 0.01)
    assert prefix_cache_warning(cool, shared_prefix=False) is None
    assert prefix_cache_warning(ServerMetrics(engine="unknown"), shared_prefix=False) is None  # no figure, no claim
    assert prefix_cache_warning(None, shared_prefix=False) is None
