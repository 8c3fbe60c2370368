"""Reports and plots: `speedlimit report` (a run or sweep of bench or simulate -> self-contained HTML + matplotlib
PNGs, optionally a predicted run overlaid on a measured one) and `plot_estimate` (the batch curve and roofline
behind `speedlimit estimate --plot`).

Modules: `results` (reading results through `speedlimit.artifacts` into numpy columns), `plots` (matplotlib, Agg),
`html` (the page: Jinja2 template ``templates/report.html.j2`` with autoescape). The CLI shell is
`speedlimit.cli.report`. matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["build_report", "plot_estimate"]


def plot_estimate(model: Any, hardware: Any, out_path: str | Path, **estimate_kwargs: Any) -> Path:
    """Draw the batch curve (knee marked) and roofline (current point) of one configuration to a PNG."""
    from speedlimit.report.plots import plot_estimate as draw

    return draw(model, hardware, out_path, **estimate_kwargs)


def build_report(path: str | Path, out_dir: str | Path | None = None, predicted: str | Path | None = None) -> Path:
    """Write report.html and its PNGs for the results at ``path`` (a requests.jsonl, a run or a sweep directory of
    bench or simulate), with the results at ``predicted`` overlaid when given; return the HTML path."""
    from speedlimit.report.html import build_report as build

    return build(Path(path), Path(out_dir) if out_dir is not None else None, Path(predicted) if predicted is not None else None)
