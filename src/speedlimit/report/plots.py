"""matplotlib figures (Agg backend, PNG): bench-result plots for `speedlimit report` and the estimate
plot for `speedlimit estimate --plot` (`plot_estimate`). Each function writes one PNG and returns its path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import EngFormatter  # noqa: E402

from speedlimit.errors import SpeedlimitError  # noqa: E402
from speedlimit.estimator.curves import batch_curve, roofline  # noqa: E402
from speedlimit.report.results import Results  # noqa: E402

BLUE, ORANGE, RED, GREY = "#2463eb", "#f59e0b", "#dc2626", "#98a2b3"
DPI = 110


def _save(fig, out_path: Path) -> Path:
    out_path = Path(out_path)
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out_path, dpi=DPI, bbox_inches="tight", format="png")
    except OSError as error:
        raise SpeedlimitError(f"cannot write {out_path} ({error.strerror or error})") from None
    finally:
        plt.close(fig)
    return out_path


def _numbers(values) -> np.ndarray:
    return np.asarray([v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)], dtype=float)


# --------------------------------------------------------------------------------------------
# estimate


def draw_batch_curve(ax, curve: dict[str, Any]) -> None:
    points = curve["points"]
    current = curve["estimate"]
    fit = [p for p in points if p["fits"] is not False]
    nofit = [p for p in points if p["fits"] is False]
    if fit:
        ax.plot([p["decode_tok_s"] for p in fit], [p["throughput_tok_s"] for p in fit], "o-", color=BLUE, ms=4, label="fits in memory")
    if nofit:
        ax.plot([p["decode_tok_s"] for p in nofit], [p["throughput_tok_s"] for p in nofit], "x", color=GREY, label="does not fit")
    for p in points[:: max(1, len(points) // 8)]:
        ax.annotate(f"b={p['batch']}", (p["decode_tok_s"], p["throughput_tok_s"]), fontsize=7, color="#475467", xytext=(3, 3), textcoords="offset points")
    ax.plot([current["decode_tok_s"]], [current["throughput_tok_s"]], "o", ms=10, color=ORANGE, mec="black", label=f"batch {current['batch']}")
    knee = next((p for p in points if p["batch"] == curve["knee_batch"]), None)
    if knee is not None:
        ax.plot([knee["decode_tok_s"]], [knee["throughput_tok_s"]], "D", ms=9, color=RED, label=f"knee (batch {knee['batch']})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("decode tok/s per user")
    ax.set_ylabel("aggregate tok/s")
    ax.set_title("Throughput vs per-user speed across batch sizes")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)


def draw_roofline(ax, result: dict[str, Any]) -> None:
    r = roofline(result)
    ax.plot(r["intensity"], r["peak_roof_flops"], "--", color=GREY, label="peak roof")
    if result["mode"] != "ideal":
        ax.plot(r["intensity"], r["effective_roof_flops"], "-", color=BLUE, label="achievable roof")
    point = r["point"]
    color = RED if point["regime"] == "compute" else BLUE
    ax.plot([point["intensity"]], [point["flops"]], "o", ms=10, color=color, mec="black", label=f"this config ({point['regime']}-bound)")
    if r["ridge_intensity"]:
        ax.axvline(r["ridge_intensity"], color=GREY, ls=":", lw=1)
        ax.annotate(f"ridge {r['ridge_intensity']:.0f} FLOP/B", (r["ridge_intensity"], min(r["peak_roof_flops"])), fontsize=7, color="#475467", xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s"))
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_title(f"Roofline: {point['regime']}-bound at {point['intensity']:.3g} FLOP/byte")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)


def plot_estimate(model, hardware, out_path, **estimate_kwargs) -> Path:
    """Draw the batch curve (knee marked) and the roofline (current point) of one configuration to a PNG."""
    curve = batch_curve(model, hardware, **estimate_kwargs)
    result = curve["estimate"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.8), layout="constrained")
    draw_batch_curve(left, curve)
    draw_roofline(right, result)
    fig.suptitle(
        f"{result['model']} on {result['hardware']}: weights {result['weights']}, KV {result['kv']}, batch {result['batch']}, "
        f"prompt {result['prompt']}, output {result['output']}, tp {result['tp']} ({result['mode']}): "
        f"{result['decode_tok_s']:.3g} tok/s per user, {result['throughput_tok_s']:.3g} tok/s total",
        fontsize=10,
    )
    return _save(fig, Path(out_path))


# --------------------------------------------------------------------------------------------
# bench results


def plot_distributions(results: Results, out_path: Path) -> Path | None:
    """Histograms of TTFT and of every inter-token gap (pooled), with p50 and p99 marked."""
    done = results.completed
    ttft = _numbers(r.get("ttft_s") for r in done)
    itl = _numbers(gap for r in done for gap in (r.get("itl_s") or []))
    if ttft.size == 0 and itl.size == 0:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, values, name in ((axes[0], ttft, "TTFT"), (axes[1], itl, "inter-token latency")):
        if values.size == 0:
            ax.text(0.5, 0.5, f"no {name} data", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        ms = values * 1e3
        ax.hist(ms, bins=min(60, max(10, int(math.sqrt(ms.size)))), color=BLUE, alpha=0.8)
        for q, style in ((50, "-"), (99, "--")):
            value = float(np.percentile(ms, q))
            ax.axvline(value, color=RED, ls=style, lw=1.2, label=f"p{q} {value:.3g} ms")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("count")
        ax.set_title(f"{name}: n={values.size}, mean {ms.mean():.3g} ms")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.25)
    return _save(fig, out_path)


def request_spans(results: Results) -> list[dict[str, Any]]:
    """(start, ttft, end) seconds from the first request's start, per request that has timing."""
    rows = []
    for r in results.requests:
        start = None
        if _numbers([r.get("start_ns")]).size and r.get("start_ns"):
            start = float(r["start_ns"]) / 1e9
        elif _numbers([r.get("start_s")]).size:
            start = float(r["start_s"])
        if start is None:
            continue
        e2e = r.get("e2e_s")
        if _numbers([e2e]).size:
            end = start + float(e2e)
        elif _numbers([r.get("end_ns")]).size and r.get("end_ns"):
            end = float(r["end_ns"]) / 1e9
        elif _numbers([r.get("end_s")]).size:
            end = float(r["end_s"])
        else:
            end = start
        ttft = r.get("ttft_s") if _numbers([r.get("ttft_s")]).size else None
        rows.append({"start": start, "end": max(end, start), "ttft": ttft, "ok": not (r.get("error_kind") or r.get("error")), "load": r.get("_load")})
    if not rows:
        return []
    origin = min(row["start"] for row in rows)
    for row in rows:
        row["start"] -= origin
        row["end"] -= origin
    return sorted(rows, key=lambda row: row["start"])


