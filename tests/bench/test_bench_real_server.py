"""Real benches against a real llama-cpp-python server running the bundled SmolLM2-135M (see conftest.py).

These check that the measurements are consistent with each other (E2E = TTFT + sum of ITL gaps + the stream's
tail, forced outputs have exactly max_tokens tokens, prompts have exactly the asked token count); they make no
claims about how fast this machine is.
"""

from __future__ import annotations

import json
import aiohttp
import pytest

from speedlimit.artifacts import SweepSummary
from speedlimit.bench.client import Endpoint
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan
from speedlimit.bench.workload import parse_length_spec

pytestmark = pytest.mark.server

OUTPUT_TOKENS = 12


def runner_for(server, *, api="completions", prompt="48", output=OUTPUT_TOKENS, seed=0):
    endpoint = Endpoint(server.base_url, api=api, timeout_s=120)
    return BenchRunner(endpoint, WorkloadPlan(parse_length_spec(prompt), output, None, seed))


def check_consistent(records, output_tokens):
    for record in records:
        assert record.ok, (record.error_kind, record.error_text)
        assert record.finish_reason == "length"
        # forced length: one SSE chunk per generated token on this server (no usage), so a 'length' finish after
        # max_tokens chunks is an exact count, not a re-tokenization of the text (which can merge tokens)
        assert record.output_chunks == output_tokens
        assert record.output_tokens == output_tokens, record.output_text
        assert record.token_count_source == "max_tokens"
        assert len(record.itl_s) == output_tokens - 1 and min(record.itl_s) >= 0
        streamed_s = record.ttft_s + sum(record.itl_s)
        tail_s = record.e2e_s - streamed_s  # the finish chunk and [DONE] after the last token
        assert 0 <= tail_s < 0.25 + 0.05 * record.e2e_s, (record.e2e_s, streamed_s)
        assert record.tpot_s == pytest.approx((record.e2e_s - record.ttft_s) / (output_tokens - 1))


async def test_concurrency_1_is_consistent_and_prompts_are_exact(llama_server):
    async with runner_for(llama_server, prompt="uniform:20:60") as runner:
        assert runner.tokenizer is not None and runner.tokenizer.kind == "llama-cpp-python"
        assert runner.endpoint.model == llama_server.model  # taken from /v1/models
        specs = await runner.specs(3)
        result = await runner.run(LoadPlan(concurrency=1, requests=3))
    async with aiohttp.ClientSession() as session:
        for spec in specs:
            async with session.post(llama_server.base_url[:-3] + "/extras/tokenize/count",
                                    json={"input": spec.prompt}) as response:
                assert (await response.json())["count"] == spec.prompt_tokens
            assert 20 <= spec.prompt_tokens <= 60
    check_consistent(result.records, OUTPUT_TOKENS)
    summary = result.summary
    assert summary.completed == 3 and summary.errors == {}
    assert summary.prompt_tokens == sum(s.prompt_tokens for s in specs)
    assert summary.token_count_source == "max_tokens" and summary.prompt_token_source == "tokenizer"
    assert summary.output_tok_s == pytest.approx(3 * OUTPUT_TOKENS / summary.duration_s)
    # one request at a time: the wall time is the sum of the requests' E2E plus small gaps between them
    assert sum(r.e2e_s for r in result.records) <= summary.duration_s * 1.0001


async def test_concurrency_4_keeps_four_in_flight(llama_server, tmp_path):
    async with runner_for(llama_server, seed=1) as runner:
        result = await runner.run(LoadPlan(concurrency=4, requests=8, warmup=1), tmp_path)
    check_consistent(result.records, OUTPUT_TOKENS)
    summary = result.summary
    assert summary.completed == 8 and summary.output_tokens == 8 * OUTPUT_TOKENS
    assert summary.mean_in_flight > 2.0  # closed loop really held several streams open
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sorted(row["index"] for row in rows) == list(range(8))
    assert all(row["output_tokens"] == OUTPUT_TOKENS and row["token_count_source"] == "max_tokens" for row in rows)


async def test_short_rate_sweep_finds_a_knee(llama_server, tmp_path):
    async with runner_for(llama_server, output=6, seed=2) as runner:
        summary = await runner.sweep("rate", [1.0, 8.0], LoadPlan(rate=1.0, requests=4), tmp_path)
    assert [p.sweep_value for p in summary.points] == [1.0, 8.0]
    assert all(p.completed == 4 and p.output_tokens == 24 for p in summary.points)
    sweep = summary.sweep
    assert sweep.knee_load in (1.0, 8.0)
    assert sweep.saturation_output_tok_s == max(p.output_tok_s for p in summary.points)
    assert SweepSummary.load(tmp_path / "summary.json").sweep == sweep


async def test_chat_api_role_delta_is_not_the_first_token(llama_server):
    async with runner_for(llama_server, api="chat", output=8, seed=3) as runner:
        result = await runner.run(LoadPlan(concurrency=2, requests=2))
    check_consistent(result.records, 8)


def test_cli_end_to_end_with_estimate(llama_server, tmp_path, run_cli):
    argv = ["bench", "--url", llama_server.base_url, "--concurrency", "2", "--requests", "2",
            "--prompt-tokens", "32", "--output-tokens", "6", "--out", str(tmp_path), "--json", "--no-progress",
            "--slo", "ttft=60s,itl=10s", "--compare-estimate", "--hardware", "intel-xeon-8480"]
    code, out, _ = run_cli(argv)
    assert code == 0
    summary = json.loads(out)
    for key in ("requests", "completed", "errors", "ttft_s", "itl_s", "tpot_s", "e2e_s", "output_tok_s",
                "request_s", "goodput_request_s", "token_count_source"):
        assert key in summary
    assert summary["completed"] == 2 and summary["goodput_requests"] == 2
    # --compare-estimate replays the sent workload through the simulator (not the static estimate's batch)
    assert summary["estimate"]["method"] == "simulate"
    assert summary["estimate"]["inputs"] == {"requests": 2, "concurrency": 2, "prompt": 32, "output": 6}
    assert summary["estimate"]["comparison"]["tpot_s.mean"]["ratio"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["estimate"] == summary["estimate"]
