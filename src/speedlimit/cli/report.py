"""`speedlimit report`: the CLI shell over `speedlimit.report`: progress on stderr for big files, the note about
skipped lines on stderr, the path of the page on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

#: Files at least this big (all requests.jsonl of the results together) get a progress bar on stderr.
PROGRESS_MIN_BYTES = 16 << 20


class _ProgressBar:
    """A rich progress bar on stderr, started at the first report of a big enough read."""

    def __init__(self) -> None:
        self.bar = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if total < PROGRESS_MIN_BYTES or done >= total:
                return
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

            self.bar = Progress("reading requests", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                                console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("read", total=total)
        self.bar.update(self.task, completed=done, total=total)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def report_command(
    results: Annotated[Path, typer.Argument(help="A requests.jsonl, or the --out directory of bench or simulate (a run or a sweep).")],
    predicted: Annotated[Path | None, typer.Option("--predicted", "-p", help="Results to overlay as the prediction (e.g. simulate's --out directory): percentiles side by side with ratios, sweep curves on the same axes.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Directory for report.html and the PNGs (default: <results dir>/report).")] = None,
) -> None:
    """Turn bench (or simulate) results into a self-contained HTML report with TTFT/ITL, sweep, comparison and timeline plots.

    Examples: `speedlimit report runs/a`; `speedlimit report runs/measured --predicted runs/simulated -o cmp/`.
    """
    from speedlimit.report.html import render_report, skipped_message
    from speedlimit.report.results import load_results

    progress = _ProgressBar()
    try:
        measured = load_results(results, progress)
        other = load_results(predicted, progress) if predicted is not None else None
    finally:
        progress.close()
    for loaded in (measured, other):
        if loaded is not None and loaded.skipped:
            typer.echo(f"warning: {skipped_message(loaded)}", err=True)
    path = render_report(measured, out, other)
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    typer.echo(f"report written to {path}" + (f" (PNGs: {', '.join(pngs)})" if pngs else ""))
