"""`speedlimit calibrate RUN_DIR`: a deployment's profile fitted on a fixed half of a bench sweep, scored on the rest.

The sweeps here are synthetic bench directories (summary.json + per-level requests.jsonl, bench's layout) whose every
time comes from the step model on a known machine: the fit must recover that machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedlimit.artifacts import LoadInfo, RequestRecord, SweepInfo, SweepSummary, write_records
from speedlimit.bench.metrics import summarize
from speedlimit.catalog import resolve_hardware
from speedlimit.cli import app
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.estimator.api import estimate, step_model
from speedlimit.verify.fit import (
    DEPLOYMENT_SPLIT,
    DeploymentParams,
    deployment_points,
    fit_deployment,
    sweep_levels,
)

MODEL, HARDWARE = "llama-3.1-8b", "h100-sxm"
TRUTH = DeploymentParams(bw_efficiency=0.71, flops_efficiency=0.43, step_overhead_s=1.7e-3, sequence_overhead_s=35e-6)
runner = CliRunner()


def truth_machine(truth: DeploymentParams = TRUTH) -> tuple[core.CostModel, core.Machine]:
    device = resolve_hardware(HARDWARE)
    cost = step_model(MODEL, HARDWARE).cost
    machine = core.Machine(bandwidth_Bps=device.memory_bandwidth_Bps * truth.bw_efficiency,
                           flops=device.peak_flops("bf16") * truth.flops_efficiency,
                           step_overhead_s=truth.step_overhead_s, memory_bytes=math.nan, link_Bps=math.nan, tp=1.0,
                           sequence_overhead_s=truth.sequence_overhead_s,
                           stream_compute_overlap=truth.stream_compute_overlap)
    return cost, machine


def write_sweep(out: Path, levels=(1, 2, 4, 8, 16, 32, 64, 128), prompt: int = 1024, output: int = 64,
                requests: int = 4, truth: DeploymentParams = TRUTH, noise: float = 0.0, distort=None,
                truth_at=None, model: str = MODEL, priced: tuple[core.CostModel, core.Machine] | None = None) -> Path:
    """A bench --sweep concurrency=... directory of ``model`` whose times come from the step model on ``truth``
    (``truth_at(level)``: a machine per level; ``priced``: this cost model and machine at every level).

    Each level runs waves of ``level`` requests sent together, one wave after another, at least ``requests`` in all:
    their timelines (sent, first token, gaps) are a closed loop's whose every step decodes the whole wave. ``noise``
    alternately lengthens and shortens the steps, every sequence's alike."""
    points = []
    for level in levels:
        cost, machine = priced or truth_machine(truth_at(level) if truth_at else truth)
        ttft = float(core.step_seconds(cost, machine, core.prefill_batch(cost, 1.0, float(prompt))))
        scale = distort(level) if distort else 1.0
        gaps = [float(core.decode_step_seconds(cost, machine, float(level), float(prompt + 1 + i)))
                * (1.0 + (noise if (i + level) % 2 else -noise)) * scale for i in range(output - 1)]
        e2e = ttft + sum(gaps)
        records = []
        for index in range(level * max(1, math.ceil(requests / level))):
            start_ns = int((index // level) * (e2e + 1e-3) * 1e9)  # the next wave leaves as this one ends
            records.append(RequestRecord(index=index, start_ns=start_ns, end_ns=start_ns + int(e2e * 1e9), ttft_s=ttft,
                                         itl_s=gaps, e2e_s=e2e, prompt_tokens=prompt, output_tokens=output,
                                         output_chunks=output, token_count_source="usage", prompt_token_source="usage",
                                         finish_reason="length"))
        folder = out / f"concurrency_{level:g}"
        folder.mkdir(parents=True)
        write_records(folder / "requests.jsonl", records)
        summary = summarize(records, max(r.e2e_s for r in records), {}, source="bench",
                            offered_load=LoadInfo(concurrency=level, requests=requests),
                            endpoint={"url": "http://synthetic/v1", "model": model})
        summary.sweep_value = float(level)
        summary.save(folder / "summary.json")
        points.append(summary)
    sweep = SweepSummary(sweep=SweepInfo(parameter="concurrency", values=[float(v) for v in levels]), points=points,
                         endpoint={"url": "http://synthetic/v1", "model": model})
    sweep.save(out / "summary.json")
    return out


def _prior(engine: str | None = None) -> DeploymentParams:
    step = step_model(MODEL, HARDWARE, engine=engine)
    return DeploymentParams(step.efficiency.bw_efficiency, step.efficiency.flops_efficiency,
                            float(step.machine.step_overhead_s), float(step.machine.sequence_overhead_s))


def _points(path: Path):
    levels, _ = sweep_levels(path)
    device = resolve_hardware(HARDWARE)
    return deployment_points(levels, step_model(MODEL, HARDWARE).cost, 1, device.memory_bandwidth_Bps, device.peak_flops("bf16"))


def test_fit_recovers_the_known_machine(tmp_path: Path) -> None:
    fit = fit_deployment(_points(write_sweep(tmp_path / "run")), _prior())
    assert fit.fitted.bw_efficiency == pytest.approx(TRUTH.bw_efficiency, rel=1e-6)
    assert fit.fitted.flops_efficiency == pytest.approx(TRUTH.flops_efficiency, rel=1e-6)
    assert fit.fitted.step_overhead_s == pytest.approx(TRUTH.step_overhead_s, rel=1e-6)
    assert fit.fitted.sequence_overhead_s == pytest.approx(TRUTH.sequence_overhead_s, rel=1e-5)
    assert fit.errors["fit"]["fitted"] == pytest.approx(0.0, abs=1e-9)
    assert fit.errors["held-out"]["fitted"] == pytest.approx(0.0, abs=1e-9)
    assert fit.errors["held-out"]["prior"] > 0.05
    assert fit.refusal() is None
    assert fit.fitted.stream_compute_overlap == 1.0


def test_fit_recovers_a_deployment_whose_stream_and_arithmetic_add(tmp_path: Path) -> None:
    """Arithmetic slow enough to matter at the fitted levels (at 64 sequences it takes longer than the stream), as on
    a CPU: the fitted levels tell a sum from a max, and the sum recovers the truth."""
    truth = DeploymentParams(bw_efficiency=0.55, flops_efficiency=0.02, step_overhead_s=1.2e-3, sequence_overhead_s=50e-6,
                             stream_compute_overlap=0.0)
    fit = fit_deployment(_points(write_sweep(tmp_path / "run", truth=truth)), _prior())
    assert fit.fitted.stream_compute_overlap == 0.0
    for name in ("bw_efficiency", "flops_efficiency", "step_overhead_s", "sequence_overhead_s"):
        assert getattr(fit.fitted, name) == pytest.approx(getattr(truth, name), rel=1e-5), name
    assert fit.errors["held-out"]["fitted"] == pytest.approx(0.0, abs=1e-9)  # the held-out levels too
    assert any("add on this machine" in note for note in fit.notes)


def test_split_is_fixed_every_other_level(tmp_path: Path) -> None:
    points = _points(write_sweep(tmp_path / "run", levels=(1, 2, 4, 8)))
    folds = {p.load: p.fold for p in points if p.kind == "decode"}
    assert folds == {1.0: "fit", 2.0: "held-out", 4.0: "fit", 8.0: "held-out"}
    assert [p.fold for p in points if p.kind == "prefill"] == ["fit"]
    assert "held out" in DEPLOYMENT_SPLIT


def test_noisy_fit_is_close(tmp_path: Path) -> None:
    fit = fit_deployment(_points(write_sweep(tmp_path / "run", noise=0.02)), _prior())
    assert fit.fitted.bw_efficiency == pytest.approx(TRUTH.bw_efficiency, rel=0.1)
    assert fit.errors["held-out"]["fitted"] < 0.05 < fit.errors["held-out"]["prior"]


def test_calibrate_cli_saves_and_estimate_uses_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path / "config"))
    run = write_sweep(tmp_path / "run")
    # the synthetic server runs every client's sequence in each step: an engine whose cap is above the sweep's
    result = runner.invoke(app, ["calibrate", str(run), "--hardware", HARDWARE, "--engine", "vllm", "--name", "mydeploy", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["saved"] and data["split"] == DEPLOYMENT_SPLIT
    assert data["fitted"]["bw_efficiency"] == pytest.approx(TRUTH.bw_efficiency, rel=1e-6)
    assert data["errors"]["held-out"]["fitted"] == pytest.approx(0.0, abs=1e-6)
    calibrated = estimate(MODEL, "mydeploy", batch=8, prompt=1024, output=64)
    assert calibrated.engine == "vllm"  # the profile names the engine it was measured on
    assert calibrated.bw_efficiency == pytest.approx(TRUTH.bw_efficiency, rel=1e-3)
    assert calibrated.sequence_overhead_s == pytest.approx(TRUTH.sequence_overhead_s, rel=1e-3)
    cost, machine = truth_machine()
    truth_itl = float(core.mean_decode_step_seconds(cost, machine, 8.0, 1024.0, 1088.0))
    assert calibrated.itl_s == pytest.approx(truth_itl, rel=1e-3)
    # simulate --hardware NAME uses it too
    sim = runner.invoke(app, ["simulate", "-m", MODEL, "-H", "mydeploy", "--requests", "4", "--concurrency", "2", "--json"])
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.output)["engine"]["bw_efficiency"] == pytest.approx(TRUTH.bw_efficiency, rel=1e-3)
    # the text output states the split and the held-out error
    text = runner.invoke(app, ["calibrate", str(run), "--hardware", HARDWARE, "--engine", "vllm", "--name", "mydeploy2"])
    assert text.exit_code == 0, text.output
    assert "held out" in text.output and "held-out points" in text.output


def test_a_fit_that_misses_its_own_points_is_refused_unless_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path / "config"))
    # the fitted levels alternately 80% slow and 45% fast: no step model fits these
    run = write_sweep(tmp_path / "run", distort=lambda level: 1.8 if level in (1, 16) else 0.55)
    result = _cli("calibrate", str(run), "--hardware", HARDWARE, "--engine", "vllm", "--name", "bad")
    assert result.returncode == 2
    assert "not saved" in result.stderr and "own points" in result.stderr and "--force" in result.stderr
    assert not (tmp_path / "config" / "profiles" / "bad.toml").exists()
    forced = runner.invoke(app, ["calibrate", str(run), "--hardware", HARDWARE, "--engine", "vllm", "--name", "bad", "--force"])
    assert forced.exit_code == 0, forced.output
    assert (tmp_path / "config" / "profiles" / "bad.toml").exists()


