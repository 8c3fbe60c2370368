"""`speedlimit report`: the CLI shell over `speedlimit.report.build_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from speedlimit.report import build_report


def report_command(
    results: Annotated[Path, typer.Argument(help="bench's requests.jsonl, or its --out directory (a run or a sweep).")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory for report.html and the PNGs (default: <results dir>/report).")] = None,
) -> None:
    """Turn bench results into a self-contained HTML report with TTFT/ITL, sweep, comparison and timeline plots."""
    path = build_report(results, out)
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    typer.echo(f"report written to {path}" + (f" (PNGs: {', '.join(pngs)})" if pngs else ""))
