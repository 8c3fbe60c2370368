"""Reports and plots: `speedlimit report` (bench results -> self-contained HTML + matplotlib PNGs) and
`plot_estimate` (the batch curve and roofline behind `speedlimit estimate --plot`).

Modules: `curves` (pure estimator curves, shared with the web page), `results` (reading bench output),
`plots` (matplotlib, Agg), `html` (the report page), `command` (the CLI shell). matplotlib is imported
only when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["build_report", "plot_estimate"]


def plot_estimate(model: Any, hardware: Any, out_path: str | Path, **estimate_kwargs: Any) -> Path:
    """Draw the batch curve (knee marked) and roofline (current point) of one configuration to a PNG."""
    from speedlimit.report.plots import plot_estimate as draw

    return draw(model, hardware, out_path, **estimate_kwargs)


def build_report(path: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write report.html and its PNGs for a bench requests.jsonl or output directory; return the HTML path."""
    from speedlimit.report.html import build_report as build

    return build(Path(path), Path(out_dir) if out_dir is not None else None)
