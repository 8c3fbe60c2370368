"""The typer commands `speedlimit verify` and `speedlimit calibrate`, and their rich tables.

`verify_command` turns flags into `VerifySettings`, runs `run.run_verify` under a rich progress bar (on
stderr, only when it is a terminal) and prints the side-by-side tables or ``--json``. `calibrate_command`
reads results files, fits through `speedlimit.verify.fit` and saves the profile.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from speedlimit.cli.options import flag_option
from speedlimit.errors import SpeedlimitError, pydantic_message, write_error

if TYPE_CHECKING:
    from speedlimit.verify.run import DecodePoint, PrefillPoint, VerifyResult


def _gb(value: float | None) -> str:
    return "—" if value is None else f"{value / 1e9:,.2f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:,.1f} ms"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


def _parse_counts(text: str, flag: str, what: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise SpeedlimitError(f"{flag} must be comma-separated {what}, got {text!r}") from None


def parse_contexts(text: str | None) -> list[int] | None:
    if text is None:
        return None
    values = _parse_counts(text, "--contexts", "token counts like 128,512,2048")
    if not values or any(v < 1 for v in values):
        raise SpeedlimitError(f"--contexts must be positive token counts like 128,512,2048, got {text!r}")
    return values


def parse_sequences(text: str | None) -> list[int] | None:
    """--batch-sequences: counts like 1,2,4 (checked by VerifySettings), or none (also empty or 0) to skip."""
    if text is None:
        return None
    if text.strip() in ("", "0", "none"):
        return []
    return _parse_counts(text, "--batch-sequences", "sequence counts like 1,2,4 (or none)")


def _measured(point: PrefillPoint | DecodePoint, value: str) -> str:
    from speedlimit.verify.run import NOISY_SPREAD

    return f"{value} [yellow]*[/yellow]" if point.runs_spread > NOISY_SPREAD else value


def render_verify(console: Console, result: VerifyResult) -> None:
    machine, model, engine = result.machine, result.model, result.engine
    bw = Table(title=f"This machine: {escape(machine.cpu)}, {machine.cores} cores, "
                     f"{(machine.memory_bytes or 0) / 2**30:.1f} GiB RAM", title_justify="left")
    bw.add_column("measurement")
    bw.add_column("threads", justify="right")
    bw.add_column("best", justify="right")
    bw.add_column("all runs", justify="right")
    for kernel in result.bandwidth.kernels:
        bw.add_row(f"bandwidth: {kernel.kernel}", str(kernel.threads), f"{_gb(kernel.best_Bps)} GB/s",
                   " ".join(f"{r / 1e9:.1f}" for r in kernel.runs_Bps))
    matmul = result.matmul
    bw.add_row(f"matmul fp32 {matmul.n}²", "BLAS", f"{matmul.best_flops / 1e9:,.1f} GFLOP/s",
               " ".join(f"{r / 1e9:.0f}" for r in matmul.runs_flops))
    clock = machine.clock
    if clock is not None and clock.hz_one_core is not None:
        bw.add_row("clock (dependent adds)", "1", f"{clock.hz_one_core / 1e9:.2f} GHz", "")
        if clock.busy_cores > 1 and clock.hz_all_busy is not None:
            bw.add_row("clock (dependent adds)", str(clock.busy_cores), f"{clock.hz_all_busy / 1e9:.2f} GHz", "slowest core")
    console.print(bw)
    console.print(f"[dim]bandwidth counted as STREAM does (no write-allocate); roofline uses "
                  f"{_gb(result.measured_bandwidth_Bps)} GB/s = {result.bandwidth.basis}[/dim]")
    if machine.layout is not None:
        console.print(f"CPU layout: {escape(machine.layout.describe())} [dim]({escape(machine.layout.source)})[/dim]")
        for note in machine.layout.notes:
            console.print(f"[yellow]note:[/yellow] {escape(note)}")

    threads = result.threads
    settings = result.settings
    side = Table(title=f"{escape(model.name)} ({escape(model.file_type)}, {model.file_bytes / 1e6:,.0f} MB) in llama-cpp-python "
                       f"{engine.version}, {threads} thread{'s' if threads > 1 else ''}, median of {settings.runs} runs", title_justify="left")
    side.add_column("")
    side.add_column("measured", justify="right")
    side.add_column("predicted", justify="right")
    side.add_column("roofline limit", justify="right")
    side.add_column("measured ÷ limit", justify="right")
    headline = next(p for p in result.decode if p.kind == "base" and p.threads == threads)
    headline_prefill = next(p for p in result.prefill if p.threads == threads)
    side.add_row(f"decode tok/s (ctx {settings.prompt_tokens}, {settings.decode_tokens} tokens)",
                 _measured(headline, _num(result.decode_tok_s_measured)), _num(result.decode_tok_s_predicted),
                 _num(result.decode_tok_s_limit), _pct(result.efficiency))
    side.add_row(f"TTFT ({settings.prompt_tokens}-token prompt)", _measured(headline_prefill, _ms(result.ttft_s_measured)),
                 _ms(result.ttft_s_predicted), _ms(result.ttft_s_limit),
                 _pct(result.prefill_efficiency))
    side.add_row("prefill tok/s", _num(result.prefill_tok_s_measured),
                 _num(settings.prompt_tokens / result.ttft_s_predicted if result.ttft_s_predicted else None),
                 _num(settings.prompt_tokens / result.ttft_s_limit if result.ttft_s_limit else None), "")
    console.print(side)
    eff = result.default_efficiency
    console.print(f"bytes streamed per token: {result.bytes_per_token / 1e6:,.1f} MB   FLOPs per token: "
                  f"{result.flops_per_token / 1e9:,.2f} G   regime: [bold]{result.regime}-bound[/bold]")
    if engine.kernel_profile:
        console.print(f"[dim]predicted = estimator on the measured bandwidth with default CPU efficiencies (bw "
                      f"{eff.bw_efficiency:g}, overhead {eff.step_overhead_s * 1e3:.3g} ms) and llama.cpp's kernel rates "
                      f"for this build at the measured clock, its matmuls' and, where fold C timed it, its attention "
                      f"kernel's (profile {escape(engine.kernel_profile)}: "
                      f"{escape(engine.kernel_profile_basis)}); limit = 100% of measured bandwidth and BLAS FLOP/s, "
                      f"no overhead[/dim]")
    else:
        console.print(f"[dim]predicted = estimator on the measured bandwidth/FLOPs with default CPU efficiencies "
                      f"(bw {eff.bw_efficiency:g}, FLOPs {eff.flops_efficiency:g}, overhead "
                      f"{eff.step_overhead_s * 1e3:g} ms); limit = 100% of measured, no overhead[/dim]")
        if engine.kernel_profile_basis:
            console.print(f"[dim]no kernel rates: {escape(engine.kernel_profile_basis)}[/dim]")

    contexts = [p for p in result.decode if p.kind == "context"]
    if contexts:
        table = Table(title=f"Decode vs context ({threads} thread{'s' if threads > 1 else ''})", title_justify="left")
        for name in ("context", "measured tok/s", "predicted", "limit", "measured ÷ limit", "MB/token"):
            table.add_column(name, justify="right")
        for point in contexts:
            table.add_row(f"{point.context_start:,}", _measured(point, _num(point.tok_s)), _num(point.tok_s_predicted),
                          _num(point.tok_s_limit), _pct(point.efficiency), f"{point.bytes_per_token / 1e6:,.1f}")
        console.print(table)
    batched = result.batched_decode
    if batched:
        context = batched[0].context
        table = Table(title=f"Decode of several sequences together (each at context {context:,}, {threads} "
                            f"thread{'s' if threads > 1 else ''})", title_justify="left")
        for name in ("sequences", "measured ms/step", "predicted", "limit", "measured tok/s (all)", "predicted tok/s"):
            table.add_column(name, justify="right")
        for point in batched:
            predicted = point.step_s_predicted
            table.add_row(str(point.sequences), _ms(point.step_s).removesuffix(" ms"),
                          _ms(predicted).removesuffix(" ms"), _ms(point.step_s_limit).removesuffix(" ms"),
                          _num(point.tok_s), _num(point.sequences / predicted if predicted else None))
        console.print(table)
        console.print("[dim]median over the steps; what each further sequence adds is what `speedlimit calibrate` "
                      "fits as the per-sequence cost[/dim]")
    if result.batched_decode_error:
        console.print(f"[yellow]note: the decode of several sequences stopped: {escape(result.batched_decode_error)}[/yellow]")
    base = [p for p in result.decode if p.kind == "base"]
    if len(base) > 1:
        table = Table(title=f"Threads (ctx {settings.prompt_tokens})", title_justify="left")
        for name in ("threads", "bandwidth GB/s", "decode tok/s", "limit", "measured ÷ limit", "prefill tok/s"):
            table.add_column(name, justify="right")
        prefill = {p.threads: p for p in result.prefill}
        for point in base:
            table.add_row(str(point.threads), _gb(point.bandwidth_Bps), _measured(point, _num(point.tok_s)), _num(point.tok_s_limit),
                          _pct(point.efficiency), _num(prefill[point.threads].tok_s))
        console.print(table)
    from speedlimit.verify.run import NOISY_SPREAD

    if any(p.runs_spread > NOISY_SPREAD for p in result.decode + result.prefill):
        console.print(f"[yellow]*[/yellow] runs of this measurement differ by more than {NOISY_SPREAD}×: other load "
                      "disturbed some of them (the median is shown; every run is in --json)")
    load = machine.load_average_start
    if load and load[0] > 0.5 * machine.cores:
        console.print(f"[yellow]note: load average was {load[0]:.1f} on {machine.cores} cores when verify started; "
                      "other work competes for the same cores and memory[/yellow]")


def verify_command(
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="GGUF file to run (default: the bundled SmolLM2-135M-Instruct Q4_1)."),
    quick: bool = flag_option("--quick/--no-quick", "Short settings that finish in under a minute on 2 cores.", default=False),
    threads: Optional[int] = typer.Option(None, "--threads", "-t", help="Engine threads (default: all cores)."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="Prompt length for prefill/TTFT (default 512; --quick 128)."),
    decode_tokens: Optional[int] = typer.Option(None, "--decode-tokens", help="Tokens per decode run (default 64; --quick 32)."),
    runs: Optional[int] = typer.Option(None, "--runs", help="Timed runs per measurement, median reported (default 5; --quick 3)."),
    contexts: Optional[str] = typer.Option(None, "--contexts", help="Decode-vs-context sweep, comma-separated (default 128,512,1024,2048,4096; --quick 128,512,1024)."),
    batch_sequences: Optional[str] = typer.Option(None, "--batch-sequences", help="Also time decode steps of this many sequences together, comma-separated, at the first context (default 1,2,4; none to skip)."),
    single_thread: bool = flag_option("--single-thread/--no-single-thread", "Also measure with 1 thread.", default=True),
    array_mib: Optional[int] = typer.Option(None, "--array-mib", help="Size of each bandwidth array in MiB (default 256)."),
    json_output: bool = flag_option("--json/--no-json", "Print the full result as JSON.", default=False),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result JSON here (updated after every stage)."),
    show_progress: bool = flag_option("--progress/--no-progress", "Show live progress on stderr (a terminal only).",
                                      default=True),
) -> None:
    """Measure this machine's speed limits, run a real model, and compare with the estimator.

    Ctrl-C (or SIGTERM) stops it after the measurement under way: what was measured is written to --out (marked
    ``interrupted``, not ``complete``) and the exit code is 130; a second Ctrl-C quits at once.
    """
    from speedlimit.verify.run import StopFlag, VerifyInterrupted, VerifySettings, run_verify, total_steps

    if model is None:
        from speedlimit.bundled import default_gguf_path

        model = default_gguf_path()
    overrides: dict[str, Any] = dict(model_path=model, threads=threads, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens,
                                     runs=runs, contexts=parse_contexts(contexts), array_mib=array_mib,
                                     batch_sequences=parse_sequences(batch_sequences))
    try:
        if quick:
            settings = VerifySettings.quick_preset(**overrides, single_thread=single_thread)
        else:
            settings = VerifySettings(**{k: v for k, v in overrides.items() if v is not None}, single_thread=single_thread)
    except ValidationError as error:
        raise SpeedlimitError(f"bad verify setting: {pydantic_message(error)}") from None
    if out is not None and out.exists() and out.is_dir():
        raise SpeedlimitError(f"--out {out} is a directory; give a file name like verify.json")

    stderr = Console(stderr=True)
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=stderr, transient=True,
                        disable=not (show_progress and stderr.is_terminal))
    with progress:
        task = progress.add_task("verify", total=total_steps(settings))

        def on_step(label: str) -> None:
            progress.update(task, description=label)
            progress.advance(task)

        stop = StopFlag()
        try:
            with stop.on_signals("stopping after the measurement under way (Ctrl-C again to quit at once)"):
                result = run_verify(settings, out=out, on_step=on_step, stop=stop)
        except MemoryError:
            raise SpeedlimitError("ran out of memory: use a smaller --array-mib, --model or --contexts") from None
        except VerifyInterrupted as interruption:
            progress.stop()
            _report_interrupted(stderr, interruption, out, json_output)
            raise typer.Exit(code=130) from None
    if json_output:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        console = Console()
        render_verify(console, result)
        if out is not None:
            console.print(f"results written to {out}")


def _report_interrupted(stderr: Console, interruption: Any, out: Path | None, json_output: bool) -> None:
    """Where an interrupted verify stands: how far it got, and where the partial result is."""
    result = interruption.result
    if json_output and result is not None:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    got = []
    if result is not None:
        if result.measured_bandwidth_Bps:
            got.append("bandwidth")
        if result.measured_flops:
            got.append("FLOP/s")
        if result.prefill or result.decode:
            got.append(f"{len(result.prefill)} prefill and {len(result.decode)} decode point(s)")
    what = ", ".join(got) or "nothing measured yet"
    if out is None:
        where = "nothing written (no --out)"
    elif result is None:
        where = f"nothing written to {out}"
    else:
        where = f"partial result (interrupted, not complete) written to {out}"
    stderr.print(f"interrupted by {interruption.signal_name} after {interruption.steps_done} of "
                 f"{interruption.steps_total} steps: {what}; {where}", highlight=False, soft_wrap=True, markup=False)


def calibrate_command(
    results: list[Path] = typer.Argument(..., help="`speedlimit verify --out` files and/or bench summary.json files, "
                                                   "or one bench --sweep run directory (summary.json + requests.jsonl)."),
    name: str = typer.Option("local", "--name", help="Profile name; then use `--hardware NAME`."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Base hardware whose peaks the fractions refer to "
                                           "(default: the machine measured by verify, else the bench run's hardware)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the profile TOML here instead of the config dir."),
    force: bool = flag_option("--force/--no-force", "Save the fit even when it predicts the measurements worse than "
                                                    "the defaults did, or misses them by more than 25% on average.",
                              default=False),
    json_output: bool = flag_option("--json/--no-json", "Print the fit as JSON.", default=False),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Bench run directory: the model the server ran "
                                        "(default: the model name the run recorded)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Bench run directory: the serving engine's profile, the "
                                         "prior (default llama.cpp)."),
    tp: int = typer.Option(1, "--tp", help="Bench run directory: tensor-parallel devices."),
    weights: Optional[str] = typer.Option(None, "--weights", help="Bench run directory: the weight format served."),
    kv: Optional[str] = typer.Option(None, "--kv", help="Bench run directory: the KV-cache format (default: the engine's)."),
) -> None:
    """Fit achievable bandwidth/FLOPs fractions and per-step overhead, and save them as a hardware profile.

    The fit is always printed; it is saved only when it predicts the measurements at least as well as the
    defaults did and misses them by at most 25% on average (or with --force). A profile that cannot be written is an
    error after the fit is shown.
    A bench sweep directory is fitted on a fixed half of its levels and scored on the others (printed).
    """
    if any(path.is_dir() for path in results):
        if len(results) != 1:
            raise SpeedlimitError("give one bench run directory (a --sweep run's --out), without other files")
        _calibrate_deployment(results[0], name=name, hardware=hardware, out=out, force=force, json_output=json_output,
                              model=model, engine=engine, tp=tp, weights=weights, kv=kv)
        return
    for flag, value in (("--model", model), ("--engine", engine), ("--weights", weights), ("--kv", kv)):
        if value is not None:
            raise SpeedlimitError(f"{flag} applies to a bench run directory; verify results and summaries name their own")
    from speedlimit.catalog import resolve_hardware
    from speedlimit.catalog.profiles import profile_path, profiles_dir, save_profile
    from speedlimit.estimator.api import bandwidth_reach
    from speedlimit.verify.fit import (LAYOUT_FIELDS, MAX_OWN_ERROR, fit_calibration, load_calibration_inputs,
                                       prior_efficiency, profile_record)

    profile_path(name)  # validate the name before any work
    if out is not None and out.is_dir():
        raise SpeedlimitError(f"--out {out} is a directory; give a file name like {name}.toml")
    points, measured, bench_hardware, notes = load_calibration_inputs(results)
    if hardware is not None:
        base = resolve_hardware(hardware)
    elif measured is not None:
        base = measured
    elif bench_hardware:
        base = resolve_hardware(bench_hardware)
    else:
        raise SpeedlimitError("cannot tell which hardware these results are from: pass --hardware NAME")
    flops = base.peak_flops("bf16")
    # a CPU's fit is relative to what llama.cpp's default threads reach (bandwidth_reach): the bandwidth estimate
    # prices, so that the profile's bw_efficiency applies to it (a verify run's machine has as many cores as it ran)
    reach = bandwidth_reach(base)
    # a recorded prediction is the prior only where it was priced on this base: verify priced its own "predicted"
    # column for the machine it measured (and its attention kernel apart at that machine's clock: another base's
    # profile prices attention in the roofline), a bench summary's estimate block for the hardware it names
    priced_here = {name: _resolves_to(name, base) for name in {p.priced_on for p in points if p.priced_on}}
    points = [point if (priced_here[point.priced_on] if point.priced_on else base is measured) else
              dataclasses.replace(point if point.priced_on else point.with_attention(), prior_s=None)
              for point in points]
    if any(point.prior_s is not None and point.priced_on for point in points):
        notes.append(f"before: the estimate's own decode step as each bench summary recorded it (its estimate block, "
                     f"priced on {base.name})")
    if base is measured and any(point.prior_s is not None and not point.priced_on for point in points):
        notes.append("before: the estimate's own predictions as verify recorded them (its \"predicted\" column: the kernel "
                     "rates of the build it ran, at the clock it measured); the default efficiencies price the rest")
    fit = fit_calibration(points, reach.bandwidth_Bps if reach else base.memory_bandwidth_Bps, flops, prior_efficiency(base))
    fit.notes[:0] = notes
    apart = [point for point in fit.points if point.attention_s > 0]
    kernel = base.attention_flops_per_core if apart else None
    if kernel:
        fit.notes.append(_attention_note(apart, f"the build's measured rate (fold C: {kernel[0] / 1e9:.3g} / "
                                                f"{kernel[1] / 1e9:.3g} GFLOP/s per core, decode / prefill), not fitted"))

    before, after = fit.error_before["all"], fit.error_after["all"]
    problem: str | None = None
    path: Path | None = None
    if before is not None and after is not None and after > before and not force:
        problem = (f"not saved: the fit predicts these measurements worse than the defaults (mean error {after:.0%} vs "
                   f"{before:.0%}); check the inputs, or pass --force to save it anyway")
    elif after is not None and after > MAX_OWN_ERROR and not force:
        # the same bar as a bench sweep's fit: a profile that misses the measurements it was made from is no
        # description of the machine (a verify run disturbed by other load gives such points)
        problem = (f"not saved: the fit misses its own measurements by {after:.0%} on average (more than "
                   f"{MAX_OWN_ERROR:.0%}): they do not follow the step model; rerun verify on an idle machine, or pass "
                   "--force to save it anyway")
    else:
        try:
            path = save_profile(name, profile_record(name, base, fit, [str(p) for p in results]), out)
        except OSError as error:
            target = out or profile_path(name)
            problem = (f"{write_error(target, error, 'the profile')}; the fit is above: pass --out FILE to write it "
                       f"elsewhere (a profile is used as --hardware NAME from {profiles_dir()})")
    if json_output:
        payload = {"profile": name, "path": str(path) if path else None, "saved": path is not None,
                   "base_hardware": base.key, "bandwidth_Bps": base.memory_bandwidth_Bps,
                   "layout": {field: getattr(base, field) for field in LAYOUT_FIELDS} if base.topology else None,
                   "flops": fit.flops if fit.flops and math.isfinite(fit.flops) else None, "bw_efficiency": fit.bw_efficiency, "flops_efficiency": fit.flops_efficiency,
                   "step_overhead_s": fit.step_overhead_s, "sequence_overhead_s": fit.sequence_overhead_s,
                   "stream_compute_overlap": fit.stream_compute_overlap,
                   "attention_flops_per_core": list(kernel) if kernel else None,
                   "error_before": _finite_values(fit.error_before),
                   "error_after": _finite_values(fit.error_after),
                   "default_efficiency": fit.before.model_dump(), "points": len(fit.points),
                   "excluded": [point.label for point in fit.excluded], "notes": fit.notes}
        sys.stdout.write(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    else:
        _print_fit(Console(), base, flops, fit)
    if problem is not None:
        raise SpeedlimitError(problem)
    if not json_output:
        use = f"--hardware {name}" if out is None else f"--hardware {name} after copying it to {profiles_dir()}"
        Console().print(f"profile saved to {escape(str(path))}\nuse it: speedlimit estimate {escape(use)} --model ...",
                        highlight=False)


def _finite_values(errors: dict[str, float | None]) -> dict[str, float | None]:
    """Mean errors for JSON: one that overflowed (a measured step of ~0 s in a hand-edited file) is null."""
    return {kind: value if value is not None and math.isfinite(value) else None for kind, value in errors.items()}


def _efficiency_table(before_label: str, before: Any, after: Any, *, per_sequence: bool = False) -> Table:
    """The fitted values beside the ones the fit started from (both fits: a verify result's and a deployment's)."""
    table = Table(show_header=True)
    table.add_column("")
    table.add_column(before_label, justify="right")
    table.add_column("fitted", justify="right")
    table.add_row("bw_efficiency", f"{before.bw_efficiency:.3f}", f"{after.bw_efficiency:.3f}")
    table.add_row("flops_efficiency", f"{before.flops_efficiency:.3f}", f"{after.flops_efficiency:.3f}")
    table.add_row("step_overhead_s", f"{before.step_overhead_s * 1e3:.3f} ms", f"{after.step_overhead_s * 1e3:.3f} ms")
    if per_sequence:
        table.add_row("sequence_overhead_s", f"{before.sequence_overhead_s * 1e6:.1f} us",
                      f"{after.sequence_overhead_s * 1e6:.1f} us")
        table.add_row("stream + arithmetic", _structure(before.stream_compute_overlap), _structure(after.stream_compute_overlap))
    return table


def _structure(overlap: float | None) -> str:
    """How a step's stream and arithmetic combine, in words (None: the roofline's default)."""
    return "added" if overlap == 0 else "larger of" if overlap is None or overlap == 1 else f"{overlap:.0%} overlap"


def _print_fit(console: Console, base: Any, flops: float, fit: Any) -> None:
    table = Table(title=escape(f"Calibration of {base.name}: peak {_gb(base.memory_bandwidth_Bps)} GB/s, "
                               f"{_num(flops / 1e9 if flops == flops else None)} GFLOP/s"), title_justify="left")
    for column in ("step", "source", "measured", "before", "after"):
        table.add_column(column, justify="left" if column in ("step", "source") else "right")
    for point in fit.points:
        table.add_row(escape(point.label), escape(Path(point.source).name), _ms(point.measured_s),
                      _ms(fit.prior_s(point)), _ms(fit.predicted_s(point)))
    for point in fit.excluded:
        table.add_row(f"[dim]{escape(point.label)} (left out)[/dim]", escape(Path(point.source).name), _ms(point.measured_s),
                      _ms(fit.prior_s(point)), _ms(fit.predicted_s(point)))
    console.print(table)
    fields = _efficiency_table("default", fit.before, fit)
    if fit.sequence_overhead_s is not None:  # fitted from decode steps of several sequences (verify's batched decode)
        fields.add_row("sequence_overhead_s", "0.0 us", f"{fit.sequence_overhead_s * 1e6:.1f} us")
        fields.add_row("stream + arithmetic", _structure(None), _structure(fit.stream_compute_overlap))
    for kind in ("decode", "prefill", "all"):
        fields.add_row(f"mean |error| {kind}", _pct(fit.error_before[kind]), _pct(fit.error_after[kind]))
    console.print(fields)
    layout = base.topology
    if layout is not None:
        per_core = f", {_gb(layout.per_core_Bps)} GB/s per core" if math.isfinite(layout.per_core_Bps) else ""
        console.print(f"CPU layout: {layout.sockets} socket{'s' if layout.sockets > 1 else ''} × "
                      f"{layout.nodes_per_socket} NUMA node{'s' if layout.nodes_per_socket > 1 else ''}, "
                      f"{layout.cores_per_socket} cores per socket, {layout.threads_per_core} thread"
                      f"{'s' if layout.threads_per_core > 1 else ''} per core{per_core}", highlight=False, soft_wrap=True)
    for note in fit.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")


def _resolves_to(name: str, base: Any) -> bool:
    """Whether hardware ``name`` (as an input recorded it) resolves to ``base``."""
    from speedlimit.catalog import resolve_hardware

    try:
        return resolve_hardware(name).key == base.key
    except SpeedlimitError:
        return False


def _attention_note(points: list[Any], rate: str) -> str:
    """calibrate's note on the attention kernel its points paid apart at ``rate`` (in words): how much of the deepest
    decode step (else prefill) it was."""
    deepest = max((p for p in points if p.attention_s > 0), key=lambda p: (p.kind == "decode", p.attention_s))
    return (f"attention: llama.cpp's CPU attention kernel priced apart at {rate}: {deepest.attention_s * 1e3:.3g} ms "
            f"of the {deepest.measured_s * 1e3:.3g} ms \"{deepest.label}\"; the profile keeps it")


def _attention_per_core(step: Any, points: list[Any]) -> tuple[float, float] | None:
    """The (decode, prefill) FLOP/s per busy core of the attention kernel ``step``'s machine prices apart, where the
    sweep's points paid it; None otherwise (the profile then prices attention in the roofline)."""
    machine, reach, topology = step.machine, step.reach, step.device.topology
    if reach is None or topology is None or not any(p.attention_s > 0 for p in points):
        return None
    busy = reach.core_fraction * topology.cores
    return float(machine.attention_decode_flops) / busy, float(machine.attention_prefill_flops) / busy


