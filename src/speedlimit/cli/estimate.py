"""CLI commands of the estimate leg: `estimate`, `sweep`, `models`, `hardware`, `engines` (thin shells over the library)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedlimit.catalog import (
    DEFAULT_ENGINE,
    catalog_engine,
    catalog_hardware,
    catalog_model,
    engine_names,
    engine_record,
    hardware_entries,
    hardware_names,
    model_entries,
    model_names,
    resolve_engine,
)
from speedlimit.cli.options import flag_option, scenario_options
from speedlimit.errors import SpeedlimitError, write_error
from speedlimit.estimator.api import Estimate, estimate_scenario, resolve
from speedlimit.precision import is_per_group
from speedlimit.scenario import scenario_from
from speedlimit.units import format_bytes, format_count, format_seconds, parse_quantity

console = Console()


def _parse_list(text: str, what: str) -> list[float]:
    """``"1,2,4"`` or a doubling range ``"1:256"`` → numbers."""
    text = text.strip()
    if ":" in text:
        start, _, stop = text.partition(":")
        low, high = parse_quantity(start, what), parse_quantity(stop, what)
        if low <= 0 or high < low:
            raise SpeedlimitError(f"--{what} range {text!r} must be LOW:HIGH with 0 < LOW <= HIGH (doubling steps)")
        values, value = [], low
        while value <= high:
            values.append(value)
            value *= 2
        return values
    return [parse_quantity(part, what) for part in text.split(",") if part.strip()]


ESTIMATE_INPUTS = (
    "model", "hardware", "profile", "bandwidth", "flops", "memory", "weights", "kv", "engine", "compute", "batch", "prompt",
    "output", "tp", "pp", "dp", "ep", "threads", "numa", "ideal", "bw_efficiency", "flops_efficiency", "step_overhead_s",
    "usd_per_hour",
)  # fmt: skip


@scenario_options(*ESTIMATE_INPUTS)
def estimate_command(
    inputs: dict[str, Any],
    plot: Annotated[Path | None, typer.Option(help="Also draw the batch curve and roofline to this PNG.")] = None,
    allow_no_fit: Annotated[bool, flag_option("--allow-no-fit/--no-allow-no-fit", "Report speed even when weights + KV cache exceed memory.")] = False,
    as_json: Annotated[bool, flag_option("--json/--no-json", "Print one JSON object.")] = False,
) -> None:
    """Predict TTFT, inter-token latency, tok/s, throughput and memory for one configuration."""
    scenario = scenario_from(**inputs)
    if plot is not None:
        _check_writable(plot, "the plot")
    result = estimate_scenario(scenario)
    if result.fits is False and not (allow_no_fit or scenario.ideal):  # ideal is the seed formula: no memory model
        raise SpeedlimitError(_does_not_fit(result))
    if plot is not None:
        from speedlimit.report import plot_estimate  # matplotlib only when asked

        resolved = resolve(scenario)
        kwargs = scenario.model_dump(exclude={"model", "hardware", "profile", "bandwidth", "flops", "memory"})
        plot_estimate(resolved.arch, resolved.device, plot, **kwargs)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), allow_nan=False))
        return
    console.print(estimate_table(result))
    if plot is not None:
        console.print(f"plot written to {escape(str(plot))}")


def estimate_table(result: Estimate) -> Table:
    """A person-readable table of one estimate."""
    title = escape(f"{result.model} on {result.hardware}" + (f" ×{result.devices}" if result.devices > 1 else ""))
    table = Table(title=title, caption=_caption(result), show_header=False, title_style="bold")
    table.add_column(style="cyan")
    table.add_column(justify="right", style="bold")
    table.add_column(style="dim")
    rows = [
        ("decode speed (per user)", f"{result.decode_tok_s:,.1f} tok/s", f"ITL {format_seconds(result.itl_s)}"),
        (f"time for a {result.output:,}-token reply", format_seconds(result.reply_s), "output × ITL"),
        ("time to first token", format_seconds(result.ttft_s), f"prefill of {result.batch}×{result.prompt:,} tokens"
         + (f", {format_seconds(result.ttft_dequantize_s)} of it converting the weights to fp16" if result.ttft_dequantize_s else "")),
        ("end-to-end latency", format_seconds(result.e2e_s), "TTFT + (output − 1) × ITL"),
        ("aggregate throughput", f"{result.throughput_tok_s:,.1f} tok/s", f"batch {result.batch}"),
        ("bytes streamed / token", format_bytes(result.bytes_per_token), escape(f"weights at {result.weight_bits:.3g} bits ({result.weights})")
         + ("; embedding table and LM head 16-bit" if result.weights == "fp8" and result.weight_bits > 8 else "")),
        ("FLOPs / token", format_count(result.flops_per_token), f"intensity {result.arithmetic_intensity:,.1f} FLOP/byte"),
        ("regime", f"{result.regime}-bound", _critical(result)),
        ("parameters", format_count(result.total_params), f"active {format_count(result.active_params)}"),
        ("weights + KV cache", format_bytes(result.memory_bytes), f"KV {format_bytes(result.kv_bytes_per_token)}/token ({result.kv})"),
        ("fits in memory", _fits(result), f"max batch {_count_or_dash(result.max_batch)} at {result.prompt + result.output:,} tokens"),
    ]
    if result.reached_bandwidth_Bps is not None:  # a CPU: what one process reaches with its threads and NUMA policy
        rows.append(("memory bandwidth reached", f"{result.reached_bandwidth_Bps / 1e9:,.4g} GB/s",
                     escape(result.bandwidth_basis)))
    if result.devices > 1:
        rows.append(("devices", f"{result.devices:,}", _layout(result)))
        rows.append(("memory / device", format_bytes(result.memory_per_device_bytes),
                     f"weights {format_bytes(result.weights_per_device_bytes)} (fullest device)"))
    if result.tp > 1:
        rows.append(("all-reduce / step", format_seconds(result.tp_comm_s), f"tensor parallel ×{result.tp}"))
    if result.ep > 1:
        rows.append(("all-to-all / step", format_seconds(result.ep_comm_s), f"expert parallel ×{result.ep}"))
    if result.pp > 1:
        rows.append(("stage sends / step", format_seconds(result.pp_comm_s), f"pipeline parallel ×{result.pp}"))
    if result.usd_per_million_tokens is not None:
        rows.append(("cost", f"${result.usd_per_million_tokens:,.3f} / M tokens", "at full batch"))
    for row in rows:
        table.add_row(*row)
    return table


def _layout(result: Estimate) -> str:
    """How the devices split the model: ``tp 2 × pp 4 × dp 1, ep 8``."""
    text = f"tp {result.tp} × pp {result.pp} × dp {result.dp}"
    return text + (f", ep {result.ep}" if result.ep > 1 else "")


def _does_not_fit(result: Estimate) -> str:
    per_device = result.memory_capacity_bytes / result.devices
    if result.devices == 1 or result.tp == result.devices:
        devices_needed = math.ceil(result.memory_bytes / per_device)
        return (
            f"{result.model} needs {format_bytes(result.memory_bytes)} (weights {format_bytes(result.weights_bytes)} + KV "
            f"{format_bytes(result.kv_cache_bytes)}) but {result.tp} × {result.hardware} offers {format_bytes(result.memory_capacity_bytes)} "
            f"usable: try --tp {devices_needed}, fewer --weights bits, a smaller --batch, or --allow-no-fit"
        )
    return (
        f"{result.model} needs {format_bytes(result.memory_per_device_bytes)} on its fullest device (weights "
        f"{format_bytes(result.weights_per_device_bytes)} + KV) but one {result.hardware} offers {format_bytes(per_device)} "
        f"usable: try more --tp or --pp, --ep with --dp, fewer --weights bits, a smaller --batch, or --allow-no-fit"
    )


def _caption(result: Estimate) -> str:
    if result.mode == "ideal":
        return "ideal: peak bandwidth ÷ weight bytes (the seed formula); no KV cache, overhead or efficiency"
    scaled = (f" (prefill {result.prefill_thread_efficiency:.2f}× per thread: its measured thread scaling)"
              if result.cpu_kernels and result.prefill_thread_efficiency != 1.0 else "")
    kernel = f"the {result.cpu_expert_kernels} kernel's" if result.cpu_expert_kernels else "its"
    routed = (f", the routed experts at {kernel} 1-token rate (each routed row a matrix-vector product)"
              if result.experts_as_matvecs else "")
    attention = (f", attention at its measured kernel rate ({format_seconds(result.attention_kernel_s)} a decode step)"
                 if result.attention_kernel_s > 0 else "")
    carried = ""
    if result.calibrated_kernel_factors:  # a calibrated CPU profile's FLOP/s carried to another type's kernels
        one, prefill = result.calibrated_kernel_factors
        carried = (f" as calibrated on {result.calibrated_kernels}"
                   + (f", x {one:.2f} (1 token) / {prefill:.2f} (prefill) for these weights' kernels"
                      if (one, prefill) != (1.0, 1.0) else ""))
    matmuls = (f"matmuls at llama.cpp's measured {result.cpu_kernels} CPU kernel rates{scaled}{routed}"
               if result.cpu_kernels else f"{result.flops_efficiency:.0%} of peak FLOP/s{carried}") + attention
    # the kernels' clause leads the basis; the caption names them already, so it shows the rest
    basis = result.efficiency_basis.split("; ", 1)[-1] if result.cpu_kernels else result.efficiency_basis
    experts = (f" (the routed experts {result.moe_bandwidth_efficiency:.0%} from {result.moe_bandwidth_tokens:,.0f} tokens "
               "a step: its fused-MoE kernel)" if result.moe_bandwidth_efficiency is not None else "")
    per_sequence = (f" + {format_seconds(result.sequence_overhead_s)} per sequence" if result.sequence_overhead_s > 0
                    else "")
    overlap = ("; the stream and the arithmetic add (calibrated)" if result.stream_compute_overlap == 0 else
               f"; the stream and the arithmetic overlap {result.stream_compute_overlap:.0%} (calibrated)"
               if result.stream_compute_overlap < 1 else "")
    return (
        f"achievable: {result.bw_efficiency:.0%} of peak bandwidth{experts}, {matmuls}, "
        f"{format_seconds(result.step_overhead_s)} per step{per_sequence}{overlap} ({escape(_short(basis))})"
    )


def _short(basis: str, limit: int = 90) -> str:
    """The first clause of an efficiency basis; the full text is in --json and efficiency.toml."""
    head = basis.split(" (", 1)[0].split("; ", 1)[0].split(": ", 1)[0]
    return head if len(head) <= limit else head[: limit - 1] + "…"


def _critical(result: Estimate) -> str:
    if result.flops is None:
        return "no FLOPs figure: memory roof only (give --flops)"
    if result.critical_batch is None:
        return "never compute-bound at this context (KV reads grow with batch)"
    return f"compute-bound from batch {result.critical_batch:,.0f}"


def _fits(result: Estimate) -> str:
    if result.fits is None:
        return "unknown"
    return "yes" if result.fits else "[red]no[/red]"


def _count_or_dash(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


@scenario_options("output", "kv", "engine", "tp", "pp", "dp", "ep", "threads", "numa", "ideal")
def sweep_command(
    inputs: dict[str, Any],
    model: Annotated[list[str], typer.Option("--model", "-m", help="Catalog name, config.json, .gguf or size; repeat for several.")],
    hardware: Annotated[list[str], typer.Option("--hardware", "-H", help="Catalog hardware or calibrated profile; repeat for several.")],
    weights: Annotated[str, typer.Option(help="Comma-separated weight formats, e.g. 16,8,4 or bf16,q4_0; a per-group "
                                              "spelling (experts=mxfp4,default=bf16) is one value; shipped: each "
                                              "model's own (a .gguf's type, a checkpoint's format), as estimate "
                                              "prices it without --weights.")] = "shipped",
    batch: Annotated[str, typer.Option(help="Batches: 1,8,64 or a doubling range 1:256.")] = "1",
    context: Annotated[str, typer.Option(help="Prompt/context tokens: 512,4096 or a doubling range 128:32768.")] = "512",
    fmt: Annotated[str, typer.Option("--format", help="csv or json.")] = "csv",
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None,
) -> None:
    """Evaluate a grid of model × hardware × weights × batch × context (vectorized)."""
    from speedlimit.estimator.sweep import check_grid_size, sweep_grid

    if fmt not in ("csv", "json"):
        raise SpeedlimitError(f"--format must be csv or json, got {fmt!r}")
    weight_list = [weights.strip()] if is_per_group(weights) else [w.strip() for w in weights.split(",") if w.strip()]
    if not weight_list:
        raise SpeedlimitError(f"--weights {weights!r} names no format: give e.g. 16,8,4 or bf16,q4_0")
    batches, contexts = _parse_list(batch, "batch"), _parse_list(context, "context")
    check_grid_size(model, hardware, weight_list, batches, contexts)
    if out is not None:
        _check_writable(out, "the sweep")
    result = sweep_grid(model, hardware, weight_list, batches, contexts, **inputs)
    write = result.write_json if fmt == "json" else result.write_csv
    if out is None:
        write(sys.stdout)
        return
    try:
        with out.open("w", newline="", encoding="utf-8") as stream:
            write(stream)
    except OSError as error:
        raise write_error(out, error, "the sweep") from None
    console.print(f"{len(result):,} configurations written to {escape(str(out))}", highlight=False)


def _check_writable(path: Path, what: str) -> None:
    """Fail before the work when ``path`` cannot be a file: a directory, or in a directory that does not exist."""
    if path.is_dir():
        raise write_error(path, IsADirectoryError(), what)
    if not path.parent.is_dir():
        raise write_error(path, FileNotFoundError(), what)


def models_command(as_json: Annotated[bool, flag_option("--json/--no-json", "Print JSON.")] = False) -> None:
    """List the model catalog."""
    rows = []
    for key in model_names():
        arch, entry = catalog_model(key), model_entries()[key]
        rows.append(
            {
                "name": key,
                "params": arch.total_params,
                "active_params": arch.active_params,
                "layers": arch.n_layers,
                "kernels_per_step": arch.decode_kernels,
                "attention": arch.attention,
                "kv_heads": arch.n_kv_heads,
                "experts": f"{arch.experts_per_token}/{arch.n_experts}" if arch.is_moe else "",
                "kv_elements_per_token": arch.kv_elements_per_token(),
                "source": entry.get("source", ""),
            }
        )
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(title="speedlimit model catalog", caption="attention: kind/KV heads; experts: active/total; KV per token at fp16")
    for column in ("name", "params", "active", "layers", "attention", "experts", "KV/token"):
        table.add_column(column, justify="left" if column in ("name", "attention") else "right", no_wrap=column == "name")
    for row in rows:
        table.add_row(
            row["name"], format_count(row["params"]), format_count(row["active_params"]), str(row["layers"]),
            f"{row['attention']}/{row['kv_heads']}" if row["attention"] != "mla" else "mla",
            row["experts"], format_bytes(row["kv_elements_per_token"] * 2),
        )  # fmt: skip
    console.print(table)


def hardware_command(as_json: Annotated[bool, flag_option("--json/--no-json", "Print JSON.")] = False) -> None:
    """List the hardware catalog."""
    rows = []
    for key in hardware_names():
        device = catalog_hardware(key)
        rows.append(
            {
                "name": key,
                "description": device.name,
                "kind": device.kind,
                "memory_bandwidth_Bps": device.memory_bandwidth_Bps,
                "memory_bytes": device.memory_bytes,
                "flops": device.flops,
                "interconnect_Bps": device.interconnect_Bps,
                "sockets": device.sockets,  # CPUs: memory_bandwidth_Bps is summed over them (None: not a CPU)
                "source": hardware_entries()[key].get("source", ""),
            }
        )
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(title="speedlimit hardware catalog")
    for column in ("name", "device", "bandwidth", "memory", "bf16 dense", "link"):
        table.add_column(column, justify="left" if column in ("name", "device") else "right", no_wrap=column == "name")
    for row, key in zip(rows, hardware_names()):
        device = catalog_hardware(key)
        table.add_row(
            row["name"], row["description"], f"{row['memory_bandwidth_Bps'] / 1e9:,.0f} GB/s",
            format_bytes(row["memory_bytes"]) if row["memory_bytes"] else "—",
            f"{device.peak_flops('bf16') / 1e12:,.1f} TFLOP/s",
            f"{row['interconnect_Bps'] / 1e9:,.0f} GB/s" if row["interconnect_Bps"] else "—",
        )  # fmt: skip
    console.print(table)


def _with_device_rule(value: dict[str, Any], shown: str) -> str:
    """``shown`` (a profile record value's base) with the device rule the record gives: other values on devices with
    more memory (vLLM, SGLang), devices exempt from them (vLLM's A100s), a cap at a fraction of the KV cache's tokens
    (SGLang), a division among data-parallel ranks that share their experts (SGLang)."""
    tiers = value.get("by_memory_gib")
    if tiers:
        rule = [f"{tier:,} from {gib:g} GiB" for gib, tier in tiers]
        if value.get("except_devices"):
            rule.append(f"not on {', '.join(value['except_devices'])}")
        shown += f" ({'; '.join(rule)})"
    if value.get("kv_tokens_fraction") is not None:
        shown += f", at most {value['kv_tokens_fraction']:g} of the KV cache's tokens"
    return shown


def _scheduler_text(values: dict[str, Any]) -> str:
    """'continuous, 1,024 from 70 GiB, else 256 seqs, ..., chunked' from a profile record's values."""
    def count(field: str, unit: str) -> str:
        return _with_device_rule(values[field], f"{values[field]['value']:,} {unit}")

    seqs = "seq" if values["max_seqs"]["value"] == 1 else "seqs"
    tokens = count("max_batched_tokens", "tok/step")
    divisor = values.get("dp_attention_chunk_divisor", {}).get("value")
    if divisor is not None:
        tokens += f", ÷ {'dp' if divisor == 'dp' else f'{divisor:,}'} per DP-attention rank"
    parts = [values["mode"]["value"], count("max_seqs", seqs), tokens]
    parts.append("chunked" if values["chunked_prefill"]["value"] else "whole prompts")
    return ", ".join(parts)


def engines_command(
    name: Annotated[str | None, typer.Argument(help="One engine (a name or alias): every value with its source.")] = None,
    as_json: Annotated[bool, flag_option("--json/--no-json", "Print JSON.")] = False,
) -> None:
    """List the serving-engine profiles (catalog/engines.toml), or one profile with every value's source."""
    if name is not None:
        record = engine_record(resolve_engine(name, what="engine"))
        if as_json:
            typer.echo(json.dumps(record))
            return
        on_amd = f"; on AMD GPUs it runs {record['rocm_profile']}" if record["rocm_profile"] else ""
        table = Table(title=escape(f"{record['label']} ({record['name']})"),
                      caption=escape(f"describes: {record['version']}{on_amd}"), show_lines=True)
        for column in ("field", "value", "source (or the fold it was fitted on)"):
            table.add_column(column, overflow="fold")
        for field, value in record["values"].items():
            shown = _with_device_rule(value, json.dumps(value["value"]))
            basis = value["source"] if value["source"] else f"fitted on fold {value['fitted']}"
            table.add_row(field, escape(shown), escape(basis))
        console.print(table)
        return
    records = [engine_record(catalog_engine(key)) for key in engine_names()]
    if as_json:
        typer.echo(json.dumps(records))
        return
    table = Table(title="speedlimit engine profiles", caption="`speedlimit engines NAME`: the version it describes and every "
                  f"value with its source; the default is {DEFAULT_ENGINE}, its backend picked from the device")
    for column in ("name", "devices", "scheduler", "KV", "graphs"):
        table.add_column(column, no_wrap=column == "name", overflow="fold")
    for record in records:
        values = record["values"]
        kv = values["kv"]["value"] + (f" (fp8 weights: {values['fp8_weights_kv']['value']})" if "fp8_weights_kv" in values else "")
        graphs = values.get("cuda_graphs", {}).get("value")
        on_amd = f" (AMD: {record['rocm_profile']})" if record["rocm_profile"] else ""
        table.add_row(
            record["name"] + (" (default)" if record["default"] else ""), ", ".join(record["devices"]) + on_amd,
            _scheduler_text(values), kv, "—" if graphs is None else ("yes" if graphs else "no"),
        )  # fmt: skip
    console.print(table)
