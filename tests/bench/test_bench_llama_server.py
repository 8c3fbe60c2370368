"""Real benches against llama.cpp's C++ `llama-server` (continuous batching, 4 slots) on the bundled SmolLM2-135M.

What this server does with bench's requests (tools/server in the vendored llama.cpp, checked here):
- `max_tokens` is an alias of its `n_predict`; `ignore_eos: true` bans end-of-generation tokens, so a forced request
  yields exactly max_tokens tokens (`finish_reason: "length"`); `min_tokens` is not a field it knows, and is ignored.
- streamed completions and chats carry `usage` on the last event (chats when `stream_options.include_usage` is set),
  so output tokens are the server's own count.
- `/tokenize {"content"}` is its tokenizer, so prompts have exact lengths.

Every request must complete: a `disconnect` here used to be a pooled keep-alive connection the server had already
closed (bench now re-sends those once and counts them in `retries`). The server's own /metrics counter of generated
tokens must move by exactly what bench counted, so no request is lost or sent twice. No speed is asserted.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from speedlimit.bench.client import Endpoint
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan
from speedlimit.bench.workload import parse_length_spec

pytestmark = pytest.mark.server

OUTPUT_TOKENS = 16
REQUESTS = 12


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def prometheus_value(text: str, name: str) -> float:
    """The value of one unlabelled sample in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no sample {name}:\n{text[:2000]}")


def tokens_predicted(server) -> float:
    return prometheus_value(get(server.root_url + "/metrics")[1], "llamacpp:tokens_predicted_total")


def runner_for(server, *, api="completions", output=OUTPUT_TOKENS, force_output=True, seed=0, **extra_body):
    endpoint = Endpoint(server.base_url, api=api, timeout_s=120, force_output=force_output, extra_body=extra_body)
    return BenchRunner(endpoint, WorkloadPlan(parse_length_spec("uniform:16:48"), output, None, seed))


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_every_request_completes_with_exactly_max_tokens(llama_cpp_server, tmp_path, concurrency):
    predicted_before = tokens_predicted(llama_cpp_server)
    async with runner_for(llama_cpp_server, seed=concurrency) as runner:
        assert runner.tokenizer is not None and runner.tokenizer.kind == "llama.cpp"
        specs = await runner.specs(REQUESTS)
        result = await runner.run(LoadPlan(concurrency=concurrency, requests=REQUESTS), tmp_path)
    summary = result.summary
    failures = [(r.index, r.error_kind, r.error_text, r.retries) for r in result.records if not r.ok]
    assert summary.completed == REQUESTS and summary.errors == {}, failures
    for record in result.records:
        assert record.finish_reason == "length"
        assert record.output_tokens == OUTPUT_TOKENS and record.token_count_source == "usage"
        assert record.output_chunks >= 1 and record.ttft_s > 0 and record.tpot_s > 0
    # the server counts the prompt exactly as its /tokenize endpoint did when bench built it
    assert sorted(r.prompt_tokens for r in result.records) == sorted(s.prompt_tokens for s in specs)
    assert summary.prompt_token_source == "usage"
    assert summary.output_tokens == REQUESTS * OUTPUT_TOKENS
    # every request reached the server exactly once: its own counter moved by what bench counted
    assert tokens_predicted(llama_cpp_server) - predicted_before == REQUESTS * OUTPUT_TOKENS
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == REQUESTS and summary.retried == sum(row["retries"] for row in rows)
    if concurrency == 4:  # continuous batching really overlapped the streams
        assert summary.mean_in_flight > 2.0


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_unforced_outputs_stop_at_or_before_max_tokens(llama_cpp_server, api):
    # greedy, so a reply that ends early (EOS) ends early on every run
    async with runner_for(llama_cpp_server, api=api, output=7, force_output=False, seed=5, temperature=0) as runner:
        result = await runner.run(LoadPlan(concurrency=2, requests=4))
    for record in result.records:
        assert record.ok, (record.error_kind, record.error_text)
        assert 1 <= record.output_tokens <= 7 and record.token_count_source == "usage"
        assert record.finish_reason == ("length" if record.output_tokens == 7 else "stop")


async def test_forced_chat_has_exactly_max_tokens(llama_cpp_server):
    async with runner_for(llama_cpp_server, api="chat", output=9, seed=6) as runner:
        result = await runner.run(LoadPlan(concurrency=2, requests=4))
    for record in result.records:
        assert record.ok, (record.error_kind, record.error_text)
        assert record.output_tokens == 9 and record.finish_reason == "length"


