"""Sweeps: evaluate a grid of model × hardware × weights × batch × context in one vectorized pass.

Each axis becomes one dimension of a numpy broadcast, so the roofline core runs once over the whole
grid (no Python loop per configuration). `sweep_grid` returns flat columns ready for CSV/JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from speedlimit.architecture import Architecture
from speedlimit.catalog import resolve_hardware, resolve_model
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.estimator.api import chosen_weights, resolve, weights_label
from speedlimit.hardware import Hardware
from speedlimit.scenario import MAX_BATCH, MAX_TOKENS, scenario_from

# Configurations one vectorized evaluation may hold in memory (a few dozen float arrays of this length), and
# rows one sweep may write (200,000 rows are ~30 MB of CSV and about a second of formatting on 2 cores).
MAX_GRID_CONFIGS = 2_000_000
MAX_SWEEP_ROWS = 200_000

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

    def write_csv(self, stream: TextIO, chunk_rows: int = 65536) -> None:
        """The rows as CSV (header first), written in chunks without a Python object per cell."""
        names = list(self.columns)
        stream.write(",".join(names) + "\n")
        for start in range(0, len(self), chunk_rows):
            cells = [_csv_cells(self.columns[name][start : start + chunk_rows]) for name in names]
            stream.write("\n".join(map(",".join, zip(*cells))) + "\n")

    def write_json(self, stream: TextIO, chunk_rows: int = 65536) -> None:
        """The rows as one JSON array of objects (NaN/inf as null, so it is valid JSON)."""
        names = list(self.columns)
        stream.write("[")
        for start in range(0, len(self), chunk_rows):
            cells = [_json_cells(self.columns[name][start : start + chunk_rows]) for name in names]
            keys = [json.dumps(name) + ": " for name in names]
            rows = ("{" + ", ".join(k + v for k, v in zip(keys, row)) + "}" for row in zip(*cells))
            stream.write((", " if start else "") + ", ".join(rows))
        stream.write("]\n")


def _csv_cells(column: np.ndarray) -> list[str]:
    if column.dtype.kind == "f":
        return [repr(v) for v in column.tolist()]  # repr: the shortest text that reads back to the same float
    if column.dtype.kind in "iub":
        return [str(v) for v in column.tolist()]
    quoted = {value: _csv_quote(str(value)) for value in set(column.tolist())}  # few distinct names
    return [quoted[v] for v in column.tolist()]


def _csv_quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\r\n') else text


def _json_cells(column: np.ndarray) -> list[str]:
    if column.dtype.kind == "f":
        return [repr(v) if math.isfinite(v) else "null" for v in column.tolist()]
    if column.dtype.kind == "b":
        return ["true" if v else "false" for v in column.tolist()]
    if column.dtype.kind in "iu":
        return [str(v) for v in column.tolist()]
    quoted = {value: json.dumps(str(value)) for value in set(column.tolist())}
    return [quoted[v] for v in column.tolist()]


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


def check_grid_size(*axes: Sequence[Any], limit: int = MAX_SWEEP_ROWS) -> int:
    """Rows of the grid over ``axes``; an error before any work when the grid has more than ``limit``."""
    rows = 1
    for axis in axes:
        rows *= len(axis)
    if rows > limit:
        sizes = " × ".join(f"{len(axis):,}" for axis in axes)
        raise SpeedlimitError(f"the sweep grid has {sizes} = {rows:,} rows, more than {limit:,}: "
                              "split it into several sweeps or use fewer values per axis")
    return rows


def sweep_arrays(
    models: Sequence[Architecture],
    hardware: Sequence[Hardware],
    weights: Sequence[str | float],
    batches: Sequence[float],
    contexts: Sequence[float],
    *,
    output: int = 256,
    kv: str | None = None,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    ep: int = 1,
    ideal: bool = False,
    engine: Any = None,
    threads: int | None = None,
    numa: str | None = None,
) -> dict[str, np.ndarray]:
    """The grid as arrays of shape (models·weights, hardware, batch, context).

    Each model × weights × hardware cell is a `Scenario` resolved like a single estimate (same validation, cost
    model and machine); batch and context are the broadcast axes. ``threads`` and ``numa`` apply to the CPUs of the
    grid (a grid mixes devices); naming them when no device is a CPU with a known layout is an error.
    """
    for name, axis in (("model", models), ("hardware", hardware), ("weights", weights)):
        if not axis:
            raise SpeedlimitError(f"sweep needs at least one {name}")
    check_grid_size(models, hardware, weights, batches, contexts, limit=MAX_GRID_CONFIGS)
    batch = _check_axis("batch", batches, 1, MAX_BATCH).reshape(1, 1, -1, 1)
    context = _check_axis("context", contexts, 0, MAX_TOKENS).reshape(1, 1, 1, -1)
    cpu = {"threads": threads, "numa": numa}
    if (threads is not None or numa is not None) and not any(device.topology for device in hardware):
        given = "--threads" if threads is not None else "--numa"
        raise SpeedlimitError(f"{given} describes the threads of a CPU run, but no hardware of this sweep is a CPU with "
                              "a known layout: leave it out")
    cells = [
        [resolve(scenario_from(model=arch, hardware=device, weights=w, kv=kv, tp=tp, pp=pp, dp=dp, ep=ep, ideal=ideal,
                               output=output, engine=engine, **(cpu if device.topology else {})))
         for device in hardware]
        for arch in models
        for w in weights
    ]
    cost = _stack([row[0].cost for row in cells], (-1, 1, 1, 1))  # a cost model does not depend on the device
    machine = _stack([cell.machine for row in cells for cell in row], (len(cells), len(hardware), 1, 1))
    reply = core.reply_decode(cost, machine, batch, context, output)
    itl = reply.itl_s
    memory = core.resident_bytes(cost, machine, batch, context + output)
    return {
        "decode_tok_s": 1.0 / itl,
        "itl_s": itl,
        "ttft_s": core.prefill_seconds(cost, machine, batch, context),
        "throughput_tok_s": batch / itl,
        "bytes_per_token": reply.step_bytes / batch,
        "memory_bytes": memory,
        "fits": core.memory_fits(cost, machine, batch, context + output),  # NaN capacity (unknown) compares False
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
    kv: str | None = None,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    ep: int = 1,
    ideal: bool = False,
    engine: Any = None,
    threads: int | None = None,
    numa: str | None = None,
) -> SweepResult:
    """Resolve names, evaluate the grid, and flatten it to one row per configuration."""
    check_grid_size(models, hardware, weights, batches, contexts)
    archs = [resolve_model(m) for m in models]
    devices = [resolve_hardware(h) for h in hardware]
    arrays = sweep_arrays(archs, devices, weights, batches, contexts, output=output, kv=kv, tp=tp, pp=pp, dp=dp, ep=ep,
                          ideal=ideal, engine=engine, threads=threads, numa=numa)
    shape = (len(archs) * len(weights), len(devices), len(batches), len(contexts))
    full = {k: np.broadcast_to(v, shape).reshape(-1) for k, v in arrays.items()}
    mw, h, b, c = (axis.reshape(-1) for axis in np.indices(shape))
    model_names = np.array([a.name for a in archs])
    # per model: "shipped" names each model's own format
    weight_names = np.array([weights_label(arch, chosen_weights(arch, w)) for arch in archs for w in weights])
    columns = {
        "model": model_names[mw // len(weights)],
        "hardware": np.array([d.key for d in devices])[h],
        "weights": weight_names[mw],
        "batch": np.asarray(batches, dtype=int)[b],
        "context": np.asarray(contexts, dtype=int)[c],
        **{k: full[k] for k in ("decode_tok_s", "itl_s", "ttft_s", "throughput_tok_s", "bytes_per_token", "memory_bytes", "fits")},
        "regime": np.where(full["compute_bound"], "compute", "memory"),
    }
    return SweepResult({name: columns[name] for name in SWEEP_COLUMNS})
