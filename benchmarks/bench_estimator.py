"""How fast is the estimator? One step through the step-cost model, one estimate, and the vectorized sweep rate.

Run: python benchmarks/bench_estimator.py
Prints: scalar step evaluations per second (`core.step_seconds` on a mixed decode + prefill step, what the
simulator calls once per engine step), microseconds per `estimate()` call (median of repeated timings) and
configurations per second for `sweep_arrays` over a grid of >= 1,000,000 configurations, plus the ratio of the
sweep to a loop of `estimate()` calls. Targets (issue 11): >= 200,000 steps/s, estimate() < 1 ms, sweep >= 1e6/s.
"""

from __future__ import annotations

import platform
import statistics
import time

import numpy as np

from speedlimit.catalog import resolve_hardware, resolve_model
from speedlimit.estimator import core, estimate
from speedlimit.estimator.api import step_model
from speedlimit.estimator.sweep import sweep_arrays


def time_steps(repeats: int = 5) -> float:
    """Scalar evaluations of one mixed step (64 decode sequences + a 512-token prefill chunk) per second, best of runs."""
    for model in ("llama-3.1-8b", "qwen3-30b-a3b"):  # warm both the dense and the MoE path
        step_model(model, "h100-sxm")
    resolved = step_model("llama-3.1-8b", "h100-sxm")
    cost, machine = resolved.cost, resolved.machine
    n = 100_000
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(n):
            context = 64.0 * (1000.0 + i % 512)  # the running sum changes every step, as in a simulation
            step = core.StepBatch(64.0, context, context, 1.0, 512.0, 1536.0, 1536.0, 655_616.0, 655_616.0)
            core.step_seconds(cost, machine, step)
        best = min(best, time.perf_counter() - start)
    return n / best


def time_estimate(repeats: int = 2000) -> float:
    arch, device = resolve_model("llama-3.1-70b"), resolve_hardware("h100-sxm")
    estimate(arch, device)  # warm caches
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        estimate(arch, device, batch=8, prompt=2048, output=512, tp=2)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def time_sweep() -> tuple[int, float]:
    models = [resolve_model(m) for m in ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b", "qwen2.5-72b")]
    hardware = [resolve_hardware(h) for h in ("h100-sxm", "h200", "a100-sxm-80gb", "rtx-4090", "apple-m2-ultra", "mi300x", "l4", "b200")]
    weights = ["bf16", "fp8", "q4_0", "int4"]
    batches = np.unique(np.round(np.geomspace(1, 1024, 64)))
    contexts = np.round(np.geomspace(128, 131072, 128))
    count = len(models) * len(weights) * len(hardware) * len(batches) * len(contexts)
    sweep_arrays(models, hardware, weights, batches[:2], contexts[:2])  # warm up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        arrays = sweep_arrays(models, hardware, weights, batches, contexts)
        np.asarray(arrays["decode_tok_s"]).sum()
        best = min(best, time.perf_counter() - start)
    return count, best


def main() -> None:
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}")
    steps_per_s = time_steps()
    print(f"step_seconds (scalar, mixed decode + prefill step): {steps_per_s:,.0f} steps/s (best of 5 x 100,000)")
    per_call_s = time_estimate()
    print(f"estimate(): {per_call_s * 1e6:,.0f} µs per call (median of 2000)")
    count, seconds = time_sweep()
    rate = count / seconds
    print(f"sweep: {count:,} configurations in {seconds * 1e3:,.0f} ms = {rate:,.0f} configurations/s (best of 3)")
    print(f"sweep vs a loop of estimate(): {rate * per_call_s:,.0f}x faster per configuration")


if __name__ == "__main__":
    main()
