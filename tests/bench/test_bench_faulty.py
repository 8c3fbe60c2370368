"""Every failure mode of the FaultyOpenAIServer fixture is counted as its own error kind, and runs go on."""

from __future__ import annotations

import json
import pytest

from faulty_server import MIXED_CYCLE, free_port
from speedlimit.bench.client import Endpoint, make_session, send_request
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan
from speedlimit.bench.workload import LengthSpec, RequestSpec


async def one(url, *, api="completions", timeout_s=5.0, max_tokens=8, include_usage=True):
    endpoint = Endpoint(url, model="fake-model", api=api, timeout_s=timeout_s, include_usage=include_usage)
    async with make_session() as session:
        return await send_request(session, endpoint, RequestSpec(0, "hello", max_tokens))


@pytest.mark.parametrize("mode, kind, status", [
    ("http_429", "http_429", 429),
    ("http_500", "http_500", 500),
    ("http_503", "http_503", 503),
    ("disconnect", "disconnect", 200),
    ("malformed", "malformed_sse", 200),
    ("empty", "empty", 200),
    ("error_event", "server_error", 200),
])
async def test_each_fault_is_its_own_error_kind(faulty_server, mode, kind, status):
    record = await one(faulty_server.url(mode))
    assert record.error_kind == kind, record.error_text
    assert record.http_status == status
    assert record.error_text
    assert record.e2e_s is not None and record.e2e_s < 5


async def send_on_one_session(server, modes, max_tokens=4):
    """Send one request per mode, in order, on one pooled session; the records and what the server saw."""
    before = len(server.served)
    records = []
    async with make_session() as session:
        for index, mode in enumerate(modes):
            endpoint = Endpoint(server.url(mode), model="fake-model", timeout_s=5.0)
            records.append(await send_request(session, endpoint, RequestSpec(index, "hello", max_tokens)))
    return records, server.served[before:]


async def test_a_reused_connection_closed_before_any_response_is_retried_once_on_a_fresh_one(faulty_server):
    (first, second), served = await send_on_one_session(faulty_server, ["stale", "stale"])
    assert first.ok and first.retries == 0
    assert second.ok, (second.error_kind, second.error_text)
    assert second.retries == 1 and second.output_tokens == 4 and second.http_status == 200
    # the second request went out on the kept-alive connection, was dropped unanswered, then went out on a new one
    assert served == [("stale", 1), ("stale", 2), ("stale", 1)]
    assert json.loads(json.dumps(second.to_json_dict()))["retries"] == 1


async def test_a_request_that_got_response_bytes_is_not_retried(faulty_server):
    (warm, cut), served = await send_on_one_session(faulty_server, ["ok", "disconnect"])
    assert warm.ok
    assert cut.error_kind == "disconnect" and cut.output_chunks == 2 and cut.retries == 0
    assert served == [("ok", 1), ("disconnect", 2)]  # on the reused connection, and sent only once


async def test_a_fresh_connection_failing_before_any_response_is_not_retried(faulty_server):
    (dropped,), served = await send_on_one_session(faulty_server, ["drop"])
    assert dropped.error_kind == "disconnect" and dropped.retries == 0 and dropped.http_status is None
    assert served == [("drop", 1)]


async def test_the_retry_happens_once_and_its_failure_is_recorded(faulty_server):
    (warm, dropped), served = await send_on_one_session(faulty_server, ["ok", "drop"])
    assert warm.ok
    assert dropped.error_kind == "disconnect" and dropped.retries == 1
    assert served == [("ok", 1), ("drop", 2), ("drop", 1)]


async def test_a_run_counts_retries_per_request_and_in_the_summary(faulty_server, tmp_path):
    endpoint = Endpoint(faulty_server.url("stale"), model="fake-model", timeout_s=5.0)
    async with BenchRunner(endpoint, WorkloadPlan(LengthSpec("fixed", 8), 4, None, 0)) as runner:
        result = await runner.run(LoadPlan(concurrency=2, requests=8), tmp_path)
    summary = result.summary
    assert summary.completed == 8 and summary.errors == {}
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert summary.retried == sum(row["retries"] for row in rows) >= 1  # one retry at most per request
    assert json.loads((tmp_path / "summary.json").read_text())["retried"] == summary.retried


