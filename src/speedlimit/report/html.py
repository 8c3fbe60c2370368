"""`speedlimit report`: a run or a sweep (bench's or simulate's files) -> PNGs and one self-contained HTML page.

The page is the Jinja2 template ``templates/report.html.j2`` rendered with autoescape, so nothing read from a
results file reaches the page unescaped; this module only turns typed results into a view of plain strings.
Sections (HTML ids): ``summary``, ``sweep`` (latency vs throughput and the knee), ``overlay`` (a predicted run or
sweep next to the measured one, `--predicted`), ``distributions`` (TTFT/ITL), ``comparison`` (bench's
``--compare-estimate``), ``timeline`` (per request), ``errors`` (when requests failed); ``skipped`` notes lines of
requests.jsonl that were not records.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader

from speedlimit.artifacts import PredictionBlock, RunSummary, SweepSummary
from speedlimit.errors import SpeedlimitError
from speedlimit.report import plots
from speedlimit.report.results import Progress, Results, load_results
from speedlimit.simulator.api import saturation_note
from speedlimit.units import format_count, format_seconds

LATENCY_METRICS = {"ttft_s", "itl_s", "tpot_s", "e2e_s"}
ROLE = {"bench": "measured", "simulate": "predicted"}
_MAX_TEXT = 300  # characters of one value shown from a file (error texts, endpoint fields)

_environment = Environment(loader=PackageLoader("speedlimit.report", "templates"), autoescape=True,
                           trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)


# ------------------------------------------------------------------------------------------------ formatting


def _number(value: Any, unit: str = "") -> str:
    """3 significant digits (thousands separated above 1,000); the missing-value glyph for None/NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return format_count(None)
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def _ratio(measured: float | None, predicted: float | None) -> str:
    if measured is None or not predicted:
        return format_count(None)
    return f"{measured / predicted:.3g}×"


def _text(value: Any) -> str:
    """A value from a file as one line of plain text (nested values as JSON), at most `_MAX_TEXT` characters."""
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(value.split())
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"


def _image(path: Path | None) -> str | None:
    return base64.b64encode(path.read_bytes()).decode("ascii") if path is not None else None


# ------------------------------------------------------------------------------------------------ sections


def _about(results: Results) -> list[tuple[str, str]]:
    """What produced the results: its source (bench or simulate), where it sent, what it simulated."""
    runs = results.runs
    if not runs:
        return []
    first = runs[0]
    rows = [("source", f"{first.source} ({ROLE.get(first.source, first.source)})")]
    for name, block in (("endpoint", results.sweep.endpoint if results.sweep else first.endpoint),
                        ("engine", results.sweep.engine if results.sweep else first.engine)):
        for key, value in (block or {}).items():
            rows.append((_text(f"{name} {key}"), _text(value)))
    if first.offered_load is not None and results.sweep is None:
        load = first.offered_load
        rows.append(("load", f"concurrency {load.concurrency}" if load.concurrency else f"rate {_number(load.rate)} req/s"))
    if first.slo:
        rows.append(("SLO", _text(", ".join(f"{key} ≤ {format_seconds(bound)}" for key, bound in first.slo.items()))))
    return rows


def _server(results: Results, out_dir: Path) -> dict[str, Any] | None:
    """The server's own view of a single run: its summary block as rows, and the server_metrics.jsonl series plot."""
    from speedlimit.bench.server_metrics import load_series
    from speedlimit.bench.describe import self_check_lines, server_lines

    summary = results.summary
    if summary is None or results.sweep is not None:
        return None
    source_dir = results.source if results.source.is_dir() else results.source.parent
    series = load_series(source_dir / "server_metrics.jsonl")
    rows = server_lines(summary.server) if summary.server is not None else []
    checks = self_check_lines(summary.self_checks) if summary.self_checks is not None else []
    if not rows and not checks and len(series) < 2:
        return None
    return {"rows": [(name.strip(), text) for name, text in rows], "checks": checks,
            "image": _image(plots.plot_server_metrics(series, out_dir / "server_metrics.png"))}


