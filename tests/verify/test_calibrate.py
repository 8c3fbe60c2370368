"""The calibrate fit on synthetic measurements with known answers, and the profile round trip."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speedlimit.verify.fit import (
    CalibrationPoint,
    fit_calibration,
    load_calibration_inputs,
    predicted_step_seconds,
)
from speedlimit.catalog.profiles import load_profile_hardware
from speedlimit.catalog import default_efficiency, efficiency_defaults, resolve_hardware
from speedlimit.hardware import Efficiency

BANDWIDTH = 20e9
FLOPS = 100e9
DEFAULTS = Efficiency(bw_efficiency=0.6, flops_efficiency=0.5, step_overhead_s=0.0002)


def synthetic_points(bw_eff: float, flops_eff: float, overhead: float) -> list[CalibrationPoint]:
    truth = Efficiency(bw_efficiency=bw_eff, flops_efficiency=flops_eff, step_overhead_s=overhead)
    points = []
    for context in (128, 512, 1024, 2048, 4096):
        bytes_ = 100e6 + 23e3 * context  # weights + KV cache, like SmolLM2-135M
        # few FLOPs per byte, so decode stays memory-bound for every truth drawn below
        point = CalibrationPoint("decode", bytes_, 0.02e9, 0.0, f"ctx {context}", "synthetic")
        points.append(point.__class__(**{**point.__dict__, "measured_s": predicted_step_seconds(point, BANDWIDTH, FLOPS, truth)}))
    for prompt in (128, 512):
        point = CalibrationPoint("prefill", 100e6, 0.28e9 * prompt, 0.0, f"prefill {prompt}", "synthetic")
        points.append(point.__class__(**{**point.__dict__, "measured_s": predicted_step_seconds(point, BANDWIDTH, FLOPS, truth)}))
    return points


def test_fit_recovers_known_answer() -> None:
    fit = fit_calibration(synthetic_points(0.45, 0.35, 0.003), BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.bw_efficiency == pytest.approx(0.45, rel=1e-9)
    assert fit.flops_efficiency == pytest.approx(0.35, rel=1e-9)
    assert fit.step_overhead_s == pytest.approx(0.003, rel=1e-9)
    assert fit.error_after["all"] == pytest.approx(0.0, abs=1e-9)
    assert fit.error_before["decode"] > 0.2  # the defaults were far off
    assert fit.notes == []


@settings(max_examples=60, deadline=None)
@given(bw=st.floats(0.05, 1.0), flops=st.floats(0.05, 1.0), overhead=st.floats(0.0, 0.02))
def test_fit_recovers_any_truth(bw: float, flops: float, overhead: float) -> None:
    fit = fit_calibration(synthetic_points(bw, flops, overhead), BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.bw_efficiency == pytest.approx(bw, rel=1e-6)
    assert fit.step_overhead_s == pytest.approx(overhead, rel=1e-6, abs=1e-12)
    assert fit.flops_efficiency == pytest.approx(flops, rel=1e-6)
    assert fit.error_after["all"] <= fit.error_before["all"] + 1e-12


def test_noisy_fit_is_close_and_better_than_defaults() -> None:
    points = synthetic_points(0.5, 0.4, 0.002)
    noisy = [p.__class__(**{**p.__dict__, "measured_s": p.measured_s * (1.03 if i % 2 else 0.97)}) for i, p in enumerate(points)]
    fit = fit_calibration(noisy, BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.bw_efficiency == pytest.approx(0.5, rel=0.15)
    assert fit.flops_efficiency == pytest.approx(0.4, rel=0.1)
    assert fit.error_after["all"] < 0.05 < fit.error_before["all"]


def test_one_decode_size_fits_without_overhead() -> None:
    point = CalibrationPoint("decode", 100e6, 0.28e9, 100e6 / (0.5 * BANDWIDTH), "one", "synthetic")
    fit = fit_calibration([point], BANDWIDTH, None, DEFAULTS)
    assert fit.bw_efficiency == pytest.approx(0.5)
    assert fit.step_overhead_s == 0.0
    assert fit.flops_efficiency == DEFAULTS.flops_efficiency
    assert any("not separable" in note for note in fit.notes)


def test_faster_than_bandwidth_caps_at_one() -> None:
    points = [CalibrationPoint("decode", b, 1.0, b / (1.5 * BANDWIDTH), "fast", "s") for b in (100e6, 150e6)]
    fit = fit_calibration(points, BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.bw_efficiency == 1.0
    assert fit.step_overhead_s == 0.0
    assert any("capped" in note for note in fit.notes)


def verify_result(points: list[CalibrationPoint]) -> dict:
    """A minimal `speedlimit verify` result holding these points (2 threads)."""
    return {
        "schema": "speedlimit.verify/1", "complete": True, "threads": 2,
        "machine": {"cpu": "Test CPU", "cores": 2, "memory_bytes": 24e9},
        "measured_bandwidth_Bps": BANDWIDTH, "measured_flops": FLOPS,
        "decode": [{"kind": "context", "threads": 2, "context_start": i, "tok_s": 1 / p.measured_s,
                    "bytes_per_token": p.step_bytes, "flops_per_token": p.step_flops}
                   for i, p in enumerate(points) if p.kind == "decode"]
        + [{"kind": "base", "threads": 1, "context_start": 0, "tok_s": 1.0, "bytes_per_token": 1e6, "flops_per_token": 1e6}],
        "prefill": [{"threads": 2, "prompt_tokens": 128, "median_s": p.measured_s, "step_bytes": p.step_bytes,
                     "step_flops": p.step_flops} for p in points if p.kind == "prefill"],
    }


def test_reads_verify_results_at_headline_threads(tmp_path: Path) -> None:
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(verify_result(synthetic_points(0.5, 0.4, 0.002))))
    points, measured, bench_hardware, notes = load_calibration_inputs([path])
    assert len(points) == 7  # the 1-thread point is left out
    assert measured is not None and measured.memory_bandwidth_Bps == BANDWIDTH and measured.kind == "cpu"
    assert bench_hardware is None
    assert len(notes) == 1 and "predates CPU layout detection" in notes[0]  # a verify result without a layout


def test_reads_bench_summary_decode_points(tmp_path: Path) -> None:
    predicted = {"batch": 4, "tp": 2, "bytes_per_token": 5e9, "flops_per_token": 2e10}
    summary = {"sweep": {"parameter": "concurrency", "values": [4, 8]},
               "points": [{"tpot_s": {"mean": 0.02}, "estimate": {"model": "m", "hardware": "h100-sxm", "predicted": predicted}},
                          {"tpot_s": {"mean": 0.03}}]}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    points, measured, bench_hardware, _ = load_calibration_inputs([path])
    assert measured is None and bench_hardware == "h100-sxm"
    assert [(p.kind, p.step_bytes, p.tp, p.measured_s) for p in points] == [("decode", 5e9 * 4, 2, 0.02)]


def test_calibrate_saves_profile_that_estimate_uses(cli, tmp_path: Path, isolated_config: Path) -> None:
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(verify_result(synthetic_points(0.45, 0.35, 0.003))))
    done = cli(["calibrate", str(path), "--name", "testbox", "--json"])
    assert done.returncode == 0, done.stderr
    fit = json.loads(done.stdout)
    assert fit["bw_efficiency"] == pytest.approx(0.45, rel=1e-6)
    assert fit["step_overhead_s"] == pytest.approx(0.003, rel=1e-4)
    assert fit["error_after"]["all"] < 1e-4 < fit["error_before"]["all"]
    assert Path(fit["path"]) == isolated_config / "profiles" / "testbox.toml"

    hardware = load_profile_hardware("testbox")
    assert hardware is not None and hardware.memory_bandwidth_Bps == BANDWIDTH
    assert resolve_hardware("testbox") == hardware
    efficiency = default_efficiency(hardware)
    assert efficiency.bw_efficiency == pytest.approx(0.45, rel=1e-3)
    assert efficiency.flops_efficiency == pytest.approx(0.35, rel=1e-3)
    assert efficiency.step_overhead_s == pytest.approx(0.003, rel=1e-3)

    done = cli(["estimate", "--model", "smollm2-135m", "--hardware", "testbox", "--json"])
    assert done.returncode == 0, done.stderr
    estimate = json.loads(done.stdout)
    assert estimate["bw_efficiency"] == pytest.approx(0.45, rel=1e-3)
    assert estimate["step_overhead_s"] == pytest.approx(0.003, rel=1e-3)


def test_a_profile_calibrated_on_one_type_prices_another_at_their_kernel_rates_ratio(cli, tmp_path: Path,
                                                                                     isolated_config: Path) -> None:
    """A verify run names its build's kernel profile and its model's tensor type; the profile fitted one FLOP/s for
    that type (q4_1 here) and keeps both names. The calibrated type is priced as before; another type's matmuls run
    at that FLOP/s times the ratio of its kernel rate to q4_1's in the build's profile (fold C), at one token a step
    and at the prefill size."""
    from speedlimit.catalog import resolve_engine

    result = verify_result(synthetic_points(0.45, 0.35, 0.003))
    result["engine"] = {"name": "llama-cpp-python", "threads": 2, "kernel_profile": "llama-cpp-cpu-intel"}
    result["model"] = {"path": "m.gguf", "name": "m", "file_type": "q4_1"}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(result))
    assert cli(["calibrate", str(path), "--name", "typed", "--json"]).returncode == 0
    typed = load_profile_hardware("typed")
    assert (typed.kernel_profile, typed.kernel_type, typed.kernel_mix) == ("llama-cpp-cpu-intel", "q4_1", None)
    # a verify run that recorded its layers' matmul weights by type: the profile keeps them, to count type by type
    result["model"]["matmul_types"] = {"q4_1": 1.0e8, "q8_0": 3.0e7}
    path.write_text(json.dumps(result))
    assert cli(["calibrate", str(path), "--name", "mixed", "--json"]).returncode == 0
    assert load_profile_hardware("mixed").kernel_mix == {"q4_1": 1.0e8, "q8_0": 3.0e7}
    rates = resolve_engine("llama-cpp-cpu-intel").kernel_rates.value
    mixed_prefill = 1.3e8 / (1.0e8 / rates["q4_1"][1] + 3.0e7 / rates["q8_0"][1])
    carried = json.loads(cli(["estimate", "-m", "llama-3.1-8b", "--hardware", "mixed", "--weights", "q4_0", "--json"]).stdout)
    assert carried["calibrated_kernel_factors"][1] == pytest.approx(rates["q4_0"][1] / mixed_prefill)
    del result["engine"]  # a run that named no kernel profile: one flat FLOP/s for every type, as before
    path.write_text(json.dumps(result))
    assert cli(["calibrate", str(path), "--name", "flat", "--json"]).returncode == 0
    assert load_profile_hardware("flat").kernel_profile is None

    def priced(hardware: str, weights: str, prompt: int) -> dict:
        done = cli(["estimate", "-m", "llama-3.1-8b", "--hardware", hardware, "--weights", weights, "--prompt",
                    str(prompt), "--output", "2", "--json"])
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert priced("typed", "q4_1", 600)["ttft_s"] == priced("flat", "q4_1", 600)["ttft_s"]
    rates = resolve_engine("llama-cpp-cpu-intel").kernel_rates.value
    q4_1, q4_0 = priced("typed", "q4_1", 600), priced("typed", "q4_0", 600)
    assert "q4_0 matmuls at the calibrated q4_1 FLOP/s" in q4_0["efficiency_basis"]
    # a 600-token prefill of an 8B model on a 100 GFLOP/s machine: its matmuls dwarf the rest
    assert q4_1["ttft_s"] / q4_0["ttft_s"] == pytest.approx(rates["q4_0"][1] / rates["q4_1"][1], rel=0.02)
    assert priced("flat", "q4_0", 600)["ttft_s"] == pytest.approx(q4_1["ttft_s"], rel=0.02)  # flat: one rate


def test_profile_keeps_the_measured_one_thread_and_all_thread_bandwidth(cli, tmp_path: Path, isolated_config: Path) -> None:
    result = verify_result(synthetic_points(0.45, 0.35, 0.003))
    result["bandwidth"] = {"single_thread_Bps": 0.6 * BANDWIDTH}  # 1 thread streams 60% of what 2 do
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(result))
    _, measured, _, _ = load_calibration_inputs([path])
    assert (measured.cores_per_socket, measured.sockets, measured.per_core_bandwidth_Bps) == (2, 1, 0.6 * BANDWIDTH)
    done = cli(["calibrate", str(path), "--name", "threadbox", "--json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["bw_efficiency"] == pytest.approx(0.45, rel=1e-6)  # fitted on the 2-thread figure
    hardware = load_profile_hardware("threadbox")
    assert (hardware.cores_per_socket, hardware.per_core_bandwidth_Bps) == (2, 0.6 * BANDWIDTH)

    default = json.loads(cli(["estimate", "--model", "smollm2-135m", "--hardware", "threadbox", "--json"]).stdout)
    one = json.loads(cli(["estimate", "--model", "smollm2-135m", "--hardware", "threadbox", "--threads", "1",
                          "--json"]).stdout)
    assert (default["threads"], default["reached_bandwidth_Bps"]) == (2, BANDWIDTH)
    assert (one["threads"], one["reached_bandwidth_Bps"]) == (1, 0.6 * BANDWIDTH)
    assert one["decode_tok_s"] < default["decode_tok_s"]


def test_calibrate_table_shows_before_and_after(cli, tmp_path: Path) -> None:
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(verify_result(synthetic_points(0.45, 0.35, 0.003))))
    done = cli(["calibrate", str(path)])
    assert done.returncode == 0, done.stderr
    assert "mean |error| all" in done.stdout and "profile saved to" in done.stdout
    assert "local.toml" in done.stdout.replace("\n", "")
    bw_row = next(line for line in done.stdout.splitlines() if "bw_efficiency" in line)
    cpu_default = efficiency_defaults()["cpu"]["bw_efficiency"]  # the kind's cited default: the "before" column
    assert f"{cpu_default:.3f}" in bw_row and "0.450" in bw_row  # default, fitted


def test_disturbed_point_is_left_out() -> None:
    points = synthetic_points(0.4, 0.5, 0.002)
    spoiled = [p.__class__(**{**p.__dict__, "measured_s": p.measured_s * (12 if p.label == "ctx 4096" else 1)}) for p in points]
    fit = fit_calibration(spoiled, BANDWIDTH, FLOPS, DEFAULTS)
    assert [p.label for p in fit.excluded] == ["ctx 4096"]
    assert fit.bw_efficiency == pytest.approx(0.4, rel=1e-6)
    assert fit.step_overhead_s == pytest.approx(0.002, rel=1e-6)
    assert any("left out 1 point" in note for note in fit.notes)


def with_predictions(result: dict, decode_s: float, prefill_s: float) -> dict:
    """The verify result with its own "predicted" column filled in, as verify writes it."""
    for row in result["decode"]:
        row["tok_s_predicted"] = 1.0 / decode_s
    for row in result["prefill"]:
        row["ttft_s_predicted"] = prefill_s
    return result


def test_the_prior_of_a_verify_result_is_its_own_predicted_column(tmp_path: Path) -> None:
    points = synthetic_points(0.45, 0.35, 0.003)
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(with_predictions(verify_result(points), decode_s=1e-3, prefill_s=0.5)))
    read, _, _, _ = load_calibration_inputs([path])
    assert [p.prior_s for p in read if p.kind == "decode"] == pytest.approx([1e-3] * 5)
    assert [p.prior_s for p in read if p.kind == "prefill"] == pytest.approx([0.5] * 2)
    fit = fit_calibration(read, BANDWIDTH, FLOPS, DEFAULTS)
    measured = {p.label: p.measured_s for p in read}
    expected = sum(abs(p.prior_s - measured[p.label]) / measured[p.label] for p in read if p.kind == "decode") / 5
    assert fit.error_before["decode"] == pytest.approx(expected, rel=1e-12)
    assert all(fit.prior_s(p) == p.prior_s for p in read)
    # a point without a recorded prediction is priced at the prior efficiencies, as before
    bare = CalibrationPoint("decode", 100e6, 1.0, 0.01, "bare", "s")
    assert fit.prior_s(bare) == pytest.approx(predicted_step_seconds(bare, BANDWIDTH, FLOPS, DEFAULTS))


def test_calibrate_scores_verify_results_against_what_verify_predicted(cli, tmp_path: Path, isolated_config: Path) -> None:
    points = synthetic_points(0.45, 0.35, 0.003)
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(with_predictions(verify_result(points), decode_s=1e-6, prefill_s=1e-6)))
    done = cli(["calibrate", str(path), "--name", "ownprior", "--json"])
    assert done.returncode == 0, done.stderr
    fit = json.loads(done.stdout)
    assert fit["error_before"]["all"] == pytest.approx(1.0, abs=1e-3)  # verify predicted ~0 s for every step
    assert any("as verify recorded them" in note for note in fit["notes"])
    # against another machine, verify's own predictions are not the prior: the catalog machine's defaults are
    other = cli(["calibrate", str(path), "--name", "other", "--hardware", "amd-epyc-9654", "--json", "--force"])
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["error_before"]["all"] != pytest.approx(1.0, abs=1e-3)
    assert not any("as verify recorded them" in note for note in json.loads(other.stdout)["notes"])


def test_a_fit_that_misses_the_measurements_it_came_from_is_not_saved(cli, tmp_path: Path,
                                                                       isolated_config: Path) -> None:
    """A verify run disturbed by other load (decode steps 5-30x slower, unevenly) fits badly: the fit is
    printed, nothing is saved and the exit code is 2, unless --force."""
    points = synthetic_points(0.45, 0.35, 0.003)
    slowdown = iter((6.0, 5.0, 30.0, 20.0, 8.0))  # as a 2-core machine's decode steps with one core taken
    disturbed = [p.__class__(**{**p.__dict__, "measured_s": p.measured_s * next(slowdown)}) if p.kind == "decode"
                 else p for p in points]
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(verify_result(disturbed)))
    refused = cli(["calibrate", str(path), "--name", "disturbed"])
    assert refused.returncode == 2 and "misses its own measurements" in refused.stderr and "--force" in refused.stderr
    assert "bw_efficiency" in refused.stdout  # the fit is still shown
    assert not (isolated_config / "profiles" / "disturbed.toml").exists()
    forced = cli(["calibrate", str(path), "--name", "disturbed", "--force", "--json"])
    assert forced.returncode == 0 and json.loads(forced.stdout)["saved"] is True


# --- verify's batched series: decode steps of several sequences together -> the per-sequence cost -------------------


def batched_points(bw_eff: float, flops_eff: float, overhead: float, per_sequence: float,
                   overlap: float = 1.0) -> list[CalibrationPoint]:
    """`synthetic_points` priced with a per-sequence cost, plus verify's series of 1, 2, 4 and 8 sequences decoding
    together at context 128 (SmolLM2-135M's work per sequence: the step turns compute-bound for slow compute);
    ``overlap`` 0: the truth's stream and arithmetic add."""
    truth = Efficiency(bw_efficiency=bw_eff, flops_efficiency=flops_eff, step_overhead_s=overhead)
    single = synthetic_points(bw_eff, flops_eff, overhead)
    series = [CalibrationPoint("decode", 100e6 + 23e3 * 128 * n, 0.28e9 * n, 0.0, f"{n} sequences", "synthetic",
                               sequences=float(n), batched=True) for n in (1, 2, 4, 8)]
    return [dataclasses.replace(p, measured_s=predicted_step_seconds(p, BANDWIDTH, FLOPS, truth, per_sequence, overlap))
            for p in single + series]


@pytest.mark.parametrize(("bw", "flops", "overhead", "per_sequence"),
                         [(0.45, 0.35, 0.003, 0.002), (0.9, 0.05, 0.0, 0.004), (0.2, 0.8, 0.001, 0.0005)])
def test_a_batched_series_gives_the_per_sequence_cost(bw, flops, overhead, per_sequence) -> None:
    fit = fit_calibration(batched_points(bw, flops, overhead, per_sequence), BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.sequence_overhead_s == pytest.approx(per_sequence, rel=1e-6)
    assert fit.bw_efficiency == pytest.approx(bw, rel=1e-6)
    assert fit.flops_efficiency == pytest.approx(flops, rel=1e-6)
    assert fit.step_overhead_s == pytest.approx(overhead, rel=1e-6, abs=1e-12)
    assert fit.error_after["all"] == pytest.approx(0.0, abs=1e-9)
    # every point, the 8-sequence step included, is priced as estimate prices it: the cost once per sequence
    eight = next(p for p in fit.points if p.sequences == 8)
    assert fit.predicted_s(eight) == pytest.approx(eight.measured_s, rel=1e-9)


    assert fit.stream_compute_overlap == 1.0  # the roofline's truth keeps the roofline's structure


@pytest.mark.parametrize(("bw", "flops", "overhead", "per_sequence"),
                         [(0.45, 0.35, 0.003, 0.002), (0.2, 0.8, 0.001, 0.0005), (0.3, 0.15, 0.0, 0.001)])
def test_a_machine_whose_stream_and_arithmetic_add_is_fitted_as_such(bw, flops, overhead, per_sequence) -> None:
    """A CPU that streams the weights and then multiplies (the project's VMs): the sum structure recovers the truth,
    where the roofline's max cannot."""
    points = batched_points(bw, flops, overhead, per_sequence, overlap=0.0)
    fit = fit_calibration(points, BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.stream_compute_overlap == 0.0
    assert fit.bw_efficiency == pytest.approx(bw, rel=1e-6)
    assert fit.flops_efficiency == pytest.approx(flops, rel=1e-6)
    assert fit.step_overhead_s == pytest.approx(overhead, rel=1e-6, abs=1e-12)
    assert fit.sequence_overhead_s == pytest.approx(per_sequence, rel=1e-6, abs=1e-12)
    assert fit.error_after["all"] == pytest.approx(0.0, abs=1e-9)
    assert any("add on this machine" in note for note in fit.notes)
    for point in fit.points:  # priced as estimate prices it: the stream plus the arithmetic
        assert fit.predicted_s(point) == pytest.approx(point.measured_s, rel=1e-9)


def test_where_one_term_dwarfs_the_other_the_roofline_stays() -> None:
    """Arithmetic 20 times slower than the stream: a sum and a max differ by a few tenths of a percent, under
    `STRUCTURE_MARGIN`, so the prior's structure stays and prices the points within that margin."""
    from speedlimit.verify.fit import STRUCTURE_MARGIN

    fit = fit_calibration(batched_points(0.9, 0.05, 0.0, 0.004, overlap=0.0), BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.stream_compute_overlap == 1.0
    assert fit.error_after["all"] < STRUCTURE_MARGIN


def test_without_a_batched_series_no_per_sequence_cost_is_fitted() -> None:
    points = synthetic_points(0.45, 0.35, 0.003)
    fit = fit_calibration(points, BANDWIDTH, FLOPS, DEFAULTS)
    assert fit.sequence_overhead_s is None
    # bench summaries' decode points run batches too, but are no series at one context: the old fit stands
    bench = [dataclasses.replace(p, sequences=4.0) for p in points]
    assert fit_calibration(bench, BANDWIDTH, FLOPS, DEFAULTS).sequence_overhead_s is None


def test_reads_the_batched_series_of_a_verify_result(tmp_path: Path) -> None:
    result = verify_result(synthetic_points(0.5, 0.4, 0.002))
    result["batched_decode"] = [
        {"threads": 2, "sequences": n, "context": 128, "step_s": 0.01 * n, "step_s_predicted": 0.004 * n,
         "step_bytes": 1e8, "step_flops": 3e8 * n} for n in (1, 2, 4)
    ] + [{"threads": 1, "sequences": 2, "context": 128, "step_s": 0.5, "step_bytes": 1e8, "step_flops": 1e8}]
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(result))
    points, _, _, _ = load_calibration_inputs([path])
    series = [p for p in points if p.batched]
    assert [(p.sequences, p.measured_s, p.prior_s) for p in series] == [
        (1.0, 0.01, 0.004), (2.0, 0.02, 0.008), (4.0, 0.04, 0.016)]  # the 1-thread step is another machine's
    assert all(p.kind == "decode" and "together" in p.label for p in series)


def _batched_verify_file(tmp_path: Path, points: list[CalibrationPoint]) -> Path:
    """A verify result holding ``points``: the context sweep at its headline threads and the batched series."""
    result = verify_result(points)
    result["batched_decode"] = [{"threads": 2, "sequences": int(p.sequences), "context": 128, "step_s": p.measured_s,
                                 "step_bytes": p.step_bytes, "step_flops": p.step_flops} for p in points if p.batched]
    result["decode"] = [d for d in result["decode"] if d["threads"] == 1 or d["context_start"] < 5]  # the sweep only
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(result))
    return path


def test_the_profile_keeps_the_per_sequence_cost_and_estimate_charges_it(cli, tmp_path: Path,
                                                                        isolated_config: Path) -> None:
    path = _batched_verify_file(tmp_path, batched_points(0.45, 0.35, 0.003, 0.002))
    done = cli(["calibrate", str(path), "--name", "seqbox", "--json"])
    assert done.returncode == 0, done.stderr
    fit = json.loads(done.stdout)
    assert fit["sequence_overhead_s"] == pytest.approx(0.002, rel=1e-4)
    hardware = load_profile_hardware("seqbox")
    assert hardware is not None and hardware.sequence_overhead_s == pytest.approx(0.002, rel=1e-4)
    one, four = (json.loads(cli(["estimate", "--model", "smollm2-135m", "--hardware", "seqbox", "--batch", str(b),
                                 "--json"]).stdout) for b in (1, 4))
    # four sequences pay the per-sequence cost three more times than one (both steps memory-bound at this truth)
    assert four["itl_s"] - one["itl_s"] >= 3 * 0.002 * 0.999
    text = cli(["estimate", "--model", "smollm2-135m", "--hardware", "seqbox", "--batch", "4"])
    assert text.returncode == 0 and "2.00 ms per sequence" in " ".join(text.stdout.split()), text.stdout
    table = cli(["calibrate", str(path), "--name", "seqbox2"])
    assert table.returncode == 0 and "sequence_overhead_s" in table.stdout and "2000.0 us" in table.stdout
    assert "larger of" in table.stdout and fit["stream_compute_overlap"] == 1.0


def test_the_profile_keeps_a_summed_step_and_estimate_prices_it(cli, tmp_path: Path, isolated_config: Path) -> None:
    path = _batched_verify_file(tmp_path, batched_points(0.45, 0.35, 0.003, 0.002, overlap=0.0))
    done = cli(["calibrate", str(path), "--name", "sumbox", "--json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stream_compute_overlap"] == 0.0
    hardware = load_profile_hardware("sumbox")
    assert hardware is not None and hardware.stream_compute_overlap == 0.0
    priced = json.loads(cli(["estimate", "--model", "smollm2-135m", "--hardware", "sumbox", "--json"]).stdout)
    assert priced["stream_compute_overlap"] == 0.0
    # the decode step is its stream plus its arithmetic plus both overheads, not the larger of the first two
    memory_s = priced["bytes_per_token"] / (hardware.memory_bandwidth_Bps * hardware.bw_efficiency)
    compute_s = priced["flops_per_token"] / (priced["flops"] * hardware.flops_efficiency)
    assert priced["itl_s"] == pytest.approx(memory_s + compute_s + 0.003 + 0.002, rel=1e-3)
    grid = json.loads(cli(["sweep", "-m", "smollm2-135m", "-H", "sumbox", "--batch", "1,4", "--context", "512",
                           "--output", "256", "--format", "json"]).stdout)
    assert grid[0]["itl_s"] == pytest.approx(priced["itl_s"], rel=1e-9)  # sweep prices the profile's sum as well
    text = cli(["estimate", "--model", "smollm2-135m", "--hardware", "sumbox"])
    assert text.returncode == 0 and "the stream and the arithmetic add (calibrated)" in " ".join(text.stdout.split())
    table = cli(["calibrate", str(path), "--name", "sumbox2"])
    assert table.returncode == 0 and "added" in table.stdout and "add on this machine" in " ".join(table.stdout.split())


@pytest.mark.filterwarnings("error")  # no numpy overflow warning on the way: the one line below is all the user sees
def test_a_batched_step_too_small_to_weigh_is_one_error() -> None:
    from speedlimit.errors import SpeedlimitError

    points = batched_points(0.45, 0.35, 0.003, 0.002)
    points[-2] = dataclasses.replace(points[-2], measured_s=1e-320)
    with pytest.raises(SpeedlimitError, match="too small or too large to weigh"):
        fit_calibration(points, BANDWIDTH, FLOPS, DEFAULTS)


# --- verify rows that priced llama.cpp's CPU attention kernel apart (fold C amendment 9) ----------------------------

ATTENTION_FLOPS_PER_S = (5e9, 4e10)  # the kernel's decode / prefill FLOP/s at the run's 2 threads
ATTENTION_FLOPS_PER_CONTEXT = 2 * 270 * 128  # FLOPs per decoded token per cached token (SmolLM2-135M's shape)


def _attention_verify_file(tmp_path: Path, truth: Efficiency, per_sequence: float) -> Path:
    """A verify result whose every row carries its attention FLOPs, KV bytes and the kernel's rate, timed as a machine
    whose steps are the roofline over the rest plus the kernel's time."""
    def timed(kind: str, bytes_: float, flops: float, attention: float, kv: float, sequences: float = 1.0) -> dict:
        rate = ATTENTION_FLOPS_PER_S[kind == "prefill"]
        point = CalibrationPoint(kind, bytes_ - kv, flops - attention, 0.0, "", "synthetic", sequences=sequences,
                                 attention_s=attention / rate)
        return {"seconds": predicted_step_seconds(point, BANDWIDTH, FLOPS, truth, per_sequence), "attention_flops": attention,
                "kv_bytes": kv, "attention_flops_per_s": rate}

    decode, batched = [], []
    for context in (128, 512, 1024, 2048, 4096):
        attention, kv = ATTENTION_FLOPS_PER_CONTEXT * context, 23e3 * context
        row = timed("decode", 100e6 + kv, 0.02e9 + attention, attention, kv)
        decode.append({"kind": "context", "threads": 2, "context_start": context, "tok_s": 1 / row.pop("seconds"),
                       "bytes_per_token": 100e6 + kv, "flops_per_token": 0.02e9 + attention, **row})
    for n in (1, 2, 4, 8):
        attention, kv = ATTENTION_FLOPS_PER_CONTEXT * 128 * n, 23e3 * 128 * n
        row = timed("decode", 100e6 + kv, 0.28e9 * n + attention, attention, kv, float(n))
        batched.append({"threads": 2, "sequences": n, "context": 128, "step_s": row.pop("seconds"),
                        "step_bytes": 100e6 + kv, "step_flops": 0.28e9 * n + attention, **row})
    attention, kv = 2 * 270 * 128 * (128 * 129 / 2), 23e3 * 128
    row = timed("prefill", 100e6 + kv, 0.28e9 * 128 + attention, attention, kv)
    prefill = [{"threads": 2, "prompt_tokens": 128, "median_s": row.pop("seconds"), "step_bytes": 100e6 + kv,
                "step_flops": 0.28e9 * 128 + attention, **row}]
    result = {"schema": "speedlimit.verify/1", "complete": True, "threads": 2,
              "machine": {"cpu": "Test CPU", "cores": 2, "memory_bytes": 24e9},
              "measured_bandwidth_Bps": BANDWIDTH, "measured_flops": FLOPS,
              "decode": decode, "prefill": prefill, "batched_decode": batched}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(result))
    return path


def test_an_attention_kernel_priced_apart_is_fitted_around_and_kept_by_the_profile(cli, tmp_path: Path,
                                                                                    isolated_config: Path) -> None:
    """calibrate takes the kernel's FLOPs and KV bytes out of each point's fitted work and adds its known time, so the
    rest of the truth comes back exactly (the bandwidth efficiency stays the prior's: with the KV cache out, every
    decode step streams the same bytes); the profile keeps the kernel's rate per busy core and estimate charges it."""
    truth = Efficiency(bw_efficiency=DEFAULTS.bw_efficiency, flops_efficiency=0.35, step_overhead_s=0.003)
    path = _attention_verify_file(tmp_path, truth, 0.002)
    points, measured, _, _ = load_calibration_inputs([path])
    assert measured is not None and measured.attention_flops_per_core == (2.5e9, 2e10)
    deep = next(p for p in points if p.label == "decode @ ctx 4096")
    assert deep.step_bytes == pytest.approx(100e6) and deep.attention_s == pytest.approx(
        ATTENTION_FLOPS_PER_CONTEXT * 4096 / 5e9)
    fit = fit_calibration(points, BANDWIDTH, FLOPS, DEFAULTS)
    assert (fit.flops_efficiency, fit.step_overhead_s, fit.sequence_overhead_s) == (
        pytest.approx(0.35, rel=1e-6), pytest.approx(0.003, rel=1e-6), pytest.approx(0.002, rel=1e-6))
    assert fit.error_after["all"] == pytest.approx(0.0, abs=1e-9)
    done = cli(["calibrate", str(path), "--name", "attnbox", "--json"])
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["attention_flops_per_core"] == [2.5e9, 2e10]
    assert any(note.startswith("attention: llama.cpp's CPU attention kernel priced apart") and "decode @ ctx 4096" in note
               for note in said["notes"])
    hardware = load_profile_hardware("attnbox")
    assert hardware is not None and hardware.attention_flops_per_core == (2.5e9, 2e10)
    short, long = (json.loads(cli(["estimate", "--model", "smollm2-135m", "--hardware", "attnbox", "--prompt", str(p),
                                   "--output", "2", "--json"]).stdout) for p in (127, 4095))
    # the profile's machine has 2 cores, both busy: 5 GFLOP/s for a decode token's attention, as verify priced it
    assert long["attention_kernel_s"] > short["attention_kernel_s"] > 0
    assert "attention: llama.cpp's CPU attention kernel as calibrated" in long["efficiency_basis"]
    text = cli(["estimate", "--model", "smollm2-135m", "--hardware", "attnbox", "--prompt", "4095"])
    assert text.returncode == 0 and "attention at its measured kernel rate" in " ".join(text.stdout.split())
    assert long["itl_s"] - short["itl_s"] == pytest.approx(long["attention_kernel_s"] - short["attention_kernel_s"], rel=1e-6)
    # the same run fitted for another machine's profile (--hardware) puts attention back in the roofline
    other = cli(["calibrate", str(path), "--name", "attnother", "--hardware", "amd-ryzen-9-7950x", "--json", "--force"])
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["attention_flops_per_core"] is None
    assert load_profile_hardware("attnother").attention_flops_per_core is None


def test_without_a_batched_series_the_attention_goes_back_into_the_line(cli, tmp_path: Path, isolated_config: Path) -> None:
    """The fit without verify's batched series draws decode time against bytes read: a run whose rows priced the
    attention apart is fitted as the same run without those fields (the KV bytes back in, the only thing that grows
    with the context), and its profile carries no attention kernel."""
    truth = Efficiency(bw_efficiency=DEFAULTS.bw_efficiency, flops_efficiency=0.35, step_overhead_s=0.003)
    path = _attention_verify_file(tmp_path, truth, 0.0)
    result = json.loads(path.read_text())
    result["batched_decode"] = []
    path.write_text(json.dumps(result))
    plain = tmp_path / "plain.json"
    for name in ("decode", "prefill"):
        for row in result[name]:
            for field in ("attention_flops", "kv_bytes", "attention_flops_per_s"):
                del row[field]
    plain.write_text(json.dumps(result))
    fits = [fit_calibration(load_calibration_inputs([p])[0], BANDWIDTH, FLOPS, DEFAULTS) for p in (path, plain)]
    assert (fits[0].bw_efficiency, fits[0].flops_efficiency, fits[0].step_overhead_s) == (
        fits[1].bw_efficiency, fits[1].flops_efficiency, fits[1].step_overhead_s)
    assert fits[0].error_after == fits[1].error_after
    done = cli(["calibrate", str(path), "--name", "attnline", "--json", "--force"])
    assert done.returncode == 0, done.stderr
    assert load_profile_hardware("attnline").attention_flops_per_core is None


def test_the_kernel_is_kept_per_busy_core_of_the_machine_verify_detected(cli, tmp_path: Path, isolated_config: Path) -> None:
    """On a machine with two threads per core verify runs a thread on every logical CPU (4 here on 2 cores) and prices
    the kernel for them; the profile keeps it per physical core busy at those threads, so that its estimate at the
    same threads charges the kernel as verify did (hyperthreads add no cores)."""
    truth = Efficiency(bw_efficiency=DEFAULTS.bw_efficiency, flops_efficiency=0.35, step_overhead_s=0.003)
    path = _attention_verify_file(tmp_path, truth, 0.002)
    result = json.loads(path.read_text())
    result["threads"] = 4
    for name in ("decode", "prefill", "batched_decode"):
        for row in result[name]:
            row["threads"] = 4
    result["machine"]["layout"] = {"sockets": 1, "numa_nodes_per_socket": 1, "cores_per_socket": 2,
                                   "threads_per_core": 2, "detected": True, "source": "test"}
    path.write_text(json.dumps(result))
    _, measured, _, _ = load_calibration_inputs([path])
    assert measured is not None and measured.topology.cores == 2
    assert measured.attention_flops_per_core == (2.5e9, 2e10)  # 5 / 40 GFLOP/s over the 2 cores 4 threads keep busy
    done = cli(["calibrate", str(path), "--name", "smtbox", "--json"])
    assert done.returncode == 0, done.stderr
    priced = json.loads(cli(["estimate", "--model", "smollm2-135m", "--hardware", "smtbox", "--threads", "4",
                             "--prompt", "4095", "--output", "2", "--json"]).stdout)
    from speedlimit.catalog import resolve_model
    context_flops = resolve_model("smollm2-135m").attn_flops_per_ctx_global
    assert priced["attention_kernel_s"] == pytest.approx(context_flops * 4096 / 5e9, rel=1e-3)