CPU_MODEL, CPU, CPU_WEIGHTS = "smollm2-135m", "amd-ryzen-9-7950x", "q4_0"


def test_a_cpu_sweep_is_priced_as_estimate_prices_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU, llama.cpp's default engine prices the matmuls at its kernel rates and the attention as a kernel of
    its own (fold C). A sweep whose every step is the estimate's own: the prior calibrate scores is that estimate
    (0 error), the points pay the attention kernel apart, and the saved profile charges it, so that it prices
    another context as the machine does (a fit that folds the attention's growth into the bandwidth does not)."""
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path / "config"))
    step = step_model(CPU_MODEL, CPU, weights=CPU_WEIGHTS)
    assert core.attention_apart(step.machine) is True and step.kernel_rate is not None
    run = write_sweep(tmp_path / "run", levels=(1, 2, 3, 4), prompt=2048, output=32, model=CPU_MODEL,
                      priced=(step.cost, step.machine))
    result = runner.invoke(app, ["calibrate", str(run), "--hardware", CPU, "--weights", CPU_WEIGHTS, "--name", "cpudeploy",
                                 "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["saved"] and data["engine"] == step.engine.key
    assert data["errors"]["held-out"]["prior"] == pytest.approx(0.0, abs=1e-9)
    assert data["errors"]["fit"]["prior"] == pytest.approx(0.0, abs=1e-9)
    assert all(p["attention_s"] > 0 for p in data["points"])
    busy = step.reach.core_fraction * step.device.topology.cores
    assert data["attention_flops_per_core"] == pytest.approx([step.machine.attention_decode_flops / busy,
                                                              step.machine.attention_prefill_flops / busy])
    assert any(note.startswith("attention: llama.cpp's CPU attention kernel priced apart") for note in data["notes"])
    # the profile at contexts the sweep never ran: the kernel's time follows them as the machine's does (decode's
    # linearly, prefill's with the square of the prompt, which a bandwidth term cannot mimic: 33% short at 8,192)
    for prompt in (128, 8192):
        truth = estimate(CPU_MODEL, CPU, weights=CPU_WEIGHTS, prompt=prompt, output=32)
        calibrated = estimate(CPU_MODEL, "cpudeploy", weights=CPU_WEIGHTS, prompt=prompt, output=32)
        assert calibrated.attention_kernel_s == pytest.approx(truth.attention_kernel_s, rel=1e-6)
        assert calibrated.itl_s == pytest.approx(truth.itl_s, rel=0.03), prompt
    long_truth = estimate(CPU_MODEL, CPU, weights=CPU_WEIGHTS, prompt=8192, output=32)
    assert estimate(CPU_MODEL, "cpudeploy", weights=CPU_WEIGHTS, prompt=8192, output=32).ttft_s == pytest.approx(
        long_truth.ttft_s, rel=0.03)
    # the fitted FLOP/s is for the sweep's q4_0: the profile names it and the kernels that priced the prior, and prices
    # another type at their measured rates' ratio (here q8_0's prefill against q4_0's)
    profile = resolve_hardware("cpudeploy")
    assert (profile.kernel_profile, profile.kernel_type) == (step.engine.key, "q4_0")
    other = estimate(CPU_MODEL, "cpudeploy", weights="q8_0", prompt=512, output=2)
    assert other.calibrated_kernels == "q4_0" and other.calibrated_kernel_factors[1] == pytest.approx(
        step.engine.kernel_rate("q8_0")[1] / step.engine.kernel_rate("q4_0")[1])


def _request(start: float, ttft: float, gaps: list[float], prompt: int = 100):
    from speedlimit.verify.fit import SweepRequest

    return SweepRequest(prompt, len(gaps) + 1, ttft, gaps, start)


def test_decode_steps_come_from_the_requests_timelines() -> None:
    """Two replies decoding together, then a third sent as the first ends: its prompt's step (the gap it overlaps
    while it waits for its first token) is no decode step, and the steps after it decode two sequences again."""
    from speedlimit.verify.fit import SweepLevel, decode_steps

    a = _request(0.0, 1.0, [0.125] * 5)  # first token at 1.0, last at 1.625
    b = _request(0.0, 1.0, [0.125] * 10)  # decodes until 2.25
    c = _request(1.626, 0.374, [0.125] * 3)  # sent as a ends; its prompt takes b's steps to 2.0, its first token
    steps = decode_steps(SweepLevel(load=2, concurrency=2, requests=[a, b, c]), max_sequences=4)
    # a: 5 steps of 2; b: 5 of 2, then 1.625-2.0 (three steps) carried c's prompt, 2.0-2.25 with c; c: 2, 2, then 1
    assert steps.carried == 3
    assert steps.sequences.tolist() == [2] * 5 + [2] * 5 + [2, 2] + [2, 2, 1]
    assert steps.context.tolist()[:5] == [101, 102, 103, 104, 105]  # the context each gap's step ran at
    assert steps.context.tolist()[10:12] == [109, 110]  # b's gaps after the three it left out
    assert steps.gap_s.tolist() == pytest.approx([0.125] * 15)


def test_a_gap_that_carried_several_tokens_is_that_many_steps() -> None:
    """A server that streams two tokens per event: each gap is two decode steps, at the context of their middle."""
    from speedlimit.verify.fit import SweepLevel, SweepRequest, decode_steps

    packed = SweepRequest(100, 9, 1.0, [0.5] * 4, 0.0)  # 9 tokens: the first, then 4 events of 2
    steps = decode_steps(SweepLevel(load=1, concurrency=1, requests=[packed]))
    assert steps.gap_s.tolist() == pytest.approx([0.25] * 4)
    assert steps.context.tolist() == pytest.approx([101.5, 103.5, 105.5, 107.5])


def test_a_serial_servers_queue_is_no_prompt_work() -> None:
    """With every running slot taken (a serial server: one), a request waiting for its first token is queued, not
    prefilled: the running reply's gaps stay decode steps of one sequence."""
    from speedlimit.verify.fit import SweepLevel, decode_steps

    a = _request(0.0, 0.2, [0.05] * 8)  # decodes 0.2-0.6
    b = _request(0.0, 0.8, [0.05] * 8)  # queued until a ends, prefilled 0.6-0.8
    steps = decode_steps(SweepLevel(load=2, concurrency=2, requests=[a, b]), max_sequences=1)
    assert steps.carried == 0 and steps.sequences.tolist() == [1] * 16
    # the same timelines on an engine with free slots: b's wait overlaps all of a's steps, so they carried its prompt
    assert decode_steps(SweepLevel(load=2, concurrency=2, requests=[a, b]), max_sequences=4).carried == 8


@pytest.mark.parametrize("model, hardware, engine, weights, prompt", [
    (CPU_MODEL, CPU, None, CPU_WEIGHTS, 4096),  # llama.cpp: 4 slots, a prompt in one step
    (MODEL, HARDWARE, "vllm", None, 8192),  # vLLM: chunked prefill beside the running decodes
])
def test_a_simulated_sweep_with_long_prompts_calibrates_to_its_own_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, hardware: str, engine: str | None,
        weights: str | None, prompt: int) -> None:
    """simulate's sweep of a deployment, written in bench's schema, priced by the estimate's own step model: every
    long prompt lands in the steps of the replies decoding beside it. calibrate must see the decode steps as decode
    steps (a mean over every gap put the prompts' work into them: 30-74% "error" for the prior that generated them,
    and a refused fit), so that the prior scores 0 and the fit matches it."""
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path / "config"))
    options = [*(["--engine", engine] if engine else []), *(["--weights", weights] if weights else [])]
    simulated = runner.invoke(app, ["simulate", "-m", model, "-H", hardware, *options, "--prompt-tokens", str(prompt),
                                    "--output-tokens", "64", "--requests", "16", "--sweep", "concurrency=1,2,3,4",
                                    "--seed", "1", "--out", str(tmp_path / "sim"), "--json"])
    assert simulated.exit_code == 0, simulated.output
    result = runner.invoke(app, ["calibrate", str(tmp_path / "sim"), "--model", model, "--hardware", hardware, *options,
                                 "--name", "simdeploy", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["saved"], data["refused"]
    decode = [p for p in data["points"] if p["kind"] == "decode"]
    assert {p["fold"] for p in decode} == {"fit", "held-out"}
    for p in decode:
        assert p["prior_s"] == pytest.approx(p["measured_s"], rel=1e-3), p["label"]
    assert data["errors"]["held-out"]["prior"] < 1e-3 and data["errors"]["held-out"]["fitted"] < 0.01
    assert any("carried another request's prompt" in note for note in data["notes"])


def test_a_fit_worse_than_the_prior_on_held_out_levels_is_refused() -> None:
    from speedlimit.verify.fit import DeploymentFit

    fit = DeploymentFit(fitted=TRUTH, prior=TRUTH, points=[],
                        errors={"fit": {"prior": 0.1, "fitted": 0.05}, "held-out": {"prior": 0.1, "fitted": 0.2}})
    assert "worse than the prior" in fit.refusal()
    # matching a prior that prices the held-out levels exactly is not worse than it
    fit.errors["held-out"] = {"prior": 0.0, "fitted": 1e-4}
    assert fit.refusal() is None


@pytest.mark.parametrize("setup, needle", [
    (lambda p: p.mkdir(), "no summary.json"),
    (lambda p: (p.mkdir(), (p / "summary.json").write_text("{not json")), "summary"),
])
def test_bad_run_directories_are_one_line_errors(tmp_path: Path, setup, needle: str) -> None:
    path = tmp_path / "run"
    setup(path)
    result = _cli("calibrate", str(path), "--hardware", HARDWARE, "--model", MODEL)
    assert result.returncode == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_missing_requests_and_too_few_levels(tmp_path: Path) -> None:
    run = write_sweep(tmp_path / "run", levels=(1, 2))
    (run / "concurrency_2" / "requests.jsonl").unlink()
    with pytest.raises(SpeedlimitError, match="requests.jsonl"):
        sweep_levels(run)
    one = write_sweep(tmp_path / "one", levels=(4, 8))
    with pytest.raises(SpeedlimitError, match="too few"):
        fit_deployment(_points(one), _prior())


def test_directory_and_files_do_not_mix(tmp_path: Path) -> None:
    run = write_sweep(tmp_path / "run", levels=(1, 2, 4))
    result = _cli("calibrate", str(run), str(run / "summary.json"), "--hardware", HARDWARE)
    assert result.returncode == 2 and "one bench run directory" in result.stderr
    result = _cli("calibrate", str(run / "summary.json"), "--engine", "vllm")
    assert result.returncode == 2 and "--engine applies to a bench run directory" in result.stderr


def test_a_fit_worse_than_the_prior_on_held_out_levels_is_refused_by_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path / "config"))
    # the fitted levels follow one machine, the held-out ones exactly the prior's: the prior predicts them better
    prior = _prior("vllm")
    run = write_sweep(tmp_path / "run", truth_at=lambda level: prior if level in (2, 8, 32, 128) else TRUTH)
    result = _cli("calibrate", str(run), "--hardware", HARDWARE, "--engine", "vllm", "--name", "worse", env={"SPEEDLIMIT_CONFIG_DIR": str(tmp_path / "config")})
    assert result.returncode == 2, result.stderr
    assert "worse than the prior" in result.stderr