def _summary(summary: RunSummary, recomputed: bool) -> dict[str, Any]:
    rows = [
        ("requests", _number(summary.requests)),
        ("completed", _number(summary.completed)),
        ("failed", _number(summary.failed)),
        ("duration", format_seconds(summary.duration_s) if summary.duration_s else format_count(None)),
        ("output tok/s", _number(summary.output_tok_s)),
        ("requests/s", _number(summary.request_s)),
    ]
    if summary.slo:
        rows.append(("goodput (requests/s meeting the SLO)", _number(summary.goodput_request_s)))
    if summary.workers is not None:  # --workers/--ray: the clock skew measured between them
        from speedlimit.bench.describe import workers_line

        rows.append(("load sent by", workers_line(summary.workers)))
    latency = [[name] + [format_seconds(getattr(getattr(summary, attr), q)) for q in ("mean", "p50", "p90", "p95", "p99")]
               for attr, name in plots.LATENCIES]
    note = "Computed from requests.jsonl: there is no summary.json beside it." if recomputed else ""
    saturated = saturation_note(summary)
    if saturated:
        note = (note + " " if note else "") + "Predicted: " + saturated + "."
    return {"rows": rows, "latency": latency, "note": note}


def _sweep(sweep: SweepSummary, out_dir: Path, predicted: SweepSummary | None) -> dict[str, Any]:
    info = sweep.sweep
    parameter = info.parameter
    if info.knee_load is not None:
        knee = (f"Knee at {parameter} = {info.knee_load:g} ({_number(info.knee_output_tok_s)} output tok/s, the lowest load "
                f"reaching {_number(100 * info.knee_fraction)}% of the saturation throughput "
                f"{_number(info.saturation_output_tok_s)} tok/s).")
    else:
        knee = "No knee in this sweep."
    if info.slo_max_load is not None:
        knee += f" The highest {parameter} that meets the SLOs: {info.slo_max_load:g}."
    for point in plots.sweep_points(sweep):
        saturated = saturation_note(point)
        if saturated:
            knee += f" At {parameter} {point.sweep_value:g}, {saturated}."
    rows = [[f"{p.sweep_value:g}", _number(p.output_tok_s), format_seconds(p.ttft_s.p50), format_seconds(p.ttft_s.p99),
             format_seconds(p.tpot_s.p50), format_seconds(p.itl_s.p50), format_seconds(p.itl_s.p99), format_seconds(p.e2e_s.p50),
             _number(p.failed)] for p in plots.sweep_points(sweep)]
    sweeps = [(ROLE.get(sweep.points[0].source, sweep.points[0].source), sweep)]
    if predicted is not None:
        sweeps.append(("predicted", predicted))
    compared = plots.compared_points(sweep)
    if compared[1]:
        knee += (f" Dotted with triangles: {compared[0]}, what --compare-estimate predicted at each level"
                 " (the per-level tables under \"Measured vs predicted\").")
    return {
        "knee": knee,
        "head": [parameter, "output tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p50", "ITL p99", "E2E p50", "failed"],
        "rows": rows,
        "image": _image(plots.plot_sweep(sweeps, out_dir / "sweep.png", compared)),
    }


def _overlay_runs(measured: RunSummary, predicted: RunSummary, out_dir: Path) -> tuple[list[str], list[list[str]], str | None]:
    rows = []
    for attr, name in plots.LATENCIES:
        for q in ("mean", "p50", "p90", "p99"):
            m, p = getattr(getattr(measured, attr), q), getattr(getattr(predicted, attr), q)
            if m is not None or p is not None:
                rows.append([f"{name} {q}", format_seconds(m), format_seconds(p), _ratio(m, p)])
    for attr, name in (("output_tok_s", "output tok/s"), ("request_s", "requests/s"), ("goodput_request_s", "goodput requests/s")):
        m, p = getattr(measured, attr), getattr(predicted, attr)
        rows.append([name, _number(m), _number(p), _ratio(m, p)])
    image = _image(plots.plot_overlay([("measured", measured), ("predicted", predicted)], out_dir / "overlay.png"))
    return ["metric", "measured", "predicted", "measured ÷ predicted"], rows, image


