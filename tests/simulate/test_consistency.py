"""The simulator agrees with the estimator where they model the same thing, and with queueing theory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from speedlimit import estimate, simulate
from speedlimit.simulator.api import build_workload, engine_config, resolve, run_workload

CASES = [
    ("llama-3.1-8b", "h100-sxm", 512, 256),
    ("mixtral-8x7b", "h100-sxm", 1024, 64),  # MoE: experts read per step
    ("gemma-2-9b", "a100-80gb", 6000, 128),  # sliding-window layers (window 4096) crossed during prefill and decode
    ("smollm2-135m", "rtx-4090", 128, 32),
]


@pytest.mark.parametrize("model,hardware,prompt,output", CASES)
def test_concurrency_one_matches_estimate(model, hardware, prompt, output):
    est = estimate(model, hardware, prompt=prompt, output=output, tp=2 if model == "mixtral-8x7b" else 1)
    run = simulate(model, hardware, concurrency=1, requests=3, prompt_tokens=prompt, output_tokens=output,
                   tp=2 if model == "mixtral-8x7b" else 1)
    s = run.summary
    assert s.completed == 3 and s.output_tokens == 3 * output
    assert s.ttft_s.p50 == pytest.approx(est.ttft_s, rel=0.01)
    assert s.itl_s.mean == pytest.approx(est.itl_s, rel=0.01)
    assert s.tpot_s.mean == pytest.approx(est.itl_s, rel=0.01)
    assert s.e2e_s.p50 == pytest.approx(est.e2e_s, rel=0.01)
    assert all(len(r.itl_s) == output - 1 for r in run.records)


@pytest.mark.parametrize("batch", [2, 8, 32])
def test_batch_started_together_without_chunking_matches_estimate_batch(batch):
    prompt, output = 512, 128
    est = estimate("llama-3.1-8b", "h100-sxm", batch=batch, prompt=prompt, output=output)
    run = simulate("llama-3.1-8b", "h100-sxm", concurrency=batch, requests=batch, prompt_tokens=prompt,
                   output_tokens=output, chunked_prefill=False, max_batched_tokens=batch * prompt,
                   max_seqs=batch)  # the default engine, llama-server, runs 4 slots
    records = run.records
    assert {r.ttft_s for r in records} == {records[0].ttft_s}  # one prefill step for all of them
    assert records[0].ttft_s == pytest.approx(est.ttft_s, rel=0.01)
    first = records[0].ttft_s
    last = max(r.e2e_s for r in records)
    decode_throughput = batch * (output - 1) / (last - first)
    assert decode_throughput == pytest.approx(est.throughput_tok_s, rel=0.01)
    assert run.summary.simulation["batch"]["max"] == batch


def test_littles_law_on_an_open_loop_run():
    # a fixed GEMM rate (the GPU kind's 0.60), not the default engine's: the queue check's absolute tolerance covers
    # the records' wait for the running step to end, which the engine's per-step queue count does not see, and that
    # wait grows with the prefill steps' length (0.029 at 0.60, 0.055 at llama.cpp CUDA's fitted 0.255, queue mean 0)
    step = resolve("llama-3.1-8b", "h100-sxm", flops_efficiency=0.60)
    engine = engine_config("continuous", max_seqs=32, step=step)
    workload = build_workload(rate=6.0, requests=600, prompt_tokens="uniform:200:1200", output_tokens="normal:200:50",
                              seed=3)
    sim = run_workload(step, engine, workload)
    raw, s = sim.raw, sim.summary
    horizon = s.duration_s
    # the engine's own count of requests in the system, integrated over its steps (idle time holds none)
    in_system = sum(n * dt for n, dt in zip(raw.step_in_system, raw.step_s)) / horizon
    arrival_rate = s.requests / horizon
    assert in_system == pytest.approx(arrival_rate * s.e2e_s.mean, rel=0.03)
    assert s.mean_in_flight == pytest.approx(s.request_s * s.e2e_s.mean, rel=1e-9)
    # and in the queue alone: mean waiting = rate × mean wait
    assert s.simulation["queue"]["mean"] * (sum(raw.step_s) / horizon) == pytest.approx(
        arrival_rate * np.mean([r.queue_s for r in sim.records]), rel=0.25, abs=0.05)


def test_same_seed_identical_run_and_other_seed_differs():
    kwargs = dict(rate=20.0, requests=300, prompt_tokens="uniform:64:2048", output_tokens="uniform:16:300",
                  max_seqs=16, kv_tokens=20_000)
    a = simulate("llama-3.1-8b", "l4", seed=7, **kwargs)
    b = simulate("llama-3.1-8b", "l4", seed=7, **kwargs)
    c = simulate("llama-3.1-8b", "l4", seed=8, **kwargs)
    assert a.summary.to_dict() == b.summary.to_dict()
    assert [r.to_json_dict() for r in a.records] == [r.to_json_dict() for r in b.records]
    assert a.summary.to_dict() != c.summary.to_dict()


def test_workload_is_benchs_draw_for_draw():
    from speedlimit.bench.workload import arrival_offsets_s, parse_length_spec

    run = simulate("llama-3.1-8b", "h100-sxm", rate=3.0, requests=50, prompt_tokens="uniform:10:500", seed=11)
    spec = parse_length_spec("uniform:10:500")
    assert [r.prompt_tokens for r in run.records] == spec.sample(50, np.random.default_rng([11, 0]))
    offsets = arrival_offsets_s(50, 3.0, 1.0, 11)
    assert [r.start_ns for r in run.records] == [int(o * 1e9 + 0.5) for o in offsets]


def test_a_sweep_level_draws_benchs_lengths_for_that_level():
    from speedlimit.bench.workload import level_seed, parse_length_spec

    spec = parse_length_spec("uniform:10:500")
    levels = [build_workload(concurrency=2, requests=20, prompt_tokens="uniform:10:500", seed=5, level=level)
              for level in (0, 1, 2)]
    for level, workload in enumerate(levels):
        assert workload.prompts == spec.sample(20, np.random.default_rng([level_seed(5, level), 0]))
    assert levels[0].prompts == build_workload(concurrency=2, requests=20, prompt_tokens="uniform:10:500",
                                               seed=5).prompts  # level 0 is a plain run
    assert levels[1].prompts != levels[0].prompts != levels[2].prompts
