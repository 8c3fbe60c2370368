"""`speedlimit report`: turn bench results into PNGs and one self-contained HTML page (PNGs inlined as base64).

Sections (HTML ids): ``summary``, ``distributions`` (TTFT/ITL), ``sweep`` (latency vs throughput and
the knee, when the input is a sweep), ``comparison`` (measured vs predicted, when bench ran with
``--compare-estimate``), ``timeline`` (per request), ``errors`` (when requests failed).
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math
from pathlib import Path
from typing import Any

import numpy as np

from speedlimit.errors import SpeedlimitError
from speedlimit.report import plots
from speedlimit.report.results import Results, load_results

LATENCY_METRICS = {"ttft_s", "itl_s", "tpot_s", "e2e_s"}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2330;max-width:1200px;margin:0 auto;padding:16px 24px;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 8px;border-bottom:1px solid #e4e7ec;padding-bottom:4px}
.muted{color:#667085}table{border-collapse:collapse;background:#fff;margin:6px 0}th,td{border:1px solid #e4e7ec;padding:4px 10px;text-align:right}
th:first-child,td:first-child,td.text{text-align:left}th{background:#f2f4f7}img{max-width:100%;background:#fff;border:1px solid #e4e7ec;border-radius:6px}
"""


def _fmt_s(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    if value == 0:
        return "0 s"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if abs(value) < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def _fmt(value: Any, unit: str = "") -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "–" if value is None else html.escape(str(value))
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text}{(' ' + unit) if unit else ''}"


def _percentiles(values: list[float]) -> dict[str, float | None]:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": float(array.mean()), **{f"p{q}": float(np.percentile(array, q)) for q in (50, 90, 99)}}


def measured_summary(results: Results) -> dict[str, Any]:
    """The headline numbers: from summary.json when bench wrote one, else recomputed from the requests."""
    if results.summary:
        return results.summary
    done = results.completed
    spans = plots.request_spans(results)
    duration = max((s["end"] for s in spans), default=0.0)
    output_tokens = sum(r.get("output_tokens") or 0 for r in done)
    return {
        "requests": len(results.requests),
        "completed": len(done),
        "failed": len(results.failed),
        "duration_s": duration if duration > 0 else None,
        "output_tok_s": output_tokens / duration if duration > 0 else None,
        "request_s": len(done) / duration if duration > 0 else None,
        "ttft_s": _percentiles([r["ttft_s"] for r in done if isinstance(r.get("ttft_s"), (int, float))]),
        "itl_s": _percentiles([g for r in done for g in (r.get("itl_s") or [])]),
        "tpot_s": _percentiles([r["tpot_s"] for r in done if isinstance(r.get("tpot_s"), (int, float))]),
        "e2e_s": _percentiles([r["e2e_s"] for r in done if isinstance(r.get("e2e_s"), (int, float))]),
        "output_tokens": output_tokens,
    }


def _img(path: Path | None, alt: str) -> str:
    if path is None:
        return f'<p class="muted">No data for: {html.escape(alt)}.</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _summary_section(summary: dict[str, Any]) -> str:
    rows = [
        ("requests", _fmt(summary.get("requests"))),
        ("completed", _fmt(summary.get("completed"))),
        ("failed", _fmt(summary.get("failed"))),
        ("duration", _fmt_s(summary.get("duration_s"))),
        ("output tok/s", _fmt(summary.get("output_tok_s"))),
        ("requests/s", _fmt(summary.get("request_s"))),
    ]
    table = "".join(f"<tr><td>{name}</td><td>{value}</td></tr>" for name, value in rows)
    latency_rows = []
    for metric, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        dist = summary.get(metric) or {}
        if isinstance(dist, dict):
            latency_rows.append(f"<tr><td>{label}</td>" + "".join(f"<td>{_fmt_s(dist.get(k))}</td>" for k in ("mean", "p50", "p90", "p99")) + "</tr>")
    latency = "<table><tr><th>latency</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th></tr>" + "".join(latency_rows) + "</table>"
    return f'<section id="summary"><h2>Summary</h2><table>{table}</table>{latency}</section>'


def _comparison_rows(comparison: dict[str, Any]) -> str:
    out = []
    for name, row in comparison.items():
        if not isinstance(row, dict):
            continue
        fmt = _fmt_s if name in LATENCY_METRICS else _fmt
        out.append(f"<tr><td>{html.escape(name)}</td><td>{fmt(row.get('measured'))}</td><td>{fmt(row.get('predicted'))}</td><td>{_fmt(row.get('ratio'))}</td></tr>")
    return "".join(out)