def _overlay_sweeps(measured: SweepSummary, predicted: SweepSummary) -> tuple[list[str], list[list[str]]]:
    by_load = {p.sweep_value: p for p in plots.sweep_points(predicted)}
    rows = []
    for m in plots.sweep_points(measured):
        p = by_load.get(m.sweep_value)
        if p is None:
            continue
        load = f"{m.sweep_value:g}"
        rows.append([load, "output tok/s", _number(m.output_tok_s), _number(p.output_tok_s), _ratio(m.output_tok_s, p.output_tok_s),
                     "", "", ""])
        for attr, name in plots.LATENCIES:
            dm, dp = getattr(m, attr), getattr(p, attr)
            if dm.n or dp.n:
                rows.append([load, name, format_seconds(dm.p50), format_seconds(dp.p50), _ratio(dm.p50, dp.p50),
                             format_seconds(dm.p99), format_seconds(dp.p99), _ratio(dm.p99, dp.p99)])
    head = [measured.sweep.parameter, "metric", "p50 measured", "p50 predicted", "p50 ratio", "p99 measured", "p99 predicted", "p99 ratio"]
    return head, rows


def _overlay(measured: Results, predicted: Results, out_dir: Path) -> dict[str, Any]:
    where = f"Measured: {measured.source} ({measured.runs[0].source}); predicted: {predicted.source} ({predicted.runs[0].source})."
    if measured.sweep is not None and predicted.sweep is not None:
        if measured.sweep.sweep.parameter != predicted.sweep.sweep.parameter:
            raise SpeedlimitError(f"cannot overlay a {predicted.sweep.sweep.parameter} sweep ({predicted.source}) on a "
                                  f"{measured.sweep.sweep.parameter} sweep ({measured.source}); sweep the same parameter")
        head, rows = _overlay_sweeps(measured.sweep, predicted.sweep)
        intro = (f"{where} Ratios are measured ÷ predicted at each load level both sweeps ran; the curves share the axes "
                 "of the sweep plot above (predicted dashed).")
        return {"intro": intro, "head": head, "rows": rows, "image": None, "text_columns": (1,)}
    if measured.summary is not None and predicted.summary is not None:
        head, rows, image = _overlay_runs(measured.summary, predicted.summary, out_dir)
        return {"intro": where + " Ratios are measured ÷ predicted (above 1: slower or more than predicted).",
                "head": head, "rows": rows, "image": image, "text_columns": (0,)}
    kinds = {True: "a sweep", False: "a single run"}
    raise SpeedlimitError(f"cannot overlay {kinds[predicted.sweep is not None]} ({predicted.source}) on "
                          f"{kinds[measured.sweep is not None]} ({measured.source}); pass two runs or two sweeps")


def _comparison_block(block: PredictionBlock, title: str, image_path: Path | None) -> dict[str, Any] | None:
    if not block.comparison:
        return None
    rows = []
    for name, row in block.comparison.items():
        fmt = format_seconds if name in LATENCY_METRICS else _number
        rows.append([_text(name), fmt(row.measured), fmt(row.predicted), _number(row.ratio)])
    inputs = ", ".join(f"{key} {value:g}" for key, value in block.inputs.items())
    intro = _text(f"{block.method.capitalize()} for {block.model} on {block.hardware}" + (f", {inputs}" if inputs else "") + ".")
    image = _image(plots.plot_comparison(block.comparison, image_path)) if image_path is not None else None
    return {"title": title, "intro": intro, "rows": rows, "image": image}


