"""Calibrate prices its points with the estimator's own step-cost model: before fitting, its prediction for a step
is exactly what `estimate` predicts for the same inputs (per-kernel overhead, tensor parallelism and all-reduce
included), on GPU, Apple and CPU bases."""

from __future__ import annotations

import pytest

from speedlimit.artifacts import Distribution, PredictionBlock, RunSummary
from speedlimit.catalog import resolve_hardware, resolve_model
from speedlimit.estimator import estimate
from speedlimit.verify.fit import (points_from_bench, points_from_verify, predicted_step_seconds, prior_efficiency,
                                   prior_step_seconds)
from speedlimit.verify.run import DecodePoint, ModelInfo, PrefillPoint, VerifyResult, measured_hardware, step_work

# (model, hardware, tp, batch, weights): memory-bound decode, so the mean step over the reply is the mid-context step
BENCH_CASES = [
    ("llama-3.1-70b", "h100-sxm", 4, 8, "bf16"),
    ("llama-3.1-70b", "h100-sxm", 8, 32, "fp8"),
    ("qwen3-30b-a3b", "h200", 2, 4, "bf16"),
    ("llama-3.1-8b", "apple-m2-ultra", 1, 1, "q4_0"),
    ("llama-3.1-8b", "amd-epyc-9654", 1, 2, "q8_0"),
]


def prior_prediction(point, hardware: str) -> float:
    base = resolve_hardware(hardware)
    return predicted_step_seconds(point, base.memory_bandwidth_Bps, base.peak_flops("bf16"), prior_efficiency(base))


@pytest.mark.parametrize(("model", "hardware", "tp", "batch", "weights"), BENCH_CASES)
def test_bench_point_before_fit_equals_estimate(model, hardware, tp, batch, weights) -> None:
    predicted = estimate(model, hardware, tp=tp, batch=batch, prompt=1024, output=256, weights=weights)
    summary = RunSummary(tpot_s=Distribution(mean=0.05, n=1),
                         estimate=PredictionBlock(model=model, hardware=hardware, predicted=predicted.to_dict()))
    points, bench_hardware, _ = points_from_bench(summary, "summary.json")
    assert bench_hardware == hardware and len(points) == 1
    assert predicted.regime == "memory"
    # the prior calibrate scores is the estimate's own step, as recorded
    assert prior_step_seconds(points[0], 1.0, None, prior_efficiency(resolve_hardware(hardware))) == predicted.itl_s
    if "attention: " not in predicted.efficiency_basis:  # a CPU's attention kernel is the estimate's, not the fit's
        assert prior_prediction(points[0], hardware) == pytest.approx(predicted.itl_s, rel=1e-9)
    if tp > 1:
        assert points[0].comm_s == pytest.approx(predicted.tp_comm_s) and points[0].comm_s > 0


def test_verify_points_before_fit_equal_estimate_on_the_measured_cpu() -> None:
    arch = resolve_model("smollm2-135m")
    hardware = measured_hardware(20e9, 150e9, 24e9, "2 threads")
    prompt, tokens = 512, 64
    default = estimate(arch, hardware, prompt=prompt, output=tokens, kv="fp16")
    d_bytes, d_flops = step_work(arch, "decode", prompt, tokens)
    p_bytes, p_flops = step_work(arch, "prefill", prompt)
    result = VerifyResult(
        threads=2, measured_bandwidth_Bps=20e9, measured_flops=150e9,
        model=ModelInfo(path="m.gguf", name=arch.name, kernels_per_step=arch.decode_kernels),
        decode=[DecodePoint(kind="base", threads=2, context_start=prompt, tokens=tokens, tok_s=100.0,
                            bytes_per_token=d_bytes, flops_per_token=d_flops)],
        prefill=[PrefillPoint(threads=2, prompt_tokens=prompt, median_s=0.5, step_bytes=p_bytes, step_flops=p_flops)],
    )
    decode, prefill = points_from_verify(result, "verify.json")
    efficiency = prior_efficiency(hardware)
    flops = hardware.peak_flops("bf16")
    assert predicted_step_seconds(decode, 20e9, flops, efficiency) == pytest.approx(default.itl_s, rel=1e-9)
    assert predicted_step_seconds(prefill, 20e9, flops, efficiency) == pytest.approx(default.ttft_s, rel=1e-9)


def test_calibrate_scores_a_bench_summary_against_the_estimate_it_recorded(tmp_path, isolated_config, cli) -> None:
    """`calibrate summary.json` on the hardware the summary's estimate block was priced on: "before" is that estimate's
    own decode step (a CPU's attention kernel and kernel rates included), not the default roofline; on another base
    (--hardware) the recorded prediction is not that base's and the default efficiencies price the prior."""
    import json

    from speedlimit.artifacts import SweepInfo, SweepSummary

    model, hardware = "llama-3.1-8b", "amd-epyc-9654"
    runs = []
    for batch in (1, 4):
        predicted = estimate(model, hardware, batch=batch, prompt=2048, output=256, weights="q8_0")
        runs.append(RunSummary(tpot_s=Distribution(mean=predicted.itl_s * 1.25, n=1),
                               estimate=PredictionBlock(model=model, hardware=hardware, predicted=predicted.to_dict())))
    summary = SweepSummary(sweep=SweepInfo(parameter="concurrency", values=[1.0, 4.0]), points=runs)
    path = tmp_path / "summary.json"
    summary.save(path)
    done = cli(["calibrate", str(path), "--name", "benchbox", "--json", "--force"])
    assert done.returncode == 0, done.stderr
    fit = json.loads(done.stdout)
    assert fit["error_before"]["decode"] == pytest.approx(0.2, rel=1e-6)  # |1 - 1.25| / 1.25 on both points
    assert any(note.startswith("before: the estimate's own decode step as each bench summary recorded it")
               for note in fit["notes"])
    other = cli(["calibrate", str(path), "--hardware", "intel-xeon-8480", "--name", "benchbox2", "--json", "--force"])
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["error_before"]["decode"] != pytest.approx(0.2, rel=1e-3)