async def test_a_stream_that_never_ends_hits_the_per_request_timeout(faulty_server):
    record = await one(faulty_server.url("hang"), timeout_s=0.3)
    assert record.error_kind == "timeout"
    assert record.output_chunks == 1  # what arrived before the timeout is kept
    # the timeout runs from before the connection, E2E from the request being on the socket (connecting excluded)
    assert 0.2 <= record.e2e_s <= 0.3 + 0.05


async def test_connection_refused_is_a_connect_error():
    record = await one(f"http://127.0.0.1:{free_port()}/v1")
    assert record.error_kind == "connect" and record.http_status is None


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_healthy_stream_uses_usage_when_asked_and_chunks_otherwise(faulty_server, api):
    with_usage = await one(faulty_server.url("ok"), api=api, max_tokens=12)
    assert with_usage.ok and with_usage.output_tokens == 12 and with_usage.token_count_source == "usage"
    assert with_usage.output_chunks == 12 and len(with_usage.itl_s) == 11
    assert with_usage.finish_reason == "length"
    without = await one(faulty_server.url("nousage"), api=api, max_tokens=5)
    # no usage, but a 'length' finish after max_tokens chunks: each chunk is one token, the count is exact
    assert without.ok and without.output_tokens == 5 and without.finish_reason == "length"
    assert without.token_count_source == "max_tokens"


async def test_fewer_chunks_than_max_tokens_are_only_a_chunk_count(faulty_server):
    record = await one(faulty_server.url("multi-4"), max_tokens=16)  # 4 tokens per chunk, no usage
    assert record.ok and record.finish_reason == "length" and record.output_chunks == 4
    assert record.output_tokens == 4 and record.token_count_source == "chunks"


async def test_mixed_faults_run_continues_and_writes_every_row(faulty_server, tmp_path):
    endpoint = Endpoint(faulty_server.url("mixed"), model="fake-model", timeout_s=0.5)
    plan = LoadPlan(concurrency=3, requests=2 * len(MIXED_CYCLE))
    async with BenchRunner(endpoint, WorkloadPlan(LengthSpec("fixed", 8), 6, None, 0)) as runner:
        result = await runner.run(plan, tmp_path)
    summary = result.summary
    assert summary.requests == 2 * len(MIXED_CYCLE)
    assert summary.completed >= 1 and summary.failed >= 1
    assert set(summary.errors) <= {"http_429", "http_500", "http_503", "disconnect", "malformed_sse", "empty",
                                      "timeout", "server_error"}
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == summary.requests
    assert json.loads((tmp_path / "summary.json").read_text())["errors"] == summary.errors


def test_cli_exit_code_reflects_failures_only_with_fail_on_error(faulty_server, tmp_path, run_cli):
    args = ["bench", "--url", faulty_server.url("http_503"), "--requests", "3", "--concurrency", "2",
            "--out", str(tmp_path), "--json", "--no-progress"]
    code, out, _ = run_cli(args)
    assert code == 0
    summary = json.loads(out)
    assert summary["errors"] == {"http_503": 3} and summary["completed"] == 0
    assert (tmp_path / "summary.json").exists() and len((tmp_path / "requests.jsonl").read_text().splitlines()) == 3
    code, _, _ = run_cli(args + ["--fail-on-error", "--force"])
    assert code == 1


