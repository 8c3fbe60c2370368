"""`simulate()`'s summary block of what bench cannot see: batch and tokens per step, queue and KV cache over time,
and each request's time split, all consistent with the engine's own per-step facts."""

from __future__ import annotations

import numpy as np
import pytest

from speedlimit import simulate


def test_simulation_block_matches_the_engines_steps():
    run = simulate("llama-3.1-8b", "l4", rate=8.0, requests=300, prompt_tokens="uniform:200:3000", output_tokens=128,
                   max_seqs=24, kv_tokens=30_000, seed=2)
    sim, raw = run.summary.simulation, run.raw
    steps = len(raw.end_times)
    assert sim["steps"] == steps and sim["simulated_s"] == pytest.approx(raw.end_times[-1])
    weights = np.asarray(raw.step_s) / sum(raw.step_s)
    assert sim["batch"]["max"] == max(raw.step_batch) <= 24
    assert sim["batch"]["mean"] == pytest.approx(float(np.dot(raw.step_batch, weights)))
    assert sim["tokens_per_step"]["mean"] == pytest.approx(float(np.mean(raw.step_tokens)))
    assert sim["prefill_token_share"] == pytest.approx(sum(raw.step_prefill) / sum(raw.step_tokens))
    assert sim["queue"]["max"] == max(raw.step_waiting) > 0
    assert sim["kv"]["capacity_tokens"] == 30_000 and 0 < sim["kv"]["peak_fraction"] <= 1
    timeline = sim["timeline"]
    assert len(timeline["t_s"]) == 200 and timeline["t_s"] == sorted(timeline["t_s"])
    assert max(timeline["batch"]) <= 24 and all(0 <= f <= 1 for f in timeline["kv_fraction"])
    assert max(timeline["queue"]) <= sim["queue"]["max"]
    split = sim["time_split"]
    e2e = np.mean([r.e2e_s for r in run.records])
    assert split["queue_s"] + split["prefill_s"] + split["decode_s"] == pytest.approx(e2e, rel=1e-9)
    assert split["queue_s"] == pytest.approx(np.mean([r.queue_s for r in run.records]))


def test_sequence_overhead_is_charged_per_running_sequence_per_step():
    kwargs = dict(concurrency=8, requests=8, prompt_tokens=256, output_tokens=32, chunked_prefill=False,
                  max_batched_tokens=8 * 256)
    plain = simulate("llama-3.1-8b", "h100-sxm", **kwargs)
    charged = simulate("llama-3.1-8b", "h100-sxm", sequence_overhead_s=1e-3, **kwargs)
    gaps = [b - a for a, b in zip(plain.records[0].itl_s, charged.records[0].itl_s)]
    assert gaps == pytest.approx([8e-3] * 31, rel=1e-6)  # every decode step ran 8 sequences: + 8 × 1 ms
    assert charged.summary.engine["sequence_overhead_s"] == 1e-3
    ttft = charged.records[0].ttft_s - plain.records[0].ttft_s
    assert ttft == pytest.approx(8e-3, rel=1e-6)  # the one prefill step held 8 sequences too