def plot_timeline(results: Results, out_path: Path) -> Path | None:
    """One horizontal bar per request: waiting for the first token (light), streaming (dark), failed (red)."""
    spans = request_spans(results)
    if not spans:
        return None
    height = min(12.0, max(3.0, 0.04 * len(spans) + 2))
    fig, ax = plt.subplots(figsize=(12, height))
    y = np.arange(len(spans))
    starts = np.array([s["start"] for s in spans])
    ends = np.array([s["end"] for s in spans])
    ttfts = np.array([s["ttft"] if s["ttft"] is not None and s["ok"] else 0.0 for s in spans])
    ok = np.array([s["ok"] for s in spans])
    bar_height = 0.8 if len(spans) < 200 else 1.0
    ax.barh(y[ok], ttfts[ok], left=starts[ok], height=bar_height, color="#bfdbfe", label="waiting for first token")
    ax.barh(y[ok], (ends - starts - ttfts)[ok], left=(starts + ttfts)[ok], height=bar_height, color=BLUE, label="streaming")
    if (~ok).any():
        ax.barh(y[~ok], np.maximum((ends - starts)[~ok], 1e-3), left=starts[~ok], height=bar_height, color=RED, label="failed")
    ax.set_xlabel("seconds since the first request was sent")
    ax.set_ylabel("request (by start time)")
    ax.set_title(f"Per-request timeline: {len(spans)} requests, {int((~ok).sum())} failed")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out_path)


