"""Estimator curves as plain data: the batch curve (throughput vs per-user speed) and the roofline.

Shared by the web calculator (`speedlimit.web`) and the PNGs of `speedlimit.report.plots`. Pure: no
I/O, no plotting. The current point always comes from `estimate()`; the batch curve evaluates the
same roofline core over an array of batch sizes in one numpy pass (tests check every point equals
`estimate(batch=b)`), because one `estimate()` call per point is too slow for a live page.

Knee of the batch curve: the batch from which every further step up raises aggregate throughput
by less than half as much (in log terms) as it raises the batch, i.e. where the throughput
elasticity d log(throughput) / d log(batch) falls below `KNEE_ELASTICITY` for good. Past it, each
doubling of the batch costs more in per-user speed than it gains in throughput. "For good" matters
for MoE models, whose elasticity dips at small batches (more experts read) and then recovers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from speedlimit.architecture import Architecture
from speedlimit.catalog import resolve_hardware, resolve_model
from speedlimit.estimator import core
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator.api import Estimate, StepModel, estimate_scenario, resolve
from speedlimit.hardware import Hardware
from speedlimit.scenario import MAX_BATCH, scenario_from

KNEE_ELASTICITY = 0.5
#: Largest batch a curve shows when the device capacity is unknown or not even batch 1 fits.
DEFAULT_CURVE_MAX_BATCH = 1024
CURVE_MAX_BATCH = 65536


def curve_batches(current_batch: int, max_batch_fits: float | None) -> list[int]:
    """~√2-spaced batch sizes from 1 to past the memory limit (and always the current batch)."""
    if max_batch_fits is None or not math.isfinite(max_batch_fits) or max_batch_fits < 1:
        upper = DEFAULT_CURVE_MAX_BATCH  # unknown capacity, or nothing fits: still show the shape
    else:
        upper = int(min(max(max_batch_fits * 1.5, 16), CURVE_MAX_BATCH))
    values = {1, int(current_batch)}
    value = 1.0
    while value <= upper:
        values.add(int(round(value)))
        value *= math.sqrt(2)
    if max_batch_fits is not None and 1 <= max_batch_fits <= CURVE_MAX_BATCH:
        values.add(int(max_batch_fits))
    return sorted(v for v in values if 1 <= v <= MAX_BATCH)


def find_batch_knee(batches: list[int], throughput_tok_s: list[float]) -> int | None:
    """The batch from which throughput elasticity stays below `KNEE_ELASTICITY` (None: not within the curve)."""
    knee = None
    for i in range(len(batches) - 1):
        b0, b1, t0, t1 = batches[i], batches[i + 1], throughput_tok_s[i], throughput_tok_s[i + 1]
        if b1 <= b0 or t0 <= 0 or t1 <= 0:
            continue
        if math.log(t1 / t0) / math.log(b1 / b0) < KNEE_ELASTICITY:
            knee = b0 if knee is None else knee
        else:
            knee = None
    return knee


def batch_curve(
    model: str | Architecture,
    hardware: str | Hardware | None = None,
    *,
    batches: list[int] | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """The current estimate plus the curve across batch sizes (``inputs``: the `Scenario` fields).

    Returns ``{"estimate": Estimate.to_dict(), "points": [{batch, decode_tok_s, itl_s,
    throughput_tok_s, memory_bytes, fits, regime}], "knee_batch": int | None, "critical_batch": ...}``.
    """
    arch = model if isinstance(model, Architecture) else resolve_model(model)
    device = hardware if hardware is None or isinstance(hardware, Hardware) else resolve_hardware(hardware)
    scenario = scenario_from(model=arch, hardware=device, **inputs)  # validates every input
    current = estimate_scenario(scenario)
    if batches is None:
        batches = curve_batches(current.batch, current.max_batch)
    else:
        for b in batches:  # same bounds as a scenario's batch
            if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH:
                raise SpeedlimitError(f"every batch must be a whole number from 1 to {MAX_BATCH:,}, got {b!r}")
        batches = sorted(set(batches))
    points = _curve_points(resolve(scenario), current, np.asarray(batches, dtype=float))
    knee = find_batch_knee([p["batch"] for p in points], [p["throughput_tok_s"] for p in points])
    return {
        "estimate": current.to_dict(),
        "points": points,
        "knee_batch": knee,
        "knee_rule": f"batch from which d log(throughput)/d log(batch) stays below {KNEE_ELASTICITY}",
        "critical_batch": current.critical_batch,
        "max_batch": current.max_batch,
    }


def _curve_points(resolved: StepModel, current: Estimate, batch: np.ndarray) -> list[dict[str, Any]]:
    cost, machine = resolved.cost, resolved.machine
    prompt, output = current.prompt, current.output
    reply = core.reply_decode(cost, machine, batch, prompt, output)
    itl = np.asarray(reply.itl_s, dtype=float)
    memory = np.asarray(core.resident_bytes(cost, machine, batch, prompt + output), dtype=float)
    fits = np.broadcast_to(core.memory_fits(cost, machine, batch, prompt + output), batch.shape)
    capacity = current.memory_capacity_bytes
    compute_bound = np.broadcast_to(reply.compute_bound, batch.shape)
    return [
        {
            "batch": int(b),
            "decode_tok_s": float(1.0 / t),
            "itl_s": float(t),
            "throughput_tok_s": float(b / t),
            "memory_bytes": float(m),
            "fits": None if capacity is None else bool(f),
            "regime": "compute" if c else "memory",
        }
        for b, t, m, f, c in zip(batch, itl, np.broadcast_to(memory, batch.shape), fits, compute_bound)
    ]


def roofline(result: dict[str, Any]) -> dict[str, Any]:
    """Roofline of one `Estimate.to_dict()` per device: peak and effective roofs, ridge points, the point.

    x: arithmetic intensity (FLOPs per byte of a decode step); y: FLOP/s per device. The point is
    the achieved rate, FLOPs per token × aggregate tokens/s ÷ devices (below the roof by the step overhead).
    """
    bw_peak = float(result["bandwidth_Bps"])
    flops_peak = result.get("flops")
    # a CPU process reaches less than the summed peak (its threads, the NUMA node holding the weights)
    bw_eff = float(result.get("reached_bandwidth_Bps") or bw_peak) * float(result["bw_efficiency"])
    flops_eff = None if flops_peak is None else float(flops_peak) * float(result["flops_efficiency"])
    intensity = float(result["arithmetic_intensity"])
    achieved = float(result["flops_per_token"]) * float(result["throughput_tok_s"]) / int(result.get("devices") or result["tp"])
    ridge_peak = None if flops_peak is None else float(flops_peak) / bw_peak
    ridge_eff = None if flops_eff is None else flops_eff / bw_eff
    ridge = ridge_peak or intensity
    x_low = 10 ** math.floor(math.log10(max(min(intensity, ridge) / 10, 1e-3)))
    x_high = 10 ** math.ceil(math.log10(max(intensity, ridge) * 10))
    xs = [float(x) for x in np.geomspace(x_low, x_high, 64)]

    def roof(bw: float, flops: float | None) -> list[float]:
        return [x * bw if flops is None else min(flops, x * bw) for x in xs]

    return {
        "intensity": xs,
        "peak_roof_flops": roof(bw_peak, None if flops_peak is None else float(flops_peak)),
        "effective_roof_flops": roof(bw_eff, flops_eff),
        "ridge_intensity": ridge_peak,
        "effective_ridge_intensity": ridge_eff,
        "point": {"intensity": intensity, "flops": achieved, "regime": result["regime"]},
        "bandwidth_Bps": bw_peak,
        "peak_flops": flops_peak,
    }