def build_report(path: Path, out_dir: Path | None = None) -> Path:
    """Write report.html and its PNGs into ``out_dir`` (default: ``<results dir>/report``); return the HTML path."""
    results = load_results(path)
    source_dir = results.source if results.source.is_dir() else results.source.parent
    out_dir = Path(out_dir) if out_dir is not None else source_dir / "report"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpeedlimitError(f"cannot create {out_dir} ({error.strerror or error}); pass --out DIR") from None

    sections = []
    if results.sweep is None:
        sections.append(_summary_section(measured_summary(results)))
    else:
        info = results.sweep["sweep"]
        parameter = html.escape(str(info.get("parameter", "load")))
        rows = "".join(
            f"<tr><td>{r['load']:g}</td><td>{_fmt(r['output_tok_s'])}</td><td>{_fmt_s(r['ttft_s_p50'])}</td><td>{_fmt_s(r['ttft_s_p99'])}</td>"
            f"<td>{_fmt_s(r['itl_s_p50'])}</td><td>{_fmt_s(r['itl_s_p99'])}</td><td>{_fmt_s(r['e2e_s_p50'])}</td><td>{_fmt(r['failed'])}</td></tr>"
            for r in plots.sweep_rows(results.sweep)
        )
        knee = info.get("knee_load")
        knee_text = (
            f"Knee at {parameter} = {knee:g} ({_fmt(info.get('knee_output_tok_s'))} output tok/s, the lowest load reaching "
            f"{_fmt(100 * (info.get('knee_fraction') or 0.9))}% of the saturation throughput {_fmt(info.get('saturation_output_tok_s'))} tok/s)."
            if isinstance(knee, (int, float)) else "No knee in this sweep."
        )
        sweep_png = plots.plot_sweep(results.sweep, out_dir / "sweep.png")
        sections.append(
            f'<section id="sweep"><h2>Latency vs throughput across the sweep</h2><p>{knee_text}</p>'
            f"<table><tr><th>{parameter}</th><th>output tok/s</th><th>TTFT p50</th><th>TTFT p99</th><th>ITL p50</th><th>ITL p99</th><th>E2E p50</th><th>failed</th></tr>{rows}</table>"
            f"{_img(sweep_png, 'latency vs throughput')}</section>"
        )

    dist_png = plots.plot_distributions(results, out_dir / "distributions.png")
    sections.append(f'<section id="distributions"><h2>TTFT and inter-token latency distributions</h2>{_img(dist_png, "TTFT and ITL distributions")}</section>')

    comparison_html = _comparison_section(results, out_dir)
    if comparison_html:
        sections.append(comparison_html)

    timeline_png = plots.plot_timeline(results, out_dir / "timeline.png")
    sections.append(f'<section id="timeline"><h2>Per-request timeline</h2>{_img(timeline_png, "per-request timeline")}</section>')

    failed = results.failed
    if failed:
        kinds: dict[str, list[dict[str, Any]]] = {}
        for r in failed:
            kinds.setdefault(str(r.get("error_kind") or "error"), []).append(r)
        rows = "".join(
            f"<tr><td>{html.escape(kind)}</td><td>{len(rows)}</td><td class='text'>{html.escape(str(rows[0].get('error_text') or rows[0].get('error') or '')[:300])}</td></tr>"
            for kind, rows in sorted(kinds.items())
        )
        sections.append(f'<section id="errors"><h2>Errors</h2><table><tr><th>kind</th><th>count</th><th>example</th></tr>{rows}</table></section>')

    generated = _dt.datetime.now().isoformat(timespec="seconds")
    page = (
        f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>speedlimit report: {html.escape(results.source.name)}</title>"
        f"<style>{CSS}</style></head><body><h1>speedlimit report</h1>"
        f"<p class=\"muted\">{html.escape(str(results.source))} — {len(results.requests)} requests — generated {generated}</p>"
        + "".join(sections)
        + "</body></html>\n"
    )
    report_path = out_dir / "report.html"
    report_path.write_text(page, encoding="utf-8")
    return report_path


def _comparison_section(results: Results, out_dir: Path) -> str:
    if results.sweep is None:
        block = (results.summary or {}).get("estimate")
        if not isinstance(block, dict) or not isinstance(block.get("comparison"), dict):
            return ""
        png = plots.plot_comparison(block["comparison"], out_dir / "comparison.png")
        inputs = block.get("inputs") or {}
        what = f"{block.get('model', '?')} on {block.get('hardware', '?')}, " + ", ".join(f"{k} {v}" for k, v in inputs.items())
        return (
            f'<section id="comparison"><h2>Measured vs predicted</h2><p class="muted">Estimate for {html.escape(what)}.</p>'
            f"<table><tr><th>metric</th><th>measured</th><th>predicted</th><th>measured ÷ predicted</th></tr>{_comparison_rows(block['comparison'])}</table>"
            f"{_img(png, 'measured vs predicted')}</section>"
        )
    parameter = results.sweep["sweep"].get("parameter", "load")
    tables = []
    for point in results.sweep["points"]:
        block = point.get("estimate")
        if isinstance(block, dict) and isinstance(block.get("comparison"), dict):
            tables.append(f"<h3>{html.escape(str(parameter))} = {point.get('sweep_value', point.get(parameter))}</h3><table><tr><th>metric</th><th>measured</th><th>predicted</th><th>measured ÷ predicted</th></tr>{_comparison_rows(block['comparison'])}</table>")
    if not tables:
        return ""
    return '<section id="comparison"><h2>Measured vs predicted</h2>' + "".join(tables) + "</section>"
