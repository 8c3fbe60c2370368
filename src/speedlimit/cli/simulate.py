"""The `speedlimit simulate` command: estimate's model/hardware options, bench's workload and load options, the
engine's knobs; prints bench's tables (plus what only a simulation sees) or JSON, and writes bench's files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from speedlimit.artifacts import RunSummary, SweepSummary, write_records
from speedlimit.cli.options import (Burstiness, Concurrency, KneeFraction, PrefixGroups, PromptTokens, Rate, Requests,
                                    Sweep, TimeScale, flag_option, scenario_options)
from speedlimit.errors import SpeedlimitError


def _prefill_label(engine: dict) -> str:
    if engine.get("chunked_prefill"):
        return "chunked prefill, decodes pause" if engine.get("prefill_first") else "chunked prefill"
    return "whole prefill" if engine.get("prefill_first", True) else "whole prefill mixed with decodes"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.2f}"


def simulation_table(summary: RunSummary) -> Table:
    """What bench can't see: the engine's batch, queue and KV cache, and where each request's time went."""
    sim = summary.simulation or {}
    engine = summary.engine or {}
    name = f"{engine['engine']}: " if engine.get("engine") else ""
    table = Table(title=f"inside the engine ({name}{engine.get('mode', '?')}, max {engine.get('max_seqs')} sequences, "
                        f"{engine.get('max_batched_tokens'):,} tokens/step, "
                        f"{_prefill_label(engine)}{', a KV stream per slot' if engine.get('slot_streams') else ''})",
                  show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    kv = sim.get("kv", {})
    capacity = kv.get("capacity_tokens")
    peak = kv.get("peak_fraction")
    rows = [
        ("engine steps", f"{sim.get('steps', 0):,} in {sim.get('simulated_s', 0):,.2f} s simulated"),
        ("batch (sequences/step)", f"mean {sim['batch']['mean']:,.1f}, max {sim['batch']['max']:,}"),
        ("tokens/step", f"mean {sim['tokens_per_step']['mean']:,.1f}, max {sim['tokens_per_step']['max']:,} "
                        f"({sim.get('prefill_token_share', 0):.0%} prefill)"),
        ("queue (waiting requests)", f"mean {sim['queue']['mean']:,.1f}, max {sim['queue']['max']:,}"),
        ("KV cache", "unbounded (capacity unknown)" if capacity is None else
         f"{capacity:,.0f} tokens, peak {peak:.0%} used, mean {kv.get('mean_fraction') or 0:.0%}"),
        ("preemptions", f"{sim.get('preemptions', 0):,} ({sim.get('preempted_requests', 0):,} requests recomputed)"),
    ]
    if sim.get("replicas"):
        rows.insert(0, ("data-parallel replicas", f"{sim['replicas']:,}, {sim['routing']} routing "
                                                  f"({sim['replicas_with_requests']:,} got requests); batch, queue "
                                                  "and KV per replica" + ("; they share their experts and step "
                                                  "together" if sim.get("lockstep") else "")))
    if sim.get("prefix_cache_hit_rate") is not None:
        per_slot = "cache_idle_slots" in engine  # llama-server: each slot reuses the prompt it last served
        ram = engine.get("cache_ram_mib")
        where = ("; per slot, no prompt cache" if ram == 0 else "; per slot, with an unbounded prompt cache"
                 if ram is None else f"; per slot, with a prompt cache of {ram:,.0f} MiB") if per_slot else ""
        rows.append(("prefix-cache hits", f"{sim['prefix_cache_hit_rate']:.1%} of prompt tokens (bench's server "
                                          f"metric{where})"))
    records_split = sim.get("time_split")
    if records_split:
        rows.append(("time split (mean)", f"queue {_ms(records_split['queue_s'])} ms, prefill "
                                           f"{_ms(records_split['prefill_s'])} ms, decode {_ms(records_split['decode_s'])} ms"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_simulation(console: Console, summary: RunSummary | SweepSummary) -> None:
    from speedlimit.cli.bench_view import summary_table, sweep_table, totals_table
    from speedlimit.simulator.api import saturation_note

    if isinstance(summary, SweepSummary):
        console.print(sweep_table(summary))
        info = summary.sweep
        if summary.points and summary.points[0].slo:
            slo = ", ".join(f"{k} ≤ {v * 1e3:g} ms" for k, v in summary.points[0].slo.items())
            best = "none" if info.slo_max_load is None else f"{info.parameter}={info.slo_max_load:g}"
            console.print(f"highest load meeting the SLOs ({slo}, for ≥ 99% of requests): {best}", highlight=False)
        for point in summary.points:
            note = saturation_note(point)
            if note:
                console.print(f"[yellow]rate {point.sweep_value:g}: {note}[/yellow]", highlight=False)
        return
    console.print(summary_table(summary, title="speedlimit simulate (predicted)"))
    console.print(totals_table(summary))
    console.print(simulation_table(summary))
    note = saturation_note(summary)
    if note:
        console.print(f"[yellow]{note}[/yellow]", highlight=False)


#: The scenario inputs simulate shares with estimate (flags, help and validation come from `Scenario`).
SIMULATE_INPUTS = (
    "model", "hardware", "profile", "bandwidth", "flops", "memory", "weights", "kv", "engine", "compute", "tp", "pp", "dp", "ep",
    "threads", "numa", "ideal", "bw_efficiency", "flops_efficiency", "step_overhead_s",
)  # fmt: skip


@scenario_options(*SIMULATE_INPUTS)
def simulate_command(
    inputs: dict[str, Any],
    sequence_overhead: Optional[float] = typer.Option(None, help="Engine cost per running sequence per step, seconds "
                                                                 "(default: the engine profile's)."),
    prompt_tokens: PromptTokens = "128",
    output_tokens: str = typer.Option("64", help="Output tokens per request: N, uniform:LOW:HIGH or normal:MEAN:STD."),
    dataset: Optional[Path] = typer.Option(None, help="bench's JSONL of prompts (lengths in words, or prompt_tokens)."),
    prefix_tokens: int = typer.Option(0, help="bench's shared prefix: this many tokens start every prompt; added to "
                                              "--prompt-tokens."),
    prefix_groups: PrefixGroups = 1,
    trace: Optional[Path] = typer.Option(None, help="Replay bench's JSONL trace: each request at its recorded time "
                                                    "with its recorded lengths ({\"arrival_s\", \"prompt_tokens\", "
                                                    "\"output_tokens\"} or Mooncake's timestamp/input_length/"
                                                    "output_length)."),
    time_scale: TimeScale = 1.0,
    seed: int = typer.Option(0, help="Seed for lengths and arrival times (bench's draws)."),
    concurrency: Concurrency = None,
    rate: Rate = None,
    burstiness: Burstiness = 1.0,
    requests: Requests = None,
    duration: Optional[float] = typer.Option(None, help="Seconds of simulated time to keep sending."),
    sweep: Sweep = None,
    knee_fraction: KneeFraction = 0.9,
    slo: Optional[str] = typer.Option(None, help="Goodput SLO, e.g. ttft=1s,tpot=50ms (keys ttft itl tpot e2e)."),
    scheduler: Optional[str] = typer.Option(None, help="continuous (iteration-level batching) or serial (one request at "
                                                       "a time) with generic defaults (256 sequences, 8,192 tokens/step; "
                                                       "serial: 1, 512); default: the engine profile's scheduler."),
    max_seqs: Optional[int] = typer.Option(None, help="Running-sequence cap (default: the engine profile's)."),
    max_batched_tokens: Optional[int] = typer.Option(None, help="Token budget per step of one replica (default: the engine profile's; SGLang's is split among DP-attention ranks)."),
    chunked_prefill: Optional[bool] = typer.Option(None, "--chunked-prefill/--no-chunked-prefill", metavar="",
                                                   help="Split prompts over steps within the token budget (else "
                                                        "prefill-first steps of whole prompts; default: the engine "
                                                        "profile's)."),
    prefix_caching: Optional[bool] = typer.Option(None, "--prefix-caching/--no-prefix-caching", metavar="",
                                                  help="Reuse the cached KV blocks of a prompt's shared prefix, LRU "
                                                       "eviction (default: the engine profile's)."),
    slot_streams: bool = flag_option("--slot-streams/--no-slot-streams",
                                     "llama.cpp's server started with --parallel N (no --kv-unified): each slot its own "
                                     "KV stream, and a step runs one forward pass per run of consecutive busy slots.",
                                     default=False),
    slot_similarity: Optional[float] = typer.Option(None, help="llama-server (the llama.cpp engines, --slot-streams): its "
                                                               "--slot-prompt-similarity (a free slot whose cached "
                                                               "prompt shares more than this part of a new one takes "
                                                               "it; 0: least recently used; default 0.1)."),
    cache_ram: Optional[float] = typer.Option(None, help="llama-server: its --cache-ram in MiB, the host-memory "
                                                         "prompt cache (0: off, -1: no limit; default 8192)."),
    cache_idle_slots: Optional[bool] = typer.Option(None, "--cache-idle-slots/--no-cache-idle-slots", metavar="",
                                                    help="llama-server: it saves idle slots' prompts to that cache as "
                                                         "each request starts (default: on, as the server's)."),
    block_size: int = typer.Option(16, help="KV-cache block size in tokens (paged attention)."),
    kv_tokens: Optional[int] = typer.Option(None, help="KV-cache capacity in tokens (default: memory beside the "
                                                       "weights; llama-server: its -c)."),
    out: Optional[Path] = typer.Option(None, help="Directory for requests.jsonl and summary.json (bench's files; "
                                                  "not one that holds a run already, unless --force)."),
    force: bool = flag_option("--force/--no-force", "Replace the run already in --out.", default=False),
    json_output: bool = flag_option("--json/--no-json", "Print the summary as JSON on stdout.", default=False),
) -> None:
    """Predict a serving engine under load, in bench's terms: TTFT/ITL/TPOT/E2E percentiles, throughput, goodput."""
    from speedlimit.bench.metrics import parse_slo
    from speedlimit.bench.runner import check_out_dir, parse_sweep, prepare_out_dir
    from speedlimit.estimator.api import resolve
    from speedlimit.scenario import scenario_from
    from speedlimit.simulator.api import build_workload, engine_config, run_workload, split_engine, with_sequence_overhead
    from speedlimit.simulator.api import sweep as run_sweep

    if not 0 < knee_fraction <= 1:
        raise SpeedlimitError(f"--knee-fraction must be in (0, 1], got {knee_fraction}")
    inputs["engine"], scheduler, use_profile = split_engine(inputs.get("engine"), scheduler)  # --engine serial: old spelling
    step = with_sequence_overhead(resolve(scenario_from(**inputs)), sequence_overhead)
    config = engine_config(scheduler, max_seqs=max_seqs, max_batched_tokens=max_batched_tokens,
                           chunked_prefill=chunked_prefill, block_size=block_size, kv_tokens=kv_tokens, step=step,
                           use_profile=use_profile, prefix_caching=prefix_caching, slot_streams=slot_streams,
                           slot_similarity=slot_similarity, cache_ram=cache_ram, cache_idle_slots=cache_idle_slots)
    slo_bounds = parse_slo(slo)
    check_out_dir(out, force)  # bench's check, before any work: never a file, never over a run unless --force
    workload_options = dict(burstiness=burstiness, requests=requests, duration_s=duration, prompt_tokens=prompt_tokens,
                            output_tokens=output_tokens, dataset=dataset, seed=seed, prefix_tokens=prefix_tokens,
                            prefix_groups=prefix_groups)
    if trace is not None and sweep:
        raise SpeedlimitError("--trace sets the arrivals: give no --sweep with it (use --time-scale for the rate)")
    if sweep:
        parameter, values = parse_sweep(sweep)
        if concurrency is not None or rate is not None:
            raise SpeedlimitError(f"--sweep {parameter}=… sets the load: drop --concurrency/--rate")
        workloads = [build_workload(**{parameter: int(v) if parameter == "concurrency" else v}, level=level,
                                    **workload_options) for level, v in enumerate(values)]
        summary, runs = run_sweep(step, config, parameter, values, workloads, slo_bounds, knee_fraction)
        if out is not None:
            prepare_out_dir(out, force)
            for value, result in zip(values, runs):
                point_dir = out / f"{parameter}_{value:g}"  # bench's level folders
                point_dir.mkdir(parents=True, exist_ok=True)
                write_records(point_dir / "requests.jsonl", result.records)
                result.summary.save(point_dir / "summary.json")
            summary.save(out / "summary.json")
    else:
        if concurrency is not None and rate is not None:
            raise SpeedlimitError("give exactly one of --concurrency (closed loop) or --rate (open loop)")
        workload = build_workload(concurrency=concurrency, rate=rate, trace=trace, time_scale=time_scale,
                                  **workload_options)
        result = run_workload(step, config, workload, slo_bounds)
        summary = result.summary
        if out is not None:
            prepare_out_dir(out, force)
            write_records(out / "requests.jsonl", result.records)
            summary.save(out / "summary.json")
    if json_output:
        sys.stdout.write(json.dumps(summary.to_dict(), indent=2) + "\n")
    else:
        print_simulation(Console(), summary)
