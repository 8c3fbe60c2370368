"""The fit of `speedlimit calibrate`: measured step times -> bw_efficiency, flops_efficiency, step_overhead_s, and
the per-sequence cost where the steps ran different numbers of sequences.

Also reads its inputs (`load_calibration_inputs`: verify results, bench summaries) and builds the profile
record that `speedlimit.catalog.profiles.save_profile` stores, with the CPU layout the profile's machine has (a
verify run's: the sockets, NUMA nodes, cores and threads per core it detected and its 1-thread bandwidth,
`measured_machine`), so that `--threads` and `--numa` price it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

from pydantic import BaseModel, Field, ValidationError

from speedlimit.artifacts import RunSummary, SweepSummary, load_summary_data, read_json
from speedlimit.errors import SpeedlimitError, pydantic_message
from speedlimit.estimator import core
from speedlimit.hardware import Efficiency, Hardware
from speedlimit.verify.run import VerifyResult

# --------------------------------------------------------------------------------------------
# the fit: measured step times -> bw_efficiency, flops_efficiency, step_overhead_s
#
# Each point is priced by the estimator's one step-cost model (`core.step_time`):
#   t = max(bytes / (tp · e_bw · BW), flops / (tp · e_f · FLOPs)) + overhead + all-reduce.
# Decode steps of one sequence are memory-bound, so their times give a straight line in
# x = bytes / (tp · BW):  t - all-reduce = x / e_bw + overhead  (weighted least squares on relative error, so a
# 10 ms and a 20 ms step count alike; the context sweep spreads x because the KV cache grows). Prefill is
# compute-bound, so with the overhead fixed:  t - overhead - all-reduce = (flops / (tp · FLOPs)) / e_f.
# Where verify also timed decode steps of several sequences together (its batched series), the four values are fitted
# at once as a bench sweep's are (`_solve`): t = max(x / e_bw, y / e_f) + overhead + s · sequences + all-reduce,
# y = FLOPs / (tp · FLOPs), each point in the regime the current fit puts it in, s the per-sequence cost: on a CPU a
# further sequence's matvecs cost about their own arithmetic whether or not the step is still memory-bound. The same
# points are also fitted with the stream and the arithmetic adding, t = x / e_bw + y / e_f + ... (the project's VMs
# time llama.cpp's CPU steps so: benchmarks/README.md), and the structure that misses them less is kept
# (`stream_compute_overlap` 1 or 0, `_fit_structure`).


@dataclass(frozen=True)
class CalibrationPoint:
    """One measured step: its work as the estimator counts it (whole step, all tp devices) and its measured time."""

    kind: Literal["decode", "prefill"]
    step_bytes: float
    step_flops: float
    measured_s: float
    label: str
    source: str
    tp: int = 1
    comm_s: float = 0.0  # tensor-parallel all-reduce time of the step (known from the interconnect, not fitted)
    kernels: float = 0.0  # kernels the step launches (prices the prior's per-kernel overhead)
    # the estimate's own time for this step where the input recorded one (a verify run's "predicted" column, priced
    # with the kernel rates of the build it ran at the clock it measured): the prior it is scored against
    prior_s: float | None = None
    # the hardware ``prior_s`` was priced on, as the input names it (a bench summary's estimate block); None: the
    # machine a verify run measured
    priced_on: str | None = None
    sequences: float = 1.0  # sequences the step decodes (or prefills) together
    batched: bool = False  # one of verify's series of decode steps of 1, 2, 4... sequences at one context
    # the time of the step's attention where the build's attention kernel is priced apart (known, not fitted, as
    # comm_s): its FLOPs and KV bytes are then out of step_flops and step_bytes (`core.attention_kernel_seconds`)
    attention_s: float = 0.0
    attention_flops: float = 0.0  # what _apart took out of step_flops and step_bytes (`with_attention` puts it back)
    kv_bytes: float = 0.0

    def with_attention(self) -> CalibrationPoint:
        """This step with its attention back in the roofline's work (a fit whose profile cannot carry the kernel)."""
        return dataclasses.replace(self, step_bytes=self.step_bytes + self.kv_bytes, step_flops=self.step_flops + self.attention_flops,
                                   attention_s=0.0, attention_flops=0.0, kv_bytes=0.0)


@dataclass
class CalibrationFit:
    bw_efficiency: float
    flops_efficiency: float
    step_overhead_s: float
    bandwidth_Bps: float
    flops: float | None
    points: list[CalibrationPoint]
    before: Efficiency
    error_before: dict[str, float | None]
    error_after: dict[str, float | None]
    notes: list[str] = field(default_factory=list)
    excluded: list[CalibrationPoint] = field(default_factory=list)
    # per running sequence per step: fitted where the decode steps ran different numbers of sequences, else None
    sequence_overhead_s: float | None = None
    # 1 (max) or 0 (sum) where the joint fit chose the step's structure, else None (the roofline's max)
    stream_compute_overlap: float | None = None

    @property
    def efficiency(self) -> Efficiency:
        return Efficiency(bw_efficiency=self.bw_efficiency, flops_efficiency=self.flops_efficiency,
                          step_overhead_s=self.step_overhead_s, basis="calibrated")

    def predicted_s(self, point: CalibrationPoint, efficiency: Efficiency | None = None) -> float:
        return predicted_step_seconds(point, self.bandwidth_Bps, self.flops, efficiency or self.efficiency,
                                      self.sequence_overhead_s or 0.0,
                                      1.0 if self.stream_compute_overlap is None else self.stream_compute_overlap)

    def prior_s(self, point: CalibrationPoint) -> float:
        """The time the estimate predicted for this step before the fit: the input's own prediction where it
        recorded one, else the step model at the prior efficiencies."""
        return prior_step_seconds(point, self.bandwidth_Bps, self.flops, self.before)


def prior_efficiency(hardware: Hardware) -> Efficiency:
    """What `estimate` prices on ``hardware`` before calibration: its defaults with the default engine's per-step and
    per-kernel costs as it runs on that device (llama.cpp's CPU, Metal or CUDA backend), the prior a fit must beat."""
    from speedlimit.catalog import default_efficiency, engine_for_device, resolve_engine

    return default_efficiency(hardware, engine_for_device(resolve_engine(None), hardware))


def predicted_step_seconds(point: CalibrationPoint, bandwidth_Bps: float, flops: float | None, efficiency: Efficiency,
                           sequence_overhead_s: float = 0.0, stream_compute_overlap: float = 1.0) -> float:
    """The estimator's time for this point's step at these efficiencies, per-sequence cost and step structure (the
    same `core.step_time` estimate uses)."""
    machine = core.Machine(
        bandwidth_Bps=bandwidth_Bps * efficiency.bw_efficiency,
        flops=flops * efficiency.flops_efficiency if flops and math.isfinite(flops) else math.nan,
        step_overhead_s=efficiency.overhead_s(point.kernels),
        memory_bytes=math.nan, link_Bps=math.nan, tp=float(point.tp), sequence_overhead_s=sequence_overhead_s,
        stream_compute_overlap=stream_compute_overlap,
    )
    return float(core.step_time(point.step_bytes, point.step_flops, machine, point.comm_s, point.sequences,
                                kernel_s=point.attention_s))


def prior_step_seconds(point: CalibrationPoint, bandwidth_Bps: float, flops: float | None, prior: Efficiency) -> float:
    """The prior's time for this step: what the input recorded as predicted (`CalibrationPoint.prior_s`), else the
    step model at ``prior``."""
    if point.prior_s is not None:
        return point.prior_s
    return predicted_step_seconds(point, bandwidth_Bps, flops, prior)