def _comparison(results: Results, out_dir: Path) -> list[dict[str, Any]]:
    if results.sweep is None:
        block = results.summary.estimate if results.summary else None
        shown = _comparison_block(block, "", out_dir / "comparison.png") if block else None
        return [shown] if shown else []
    blocks = []
    for point in plots.sweep_points(results.sweep):
        if point.estimate is not None:
            shown = _comparison_block(point.estimate, f"{results.sweep.sweep.parameter} = {point.sweep_value:g}", None)
            if shown:
                blocks.append(shown)
    return blocks


def _errors(results: Results) -> list[list[str]]:
    if results.requests is not None and results.requests.errors:
        return [[_text(kind), _number(count), _text(example)] for kind, (count, example) in results.requests.errors.items()]
    counts: dict[str, int] = {}
    for run in results.runs:
        for kind, count in run.errors.items():
            counts[kind] = counts.get(kind, 0) + count
    return [[_text(kind), _number(count), ""] for kind, count in sorted(counts.items())]


def skipped_message(results: Results) -> str:
    """One line about the lines of requests.jsonl that were not records ('' when none were)."""
    if not results.skipped:
        return ""
    parts = []
    for path, lines in results.bad_lines.items():
        shown = ", ".join(str(n) for n in lines[:5]) + (", …" if len(lines) > 5 else "")
        parts.append(f"{path} line{'s' if len(lines) > 1 else ''} {shown}")
    kept = f"{len(results.requests):,} requests" if results.requests is not None else "the rest"
    return (f"skipped {results.skipped:,} line{'s' if results.skipped > 1 else ''} that {'are' if results.skipped > 1 else 'is'} "
            f"not a request record ({'; '.join(parts)}: a truncated last line is what a killed run leaves); "
            f"reported the other {kept}")


# ------------------------------------------------------------------------------------------------ the page


def render_report(results: Results, out_dir: Path | None = None, predicted: Results | None = None) -> Path:
    """Write report.html and its PNGs into ``out_dir`` (default: ``<results dir>/report``); return the HTML path."""
    source_dir = results.source if results.source.is_dir() else results.source.parent
    out_dir = Path(out_dir) if out_dir is not None else source_dir / "report"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpeedlimitError(f"cannot create {out_dir} ({error.strerror or error}); pass --out DIR") from None

    overlay = _overlay(results, predicted, out_dir) if predicted is not None else None
    requests = results.requests
    context = {
        "title": results.source.name,
        "source": str(results.source),
        "what": (f"{len(requests):,} requests" if requests is not None else "summary only (no requests.jsonl)")
        + (f" in {len(results.sweep.points)} load levels" if results.sweep else ""),
        "generated": _dt.datetime.now().isoformat(timespec="seconds"),
        "about": _about(results),
        "skipped": (lambda line: line[:1].upper() + line[1:])(skipped_message(results)),
        "summary": _summary(results.summary, results.recomputed) if results.summary is not None else None,
        "sweep": _sweep(results.sweep, out_dir, predicted.sweep if predicted else None) if results.sweep is not None else None,
        "overlay": overlay,
        "distributions": _image(plots.plot_distributions(requests, results.summary, out_dir / "distributions.png")) if requests else None,
        "comparison": _comparison(results, out_dir),
        "timeline": _image(plots.plot_timeline(requests, out_dir / "timeline.png")) if requests else None,
        "server": _server(results, out_dir),
        "errors": _errors(results),
    }
    page = _environment.get_template("report.html.j2").render(context)
    report_path = out_dir / "report.html"
    try:
        report_path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise SpeedlimitError(f"cannot write {report_path} ({error.strerror or error}); pass --out DIR") from None
    return report_path


def build_report(path: Path, out_dir: Path | None = None, predicted: Path | None = None,
                 on_progress: Progress | None = None) -> Path:
    """Read the results at ``path`` (and ``predicted``, to overlay) and write the report; return the HTML path."""
    results = load_results(path, on_progress)
    other = load_results(predicted, on_progress) if predicted is not None else None
    return render_report(results, out_dir, other)