def test_cli_unreachable_server_is_one_line_and_exit_2():
    """In a real process, so warnings printed at interpreter exit (an unclosed session) count too."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "speedlimit.cli", "bench", "--url", f"http://127.0.0.1:{free_port()}/v1",
                             "--requests", "1"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: cannot reach")


def test_cli_skip_preflight_records_connect_errors_instead(run_cli):
    code, out, _ = run_cli(["bench", "--url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m", "--requests",
                            "2", "--skip-preflight", "--json", "--no-progress"])
    assert code == 0 and json.loads(out)["errors"] == {"connect": 2}


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "2", "--rate", "3"], "exactly one of"),
    (["--requests", "3", "--duration", "2"], "not both"),
    (["--prompt-tokens", "lots"], "bad token length"),
    (["--slo", "ttft=soon"], "cannot read duration"),
    (["--sweep", "batch=1,2"], "bad --sweep"),
    (["--api", "embeddings"], "unknown --api"),
    (["--compare-estimate"], "--hardware"),
])
def test_cli_bad_input_exits_2_with_one_line(faulty_server, run_cli, argv, message):
    code, _, err = run_cli(["bench", "--url", faulty_server.url("ok"), *argv])
    assert code == 2 and message in err and err.count("\n") == 1


def test_cli_happy_path_on_the_fake_server_with_sweep_and_slo(faulty_server, tmp_path, run_cli):
    code, out, _ = run_cli(["bench", "--url", faulty_server.url("ok"), "--sweep", "concurrency=1,4", "--requests",
                            "8", "--output-tokens", "5", "--slo", "ttft=1s", "--out", str(tmp_path), "--json",
                            "--no-progress"])
    assert code == 0
    summary = json.loads(out)
    assert [p["sweep_value"] for p in summary["points"]] == [1, 4]
    assert all(p["completed"] == 8 and p["output_tokens"] == 40 for p in summary["points"])
    assert summary["sweep"]["knee_load"] in (1, 4)
    assert (tmp_path / "concurrency_4" / "requests.jsonl").exists()


async def test_a_duration_run_past_its_prompt_pool_warns_that_prompts_repeat(faulty_server, monkeypatch):
    import speedlimit.bench.runner as runner_module

    monkeypatch.setattr(runner_module, "DURATION_POOL_CLOSED", 2)  # a --duration run builds max(2, 4 x concurrency)
    endpoint = Endpoint(faulty_server.url("ok"), model="fake-model", timeout_s=5)
    async with BenchRunner(endpoint, WorkloadPlan(LengthSpec("fixed", 8), 4, None, 0)) as runner:
        timed = await runner.run(LoadPlan(concurrency=1, duration_s=0.5))
        counted = await runner.run(LoadPlan(concurrency=1, requests=3))
    repeats = len([r for r in timed.records if r.index >= 4])
    assert repeats >= 1
    warning = next(w for w in timed.summary.warnings if "re-sent" in w)
    assert warning.startswith(f"{repeats} of {len(timed.records)} requests re-sent one of the run's 4 distinct")
    assert "--requests" in warning
    assert not any("re-sent" in w for w in counted.summary.warnings)


async def test_a_dataset_sweep_warns_that_later_levels_re_send_its_prompts(faulty_server, tmp_path):
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"question {i} about the weather"}) + "\n" for i in range(5)))
    endpoint = Endpoint(faulty_server.url("ok"), model="fake-model", timeout_s=5)
    async with BenchRunner(endpoint, WorkloadPlan(LengthSpec("fixed", 8), 4, dataset, 0)) as runner:
        summary = await runner.sweep("concurrency", [1.0, 2.0], LoadPlan(concurrency=1, requests=4), tmp_path / "sweep")
    first, second = summary.points
    assert not any("re-sent the --dataset prompts" in w for w in first.warnings)
    assert any(w.startswith("sweep level 2 re-sent the --dataset prompts") for w in second.warnings)
    saved = json.loads((tmp_path / "sweep" / "concurrency_2" / "summary.json").read_text())
    assert any("re-sent the --dataset prompts" in w for w in saved["warnings"])  # the level's own file says so too


async def test_a_warm_up_stops_at_its_first_failed_request(faulty_server, monkeypatch):
    import speedlimit.bench.runner as runner_module

    sent = []
    real_send = runner_module.send_request

    async def counting_send(session, endpoint, spec):
        sent.append(spec.prompt)
        return await real_send(session, endpoint, spec)

    monkeypatch.setattr(runner_module, "send_request", counting_send)
    endpoint = Endpoint(faulty_server.url("hang"), model="fake-model", timeout_s=0.2)
    async with BenchRunner(endpoint, WorkloadPlan(LengthSpec("fixed", 8), 4, None, 0)) as runner:
        result = await runner.run(LoadPlan(concurrency=1, requests=2, warmup=6))
    # one warm-up request timed out, so the other five were never sent; the measured run sent its two and kept them
    assert len(sent) == 1 + 2
    assert [r.error_kind for r in result.records] == ["timeout", "timeout"]