def fit_errors(points: list[CalibrationPoint], bandwidth_Bps: float, flops: float | None,
               efficiency: Efficiency, *, prior: bool = False, sequence_overhead_s: float = 0.0,
               stream_compute_overlap: float = 1.0) -> dict[str, float | None]:
    """Mean absolute relative error of predicted vs measured step time, per kind and over all points (``prior``:
    of the prior's times, the inputs' own predictions where they recorded them)."""
    errors: dict[str, list[float]] = {"decode": [], "prefill": []}
    for point in points:
        predicted = (prior_step_seconds(point, bandwidth_Bps, flops, efficiency) if prior else
                     predicted_step_seconds(point, bandwidth_Bps, flops, efficiency, sequence_overhead_s,
                                            stream_compute_overlap))
        errors[point.kind].append(abs(predicted - point.measured_s) / point.measured_s)
    every = errors["decode"] + errors["prefill"]
    return {
        "decode": sum(errors["decode"]) / len(errors["decode"]) if errors["decode"] else None,
        "prefill": sum(errors["prefill"]) / len(errors["prefill"]) if errors["prefill"] else None,
        "all": sum(every) / len(every) if every else None,
    }


def _weighted_line(x: list[float], t: list[float]) -> tuple[float, float]:
    """Least squares t ≈ slope·x + intercept with weights 1/t² (relative error)."""
    w = [1.0 / ti**2 for ti in t]
    sw, sx, st = sum(w), sum(wi * xi for wi, xi in zip(w, x)), sum(wi * ti for wi, ti in zip(w, t))
    sxx = sum(wi * xi * xi for wi, xi in zip(w, x))
    sxt = sum(wi * xi * ti for wi, xi, ti in zip(w, x, t))
    det = sw * sxx - sx * sx
    slope = (sw * sxt - sx * st) / det
    return slope, (st - slope * sx) / sw


def _weighted_slope(x: list[float], t: list[float]) -> float:
    """Least squares t ≈ slope·x through the origin, weights 1/t²."""
    w = [1.0 / ti**2 for ti in t]
    return sum(wi * xi * ti for wi, xi, ti in zip(w, x, t)) / sum(wi * xi * xi for wi, xi in zip(w, x))


# the Hardware model's bound on a profile's per-sequence cost (hardware.py: at most 0.1 s per sequence per step)
MAX_SEQUENCE_OVERHEAD_S = 0.1

# A point further than this (relative) from the first fit, and 3x further than the median point, is left
# out and named: on a shared machine one disturbed run set can be 10x slow and would drag the whole fit.
OUTLIER_RELATIVE_ERROR = 0.25


def _fit_decode(decode: list[CalibrationPoint], bandwidth_Bps: float) -> tuple[float, float, list[str]]:
    """(bw_efficiency, step_overhead_s, notes) from decode points: t = (bytes / BW) / e_bw + overhead."""
    notes: list[str] = []
    x = [p.step_bytes / (p.tp * bandwidth_Bps) for p in decode]
    t = [p.measured_s - p.comm_s for p in decode]
    slope, overhead = None, 0.0
    if len(decode) >= 2 and (max(x) - min(x)) > 0.02 * max(x):
        slope, overhead = _weighted_line(x, t)
        if slope <= 0 or overhead < 0:
            notes.append("decode time did not grow with bytes read as a line with a positive overhead; "
                         "fitted with no per-step overhead")
            slope, overhead = None, 0.0
    else:
        notes.append("decode points all read about the same bytes (no context sweep): per-step overhead not "
                     "separable, fitted as 0")
    if slope is None:
        slope = _weighted_slope(x, t)
    bw_efficiency = 1.0 / slope
    if bw_efficiency > 1.0:
        notes.append(f"decode ran at {bw_efficiency:.2f}× the bandwidth figure (caches or a low bandwidth "
                     "measurement); bw_efficiency capped at 1.0")
        bw_efficiency = 1.0
        overhead = max(0.0, sum((ti - xi) / ti**2 for xi, ti in zip(x, t)) / sum(1 / ti**2 for ti in t))
    return bw_efficiency, min(overhead, 1.0), notes