def sweep_rows(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    parameter = sweep["sweep"].get("parameter", "load")
    rows = []
    for point in sweep["points"]:
        load = point.get("sweep_value", point.get(parameter))
        throughput = point.get("output_tok_s")
        if not isinstance(load, (int, float)) or not isinstance(throughput, (int, float)):
            continue
        rows.append({
            "load": float(load),
            "output_tok_s": float(throughput),
            **{f"{metric}_{q}": (point.get(metric) or {}).get(q) for metric in ("ttft_s", "itl_s", "e2e_s") for q in ("p50", "p99")},
            "failed": point.get("failed", 0),
        })
    return sorted(rows, key=lambda row: row["load"])


def plot_sweep(sweep: dict[str, Any], out_path: Path) -> Path | None:
    """Throughput vs load, and latency (p50/p99 ITL, TTFT) vs throughput, with the knee marked."""
    rows = sweep_rows(sweep)
    if not rows:
        return None
    info = sweep["sweep"]
    parameter = info.get("parameter", "load")
    knee_load = info.get("knee_load")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.6), layout="constrained")
    loads = [r["load"] for r in rows]
    tput = [r["output_tok_s"] for r in rows]
    left.plot(loads, tput, "o-", color=BLUE)
    if knee_load is not None:
        left.axvline(knee_load, color=RED, ls="--", lw=1.2, label=f"knee: {parameter}={knee_load:g}")
        left.legend(fontsize=8)
    left.set_xscale("log", base=2)
    left.set_xlabel(parameter)
    left.set_ylabel("output tok/s")
    left.set_title("Throughput vs load")
    left.grid(True, which="both", alpha=0.25)
    for metric, color in (("itl_s", BLUE), ("ttft_s", ORANGE)):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ys = [r[f"{metric}_{q}"] for r in rows]
            pairs = [(x, y * 1e3) for x, y in zip(tput, ys) if isinstance(y, (int, float))]
            if pairs:
                right.plot(*zip(*pairs), style, color=color, ms=4, label=f"{metric[:-2].upper()} {q}")
    knee = next((r for r in rows if r["load"] == knee_load), None)
    if knee is not None:
        right.axvline(knee["output_tok_s"], color=RED, ls="--", lw=1.2, label=f"knee ({knee['output_tok_s']:.3g} tok/s)")
    for r in rows:
        right.annotate(f"{r['load']:g}", (r["output_tok_s"], (r["itl_s_p50"] or 0) * 1e3), fontsize=7, color="#475467", xytext=(3, 3), textcoords="offset points")
    right.set_yscale("log")
    right.set_xlabel("output tok/s")
    right.set_ylabel("latency (ms)")
    right.set_title("Latency vs throughput (labels: load)")
    right.grid(True, which="both", alpha=0.25)
    right.legend(fontsize=8)
    return _save(fig, out_path)


def plot_comparison(comparison: dict[str, dict[str, Any]], out_path: Path) -> Path | None:
    """measured / predicted for each compared metric (1 = the estimate was exact)."""
    rows = [(name, row["ratio"]) for name, row in comparison.items() if isinstance(row, dict) and isinstance(row.get("ratio"), (int, float))]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.6))
    names = [name for name, _ in rows]
    ratios = [ratio for _, ratio in rows]
    ax.barh(names, ratios, color=[BLUE if 0.8 <= r <= 1.25 else ORANGE for r in ratios])
    ax.axvline(1.0, color="black", lw=1)
    for y, ratio in enumerate(ratios):
        ax.annotate(f"{ratio:.2f}×", (ratio, y), xytext=(4, -3), textcoords="offset points", fontsize=8)
    ax.set_xlabel("measured ÷ predicted")
    ax.set_title("Measured vs predicted (latencies > 1: slower than predicted; throughputs > 1: faster)")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.25)
    return _save(fig, out_path)
