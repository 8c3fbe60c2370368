"""matplotlib figures (Agg backend, PNG): the run plots of `speedlimit report` (from `RequestColumns` and the
typed summaries) and the estimate plot of `speedlimit estimate --plot` (`plot_estimate`). Each function writes one
PNG and returns its path (None when there is nothing to draw). Text that came from a file is drawn literally
(`_literal`: no mathtext).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import EngFormatter, FuncFormatter  # noqa: E402

from speedlimit.errors import SpeedlimitError  # noqa: E402
from speedlimit.estimator.curves import batch_curve, roofline  # noqa: E402
from speedlimit.artifacts import Comparison, RunSummary, SweepSummary  # noqa: E402
from speedlimit.report.results import RequestColumns  # noqa: E402

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


def _literal(text: str) -> str:
    """``text`` drawn as is: a ``$`` from a file must not start mathtext (which can fail to parse)."""
    return str(text).replace("$", r"\$")


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
        f"prompt {result['prompt']}, output {result['output']}, tp {result['tp']}"
        + "".join(f", {key} {result[key]}" for key in ("pp", "dp", "ep") if result.get(key, 1) > 1)
        + f" ({result['mode']}): "
        f"{result['decode_tok_s']:.3g} tok/s per user, {result['throughput_tok_s']:.3g} tok/s total",
        fontsize=10,
    )
    return _save(fig, Path(out_path))


# --------------------------------------------------------------------------------------------
# runs (bench measures them, simulate predicts them)

#: At most this many requests are drawn as bars in a timeline; past it an evenly spaced sample by start time.
TIMELINE_MAX_BARS = 2_000
LATENCIES = (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))


def plot_distributions(requests: RequestColumns, summary: RunSummary | None, out_path: Path) -> Path | None:
    """Histograms of TTFT and of the pooled inter-token gaps; p50 and p99 marked (from ``summary`` when given)."""
    ttft = requests.ttft_s[requests.ok & np.isfinite(requests.ttft_s)]
    itl = requests.itl_s
    if ttft.size == 0 and itl.size == 0:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    panels = ((axes[0], ttft, "TTFT", summary.ttft_s if summary else None, ""),
              (axes[1], itl, "inter-token latency", summary.itl_s if summary else None,
               " (an even sample)" if requests.itl_sampled else ""))
    for ax, values, name, dist, note in panels:
        if values.size == 0:
            ax.text(0.5, 0.5, f"no {name} data", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        ms = values * 1e3
        marks = {50: dist.p50, 99: dist.p99} if dist is not None and dist.n else {}
        high = float(np.percentile(ms, 99.9))  # the far tail would squeeze the histogram into one bar
        ax.hist(np.minimum(ms, high), bins=min(60, max(10, int(math.sqrt(ms.size)))), color=BLUE, alpha=0.8)
        for q, style in ((50, "-"), (99, "--")):
            value = marks[q] * 1e3 if marks.get(q) is not None else float(np.percentile(ms, q))
            ax.axvline(value, color=RED, ls=style, lw=1.2, label=f"p{q} {value:.3g} ms")
        ax.set_xlabel(f"{name} (ms; beyond p99.9 counted in the last bar)")
        ax.set_ylabel("count")
        ax.set_title(f"{name}: n={values.size:,}{note}, mean {ms.mean():.3g} ms")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.25)
    return _save(fig, out_path)


def plot_timeline(requests: RequestColumns, out_path: Path, max_bars: int = TIMELINE_MAX_BARS) -> Path | None:
    """One bar per request: waiting for the first token (light), streaming (dark), failed (red); at most ``max_bars``."""
    total = len(requests)
    if total == 0:
        return None
    order = np.argsort(requests.start_s, kind="stable")
    if total > max_bars:
        order = order[np.linspace(0, total - 1, max_bars).round().astype(int)]
    starts = requests.start_s[order]
    ends = starts + np.nan_to_num(requests.e2e_s[order], nan=0.0).clip(min=0)
    ok = requests.ok[order]
    ttfts = np.where(ok, np.nan_to_num(requests.ttft_s[order], nan=0.0), 0.0)
    y = np.arange(order.size, dtype=float)
    fig, ax = plt.subplots(figsize=(12, min(12.0, max(3.0, 0.04 * order.size + 2))))
    half = 0.4 if order.size < 200 else 0.5
    handles = []
    for mask, left, right, color, label in ((ok, starts, starts + ttfts, "#bfdbfe", "waiting for first token"),
                                            (ok, starts + ttfts, ends, BLUE, "streaming"),
                                            (~ok, starts, np.maximum(ends, starts + 1e-3), RED, "failed")):
        if mask.any():
            ax.add_collection(PolyCollection(_bars(y[mask], left[mask], right[mask], half), facecolors=color, edgecolors="none"))
            handles.append(Patch(color=color, label=label))
    ax.set_xlim(0, max(float(ends.max()), 1e-3) * 1.01)
    ax.set_ylim(-1, order.size)
    shown = f"{order.size:,} of {total:,} requests (evenly by start time)" if order.size < total else f"{total:,} requests"
    ax.set_xlabel("seconds since the first request was sent")
    ax.set_ylabel("request (by start time)")
    ax.set_title(f"Per-request timeline: {shown}, {requests.failed:,} failed in all")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.25)
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    return _save(fig, out_path)


def _bars(y: np.ndarray, left: np.ndarray, right: np.ndarray, half: float) -> np.ndarray:
    """Rectangles [left, right] x [y - half, y + half] as PolyCollection vertices (one artist for all bars)."""
    return np.stack([np.column_stack([left, y - half]), np.column_stack([right, y - half]),
                     np.column_stack([right, y + half]), np.column_stack([left, y + half])], axis=1)


def sweep_points(sweep: SweepSummary) -> list[RunSummary]:
    """The sweep's runs that have a load level, by load."""
    return sorted((p for p in sweep.points if p.sweep_value is not None), key=lambda p: p.sweep_value)


