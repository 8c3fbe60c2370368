"""Terminal output of `speedlimit bench`: the rich live progress line and the final tables (no metrics math here)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from speedlimit.bench.metrics import RequestRecord


class LiveProgress:
    """A rich progress bar (on stderr) with running ok/error counts and output tok/s; updates are cheap counters."""

    def __init__(self, console: Console, description: str, total: int | None) -> None:
        self.completed = 0
        self.errors = 0
        self.tokens = 0
        self.start = time.perf_counter()
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[stats]}"), console=console,
                                 transient=True, refresh_per_second=4)
        self.task = self.progress.add_task(description, total=total, stats="")
        self.progress.start()

    def advance(self, record: RequestRecord) -> None:
        if record.ok:
            self.completed += 1
            self.tokens += record.output_tokens or 0
        else:
            self.errors += 1
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.progress.update(self.task, advance=1,
                             stats=f"ok {self.completed}  err {self.errors}  {self.tokens / elapsed:,.0f} out tok/s")

    def close(self) -> None:
        self.progress.stop()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.2f}"


def summary_table(summary: dict[str, Any], title: str = "speedlimit bench") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("latency (ms)")
    for column in ("mean", "p50", "p90", "p95", "p99"):
        table.add_column(column, justify="right")
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        stats = summary[key]
        table.add_row(label, *(_ms(stats.get(c)) for c in ("mean", "p50", "p90", "p95", "p99")))
    return table


def totals_table(summary: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    errors = ", ".join(f"{kind} {count}" for kind, count in summary["errors"].items()) or "none"
    rows = [
        ("requests", f"{summary['completed']} completed / {summary['requests']} sent"),
        ("errors", errors),
        ("duration", f"{summary['duration_s']:.2f} s"),
        ("requests/s", f"{summary['request_s']:.3f}"),
        ("output tok/s", f"{summary['output_tok_s']:,.1f}"),
        ("total tok/s", f"{summary['total_tok_s']:,.1f}"),
        ("goodput req/s", f"{summary['goodput_request_s']:.3f}" + (f"  (SLO {summary['slo']})" if summary["slo"]
                                                                   else "  (no --slo: every completed request)")),
        ("token counts", f"output: {summary['token_count_source']}, prompt: {summary['prompt_token_source']}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def estimate_table(block: dict[str, Any]) -> Table:
    table = Table(title=f"vs estimate: {block['model']} on {block['hardware']} {block['inputs']}", title_justify="left")
    for column in ("metric", "measured", "predicted", "measured/predicted"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for label, row in block["comparison"].items():
        fmt = (lambda v: "-" if v is None else f"{v:.4g}")
        table.add_row(label, fmt(row["measured"]), fmt(row["predicted"]), fmt(row["ratio"]))
    return table


def sweep_table(summary: dict[str, Any]) -> Table:
    sweep = summary["sweep"]
    parameter = sweep["parameter"]
    table = Table(title=f"sweep over {parameter}: saturation {sweep['saturation_output_tok_s']:,.1f} out tok/s "
                        f"at {sweep['saturation_load']:g}, knee at {parameter}={sweep['knee_load']:g}",
                  title_justify="left")
    for column in (parameter, "req/s", "out tok/s", "TTFT p50 ms", "ITL p50 ms", "E2E p99 ms", "errors"):
        table.add_column(column, justify="right")
    for point in summary["points"]:
        table.add_row(f"{point[parameter]:g}", f"{point['request_s']:.3f}", f"{point['output_tok_s']:,.1f}",
                      _ms(point["ttft_s"]["p50"]), _ms(point["itl_s"]["p50"]), _ms(point["e2e_s"]["p99"]),
                      str(point["failed"]))
    return table


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    if "sweep" in summary:
        console.print(sweep_table(summary))
        return
    console.print(summary_table(summary))
    console.print(totals_table(summary))
    if "estimate" in summary:
        console.print(estimate_table(summary["estimate"]))