def _calibrate_deployment(path: Path, *, name: str, hardware: str | None, out: Path | None, force: bool,
                          json_output: bool, model: str | None, engine: str | None, tp: int, weights: str | None,
                          kv: str | None) -> None:
    """`speedlimit calibrate RUN_DIR`: fit this deployment's profile on part of a bench sweep, score it on the rest."""
    from speedlimit.catalog import resolve_hardware
    from speedlimit.catalog.profiles import profile_path, profiles_dir, save_profile
    from speedlimit.estimator.api import file_matmul_mix, step_model
    from speedlimit.verify.fit import DeploymentParams, deployment_points, deployment_record, fit_deployment, sweep_levels

    profile_path(name)  # validate the name before any work
    if out is not None and out.is_dir():
        raise SpeedlimitError(f"--out {out} is a directory; give a file name like {name}.toml")
    levels, info = sweep_levels(path)
    model = model or info.get("model")
    if not model:
        raise SpeedlimitError(f"{path} does not say which model it served: pass --model NAME")
    hardware = hardware or info.get("hardware")
    if not hardware:
        raise SpeedlimitError(f"{path} does not say which hardware it ran on: pass --hardware NAME")
    base = resolve_hardware(hardware)
    step = step_model(model, base, engine=engine, tp=tp, weights=weights, kv=kv)
    peak_flops = step.peak_flops
    if not math.isfinite(peak_flops):
        raise SpeedlimitError(f"{base.name} has no peak FLOP/s figure: pass --hardware with one")
    cap = 1.0 if step.engine.mode.value == "serial" else float(step.engine.max_seqs.at(base.memory_bytes, device=base))
    points = deployment_points(levels, step.cost, tp, step.reach.bandwidth_Bps if step.reach else base.memory_bandwidth_Bps, peak_flops,
                               base.interconnect_Bps or math.nan, max_sequences=cap, priced=step.machine,
                               notes=(point_notes := []))
    # where llama.cpp's CPU kernel rates price the matmuls, the prior's flat fraction of the peak is the decode
    # kernel's (the one a sweep's decode points run at); the points' own prior times are the estimate's either way
    flops_efficiency = (step.kernel_rate.peak_flops * step.kernel_rate.decode_factor / peak_flops
                        if step.kernel_rate is not None else step.efficiency.flops_efficiency)
    prior = DeploymentParams(bw_efficiency=step.efficiency.bw_efficiency, flops_efficiency=flops_efficiency,
                             step_overhead_s=float(step.machine.step_overhead_s),
                             sequence_overhead_s=float(step.machine.sequence_overhead_s),
                             stream_compute_overlap=float(step.machine.stream_compute_overlap))
    fit = fit_deployment(points, prior)
    fit.notes.extend(point_notes + info.get("notes", []))
    kernel = _attention_per_core(step, points)
    if kernel is not None:
        fit.notes.append(_attention_note(points, f"{kernel[0] / 1e9:.3g} / {kernel[1] / 1e9:.3g} GFLOP/s per busy "
                                                 "core (decode / prefill; the estimate's rate, not fitted)"))
    refusal = fit.refusal()
    saved: Path | None = None
    problem: str | None = None
    if refusal is not None and not force:
        problem = f"not saved: {refusal}; pass --force to save it anyway"
    else:
        try:
            # the kernels whose rates priced the prior, and the weights' type the fitted FLOP/s is for
            mix = file_matmul_mix(step.arch, None) if weights is None else None
            types = ((step.engine.key, step.kernel_rate.tensor_type, mix) if step.kernel_rate is not None else
                     (base.kernel_profile, step.kernel_transfer[3], mix)
                     if step.kernel_transfer and base.kernel_profile else None)
            saved = save_profile(name, deployment_record(name, base, fit, step.engine.key, [str(path)], kernel, types),
                                 out)
        except OSError as error:
            problem = f"{write_error(out or profile_path(name), error, 'the profile')}; pass --out FILE to write it elsewhere"
    if json_output:
        payload = {"profile": name, "path": str(saved) if saved else None, "saved": saved is not None,
                   "base_hardware": base.key, "model": step.arch.name, "engine": step.engine.key, "tp": tp,
                   "split": fit.split, "fitted": fit.fitted.__dict__, "prior": fit.prior.__dict__, "errors": fit.errors,
                   "points": [{"label": p.label, "kind": p.kind, "fold": p.fold, "measured_s": p.measured_s,
                               "prior_s": fit.prior_s(p), "fitted_s": fit.fitted.predict(p),
                               "attention_s": p.attention_s} for p in fit.points],
                   "attention_flops_per_core": list(kernel) if kernel else None,
                   "refused": refusal, "notes": fit.notes}
        sys.stdout.write(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    else:
        console = Console()
        table = Table(title=escape(f"Calibration of {step.arch.name} on {base.name} ×{tp}, engine {step.engine.key}"),
                      title_justify="left")
        for column in ("point", "fold", "measured", "prior", "fitted"):
            table.add_column(column, justify="left" if column in ("point", "fold") else "right")
        for point in fit.points:
            table.add_row(escape(point.label), point.fold, _ms(point.measured_s), _ms(fit.prior_s(point)),
                          _ms(fit.fitted.predict(point)))
        console.print(table)
        values = _efficiency_table("prior", fit.prior, fit.fitted, per_sequence=True)
        for fold in ("fit", "held-out"):
            values.add_row(f"mean |error|, {fold} points", _pct(fit.errors[fold]["prior"]), _pct(fit.errors[fold]["fitted"]))
        console.print(values)
        console.print(f"split: {fit.split}", highlight=False)
        for note in fit.notes:
            console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if problem is not None:
        raise SpeedlimitError(problem)
    if not json_output:
        use = f"--hardware {name}" if out is None else f"--hardware {name} after copying it to {profiles_dir()}"
        Console().print(f"profile saved to {escape(str(saved))}\nuse it: speedlimit estimate {escape(use)} "
                        f"--engine {step.engine.key} --model ...", highlight=False)
