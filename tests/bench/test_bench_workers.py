"""bench --workers N (processes) and --ray (Ray actors): same results files as one process, one run clock, Ctrl-C
keeps every finished request. Against the fake server on 127.0.0.1; the Ray test starts a local Ray instance
(2 CPUs, 127.0.0.1) and is skipped, saying why, when Ray is not installed (pip install 'speedlimit[ray]')."""

from __future__ import annotations

import importlib.util
import json
import signal
import time

import pytest

from speedlimit.artifacts import RunSummary
from speedlimit.bench.client import Endpoint, run_async
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan
from speedlimit.bench.workload import RequestSpec
from speedlimit.bench.workers import ProcessPool, ScaleOut, make_scale_out, plan_jobs
from speedlimit.errors import SpeedlimitError
from test_bench_hardening import _rows, _start_bench, _wait_for


def _specs(n: int) -> list[RequestSpec]:
    return [RequestSpec(i, f"p{i}", 4, prompt_tokens=1) for i in range(n)]


def test_plan_jobs_deals_slots_and_one_arrival_schedule():
    endpoint = Endpoint("http://127.0.0.1:1/v1")
    jobs = plan_jobs(2, endpoint, _specs(10), 10, concurrency=3)
    assert [job.slots for job in jobs] == [[0, 2], [1]]
    assert sorted(n for job in jobs for n in job.indices()) == list(range(10))  # every request once
    assert list(jobs[1].indices()) == [1, 4, 7]
    assert [s is None for s in jobs[1].specs] == [i not in (1, 4, 7) for i in range(10)]  # only what it sends
    assert len(plan_jobs(4, endpoint, _specs(4), 4, concurrency=2)) == 2  # more workers than slots: 2 busy
    offsets = [0.0, 0.1, 0.2, 0.3, 0.4]
    jobs = plan_jobs(2, endpoint, _specs(3), 5, offsets_s=offsets)
    assert jobs[0].arrivals == [(0, 0.0), (2, 0.2), (4, 0.4)] and jobs[1].arrivals == [(1, 0.1), (3, 0.3)]
    assert jobs[0].specs[1] is not None  # request 4 cycles back to prompt 1


def test_workers_flag_bounds():
    assert make_scale_out(None, None, use_ray=False) is None and make_scale_out(1, None, use_ray=False) is None
    with pytest.raises(SpeedlimitError, match="--workers must be between"):
        make_scale_out(0, None, use_ray=False)


@pytest.mark.parametrize("load", [["--concurrency", "3"], ["--rate", "200"]])
def test_one_and_two_workers_write_the_same_schema_and_requests(run_cli, faulty_server, tmp_path, load):
    common = ["bench", "--url", faulty_server.url("ok"), "--requests", "12", "--prompt-tokens", "uniform:4:40",
              "--output-tokens", "7", "--no-progress", *load]
    code1, _, err1 = run_cli([*common, "--out", str(tmp_path / "one")])
    code2, out2, err2 = run_cli([*common, "--workers", "2", "--out", str(tmp_path / "two")])
    assert code1 == 0 and code2 == 0, err1 + err2
    assert "2 processes on 1 host(s); clock skew" in out2
    one, two = _rows(tmp_path / "one" / "requests.jsonl"), _rows(tmp_path / "two" / "requests.jsonl")
    assert [sorted(row) for row in one] == [sorted(row) for row in two]  # same columns, row for row
    lengths = lambda rows: sorted((r["index"], r["prompt_tokens"], r["output_tokens"]) for r in rows)  # noqa: E731
    assert lengths(one) == lengths(two) and len(two) == 12
    assert {r["worker"] for r in two} == {0, 1} and {r["worker"] for r in one} == {None}
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert sorted(s1) == sorted(s2) and s1["workers"] is None
    assert (s1["requests"], s1["completed"], s1["output_tokens"]) == (s2["requests"], s2["completed"],
                                                                       s2["output_tokens"])
    workers = RunSummary.load(tmp_path / "two" / "summary.json").workers
    assert workers.mode == "processes" and workers.count == 2 and sum(w.requests for w in workers.workers) == 12
    assert workers.max_clock_offset_ms < 50 and workers.max_clock_uncertainty_ms < 500  # one machine: one clock
    # the merged records are on one clock: the run's span is the summary's duration, not two processes' clocks
    span = (max(r["end_ns"] for r in two) - min(r["start_ns"] for r in two)) / 1e9
    assert span == pytest.approx(s2["duration_s"], abs=1e-6) and span < 30
    code, _, err = run_cli(["report", str(tmp_path / "two")])  # the report states the skew it measured too
    assert code == 0, err
    html = next((tmp_path / "two" / "report").glob("*.html")).read_text()
    assert "load sent by" in html and "2 processes on 1 host(s); clock skew" in html


def test_open_loop_workers_keep_the_one_seeded_schedule(faulty_server):
    async def run(scale):
        plan = LoadPlan(rate=50, requests=10)
        async with BenchRunner(Endpoint(faulty_server.url("ok")), WorkloadPlan(output_tokens=3), scale=scale) as r:
            return (await r.run(plan)).records

    records = run_async(run(ScaleOut(ProcessPool(2))))
    by_index = sorted(records, key=lambda r: r.index)
    from speedlimit.bench.workload import arrival_offsets_s

    planned = arrival_offsets_s(10, 50, 1.0, 0)
    sent = [(r.start_ns - by_index[0].start_ns) / 1e9 for r in by_index]
    # both workers' sends, on the parent's clock, follow the one schedule (loose bound: a loaded 2-core machine)
    assert all(abs(s - p) < 0.25 for s, p in zip(sent, planned)), (sent, planned)
    assert {r.worker for r in records} == {0, 1}


def test_sigint_with_workers_keeps_every_finished_request_and_exits_130(faulty_server, tmp_path):
    out = tmp_path / "run"
    process = _start_bench("--url", faulty_server.url("paced-100"), "--output-tokens", "20", "--concurrency", "4",
                           "--requests", "12", "--workers", "2", "--out", str(out))
    try:
        _wait_for(lambda: len(_rows(out / "requests.jsonl")) >= 4, timeout_s=60)  # a first round from both workers
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["completed"] >= 4 and summary["cancelled"] >= 1
    rows = _rows(out / "requests.jsonl")
    assert len(rows) == summary["requests"] == summary["completed"] + summary["cancelled"]
    assert {row["worker"] for row in rows if row["error_kind"] is None} == {0, 1}
    assert all(row["output_chunks"] >= 1 for row in rows if row["error_kind"] == "cancelled")


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="Ray is not installed (pip install 'speedlimit[ray]'); --workers is tested without it")
def test_ray_actors_on_a_local_ray_instance(faulty_server, tmp_path):
    from speedlimit.bench.workers import RayPool

    async def run():
        scale = ScaleOut(RayPool(2, None, num_cpus=2, _node_ip_address="127.0.0.1"))
        async with BenchRunner(Endpoint(faulty_server.url("ok")), WorkloadPlan(output_tokens=5), scale=scale) as r:
            return await r.run(LoadPlan(concurrency=4, requests=16), tmp_path)

    result = run_async(run())
    summary = RunSummary.load(tmp_path / "summary.json")
    assert summary.completed == 16 and len(_rows(tmp_path / "requests.jsonl")) == 16
    assert summary.workers.mode == "ray" and {r.worker for r in result.records} == {0, 1}
    assert summary.workers.max_clock_uncertainty_ms > 0 and summary.workers.start_spread_ms is not None