def _split_outliers(points: list[CalibrationPoint], predict: Any) -> tuple[list[CalibrationPoint], list[CalibrationPoint]]:
    if len(points) < 3:
        return points, []
    errors = [abs(predict(p) - p.measured_s) / p.measured_s for p in points]
    limit = max(OUTLIER_RELATIVE_ERROR, 3 * sorted(errors)[len(errors) // 2])
    kept = [p for p, e in zip(points, errors) if e <= limit]
    return (kept, [p for p in points if p not in kept]) if len(kept) >= 2 else (points, [])


def fit_calibration(points: list[CalibrationPoint], bandwidth_Bps: float, flops: float | None,
                    before: Efficiency) -> CalibrationFit:
    """`_fit_calibration`, with measurements the step model cannot describe as one line, not a traceback."""
    try:
        return _fit_calibration(points, bandwidth_Bps, flops, before)
    except (ArithmeticError, ValueError) as error:  # a degenerate fit: 1/0, overflow, an efficiency out of (0, 1]
        message = pydantic_message(error) if isinstance(error, ValidationError) else str(error)
        raise SpeedlimitError(f"the measurements cannot be fitted ({message}); are they from one machine and model?") from None


def _fit_calibration(points: list[CalibrationPoint], bandwidth_Bps: float, flops: float | None,
                     before: Efficiency) -> CalibrationFit:
    """Fit bw_efficiency and step_overhead_s to decode points, flops_efficiency to prefill points.

    Points far off a first fit (see `OUTLIER_RELATIVE_ERROR`) are left out, refitted without, and listed
    in ``excluded`` and the notes; the errors before/after are over the points kept.
    """
    decode = [p for p in points if p.kind == "decode" and p.measured_s > 0]
    prefill = [p for p in points if p.kind == "prefill" and p.measured_s > 0]
    if not decode:
        raise SpeedlimitError("no decode measurements in the given results: pass `speedlimit verify --out FILE` results "
                              "or bench summaries made with --compare-estimate")
    if len({p.sequences for p in decode if p.batched}) > 1 and flops and math.isfinite(flops):
        return _fit_joint(decode + prefill, bandwidth_Bps, flops, before)
    # the lines below fit decode time against bytes read: the attention goes back into the roofline's work (with its
    # KV reads, the one thing that grows with the context), and the profile carries no kernel of its own
    decode, prefill = [p.with_attention() for p in decode], [p.with_attention() for p in prefill]
    bw_efficiency, overhead, notes = _fit_decode(decode, bandwidth_Bps)
    decode, excluded = _split_outliers(decode, lambda p: p.step_bytes / (p.tp * bandwidth_Bps * bw_efficiency) + overhead + p.comm_s)
    if excluded:
        bw_efficiency, overhead, notes = _fit_decode(decode, bandwidth_Bps)

    flops_efficiency = before.flops_efficiency
    if not prefill:
        notes.append(f"no prefill measurements: flops_efficiency kept at {before.flops_efficiency:g}")
    elif not flops or not math.isfinite(flops):
        notes.append("the base hardware has no FLOPs figure: flops_efficiency kept at its default")
    else:
        def fit_prefill(chosen: list[CalibrationPoint]) -> float:
            usable = [p for p in chosen if p.measured_s > overhead + p.comm_s] or chosen
            y = [p.step_flops / (p.tp * flops) for p in usable]
            return 1.0 / _weighted_slope(y, [max(p.measured_s - overhead - p.comm_s, 1e-12) for p in usable])

        flops_efficiency = fit_prefill(prefill)
        prefill, dropped = _split_outliers(prefill, lambda p: p.step_flops / (p.tp * flops * flops_efficiency) + overhead + p.comm_s)
        if dropped:
            flops_efficiency = fit_prefill(prefill)
            excluded += dropped
        if flops_efficiency > 1.0:
            notes.append(f"prefill ran at {flops_efficiency:.2f}× the FLOPs figure; flops_efficiency capped at 1.0")
            flops_efficiency = 1.0
    if excluded:
        notes.append(f"left out {len(excluded)} point(s) more than {OUTLIER_RELATIVE_ERROR:.0%} off the fit (runs disturbed "
                     "by other load?): " + ", ".join(f"{p.label} ({Path(p.source).name})" for p in excluded))
    fitted = Efficiency(bw_efficiency=bw_efficiency, flops_efficiency=flops_efficiency, step_overhead_s=overhead,
                        basis="calibrated")
    kept = decode + prefill
    return CalibrationFit(
        bw_efficiency=bw_efficiency, flops_efficiency=flops_efficiency, step_overhead_s=overhead,
        bandwidth_Bps=bandwidth_Bps, flops=flops, points=kept, before=before,
        error_before=fit_errors(kept, bandwidth_Bps, flops, before, prior=True),
        error_after=fit_errors(kept, bandwidth_Bps, flops, fitted), notes=notes, excluded=excluded,
    )


def _fit_joint(points: list[CalibrationPoint], bandwidth_Bps: float, flops: float, before: Efficiency) -> CalibrationFit:
    """All four values at once, where verify timed decode steps of several sequences (see the comment at the top):
    the deployment fit's (`_fit_regimes`) on these points; points far off (`_split_outliers`) are left out and the fit
    repeated without them."""
    prior = DeploymentParams(bw_efficiency=before.bw_efficiency, flops_efficiency=before.flops_efficiency,
                             step_overhead_s=before.step_overhead_s, sequence_overhead_s=0.0)

    def as_deployment(point: CalibrationPoint) -> DeploymentPoint:
        return DeploymentPoint(point.kind, point.label, 0.0, point.sequences, point.step_bytes / (point.tp * bandwidth_Bps),
                               point.step_flops / (point.tp * flops), point.comm_s, point.measured_s, "fit",
                               point.attention_s)

    params, notes = _fit_structure([as_deployment(p) for p in points], prior)
    kept, excluded = _split_outliers(points, lambda p: params.predict(as_deployment(p)))
    if excluded:
        params, notes = _fit_structure([as_deployment(p) for p in kept], prior)
        notes.append(f"left out {len(excluded)} point(s) more than {OUTLIER_RELATIVE_ERROR:.0%} off the fit (runs "
                     "disturbed by other load?): " + ", ".join(f"{p.label} ({Path(p.source).name})" for p in excluded))
    overhead, per_sequence = min(float(params.step_overhead_s), 1.0), min(float(params.sequence_overhead_s),
                                                                          MAX_SEQUENCE_OVERHEAD_S)
    fitted = Efficiency(bw_efficiency=float(params.bw_efficiency), flops_efficiency=float(params.flops_efficiency),
                        step_overhead_s=overhead, basis="calibrated")
    return CalibrationFit(
        bw_efficiency=fitted.bw_efficiency, flops_efficiency=fitted.flops_efficiency, step_overhead_s=overhead,
        bandwidth_Bps=bandwidth_Bps, flops=flops, points=kept, before=before,
        error_before=fit_errors(kept, bandwidth_Bps, flops, before, prior=True),
        error_after=fit_errors(kept, bandwidth_Bps, flops, fitted, sequence_overhead_s=per_sequence,
                               stream_compute_overlap=params.stream_compute_overlap),
        notes=notes, excluded=excluded, sequence_overhead_s=per_sequence,
        stream_compute_overlap=params.stream_compute_overlap,
    )


# --------------------------------------------------------------------------------------------
# reading verify results and bench summaries


# a recorded step time beyond this is no prediction (a hand-edited or corrupt file): the prior falls back to the model
LONGEST_PREDICTED_STEP_S = 365 * 24 * 3600.0


def _seconds(value: float | None) -> float | None:
    """A recorded prediction usable as a prior: a positive time under a year (a hand-edited file may hold anything)."""
    return value if value is not None and 0 < value < LONGEST_PREDICTED_STEP_S else None


def _apart(step_bytes: float, step_flops: float, row: Any) -> dict[str, float]:
    """A verify row's step work as `CalibrationPoint` fields: where verify priced the build's attention kernel apart
    (``attention_flops_per_s``), its FLOPs and the KV bytes leave the step and its time is known; else as recorded."""
    rate = row.attention_flops_per_s
    if not rate or not row.attention_flops:
        return {"step_bytes": step_bytes, "step_flops": step_flops}
    return {"step_bytes": max(step_bytes - row.kv_bytes, 0.0), "step_flops": max(step_flops - row.attention_flops, 0.0),
            "attention_s": row.attention_flops / rate, "attention_flops": row.attention_flops, "kv_bytes": row.kv_bytes}


def points_from_verify(result: VerifyResult, source: str) -> list[CalibrationPoint]:
    """Points at the run's headline thread count (the configuration the profile describes)."""
    threads = result.threads or (result.settings.threads if result.settings else None)
    kernels = result.model.kernels_per_step if result.model else 0.0
    points = []
    for row in result.decode:
        if row.threads == threads:
            predicted = _seconds(1.0 / row.tok_s_predicted if row.tok_s_predicted else None)
            points.append(CalibrationPoint("decode", measured_s=1.0 / row.tok_s,
                                           label=f"decode @ ctx {row.context_start}" + (" (base)" if row.kind == "base" else ""),
                                           source=source, kernels=kernels, prior_s=predicted,
                                           **_apart(row.bytes_per_token, row.flops_per_token, row)))
    for row in result.prefill:
        if row.threads == threads:
            predicted = _seconds(row.ttft_s_predicted)
            points.append(CalibrationPoint("prefill", measured_s=row.median_s, label=f"prefill {row.prompt_tokens} tok",
                                           source=source, kernels=kernels, prior_s=predicted,
                                           **_apart(row.step_bytes, row.step_flops, row)))
    for row in result.batched_decode:
        if row.threads == threads:
            points.append(CalibrationPoint("decode", measured_s=row.step_s,
                                           label=f"decode of {row.sequences} sequence{'s' if row.sequences > 1 else ''} "
                                           f"together @ ctx {row.context}", source=source, kernels=kernels,
                                           prior_s=_seconds(row.step_s_predicted), sequences=float(row.sequences),
                                           batched=True, **_apart(row.step_bytes, row.step_flops, row)))
    return points


def _attention_flops(result: VerifyResult) -> tuple[float, float] | None:
    """(decode, prefill) FLOP/s of the attention kernel verify priced apart at its headline thread count, or None (a
    run without fold C's attention rates for its build, or one that predates them)."""
    threads = result.threads or (result.settings.threads if result.settings else None)
    decode = next((row.attention_flops_per_s for row in result.decode if row.threads == threads
                   and row.attention_flops_per_s), None)
    prefill = next((row.attention_flops_per_s for row in result.prefill if row.threads == threads
                    and row.attention_flops_per_s), None)
    if not threads or decode is None or prefill is None:
        return None
    return decode, prefill


class PredictedStep(BaseModel):
    """The fields of an `Estimate` that price its decode step again (a bench summary's ``estimate.predicted``)."""

    batch: int = Field(ge=1)
    tp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    bytes_per_token: float = Field(gt=0)
    flops_per_token: float = Field(ge=0)
    tp_comm_s: float = Field(default=0.0, ge=0)
    kernels_per_step: float = Field(default=0.0, ge=0)
    # the estimate's own decode step (ITL): the prior calibrate scores, as it priced it (a CPU's attention kernel
    # included, which the fitted step model leaves to the fitted values)
    itl_s: float | None = Field(default=None, gt=0)


def points_from_bench(summary: RunSummary | SweepSummary,
                      source: str) -> tuple[list[CalibrationPoint], str | None, list[str]]:
    """Decode points (mean TPOT) of a bench summary that carries an ``estimate`` block; its hardware name; notes.

    TTFT under concurrent load includes queueing, so bench runs contribute no prefill points. A run replayed on
    data-parallel replicas or ranks (``dp`` > 1) is left out, with a note: its decode step is one replica's share of
    the batch, which a point (one device group stepping the whole batch) does not describe.
    """
    points, hardware, notes = [], None, []
    replicated = 0
    runs = summary.points if isinstance(summary, SweepSummary) else [summary]
    for run in runs:
        block = run.estimate
        tpot = run.tpot_s.mean
        if block is None or not block.predicted or not tpot:
            continue
        try:
            predicted = PredictedStep.model_validate(block.predicted)
        except ValidationError as error:
            raise SpeedlimitError(f"{source}: the estimate block is not an estimate ({pydantic_message(error)})") from None
        hardware = hardware or block.hardware
        if predicted.dp > 1:
            replicated += 1
            continue
        points.append(CalibrationPoint(
            "decode", predicted.bytes_per_token * predicted.batch, predicted.flops_per_token * predicted.batch,
            float(tpot), f"bench decode, batch {predicted.batch}", source, tp=predicted.tp,
            comm_s=predicted.tp_comm_s, kernels=predicted.kernels_per_step, prior_s=_seconds(predicted.itl_s),
            priced_on=block.hardware))
    if replicated:
        notes.append(f"{source}: {replicated} run(s) replayed on data-parallel replicas (dp > 1) left out: calibrate "
                     "fits one device group's decode step")
    return points, hardware, notes


def load_calibration_inputs(paths: list[Path]) -> tuple[list[CalibrationPoint], Hardware | None, str | None, list[str]]:
    """All points from ``paths``; the measured machine of the first verify result; a bench hardware name; notes."""
    points: list[CalibrationPoint] = []
    measured: Hardware | None = None
    bench_hardware: str | None = None
    notes: list[str] = []
    if not paths:
        raise SpeedlimitError("give at least one results file: `speedlimit verify --out verify.json` writes one")
    for path in paths:
        data = read_json(path, "a verify result or bench summary.json")
        if not isinstance(data, dict):
            raise SpeedlimitError(f"{path} is not a verify result or bench summary (expected a JSON object)")
        if str(data.get("schema", "")).startswith("speedlimit.verify/"):
            result = VerifyResult.parse(data, str(path))
            found = points_from_verify(result, str(path))
            if not result.complete:
                notes.append(f"{path} is an incomplete verify run: using the {len(found)} points it has")
            if measured is None and result.measured_bandwidth_Bps:
                measured, layout_notes = measured_machine(result, str(path))
                notes += layout_notes
        elif "estimate" in data or "points" in data or "itl_s" in data:
            found, hardware, bench_notes = points_from_bench(load_summary_data(data, str(path)), str(path))
            bench_hardware = bench_hardware or hardware
            notes += bench_notes
            if not found and not bench_notes:
                notes.append(f"{path}: bench summary without an estimate block (run bench with --compare-estimate): skipped")
        else:
            raise SpeedlimitError(f"{path} is neither a `speedlimit verify` result nor a bench summary.json")
        points += found
    return points, measured, bench_hardware, notes


def measured_machine(result: VerifyResult, source: str) -> tuple[Hardware, list[str]]:
    """The machine a verify run measured, as the profile's base hardware; and notes on what its layout rests on.

    verify streams arrays that one thread allocated (first touch puts every page on that thread's NUMA node) with
    all its threads, so its all-thread figure is ONE node's bandwidth as llama.cpp without --numa reaches it, and its
    1-thread figure one core's (`per_core_bandwidth_Bps`). With the layout verify detected (`CpuLayout`), every
    node is taken to stream what the measured one did: the machine's ``memory_bandwidth_Bps`` is the measured figure
    × its NUMA nodes, which no run measured (``--numa distribute`` prices it; without --numa and with --numa isolate
    the estimate stays on the measured node). Where verify could not read the layout, or predates reading it, the
    machine counts as one socket and node with as many cores as threads measured (logical CPUs where SMT is on: the
    measurement ran on them). Without a 1-thread figure (``--no-single-thread``) there is no per-core bandwidth and
    threads only scale FLOP/s. Where verify ran more threads than physical cores (SMT) and they streamed more than
    cores × the 1-thread figure, the per-core figure is raised to all-thread ÷ cores (a note says so), so llama.cpp's
    default threads are not priced below what verify measured. No socket-link figure is measured, so none bounds
    remote reads.
    """
    threads = result.settings.threads if result.settings else result.threads
    single = result.bandwidth.single_thread_Bps if result.bandwidth else None
    measured_Bps = float(result.measured_bandwidth_Bps or 0.0)
    layout, notes = result.machine.layout, []
    fields: dict[str, Any] = {}
    nodes = 1
    if layout is not None and layout.detected:
        nodes = layout.numa_nodes
        described = layout.describe()
        cores = layout.cores
        if single and threads and threads > cores and single * cores < measured_Bps:
            # more threads than cores (SMT) streamed more than the cores' 1-thread figure allows: the per-core bound
            # must not price the measured all-thread run below what it reached
            notes.append(f"{source}: {cores} cores × the 1-thread {single / 1e9:.4g} GB/s is less than the "
                         f"{measured_Bps / 1e9:.4g} GB/s all {threads} threads reached (SMT threads add bandwidth): "
                         f"per-core bandwidth taken as {measured_Bps / 1e9:.4g} / {cores} = {measured_Bps / cores / 1e9:.4g} GB/s")
            single = measured_Bps / cores
        fields = {**layout.hardware_fields(), "per_core_bandwidth_Bps": single}
    else:
        described = "one socket, one NUMA node (assumed)"
        why = "verify could not read the CPU layout" if layout is not None else "the verify result predates CPU layout detection"
        if threads:
            fields = {"sockets": 1, "numa_nodes_per_socket": 1, "cores_per_socket": int(threads), "threads_per_core": 1,
                      "per_core_bandwidth_Bps": single}
            notes.append(f"{source}: {why}, so the machine counts as one socket and one NUMA node with {threads} cores")
    basis = (f"memory_bandwidth_Bps: {measured_Bps / 1e9:.4g} GB/s measured by verify with {threads or '?'} threads on "
             "arrays one thread allocated")
    if nodes > 1:
        basis += (f", so on one NUMA node; the {nodes} nodes are each taken to stream as much "
                  f"({nodes} × {measured_Bps / 1e9:.4g} = {nodes * measured_Bps / 1e9:.4g} GB/s, not measured)")
        notes.append(f"{basis}: --numa distribute prices that extrapolation; without --numa the estimate is the measured node")
    basis += f"; layout: {described}"
    try:
        hardware = Hardware(
            key="this-machine", name=f"{result.machine.cpu or 'this machine'} (measured)",
            vendor="measured", kind="cpu", memory_bandwidth_Bps=measured_Bps * nodes,
            memory_bytes=result.machine.memory_bytes,
            flops={"fp32": result.measured_flops} if result.measured_flops else {},
            source=f"speedlimit verify ({source})", notes=basis, **fields, **_kernel_fields(result))
        attention = _attention_flops(result)
        if attention is not None and threads:
            # per busy core of this layout at the run's threads (hyperthreads add none), so that the profile prices
            # the kernel at the run's thread count as verify priced it
            from speedlimit.estimator.api import bandwidth_reach

            reach = bandwidth_reach(hardware, int(threads))
            busy = reach.core_fraction * hardware.topology.cores if reach and hardware.topology else float(threads)
            hardware = Hardware.model_validate({**hardware.model_dump(),
                                                "attention_flops_per_core": (attention[0] / busy, attention[1] / busy)})
    except ValidationError as error:
        raise SpeedlimitError(f"{source}: the measured machine is unusable ({pydantic_message(error)})") from None
    return hardware, notes


def _kernel_fields(result: VerifyResult) -> dict[str, str]:
    """The build's CPU kernel profile and the model's main GGUF tensor type, where verify named a kernel profile for
    the build and the model's file type has one (`Hardware.kernel_profile`, `Hardware.kernel_type`)."""
    from speedlimit.precision import main_tensor_type

    profile = result.engine.kernel_profile if result.engine else None
    model = result.model
    if not profile or model is None:
        return {}
    # the type the matmuls ran, as the estimate prices the file: the one most of its layers' matmul weights hold, else
    # its file type's main type
    held = max(model.matmul_types, key=model.matmul_types.__getitem__) if model.matmul_types else ""
    tensor_type = (main_tensor_type(held) if held else None) or (main_tensor_type(model.file_type) if model.file_type
                                                                 else None)
    if not tensor_type:
        return {}
    return {"kernel_profile": profile, "kernel_type": tensor_type,
            **({"kernel_mix": dict(model.matmul_types)} if model.matmul_types else {})}


#: The CPU layout fields a profile carries over from the hardware it was calibrated on.
LAYOUT_FIELDS = ("sockets", "numa_nodes_per_socket", "cores_per_socket", "threads_per_core", "memory_channels_per_socket",
                 "per_core_bandwidth_Bps", "socket_link_Bps")


def profile_record(name: str, base: Hardware, fit: CalibrationFit, sources: list[str]) -> dict[str, Any]:
    """The TOML record `save_profile` writes: the base hardware's peaks plus the fitted efficiencies."""
    return {
        "key": name,
        "name": f"{name} (calibrated on {base.name})",
        "vendor": base.vendor,
        "kind": base.kind,
        "memory_bandwidth_Bps": base.memory_bandwidth_Bps,
        "memory_bytes": base.memory_bytes,
        "interconnect_Bps": base.interconnect_Bps,
        "bw_efficiency": round(fit.bw_efficiency, 4),
        "flops_efficiency": round(fit.flops_efficiency, 4),
        "step_overhead_s": round(fit.step_overhead_s, 7),
        **({"sequence_overhead_s": round(fit.sequence_overhead_s, 9)} if fit.sequence_overhead_s is not None else {}),
        **({"stream_compute_overlap": fit.stream_compute_overlap} if fit.stream_compute_overlap is not None else {}),
        # the attention kernel the points paid apart (a verify run's, at fold C's rates): the profile's steps pay it too
        **({"attention_flops_per_core": list(base.attention_flops_per_core)}
           if base.attention_flops_per_core and any(point.attention_s for point in fit.points) else {}),
        # the build's kernel rates and the type the fitted FLOP/s is for: other types at their measured ratio
        **({"kernel_profile": base.kernel_profile, "kernel_type": base.kernel_type,
            **({"kernel_mix": dict(base.kernel_mix)} if base.kernel_mix else {})}
           if base.kernel_profile and base.kernel_type and fit.flops_efficiency else {}),
        "base_hardware": base.key,
        "source": base.source or "speedlimit calibrate",
        "calibrated_from": sources,
        "calibrated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "fit_error_before": fit.error_before["all"],
        "fit_error_after": fit.error_after["all"],
        **{field: getattr(base, field) for field in LAYOUT_FIELDS},
        "notes": base.notes or None,
        "flops": dict(base.flops),
    }


# --------------------------------------------------------------------------------------------
# calibrating a deployment from a bench sweep (issue 13): bw_efficiency, flops_efficiency, per-step and
# per-sequence cost, fitted on a fixed part of the sweep and scored on the rest
#
# Each point is a step the sweep measured, priced by the step model with a flat GEMM rate:
#   t = max(x / e_bw, y / e_f) + step_s + seq_s · n + all-reduce
# x = bytes / (tp · peak BW), y = FLOPs / (tp · peak FLOP/s), n = sequences in the step. Decode points come from the
# inter-token gaps of every completed request, split into the first and the second half of its reply (two
# contexts per level: the KV term's slope separates e_bw from the fixed cost), at n = the level's concurrency;
# the prefill point is the mean TTFT of the lowest level (one prompt alone). The fit is a weighted least squares on
# relative error, each point in the regime (memory or compute) the current fit puts it in, repeated until the
# regimes settle.

#: The split, fixed before any fit and printed with it: sweep levels in order of load, the 1st, 3rd, 5th... are
#: fitted (with the prefill point of the lowest level), the 2nd, 4th... are held out and only scored.
DEPLOYMENT_SPLIT = "levels sorted by load: the 1st, 3rd, 5th, ... (and the lowest level's TTFT) are fitted; the 2nd, 4th, ... are held out"
#: A fit that misses its own points by more than this (mean |error|) is not saved without --force.
MAX_OWN_ERROR = 0.25
#: A fit is worse than the prior on the held-out levels where it misses them by this much more (mean |error|): a
#: prior that already prices them exactly (a simulated sweep) is matched, not beaten, by a fit within rounding.
WORSE_THAN_PRIOR_MARGIN = 0.005


@dataclass(frozen=True)
class DeploymentPoint:
    kind: Literal["decode", "prefill"]
    label: str
    load: float
    sequences: float
    x_s: float  # bytes / (tp · peak bandwidth)
    y_s: float  # FLOPs / (tp · peak FLOP/s)
    comm_s: float
    measured_s: float
    fold: Literal["fit", "held-out"]
    attention_s: float = 0.0  # an attention kernel priced apart (known, not fitted: `CalibrationPoint.attention_s`)
    # the estimate's own time for this step (its engine's kernel rates, GEMM curve and attention kernel included):
    # what the prior is scored by; None: the prior's four values price it
    prior_s: float | None = None


@dataclass(frozen=True)
class DeploymentParams:
    bw_efficiency: float
    flops_efficiency: float
    step_overhead_s: float
    sequence_overhead_s: float
    stream_compute_overlap: float = 1.0  # 1: the step costs the larger of stream and arithmetic; 0: their sum

    def predict(self, point: DeploymentPoint) -> float:
        return (core.stream_compute_seconds(point.x_s / self.bw_efficiency, point.y_s / self.flops_efficiency,
                                            self.stream_compute_overlap)
                + self.step_overhead_s + self.sequence_overhead_s * point.sequences + point.comm_s + point.attention_s)


@dataclass
class DeploymentFit:
    fitted: DeploymentParams
    prior: DeploymentParams
    points: list[DeploymentPoint]
    errors: dict[str, dict[str, float | None]]  # fold -> {"prior": mean |error|, "fitted": ...}
    split: str = DEPLOYMENT_SPLIT
    notes: list[str] = field(default_factory=list)

    def prior_s(self, point: DeploymentPoint) -> float:
        return deployment_prior_seconds(point, self.prior)

    def refusal(self) -> str | None:
        """Why this fit must not be saved without --force (None: it may be)."""
        held, own = self.errors["held-out"], self.errors["fit"]["fitted"]
        if own is not None and own > MAX_OWN_ERROR:
            return (f"the fit misses its own points by {own:.0%} on average (more than {MAX_OWN_ERROR:.0%}): the step "
                    "model does not describe this deployment (check --model, --hardware, --tp, --weights)")
        if held["prior"] is not None and held["fitted"] is not None and held["fitted"] > held["prior"] + WORSE_THAN_PRIOR_MARGIN:
            return (f"the fit predicts the held-out levels worse than the prior ({held['fitted']:.0%} vs "
                    f"{held['prior']:.0%} mean error)")
        return None


@dataclass(frozen=True)
class SweepRequest:
    """One completed request of a sweep level, as bench recorded it."""

    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    itl_s: list[float]  # gaps between the reply's stream events
    start_s: float  # when it was sent, on the level's clock (bench's ``start_ns``)


@dataclass(frozen=True)
class SweepLevel:
    """One measured level of a sweep: its load, clients in flight, and the completed requests' timings."""

    load: float
    concurrency: float
    requests: list[SweepRequest]


class DecodeSteps(NamedTuple):
    """A level's inter-token gaps that were decode steps (one entry per gap, arrays), and the gaps left out."""

    sequences: Any  # int array: the sequences decoding in the gap's step
    context: Any  # float array: this reply's context in it
    gap_s: Any  # float array: the gap
    carried: int  # gaps left out: their step also carried another request's prompt


#: A decode point needs at least this many gaps (one step seen by each of its sequences counts as many): fewer are
#: the transitions as a level fills or drains, too few to price a step by.
MIN_GAPS_PER_POINT = 8


def decode_steps(level: SweepLevel, max_sequences: float = math.inf) -> DecodeSteps:
    """The level's inter-token gaps that were decode steps, each with the sequences decoding in it, and how many
    gaps were left out for carrying another request's prompt.

    The requests' timelines come from when each was sent, its TTFT and its gaps: a reply decodes from its first
    token to its last. A gap's step decoded every reply that was mid-decode at the gap's midpoint. A gap that
    overlaps another request's wait for its first token while a running slot was free (fewer than ``max_sequences``
    decoding: it was being prefilled, not queued) carried that prompt's work too: in a closed loop with long prompts
    those steps are the slow ones, and a mean over every gap prices the prompts as decode."""
    import numpy as np

    sent = np.array([r.start_s for r in level.requests], dtype=float)
    first = sent + np.array([r.ttft_s for r in level.requests], dtype=float)
    times = [first[i] + np.concatenate(([0.0], np.cumsum(np.asarray(r.itl_s, dtype=float))))
             for i, r in enumerate(level.requests)]
    last = np.array([t[-1] for t in times]) if times else np.zeros(0)
    # counts by sorted ends (every request's sent <= first <= last): decoding at m = #{first < m} - #{last <= m};
    # waiting windows (sent, first) overlapping a gap (a, b) = #{sent < b} - #{first <= a}, its own never among them
    firsts, lasts, sents = np.sort(first), np.sort(last), np.sort(sent)
    cap = max(1.0, max_sequences)
    sequences, contexts, gaps = [], [], []
    carried = 0
    for request, stamps in zip(level.requests, times):
        a, b = stamps[:-1], stamps[1:]
        middle = (a + b) / 2
        decoding = np.maximum(np.searchsorted(firsts, middle, "left") - np.searchsorted(lasts, middle, "right"), 1)
        waiting = np.searchsorted(sents, b, "left") - np.searchsorted(firsts, a, "right")
        clean = ~((decoding < cap) & (waiting > 0))
        carried += int(clean.size - clean.sum())
        # a server that packs several tokens into a stream event (more output tokens than events) ran that many
        # steps in a gap: a step is the gap over them, at the context of the gap's middle step
        per_gap = max(1.0, (request.output_tokens - 1) / len(request.itl_s)) if request.itl_s else 1.0
        sequences.append(np.minimum(decoding[clean], cap).astype(np.int64))
        contexts.append(float(request.prompt_tokens) + 1.0 + (np.flatnonzero(clean) + 0.5) * per_gap - 0.5)
        gaps.append((b - a)[clean] / per_gap)
    join = lambda parts, kind: np.concatenate(parts) if parts else np.zeros(0, dtype=kind)  # noqa: E731
    return DecodeSteps(join(sequences, np.int64), join(contexts, float), join(gaps, float), carried)


def deployment_points(levels: list[SweepLevel], cost: core.CostModel, tp: int, bandwidth_Bps: float, flops: float,
                      link_Bps: float = math.nan, max_sequences: float = math.inf,
                      priced: core.Machine | None = None, notes: list[str] | None = None) -> list[DeploymentPoint]:
    """The decode and prefill points of a sweep, each tagged with its fold of `DEPLOYMENT_SPLIT`.

    A level's decode points are its decode steps (`decode_steps`: gaps carrying another request's prompt left out,
    each gap's sequences counted from the requests' timelines, at most ``max_sequences``, the engine's cap: 1 for a
    serial server), grouped by the sequences decoding and split into the shorter and longer half of their contexts.
    ``notes`` receives how many gaps were left out.

    ``priced``: the estimate's machine for this deployment. Each point then carries the estimate's own step time as
    its prior (`DeploymentPoint.prior_s`), and where that machine prices the attention as a kernel of its own
    (`core.attention_apart`: llama.cpp's CPU flash attention at its measured rate) the point pays the kernel's known
    time and its KV bytes and attention FLOPs leave the fitted work, as verify's points do (`_apart`)."""
    machine = core.Machine(bandwidth_Bps=bandwidth_Bps, flops=flops, step_overhead_s=0.0, memory_bytes=math.nan,
                           link_Bps=link_Bps, tp=float(tp))
    apart = priced is not None and core.attention_apart(priced) is True
    ordered = sorted((lv for lv in levels if lv.requests), key=lambda lv: lv.load)
    points: list[DeploymentPoint] = []

    def point(kind: Literal["decode", "prefill"], label: str, load: float, step: core.StepBatch, n: float,
              measured: float, fold: Literal["fit", "held-out"]) -> DeploymentPoint:
        step_bytes, step_flops, attention_s = float(core.step_bytes(cost, step)), float(core.step_flops(cost, step)), 0.0
        if apart:
            step_bytes -= float(core.step_kv_bytes(cost, step))
            step_flops -= float(core.step_attention_flops(cost, step))
            attention_s = float(core.attention_kernel_seconds(cost, priced, step))
        prior_s = float(core.step_seconds(cost, priced, step)) if priced is not None else None
        return DeploymentPoint(kind, label, load, n, step_bytes / (tp * bandwidth_Bps), step_flops / (tp * flops),
                               float(core.allreduce_seconds(cost, machine, step.tokens)), measured, fold,
                               attention_s=attention_s, prior_s=prior_s if prior_s is not None and prior_s > 0 else None)

    import numpy as np

    carried = total = 0
    for index, level in enumerate(ordered):
        fold: Literal["fit", "held-out"] = "fit" if index % 2 == 0 else "held-out"
        steps = decode_steps(level, max_sequences)
        carried += steps.carried
        total += steps.carried + steps.gap_s.size
        for n in sorted(set(steps.sequences.tolist()), reverse=True):
            chosen = np.flatnonzero(steps.sequences == n)
            chosen = chosen[np.argsort(steps.context[chosen], kind="stable")]
            halves = np.array_split(chosen, 2) if chosen.size >= 2 * MIN_GAPS_PER_POINT else [chosen]
            for half in halves:
                if half.size < MIN_GAPS_PER_POINT:
                    continue
                context = float(steps.context[half].mean())
                label = f"{level.load:g}: decode of {n} sequence{'s' if n > 1 else ''} (context {context:,.0f})"
                points.append(point("decode", label, level.load, core.decode_batch(cost, float(n), context), float(n),
                                    float(steps.gap_s[half].mean()), fold))
    if carried and notes is not None:
        notes.append(f"{carried:,} of the {total:,} inter-token gaps were steps that also carried another request's "
                     "prompt (it was waiting for its first token while a running slot was free): left out of the "
                     "decode points, which the prefill point prices")
    if ordered:
        lowest = ordered[0]
        ttfts = [(r.prompt_tokens, r.ttft_s) for r in lowest.requests if r.ttft_s and r.ttft_s > 0]
        if ttfts:
            prompt = sum(p for p, _ in ttfts) / len(ttfts)
            points.append(point("prefill", f"{lowest.load:g}: prefill of {prompt:,.0f} tokens (mean TTFT)", lowest.load,
                                core.prefill_batch(cost, 1.0, prompt), 1.0, sum(t for _, t in ttfts) / len(ttfts), "fit"))
    return points


def deployment_prior_seconds(point: DeploymentPoint, prior: DeploymentParams) -> float:
    """The prior's time for ``point``: the estimate's own (`DeploymentPoint.prior_s`), else ``prior``'s values."""
    return point.prior_s if point.prior_s is not None else prior.predict(point)


def _mean_error(points: list[DeploymentPoint], predict: Callable[[DeploymentPoint], float]) -> float | None:
    """Mean |relative error| of ``predict``'s times on ``points``."""
    errors = [abs(predict(p) - p.measured_s) / p.measured_s for p in points if p.measured_s > 0]
    return sum(errors) / len(errors) if errors else None


def _solve(points: list[DeploymentPoint], memory: list[bool] | None, prior: DeploymentParams,
           notes: list[str]) -> DeploymentParams:
    """Weighted (1/t) least squares for (1/e_bw, 1/e_f, step, seq) with each point in its given regime (``memory``
    None: every point pays both, the stream and the arithmetic adding); a parameter the points cannot determine keeps
    its prior, and a negative cost is fixed at 0."""
    import numpy as np

    additive = memory is None
    rows = np.array([[p.x_s, p.y_s, 1.0, p.sequences] if additive else
                     [p.x_s if m else 0.0, 0.0 if m else p.y_s, 1.0, p.sequences]
                     for p, m in zip(points, memory or [False] * len(points))])
    target = np.array([p.measured_s - p.comm_s - p.attention_s for p in points])
    with np.errstate(all="ignore"):  # a step time of 1e-320 s (a hand-edited file) overflows its weight: said below
        weight = 1.0 / np.array([p.measured_s for p in points])
        weighted = rows * weight[:, None]
    if not (np.all(np.isfinite(weighted)) and np.all(np.isfinite(target * weight))):
        raise SpeedlimitError("the measurements cannot be fitted: a step time is too small or too large to weigh "
                              "(is the file hand-edited?)")
    fixed = {0: 1.0 / prior.bw_efficiency, 1: 1.0 / prior.flops_efficiency, 2: prior.step_overhead_s, 3: prior.sequence_overhead_s}
    free = [j for j in range(4) if np.any(rows[:, j] != 0)]
    for j in (0, 1):
        if j not in free:
            notes.append(f"no {'memory' if j == 0 else 'compute'}-bound point: "
                         f"{'bw' if j == 0 else 'flops'}_efficiency kept at the prior")
    spread = rows[:, 0][rows[:, 0] > 0]
    if 0 in free and len(spread) and (spread.max() - spread.min()) < 0.05 * spread.max():
        free.remove(0)
        notes.append("the fitted decode steps all read about the same bytes (within 5%: one batch, short replies), "
                     "so time per byte and per-step cost are not separable: bw_efficiency kept at the prior")
    while True:
        if not free:
            raise SpeedlimitError("the sweep determines none of the fitted values: give levels with different loads")
        known = [j for j in range(4) if j not in free]
        rhs = target - (rows[:, known] @ np.array([fixed[j] for j in known]) if known else 0.0)
        design = rows[:, free] * weight[:, None]
        rank = np.linalg.matrix_rank(design, tol=1e-9 * max(1.0, np.abs(design).max()))
        if rank < len(free):
            drop = 3 if 3 in free else 2  # the per-sequence cost first, then the per-step cost
            notes.append(f"the sweep cannot separate the {'per-sequence' if drop == 3 else 'per-step'} cost from the "
                         "others (too few loads or contexts): kept at the prior")
            free.remove(drop)
            continue
        solution, *_ = np.linalg.lstsq(design, rhs * weight, rcond=None)
        values = dict(zip(free, solution))
        negative = [j for j in (3, 2) if j in values and values[j] < 0]
        if negative:
            free.remove(negative[0])
            fixed[negative[0]] = 0.0
            notes.append(f"the {'per-sequence' if negative[0] == 3 else 'per-step'} cost came out negative: fixed at 0")
            continue
        bad = [j for j in (0, 1) if j in values and values[j] <= 0]
        if bad:
            free.remove(bad[0])
            notes.append(f"the measurements give a non-positive time per {'byte' if bad[0] == 0 else 'FLOP'}: "
                         f"{'bw' if bad[0] == 0 else 'flops'}_efficiency kept at the prior")
            continue
        merged = {**fixed, **values}
        return DeploymentParams(bw_efficiency=1.0 / merged[0], flops_efficiency=1.0 / merged[1],
                                step_overhead_s=merged[2], sequence_overhead_s=merged[3],
                                stream_compute_overlap=0.0 if additive else 1.0)


def _fit_regimes(points: list[DeploymentPoint], prior: DeploymentParams) -> tuple[DeploymentParams, list[str]]:
    """`_solve` with each point in the regime the current fit puts it in (starting from the prior's), repeated until
    the regimes settle; an efficiency above 1 is capped at 1. The fitted values and the notes of the last solve."""
    memory = [p.x_s / prior.bw_efficiency >= p.y_s / prior.flops_efficiency for p in points]
    for _ in range(20):
        notes: list[str] = []
        params = _solve(points, memory, prior, notes)
        regimes = [p.x_s / params.bw_efficiency >= p.y_s / params.flops_efficiency for p in points]
        if regimes == memory:
            break
        memory = regimes
    return _capped(params, notes), notes


def _capped(params: DeploymentParams, notes: list[str]) -> DeploymentParams:
    """``params`` with an efficiency above 1 (faster than the peak figure) capped at 1, and a note saying so."""
    for name in ("bw_efficiency", "flops_efficiency"):
        value = getattr(params, name)
        if value > 1.0:
            notes.append(f"{name} came out {value:.2f} (faster than the peak figure): capped at 1.0")
            params = DeploymentParams(**{**params.__dict__, name: 1.0})
    return params


#: The sum structure replaces the roofline's only where it misses the fitted points by this much less (mean |error|):
#: below it the two describe the points alike (a GPU's sweep often fits both exactly) and the roofline stays.
STRUCTURE_MARGIN = 0.01


def _fit_structure(points: list[DeploymentPoint], prior: DeploymentParams) -> tuple[DeploymentParams, list[str]]:
    """The better of two step structures on ``points``: the roofline's (`_fit_regimes`: the larger of stream and
    arithmetic) and the stream and the arithmetic adding (one `_solve` with every point paying both), each with its
    own four fitted values. The sum is kept only where it misses the points less on average by `STRUCTURE_MARGIN`;
    the notes say so with both errors. Either structure has the same four free values, so neither wins by having
    more to fit with."""
    params, notes = _fit_regimes(points, prior)
    sum_notes: list[str] = []
    try:
        summed = _capped(_solve(points, None, prior, sum_notes), sum_notes)
    except SpeedlimitError:  # the sum cannot be fitted on these points: the roofline's fit stands
        return params, notes
    max_error, sum_error = _mean_error(points, params.predict), _mean_error(points, summed.predict)
    if max_error is None or sum_error is None or not sum_error < max_error - STRUCTURE_MARGIN:
        return params, notes
    sum_notes.append(f"the stream and the arithmetic add on this machine: a step costs the weight and KV stream plus "
                     f"its multiply-accumulates ({sum_error:.0%} mean error on the fitted points, against "
                     f"{max_error:.0%} for the larger of the two), so the profile prices them added")
    return summed, sum_notes


def fit_deployment(points: list[DeploymentPoint], prior: DeploymentParams) -> DeploymentFit:
    """Fit on the points of the fit fold, score both folds with the prior and the fit (see `DEPLOYMENT_SPLIT`)."""
    fit_points = [p for p in points if p.fold == "fit" and p.measured_s > 0]
    if len({p.load for p in fit_points if p.kind == "decode"}) < 2:
        raise SpeedlimitError("the sweep has too few measured levels to fit: give a sweep of at least 3 load levels "
                              "with completed requests (e.g. bench --sweep concurrency=1,2,4,8; every other level is "
                              "held out)")
    params, notes = _fit_structure(fit_points, prior)
    held = [p for p in points if p.fold == "held-out" and p.measured_s > 0]
    if not held:
        notes.append("no held-out level (the sweep has one level): nothing to score the fit on")
    errors = {fold: {"prior": _mean_error(chosen, lambda p: deployment_prior_seconds(p, prior)),
                     "fitted": _mean_error(chosen, params.predict)}
              for fold, chosen in (("fit", fit_points), ("held-out", held))}
    return DeploymentFit(fitted=params, prior=prior, points=points, errors=errors, notes=notes)


def sweep_levels(path: Path) -> tuple[list[SweepLevel], dict[str, Any]]:
    """The levels of a bench (or simulate) run directory: a sweep's ``<parameter>_<value>/`` folders, or one run.

    Each level's completed requests come from its requests.jsonl; the load from its summary.json. Also returns what
    the summary says about the endpoint (``model`` it served, ``estimate`` hardware) for defaults.
    """
    from speedlimit.artifacts import iter_records, load_summary

    if not path.is_dir():
        raise SpeedlimitError(f"{path} is not a bench run directory")
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise SpeedlimitError(f"{path} has no summary.json: give the --out directory of a `speedlimit bench --sweep` run")
    summary = load_summary(summary_path)
    info: dict[str, Any] = {}
    runs: list[tuple[Path, RunSummary]] = []
    if isinstance(summary, SweepSummary):
        parameter = summary.sweep.parameter
        for point in summary.points:
            folder = path / f"{parameter}_{point.sweep_value:g}"
            runs.append((folder, point))
    else:
        runs.append((path, summary))
    levels = []
    for folder, run in runs:
        info.setdefault("model", (run.endpoint or {}).get("model"))
        if run.estimate is not None and run.estimate.hardware:
            info.setdefault("hardware", run.estimate.hardware)
        records_path = folder / "requests.jsonl"
        if not records_path.is_file():
            raise SpeedlimitError(f"{folder} has no requests.jsonl: the calibration needs each request's timings")
        requests = [SweepRequest(int(r.prompt_tokens), int(r.output_tokens), float(r.ttft_s), [float(g) for g in r.itl_s],
                                 r.start_ns / 1e9)
                    for r in iter_records(records_path)
                    if r.ok and r.prompt_tokens is not None and r.output_tokens and r.ttft_s is not None and r.itl_s
                    and _timeline_usable(r.start_ns / 1e9, r.ttft_s, r.itl_s)]
        load = run.sweep_value if run.sweep_value is not None else (
            run.offered_load.concurrency if run.offered_load and run.offered_load.concurrency else 1.0)
        concurrency = (run.offered_load.concurrency if run.offered_load and run.offered_load.concurrency
                       else run.mean_in_flight or 1.0)
        levels.append(SweepLevel(load=float(load), concurrency=float(concurrency), requests=requests))
    if not any(level.requests for level in levels):
        raise SpeedlimitError(f"{path}: no completed request with token counts and inter-token gaps")
    shared = shared_prompts_note([run for _, run in runs])
    if shared:
        info["notes"] = [shared]
    return levels, info


def _timeline_usable(start_s: float, ttft_s: float, itl_s: list[float]) -> bool:
    """Whether a record's timings make a timeline: finite, not negative, the whole under a year (a hand-edited or
    damaged file may hold anything; such a record is left out as an unfinished one is)."""
    times = [start_s, ttft_s, *itl_s]
    return all(math.isfinite(t) and t >= 0 for t in times) and ttft_s + sum(itl_s) < LONGEST_PREDICTED_STEP_S


def shared_prompts_note(runs: list[RunSummary]) -> str | None:
    """A note when a bench sweep's levels were sent the same synthetic prompts: bench before it drew each level's
    prompts from its own seed (no ``prompt_seed`` in the workload block), or levels that share one. A prefix-caching
    server then answered the later levels' prompts from its cache, so their TPOTs ran without the prompt work real
    traffic brings."""
    workloads = [(run.endpoint or {}).get("workload") for run in runs]
    if len(runs) < 2 or any(not isinstance(w, dict) for w in workloads) or any(w.get("dataset") for w in workloads):
        return None  # a single run, a simulated run (no endpoint), or the user's own dataset
    seeds = [w.get("prompt_seed") for w in workloads]
    if None not in seeds and len(set(seeds)) == len(seeds):
        return None
    effect = ("a server with prefix caching answered the later levels' prompts from its cache, so their decode steps "
              "ran without the prompt work of real traffic; re-measure with this bench for a clean fit")
    if None in seeds:
        return (f"this sweep does not record which prompts each level was sent, and bench before 2026-12-03 sent every "
                f"level the same ones: if it did, {effect}")
    return f"levels of this sweep share a prompt seed, so they were sent the same prompts: {effect}"


def deployment_record(name: str, base: Hardware, fit: DeploymentFit, engine: str, sources: list[str],
                      attention_flops_per_core: tuple[float, float] | None = None,
                      kernel: tuple[str, str, dict[str, float] | None] | None = None) -> dict[str, Any]:
    """The profile TOML record of a deployment fit (`save_profile` writes it; `--hardware NAME` reads it), with the
    attention kernel's (decode, prefill) FLOP/s per busy core where its points paid the kernel apart, and ``kernel``:
    (the engine profile whose CPU kernel rates priced the prior, the tensor type of the weights the sweep ran, their
    file's mix of types or None), so that other types are priced at their rates' ratio (`Hardware.kernel_type`)."""
    params = fit.fitted
    attention = attention_flops_per_core if any(point.attention_s for point in fit.points) else None
    return {
        "key": name,
        "name": f"{name} (calibrated on {base.name}, {engine})",
        "vendor": base.vendor,
        "kind": base.kind,
        "memory_bandwidth_Bps": base.memory_bandwidth_Bps,
        "memory_bytes": base.memory_bytes,
        "interconnect_Bps": base.interconnect_Bps,
        "bw_efficiency": round(params.bw_efficiency, 4),
        "flops_efficiency": round(params.flops_efficiency, 4),
        "step_overhead_s": round(params.step_overhead_s, 7),
        "sequence_overhead_s": round(params.sequence_overhead_s, 9),
        "stream_compute_overlap": params.stream_compute_overlap,
        **({"attention_flops_per_core": list(attention)} if attention else {}),
        **({"kernel_profile": kernel[0], "kernel_type": kernel[1], **({"kernel_mix": kernel[2]} if kernel[2] else {})}
           if kernel else {}),
        "base_hardware": base.key,
        "engine": engine,
        "source": base.source or "speedlimit calibrate",
        "calibrated_from": sources,
        "calibrated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "fit_split": fit.split,
        "fit_error_fit_fold": fit.errors["fit"]["fitted"],
        "fit_error_held_out": fit.errors["held-out"]["fitted"],
        "prior_error_held_out": fit.errors["held-out"]["prior"],
        **{field: getattr(base, field) for field in LAYOUT_FIELDS},
        "flops": dict(base.flops),
    }
