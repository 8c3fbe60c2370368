"""Terminal output of `speedlimit bench`: the rich live progress line and the final tables (no metrics math here)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from speedlimit.artifacts import PredictionBlock, RequestRecord, RunSummary, SelfChecks, SweepSummary
from speedlimit.bench.describe import self_check_lines, server_lines, workers_line


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


def summary_table(summary: RunSummary, title: str = "speedlimit bench") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("latency (ms)")
    for column in ("mean", "p50", "p90", "p95", "p99"):
        table.add_column(column, justify="right")
    rows = (("TTFT", summary.ttft_s), ("ITL per chunk", summary.itl_s), ("ITL per token", summary.itl_token_s),
            ("TPOT (per token)", summary.tpot_s), ("E2E", summary.e2e_s))
    for label, stats in rows:
        table.add_row(label, *(_ms(getattr(stats, c)) for c in ("mean", "p50", "p90", "p95", "p99")))
    return table


def totals_table(summary: RunSummary) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    errors = ", ".join(f"{kind} {count}" for kind, count in summary.errors.items()) or "none"
    slo = ", ".join(f"{key} ≤ {bound * 1e3:g} ms" for key, bound in summary.slo.items())
    sent = f"{summary.completed} completed / {summary.requests} sent"
    if summary.cancelled:
        sent += f" ({summary.cancelled} cancelled by {summary.interrupted or 'an interruption'})"
    rows = [
        ("requests", sent),
        ("errors", errors),
        ("duration", f"{summary.duration_s:.2f} s"),
        ("requests/s", f"{summary.request_s:.3f}"),
        ("output tok/s", f"{summary.output_tok_s:,.1f}"),
        ("total tok/s", f"{summary.total_tok_s:,.1f}"),
        ("goodput req/s", f"{summary.goodput_request_s:.3f}" + (f"  (SLO {slo})" if slo
                                                                else "  (no --slo: every completed request)")),
        ("token counts", f"output: {summary.token_count_source}, prompt: {summary.prompt_token_source}"),
    ]
    if summary.workers is not None:
        rows.append(("workers", workers_line(summary.workers)))
    if summary.retried:
        rows.insert(2, ("retried", f"{summary.retried} (failed before any response byte on a reused connection)"))
    for name, value in rows:
        table.add_row(name, Text(value))
    return table


def checks_table(summary: RunSummary) -> Table | None:
    rows = []
    if summary.server is not None:
        rows.extend(server_lines(summary.server))
    if summary.self_checks is not None:
        rows.extend(self_check_lines(summary.self_checks))
    if not rows:
        return None
    table = Table(title="self-checks and the server's view", title_justify="left", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for name, value in rows:
        table.add_row(name, Text(value))
    return table


def estimate_title(block: PredictionBlock, *, skip: tuple[str, ...] = ()) -> Text:
    """"vs simulate: MODEL on HARDWARE (its inputs, the engine it ran and where each came from)"; ``skip``: inputs
    left out (a sweep's table has a column for them)."""
    parts = []
    # the layout's last figure says where the layout came from (tp_from_server: runs of before dp and ep)
    layout_keys = [key for key in ("tp", "dp", "ep") if key in block.inputs]
    from_server = "layout_from_server" in block.inputs or "tp_from_server" in block.inputs
    for key, value in block.inputs.items():
        if key in ("engine_from_server", "tp_from_server", "layout_from_server") or key in skip:  # flags, columns
            continue
        parts.append(f"{key} {value:g}" + (" (the server's)" if from_server and key in layout_keys[-1:] else ""))
    engine = (block.predicted.get("engine") or {}) if isinstance(block.predicted, dict) else {}
    name = engine.get("engine") if isinstance(engine, dict) else None
    if isinstance(name, str):  # the profile the replay ran (a catalog key), and why
        parts.append(f"engine {name}" + (" (the server's, from its /metrics)" if "engine_from_server" in block.inputs
                                         else ""))
    inputs = ", ".join(parts)
    return Text(f"vs {block.method}: {block.model} on {block.hardware} ({inputs})")


def estimate_table(block: PredictionBlock) -> Table:
    table = Table(title=estimate_title(block), title_justify="left")
    for column in ("metric", "measured", "predicted", "measured/predicted"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    fmt = (lambda v: "-" if v is None else f"{v:.4g}")
    for label, row in block.comparison.items():
        table.add_row(label, fmt(row.measured), fmt(row.predicted), fmt(row.ratio))
    return table


def sweep_table(summary: SweepSummary) -> Table:
    sweep = summary.sweep
    parameter = sweep.parameter
    table = Table(title=f"sweep over {parameter}: saturation {sweep.saturation_output_tok_s or 0:,.1f} out tok/s "
                        f"at {sweep.saturation_load or 0:g}, knee at {parameter}={sweep.knee_load or 0:g}",
                  title_justify="left")
    checked = any(point.self_checks is not None for point in summary.points)
    for column in (parameter, "req/s", "out tok/s", "TTFT p50 ms", "TPOT p50 ms", "E2E p99 ms", "errors"):
        table.add_column(column, justify="right")
    if checked:
        table.add_column("self-check")
    for point in summary.points:
        row = [f"{point.sweep_value or 0:g}", f"{point.request_s:.3f}", f"{point.output_tok_s:,.1f}",
               _ms(point.ttft_s.p50), _ms(point.tpot_s.p50), _ms(point.e2e_s.p99), str(point.failed)]
        if checked:
            row.append(self_check_flag(point.self_checks))
        table.add_row(*row)
    return table


#: What a sweep's comparison shows per level: (column, comparison key).
SWEEP_COMPARED = (("TTFT p50 ms", "ttft_s.p50"), ("TPOT ms", "tpot_s.mean"), ("out tok/s", "output_tok_s"))


def sweep_estimate_table(summary: SweepSummary) -> Table | None:
    """Each level's measured and predicted (pred.) TTFT p50, mean TPOT and output throughput, where
    --compare-estimate replayed them (the title is the first replayed level's; every figure and percentile is in each
    level's summary)."""
    blocks = [point.estimate for point in summary.points if point.estimate is not None]
    if not blocks:
        return None
    table = Table(title=estimate_title(blocks[0], skip=("requests", "concurrency", "rate", "prompt", "output")),
                  title_justify="left")
    table.add_column(summary.sweep.parameter, justify="right")
    for column, _ in SWEEP_COMPARED:
        table.add_column(column, justify="right")
        table.add_column("pred.", justify="right")
    table.add_column("tok/s meas./ pred.", justify="right")
    fmt = (lambda v, scale=1.0: "-" if v is None else f"{v * scale:,.4g}")
    for point in summary.points:
        if point.estimate is None:
            continue
        rows = point.estimate.comparison
        cells = [f"{point.sweep_value or 0:g}"]
        for _, key in SWEEP_COMPARED:
            row = rows.get(key)
            scale = 1.0 if key == "output_tok_s" else 1000.0
            cells += [fmt(row.measured if row else None, scale), fmt(row.predicted if row else None, scale)]
        throughput = rows.get("output_tok_s")
        cells.append(fmt(throughput.ratio if throughput else None))
        table.add_row(*cells)
    return table


def self_check_flag(checks: SelfChecks | None) -> str:
    """One word or a few for a sweep level: ok, or which self-check failed (details in its summary.json)."""
    if checks is None:
        return "-"
    from speedlimit.bench.selfcheck import LATE_SHARE_BAD

    flags = []
    if checks.client is not None and checks.client.bottleneck:
        flags.append("CLIENT-BOUND")
    if checks.arrivals is not None and checks.arrivals.late > LATE_SHARE_BAD * checks.arrivals.requests:
        flags.append("sent late")
    if checks.output_length is not None and (checks.output_length.more or checks.output_length.fewer):
        flags.append("lengths off")
    return ", ".join(flags) or "ok"


def print_summary(console: Console, summary: RunSummary | SweepSummary) -> None:
    if isinstance(summary, SweepSummary):
        console.print(sweep_table(summary))
        compared = sweep_estimate_table(summary)
        if compared is not None:
            console.print(compared)
        return
    console.print(summary_table(summary))
    console.print(totals_table(summary))
    checks = checks_table(summary)
    if checks is not None:
        console.print(checks)
    if summary.estimate is not None:
        console.print(estimate_table(summary.estimate))


def print_warnings(console: Console, summary: RunSummary | SweepSummary) -> None:
    """Each distinct warning of the run (or of the sweep's points) once, loudly, on `console` (stderr)."""
    points = summary.points if isinstance(summary, SweepSummary) else [summary]
    seen: list[str] = []
    for point in points:
        seen.extend(w for w in point.warnings if w not in seen)
    for warning in seen:
        console.print(Text("warning: ", style="bold yellow") + Text(warning), soft_wrap=True)
    notes: list[str] = []
    for point in points:
        notes.extend(n for n in point.notes if n not in notes)
    for note in notes:
        console.print(Text("note: ", style="bold") + Text(note), soft_wrap=True)


def print_interrupted(console: Console, summary: RunSummary | SweepSummary, out: Path | None) -> None:
    """Where an interrupted run stands and where its results are."""
    points = summary.points if isinstance(summary, SweepSummary) else [summary]
    finished = sum(p.requests - p.cancelled for p in points)
    cancelled = sum(p.cancelled for p in points)
    signal = summary.interrupted or "a signal"
    what = f"{finished} request(s) finished, {cancelled} in flight recorded as cancelled"
    if isinstance(summary, SweepSummary):
        levels = ", ".join(f"{p.sweep_value:g}" + (" (partial)" if p.interrupted else "") for p in points)
        what += f"; {summary.sweep.parameter} levels run: {levels or 'none'} of {len(summary.sweep.values)}"
    where = (f"summary and requests written to {out}/" if out is not None
             else "nothing written (no --out)")
    console.print(Text(f"interrupted by {signal}: {what}; {where}"), soft_wrap=True)