class Quantiles(NamedTuple):
    p50: float | None
    p99: float | None


class CurvePoint(NamedTuple):
    """One load level of a predicted curve, with the attributes `plot_sweep` reads from a `RunSummary`."""

    sweep_value: float
    output_tok_s: float
    ttft_s: Quantiles
    tpot_s: Quantiles


def _predicted(point: RunSummary, metric: str) -> float | None:
    row = point.estimate.comparison.get(metric) if point.estimate is not None else None
    value = row.predicted if row is not None else None
    return value if value is not None and math.isfinite(value) else None


def compared_points(sweep: SweepSummary) -> tuple[str, list[CurvePoint]]:
    """What `bench --sweep ... --compare-estimate` predicted at each load level (each point's estimate block), as a
    curve the sweep plot draws beside the measured one, and its legend label (the replay, or the static estimate)."""
    points = []
    methods = set()
    for point in sweep_points(sweep):
        tok_s = _predicted(point, "output_tok_s")
        if tok_s is None or tok_s <= 0:
            continue
        methods.add(point.estimate.method)
        points.append(CurvePoint(point.sweep_value, tok_s,
                                 *(Quantiles(_predicted(point, f"{metric}.p50"), _predicted(point, f"{metric}.p99"))
                                   for metric in ("ttft_s", "tpot_s"))))
    label = "predicted (replay)" if methods == {"simulate"} else "predicted (estimate)"
    return label, points


