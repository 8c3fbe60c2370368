"""bench's server-side view against llama.cpp's real C++ `llama-server --metrics` (4 slots, the bundled SmolLM2-135M):
the series file, the typed server block, request ids on every record, and the self-checks. No speed is asserted."""

from __future__ import annotations

import json
import uuid

import pytest

from speedlimit.artifacts import RunSummary

pytestmark = pytest.mark.server

REQUESTS = 16
OUTPUT_TOKENS = 24


def test_bench_scrapes_llama_server_metrics_into_series_and_server_block(llama_cpp_server, tmp_path, run_cli):
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(["bench", "--url", llama_cpp_server.base_url, "--requests", str(REQUESTS),
                                    "--concurrency", "4", "--output-tokens", str(OUTPUT_TOKENS), "--prompt-tokens",
                                    "32", "--metrics-interval", "0.2", "--no-progress", "--out", str(out)])
    assert code == 0, stderr
    assert "server metrics" not in stderr  # no warning, no note: the endpoint is there and parses

    rows = [json.loads(line) for line in (out / "server_metrics.jsonl").read_text().splitlines()]
    assert rows[0]["phase"] == "before" and rows[-1]["phase"] == "after"
    assert any(r["phase"] == "during" for r in rows)
    assert all("llamacpp:tokens_predicted_total" in r["samples"] for r in rows)
    assert max(r["samples"]["llamacpp:requests_processing"] for r in rows) >= 1  # seen busy mid-run

    summary = RunSummary.load(out / "summary.json")
    server = summary.server
    assert server.engine == "llamacpp" and server.scrapes == len(rows) and server.failures == 0
    assert server.running.metric == "llamacpp:requests_processing" and server.running.max <= 4
    assert server.waiting.metric == "llamacpp:requests_deferred"
    # its /props: --parallel 4 over -c 4096 (per-slot caches, since --parallel was given)
    assert (server.slots, server.slot_context_tokens) == (4, 1024)
    # the server's own count of what it generated during the run is exactly what bench counted (usage)
    assert server.counters["generation_tokens"] == summary.output_tokens == REQUESTS * OUTPUT_TOKENS
    assert server.counters["prompt_tokens"] + server.counters.get("cached_prompt_tokens", 0) >= REQUESTS
    assert server.histograms == {}  # llama.cpp exports no latency histograms
    checks = summary.self_checks
    assert checks.ttft_vs_server is None and checks.output_length.exact == REQUESTS
    assert checks.client.wall_s > 0 and checks.client.loop_lag_samples > 0

    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len({r["request_id"] for r in records}) == REQUESTS
    assert all(uuid.UUID(r["request_id"]).version == 4 for r in records)
    assert all(r["server_request_id"] for r in records)  # llama-server's chunk id (chatcmpl-/cmpl-...)
    assert "server metrics" in stdout and "llamacpp" in stdout and "1,024-token context each" in stdout


def test_compare_estimate_replays_on_as_many_slots_as_llama_server_has(llama_cpp_server, tmp_path, run_cli):
    """Concurrency 8 against llama-server's 4 slots: the replay runs 4 sequences at once, as the server did (its
    /props), not the default engine's 256; what it predicts is compared, not asserted (the 2-core VM's speed varies)."""
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(["bench", "--url", llama_cpp_server.base_url, "--requests", "8", "--concurrency", "8",
                                    "--output-tokens", "8", "--prompt-tokens", "32", "--no-progress", "--out", str(out),
                                    "--compare-estimate", "--hardware", "amd-ryzen-9-7950x"])
    assert code == 0, stderr
    block = RunSummary.load(out / "summary.json").estimate
    assert block.method == "simulate" and block.inputs["max_seqs_from_server"] == 4
    assert block.predicted["engine"]["max_seqs"] == 4
    # no --engine: the replay runs llama.cpp's profile (its CPU backend here), the engine the server's /metrics name
    assert block.inputs["engine_from_server"] == 1 and block.predicted["engine"]["engine"] == "llama-cpp-cpu"
    assert "engine llama-cpp-cpu (the server's, from its /metrics)" in " ".join(stdout.split())
    assert block.comparison["ttft_s.mean"].ratio > 0


def test_bench_records_which_slots_a_fresh_llama_server_had_used_and_the_replay_starts_there(fresh_llama_cpp_server,
                                                                                           tmp_path, run_cli):
    """bench reads llama-server's /slots as each run begins, after its warm-up: on a fresh server the warm-up request
    took the top slot (the server's LRU takes never-used slots highest first); the next run sees that slot and the
    two its requests took, least recently used first, and a replay with slot streams starts from them."""
    def bench(out, seed, *extra):
        code, stdout, stderr = run_cli(["bench", "--url", fresh_llama_cpp_server.base_url, "--requests", "2",
                                        "--concurrency", "2", "--output-tokens", "4", "--prompt-tokens", "32",
                                        "--warmup", "1", "--seed", str(seed), "--no-progress", "--out", str(out), *extra])
        assert code == 0, stderr
        return RunSummary.load(out / "summary.json"), stdout

    first, stdout = bench(tmp_path / "first", 1)
    assert (first.server.slot_history, first.server.slots_busy) == ([3], 0)
    assert "used before the run: 3" in " ".join(stdout.split())
    second, _ = bench(tmp_path / "second", 2, "--compare-estimate", "--hardware", "amd-ryzen-9-7950x",
                      "--replay-engine", "slot_streams=1")
    # the first run's warm-up (slot 3) and requests (slots 2 and 1, in the order sent), then this run's warm-up in the
    # one slot never used
    assert second.server.slot_history == [3, 2, 1, 0] and second.server.slots_busy == 0
    block = second.estimate
    assert block.inputs["slots_used_from_server"] == 4 and block.predicted["engine"]["slot_history"] == [3, 2, 1, 0]
