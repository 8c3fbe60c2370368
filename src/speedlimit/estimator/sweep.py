"""Sweeps: evaluate a grid of model × hardware × weights × batch × context in one vectorized pass.

Each axis becomes one dimension of a numpy broadcast, so the roofline core runs once over the whole
grid (no Python loop per configuration). `sweep_grid` returns flat columns ready for CSV/JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speedlimit.architecture import Architecture
from speedlimit.catalog import default_efficiency, resolve_hardware, resolve_model
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.estimator.api import MAX_BATCH, MAX_TOKENS, MAX_TP, cost_model, ideal_cost_model, machine_for
from speedlimit.hardware import Hardware
from speedlimit.precision import parse_precision

SWEEP_COLUMNS = (
    "model",
    "hardware",
    "weights",
    "batch",
    "context",
    "decode_tok_s",
    "itl_s",
    "ttft_s",
    "throughput_tok_s",
    "bytes_per_token",
    "memory_bytes",
    "fits",
    "regime",
)


@dataclass(frozen=True)
class SweepResult:
    """Flat columns, one row per configuration, in `SWEEP_COLUMNS` order."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["batch"])

    def rows(self):
        names = list(self.columns)
        for values in zip(*(self.columns[n] for n in names)):
            yield dict(zip(names, (v.item() if hasattr(v, "item") else v for v in values)))


def _stack(records: Sequence[tuple], shape: tuple[int, ...]):
    """NamedTuples of floats → one NamedTuple of arrays reshaped for broadcasting."""
    kind = type(records[0])
    return kind(*(np.array([getattr(r, f) for r in records], dtype=float).reshape(shape) for f in kind._fields))


def _check_axis(name: str, values: Sequence[float], low: float, high: float) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise SpeedlimitError(f"sweep needs at least one {name}")
    if not np.all(np.isfinite(array)) or np.any(array < low) or np.any(array > high) or np.any(array != np.round(array)):
        raise SpeedlimitError(f"every {name} must be a whole number between {low:g} and {high:,.0f}")
    return array


def sweep_arrays(
    models: Sequence[Architecture],
    hardware: Sequence[Hardware],
    weights: Sequence[str | float],
    batches: Sequence[float],
    contexts: Sequence[float],
    *,
    output: int = 256,
    kv: str = "fp16",
    tp: int = 1,
    ideal: bool = False,
) -> dict[str, np.ndarray]:
    """The grid as arrays of shape (models·weights, hardware, batch, context)."""
    precisions = [parse_precision(w) for w in weights]
    kv_precision = parse_precision(kv, what="kv")
    tp = int(_check_axis("tp", [tp], 1, MAX_TP)[0])
    batch = _check_axis("batch", batches, 1, MAX_BATCH).reshape(1, 1, -1, 1)
    context = _check_axis("context", contexts, 0, MAX_TOKENS).reshape(1, 1, 1, -1)
    costs, dtypes, kernels = [], [], []
    for arch in models:
        for precision in precisions:
            cost, _ = cost_model(arch, precision, kv_precision)
            costs.append(ideal_cost_model(cost, arch) if ideal else cost)
            dtypes.append(precision.compute_dtype)
            kernels.append(arch.decode_kernels)
    cost = _stack(costs, (-1, 1, 1, 1))
    efficiencies = [default_efficiency(h) for h in hardware]
    machines = [
        machine_for(h, e.model_copy(update={"step_overhead_s": e.overhead_s(k)}), dtype, tp, ideal)
        for dtype, k in zip(dtypes, kernels)
        for h, e in zip(hardware, efficiencies)
    ]
    machine = _stack(machines, (len(costs), len(hardware), 1, 1))
    reply = core.reply_decode(cost, machine, batch, context, output)
    itl = reply.itl_s
    memory = cost.total_weight_bytes + core.kv_cache_bytes(cost, batch, context + output)
    return {
        "decode_tok_s": 1.0 / itl,
        "itl_s": itl,
        "ttft_s": core.prefill_seconds(cost, machine, batch, context),
        "throughput_tok_s": batch / itl,
        "bytes_per_token": reply.step_bytes / batch,
        "memory_bytes": memory,
        "fits": memory <= core.usable_memory_bytes(machine),  # NaN capacity (unknown) compares False
        "compute_bound": reply.compute_bound,
    }


def sweep_grid(
    models: Sequence[str],
    hardware: Sequence[str],
    weights: Sequence[str | float],
    batches: Sequence[float],
    contexts: Sequence[float],
    *,
    output: int = 256,
    kv: str = "fp16",
    tp: int = 1,
    ideal: bool = False,
) -> SweepResult:
    """Resolve names, evaluate the grid, and flatten it to one row per configuration."""
    archs = [resolve_model(m) for m in models]
    devices = [resolve_hardware(h) for h in hardware]
    arrays = sweep_arrays(archs, devices, weights, batches, contexts, output=output, kv=kv, tp=tp, ideal=ideal)
    shape = (len(archs) * len(weights), len(devices), len(batches), len(contexts))
    full = {k: np.broadcast_to(v, shape).reshape(-1) for k, v in arrays.items()}
    mw, h, b, c = (axis.reshape(-1) for axis in np.indices(shape))
    model_names = np.array([a.name for a in archs])
    weight_names = np.array([parse_precision(w).name for w in weights])
    columns = {
        "model": model_names[mw // len(weights)],
        "hardware": np.array([d.key for d in devices])[h],
        "weights": weight_names[mw % len(weights)],
        "batch": np.asarray(batches, dtype=int)[b],
        "context": np.asarray(contexts, dtype=int)[c],
        **{k: full[k] for k in ("decode_tok_s", "itl_s", "ttft_s", "throughput_tok_s", "bytes_per_token", "memory_bytes", "fits")},
        "regime": np.where(full["compute_bound"], "compute", "memory"),
    }
    return SweepResult({name: columns[name] for name in SWEEP_COLUMNS})