def plot_sweep(sweeps: list[tuple[str, SweepSummary]], out_path: Path,
               compared: tuple[str, list[CurvePoint]] | None = None) -> Path | None:
    """Throughput vs load, and latency (p50/p99 TTFT and TPOT) vs throughput, every sweep on the same axes; the
    first sweep solid with its knee marked, the others dashed (e.g. measured vs predicted), and ``compared`` (the
    prediction `bench --compare-estimate` stored at each level, `compared_points`) dotted."""
    # (label, points, (throughput marker + line style, throughput colour, latency markers for p50 and p99)): the first
    # sweep solid, other sweeps dashed, the stored prediction dotted with triangles
    series: list[tuple[str, list, tuple[str, str, dict[str, str]]]] = [
        (label, sweep_points(sweep), ("o-", BLUE, {"p50": "o", "p99": "s"}) if number == 0
         else ("s--", GREY, {"p50": "o", "p99": "s"}))
        for number, (label, sweep) in enumerate(sweeps)]
    if compared is not None and compared[1]:
        series.append((*compared, ("^:", RED, {"p50": "^", "p99": "^"})))
    if not any(points for _, points, _ in series):
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.8), layout="constrained")
    parameter = sweeps[0][1].sweep.parameter
    for number, (label, points, (style, color0, latency_markers)) in enumerate(series):
        if not points:
            continue
        first = number == 0
        loads = [p.sweep_value for p in points]
        tput = [p.output_tok_s for p in points]
        left.plot(loads, tput, style, color=color0, mfc=None if first else "none", label=_literal(label))
        for metric, color in (("tpot_s", BLUE), ("ttft_s", ORANGE)):
            for q, marker in latency_markers.items():
                pairs = [(x, getattr(getattr(p, metric), q) * 1e3) for x, p in zip(tput, points)
                         if getattr(getattr(p, metric), q) is not None]
                if pairs:
                    right.plot(*zip(*pairs), marker + ("-" if first else ":"), color=color, ms=4,
                               mfc=None if first else "none", alpha=1.0 if first else 0.8,
                               label=_literal(f"{metric[:-2].upper()} {q} ({label})"))
        if first:
            sweep = sweeps[0][1]
            for p in points:
                value = p.tpot_s.p50 or p.ttft_s.p50
                if value:
                    right.annotate(f"{p.sweep_value:g}", (p.output_tok_s, value * 1e3), fontsize=7, color="#475467",
                                   xytext=(3, 3), textcoords="offset points")
            knee = sweep.sweep.knee_load
            if knee is not None:
                left.axvline(knee, color=RED, ls="--", lw=1.2, label=f"knee: {parameter}={knee:g}")
                knee_point = next((p for p in points if p.sweep_value == knee), None)
                if knee_point is not None:
                    right.axvline(knee_point.output_tok_s, color=RED, ls="--", lw=1.2, label=f"knee ({knee_point.output_tok_s:.3g} tok/s)")
    left.set_xscale("log", base=2)
    left.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    left.set_xlabel(parameter)
    left.set_ylabel("output tok/s")
    left.set_title("Throughput vs load")
    left.grid(True, which="both", alpha=0.25)
    left.legend(fontsize=8)
    right.set_yscale("log")
    right.set_xlabel("output tok/s")
    right.set_ylabel("latency (ms)")
    right.set_title("Latency vs throughput (labels: load)")
    right.grid(True, which="both", alpha=0.25)
    right.legend(fontsize=7)
    return _save(fig, out_path)


def plot_comparison(comparison: dict[str, Comparison], out_path: Path) -> Path | None:
    """measured / predicted for each compared metric (1 = the estimate was exact)."""
    rows = [(name, row.ratio) for name, row in comparison.items() if row.ratio is not None and math.isfinite(row.ratio)]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.6))
    ratios = [ratio for _, ratio in rows]
    ax.barh(range(len(rows)), ratios, color=[BLUE if 0.8 <= r <= 1.25 else ORANGE for r in ratios])
    ax.set_yticks(range(len(rows)), [_literal(name) for name, _ in rows])
    ax.axvline(1.0, color="black", lw=1)
    for y, ratio in enumerate(ratios):
        ax.annotate(f"{ratio:.2f}×", (ratio, y), xytext=(4, -3), textcoords="offset points", fontsize=8)
    ax.set_xlabel("measured ÷ predicted")
    ax.set_title("Measured vs predicted (latencies > 1: slower than predicted; throughputs > 1: faster)")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.25)
    return _save(fig, out_path)