def prompt_tokens_evaluated(server) -> float:
    """Prompt tokens the server has run through the model (a prefix-cache hit is not evaluated again)."""
    return prometheus_value(get(server.root_url + "/metrics")[1], "llamacpp:prompt_tokens_total")


async def test_sweep_levels_send_prompts_the_prefix_cache_has_not_seen(llama_cpp_server, tmp_path):
    # llama-server keeps each slot's last prompt and reuses its longest common prefix (cache_prompt, on by default):
    # if every level sent the same seeded prompts, levels after the first would evaluate ~1 token per request and
    # their TTFTs would be cache hits. The server's own counter says what it evaluated.
    evaluated_before = prompt_tokens_evaluated(llama_cpp_server)
    async with runner_for(llama_cpp_server, output=4, seed=7) as runner:
        summary = await runner.sweep("concurrency", [1.0, 2.0, 4.0], LoadPlan(concurrency=1, requests=4), tmp_path)
    assert [p.completed for p in summary.points] == [4, 4, 4]
    from speedlimit.bench.workload import level_seed

    # each level's summary says which seed its prompts came from (calibrate reads it)
    assert [p.endpoint["workload"]["prompt_seed"] for p in summary.points] == [level_seed(7, i) for i in range(3)]
    sent = sum(p.prompt_tokens for p in summary.points)
    evaluated = prompt_tokens_evaluated(llama_cpp_server) - evaluated_before
    # synthetic prompts of random words share at most a first word; the old same-prompts sweep evaluated ~1/3 of this
    assert evaluated >= 0.9 * sent, (evaluated, sent)


async def test_the_same_prompts_sent_again_are_flagged_as_prefix_cache_hits(llama_cpp_server):
    # one run, then the very same seeded prompts again (what a sweep did before each level had its own seed): the
    # server's own prompt_tokens_cached_total says the second run's prompts came from its cache, and bench says so
    async with runner_for(llama_cpp_server, output=4, seed=11) as runner:
        first = await runner.run(LoadPlan(concurrency=1, requests=4))
        again = await runner.run(LoadPlan(concurrency=1, requests=4))
    assert first.summary.server is not None and again.summary.server is not None
    assert not any("prefix cache" in w for w in first.summary.warnings), first.summary.warnings
    assert again.summary.server.prefix_cache_hit_rate > 0.9
    assert any(w.startswith("the server answered") and "prefix cache" in w for w in again.summary.warnings)


def test_metrics_and_slots_are_served(llama_cpp_server):
    status, text = get(llama_cpp_server.root_url + "/metrics")
    assert status == 200
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing"):
        assert prometheus_value(text, name) >= 0
    status, text = get(llama_cpp_server.root_url + "/slots")
    slots = json.loads(text)
    assert status == 200 and len(slots) == 4  # --parallel 4


def test_cli_bench_at_concurrency_4_reports_no_disconnects(llama_cpp_server, tmp_path, run_cli):
    code, out, err = run_cli(["bench", "--url", llama_cpp_server.base_url, "--concurrency", "4", "--requests", "12",
                              "--output-tokens", "16", "--out", str(tmp_path / "run"), "--json", "--no-progress"])
    assert code == 0, err
    summary = json.loads(out)
    assert summary["completed"] == 12 and summary["errors"] == {} and summary["output_tokens"] == 12 * 16
    assert "retried" in summary


async def test_a_url_without_v1_fails_each_request_saying_where_the_openai_api_is(llama_cpp_server, tmp_path):
    # llama-server serves its own /completions at the root (content/stop events, no choices) and /models there too,
    # so the pre-flight passes; each request must fail as malformed with the one fix named, not an opaque payload
    endpoint = Endpoint(llama_cpp_server.root_url, timeout_s=60, force_output=True)
    async with BenchRunner(endpoint, WorkloadPlan(parse_length_spec("16"), 4, None, 3)) as runner:
        result = await runner.run(LoadPlan(concurrency=1, requests=2), tmp_path)
    assert result.summary.completed == 0 and result.summary.errors == {"malformed_sse": 2}
    assert all("pass --url ending in /v1" in record.error_text for record in result.records)