def _cli(*args: str, env: dict[str, str] | None = None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "speedlimit.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _with_workloads(run: Path, seeds) -> Path:
    """Give the sweep's levels bench's workload block: ``prompt_seed`` per level (None: a bench before it had one)."""
    sweep = SweepSummary.load(run / "summary.json")
    for point, seed in zip(sweep.points, seeds):
        workload = {"prompt_tokens": {"kind": "fixed"}, "seed": 0, "dataset": None}
        if seed is not None:
            workload["prompt_seed"] = seed
        point.endpoint = {"url": "http://synthetic/v1", "model": MODEL, "workload": workload}
    sweep.save(run / "summary.json")
    return run


def test_a_sweep_whose_levels_shared_their_prompts_is_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from speedlimit.bench.workload import level_seed

    levels = (1, 2, 4, 8)
    clean = _with_workloads(write_sweep(tmp_path / "clean", levels=levels), [level_seed(0, i) for i in range(len(levels))])
    assert "notes" not in sweep_levels(clean)[1]
    old = _with_workloads(write_sweep(tmp_path / "old", levels=levels), [None] * len(levels))
    note = sweep_levels(old)[1]["notes"][0]
    assert note.startswith("this sweep does not record which prompts each level was sent")
    same = _with_workloads(write_sweep(tmp_path / "same", levels=levels), [7, 7, 8, 9])
    assert sweep_levels(same)[1]["notes"][0].startswith("levels of this sweep share a prompt seed")
    # the calibration says so beside its figures
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path / "config"))
    result = runner.invoke(app, ["calibrate", str(old), "--hardware", HARDWARE, "--engine", "vllm", "--name", "olddeploy",
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert any(n.startswith("this sweep does not record") for n in json.loads(result.output)["notes"])


def test_a_profile_saved_before_the_step_structure_keeps_its_own_per_sequence_cost() -> None:
    """A deployment profile written before `stream_compute_overlap` existed (no such field) still charges the
    per-sequence cost it was fitted with, not the engine profile's (vLLM's cited 12.7 us), and the roofline's max."""
    from speedlimit.hardware import Hardware

    base = resolve_hardware(HARDWARE)
    saved = Hardware(**{**base.model_dump(), "key": "olddeploy", "name": "olddeploy", "bw_efficiency": 0.7,
                        "flops_efficiency": 0.4, "step_overhead_s": 1e-3, "sequence_overhead_s": 3e-3,
                        "calibrated_at": "2026-12-04T00:00:00+00:00"})
    priced = estimate(MODEL, saved, engine="vllm", batch=8)
    assert priced.sequence_overhead_s == pytest.approx(3e-3)
    assert priced.stream_compute_overlap == 1.0