def plot_overlay(runs: list[tuple[str, RunSummary]], out_path: Path) -> Path | None:
    """Each latency's p50/p90/p95/p99 for every run on the same axes (first solid, others dashed)."""
    quantiles = ("p50", "p90", "p95", "p99")
    drawn = [(attr, name) for attr, name in LATENCIES if any(getattr(run, attr).n for _, run in runs)]
    if not drawn:
        return None
    fig, axes = plt.subplots(1, len(drawn), figsize=(3.4 * len(drawn) + 1, 3.8), layout="constrained", squeeze=False)
    for ax, (attr, name) in zip(axes[0], drawn):
        for number, (label, run) in enumerate(runs):
            dist = getattr(run, attr)
            pairs = [(q, getattr(dist, q) * 1e3) for q in quantiles if getattr(dist, q) is not None]
            if pairs:
                ax.plot(*zip(*pairs), "o-" if number == 0 else "s--", color=BLUE if number == 0 else ORANGE,
                        mfc=None if number == 0 else "none", label=_literal(label))
        ax.set_title(name)
        ax.set_ylabel("ms")
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=8)
    fig.suptitle("Latency percentiles on the same axes")
    return _save(fig, out_path)


# --------------------------------------------------------------------------------------------
# the server's own metrics (bench's server_metrics.jsonl)


def server_series(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The plotted series of a server_metrics.jsonl: time, running/waiting requests, KV-cache use (%), and prompt and
    generation tok/s between consecutive scrapes (counter differences; a reset restarts from zero)."""
    from speedlimit.bench.server_metrics import COUNTERS, GAUGES, detect_engine

    engine = next((detect_engine(r["samples"]) for r in rows if r["samples"]), "unknown")
    t = np.array([float(r.get("t_s") or 0.0) for r in rows], dtype=float)

    def column(names: tuple[str, ...]) -> np.ndarray | None:
        name = next((n for n in names if any(n in r["samples"] for r in rows)), None)
        if name is None:
            return None
        return np.array([r["samples"].get(name) if r["samples"].get(name) is not None else np.nan for r in rows],
                        dtype=float)

    gauges = {key: column(names) for key, names in GAUGES.get(engine, {}).items()}
    rates = {}
    for key in ("prompt_tokens", "generation_tokens"):
        values = column(COUNTERS.get(engine, {}).get(key, ()))
        if values is not None and values.size > 1:
            steps = np.diff(values)
            steps = np.where(steps < 0, values[1:], steps)  # a counter reset
            dt = np.diff(t)
            rates[key] = np.where(dt > 0, steps / np.where(dt > 0, dt, 1.0), np.nan)
    return {"engine": engine, "t": t, "gauges": gauges, "rates": rates}


def plot_server_metrics(rows: list[dict[str, Any]], out_path: Path) -> Path | None:
    """The server's view over the run: requests running/waiting, KV-cache use, prompt and generation tok/s."""
    if len(rows) < 2:
        return None
    series = server_series(rows)
    gauges, rates, t = series["gauges"], series["rates"], series["t"]
    panels = [p for p in ("requests", "kv", "rates")
              if (p == "requests" and (gauges.get("running") is not None or gauges.get("waiting") is not None))
              or (p == "kv" and gauges.get("kv_cache_usage") is not None) or (p == "rates" and rates)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 0.5, 3.6), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "requests":
            for key, color, label in (("running", BLUE, "running"), ("waiting", ORANGE, "waiting")):
                if gauges.get(key) is not None:
                    ax.step(t, gauges[key], where="post", color=color, label=label)
            ax.set_title("requests on the server")
        elif panel == "kv":
            ax.plot(t, gauges["kv_cache_usage"] * 100, color=BLUE, marker=".", ms=3)
            ax.set_ylim(0, 105)
            ax.set_ylabel("%")
            ax.set_title("KV-cache use")
        else:
            mid = (t[1:] + t[:-1]) / 2
            for key, color, label in (("generation_tokens", BLUE, "generation"), ("prompt_tokens", ORANGE, "prompt")):
                if key in rates:
                    ax.plot(mid, rates[key], color=color, marker=".", ms=3, label=label)
            ax.set_title("server tok/s between scrapes")
        ax.set_xlabel("s since the scrape before the run")
        ax.grid(True, alpha=0.25)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(_literal(f"{series['engine']} /metrics: {len(rows)} scrapes"), fontsize=11)
    return _save(fig, out_path)
