"""The `speedlimit bench` typer command: parse flags, run `BenchRunner`, print/write the summary, pick the exit code.

Exit codes: 0 after any run (errors are counted, not fatal), 1 when --fail-on-error and a request failed,
2 on bad input (checked before anything is sent or created), an --out that already holds a run (unless --force), or
a server that fails the pre-flight `GET /v1/models` (unreachable, hanging, 404, not serving --model; --skip-preflight
sends anyway), 130 when interrupted (SIGINT/SIGTERM: the summary of what finished is still written and printed).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from speedlimit.artifacts import RunSummary, SweepSummary
from speedlimit.bench.client import API_KEY_ENV, Endpoint, run_async
from speedlimit.bench.compare import replay_for
from speedlimit.bench.metrics import parse_slo
from speedlimit.cli.options import (Burstiness, Concurrency, KneeFraction, PrefixGroups, PromptTokens, Rate, Requests,
                                    Sweep, TimeScale, flag_option)
from speedlimit.cli.bench_view import LiveProgress, print_interrupted, print_summary, print_warnings
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan, check_out_dir, parse_sweep, prepare_out_dir
from speedlimit.bench.workload import parse_length_spec
from speedlimit.errors import SpeedlimitError
from speedlimit.scenario import MAX_TP, check_layout


def _extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise SpeedlimitError(f"--extra-body is not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise SpeedlimitError("--extra-body must be a JSON object")
    return value


def bench_command(
    url: str = typer.Option(..., help="Server base URL ending in /v1, e.g. http://127.0.0.1:8000/v1."),
    model: Optional[str] = typer.Option(None, help="Served model name (default: the first one /v1/models lists)."),
    api: str = typer.Option("completions", help="completions (/v1/completions) or chat (/v1/chat/completions)."),
    api_key: Optional[str] = typer.Option(None, envvar=API_KEY_ENV, help=f"Bearer key (or ${API_KEY_ENV}).",
                                          show_default=False),
    prompt_tokens: PromptTokens = "128",
    output_tokens: int = typer.Option(64, help="Output tokens per request (max_tokens; forced unless --no-force-output)."),
    dataset: Optional[Path] = typer.Option(None, help="JSONL of prompts ({'prompt': ...} or {'messages': [...]}), "
                                                      "or multi-turn chats ({'conversation': [{'role', 'content'}, "
                                                      "...]}: one request per user turn, with the turns before it)."),
    prefix_tokens: int = typer.Option(0, help="A shared prefix of this many tokens on every prompt (exercises "
                                              "prefix caching); added to --prompt-tokens."),
    prefix_groups: PrefixGroups = 1,
    trace: Optional[Path] = typer.Option(None, help="Replay a JSONL trace: one request a line, sent at its "
                                                    "recorded time ({'arrival_s', 'prompt_tokens', "
                                                    "'output_tokens'}, or Mooncake's timestamp ms/input_length/"
                                                    "output_length)."),
    time_scale: TimeScale = 1.0,
    seed: int = typer.Option(0, help="Seed for prompts, lengths and arrival times."),
    concurrency: Concurrency = None,
    rate: Rate = None,
    burstiness: Burstiness = 1.0,
    requests: Requests = None,
    duration: Optional[float] = typer.Option(None, help="Seconds to keep sending (instead of --requests)."),
    warmup: int = typer.Option(0, help="Requests sent first and left out of the results (the warm-up stops at its "
                                       "first failed request)."),
    sweep: Sweep = None,
    knee_fraction: KneeFraction = 0.9,
    slo: Optional[str] = typer.Option(None, help="Goodput SLO, e.g. ttft=500ms,itl=50ms (keys ttft itl tpot e2e; itl "
                                                 "is per token: the request's nearest-rank p99, its max when < 100 "
                                                 "gaps)."),
    timeout: float = typer.Option(600.0, help="Per-request timeout in seconds."),
    out: Optional[Path] = typer.Option(None, help="Directory for requests.jsonl and summary.json (must not hold a "
                                                  "run already, unless --force)."),
    force: bool = flag_option("--force/--no-force", "Replace the bench run already in --out.", default=False),
    json_output: bool = flag_option("--json/--no-json", "Print the summary as JSON on stdout.", default=False),
    fail_on_error: bool = flag_option("--fail-on-error/--no-fail-on-error", "Exit 1 when any request failed.",
                                      default=False),
    include_usage: bool = flag_option("--include-usage/--no-include-usage", "Ask for usage in the stream "
                                      "(stream_options.include_usage).", default=True),
    force_output: bool = flag_option("--force-output/--no-force-output", "Send min_tokens and ignore_eos so outputs "
                                     "reach --output-tokens.", default=True),
    extra_body: Optional[str] = typer.Option(None, help="JSON object merged into every request body."),
    count_tokens: bool = flag_option("--count-tokens/--no-count-tokens", "Without usage, count output tokens with "
                                     "the server's tokenizer.", default=True),
    tokenizer: Optional[Path] = typer.Option(None, help="The served model's tokenizer.json or .gguf: exact prompt "
                                                        "lengths and output token counts without asking the server."),
    skip_preflight: bool = flag_option("--skip-preflight/--no-skip-preflight", "Do not check /v1/models or probe "
                                       "the tokenizer first.", default=False),
    progress: bool = flag_option("--progress/--no-progress", "Show live progress on stderr.", default=True),
    compare_estimate: bool = flag_option("--compare-estimate/--no-compare-estimate", "Replay the workload sent "
                                         "through the serving simulator and add measured/predicted for every "
                                         "metric and percentile.", default=False),
    hardware: Optional[str] = typer.Option(None, help="Hardware catalog name or calibrated profile for "
                                                      "--compare-estimate."),
    replay_engine: Optional[str] = typer.Option(None, help="Scheduler the replay simulates: continuous or serial "
                                                           "(generic), then key=value (max_seqs, max_batched_tokens, "
                                                           "kv_tokens, chunked_prefill, prefix_caching, slot_streams, "
                                                           "slots_used, slot_history, step_overhead, sequence_overhead), or the "
                                                           "options alone (the --engine "
                                                           "profile's scheduler); default: --engine's, else "
                                                           "continuous; without kv_tokens / max_seqs, what the "
                                                           "server reported (its KV cache, llama-server's slots and, with "
                                                           "slot_streams=1, which of them were used before the run)."),
    engine: Optional[str] = typer.Option(None, help="Engine profile the --compare-estimate replay runs (speedlimit "
                                                    "engines: its step costs and scheduler defaults), e.g. vllm, "
                                                    "sglang, llama-server."),
    tp: Optional[int] = typer.Option(None, help="Tensor-parallel GPUs the server ran on, for --compare-estimate "
                                                "(default: the layout the server reports, SGLang's server info, "
                                                "else 1)."),
    dp: Optional[int] = typer.Option(None, help="Data-parallel replicas the server ran, for --compare-estimate (as "
                                                "simulate's --dp; with --ep, ranks stepping together, as SGLang's "
                                                "data-parallel attention)."),
    ep: Optional[int] = typer.Option(None, help="Expert-parallel GPUs the server ran, for --compare-estimate: 1 or "
                                                "tp × dp."),
    weights: Optional[str] = typer.Option(None, help="Weight format the server ran, for --compare-estimate (as "
                                                     "estimate's --weights; default: as the checkpoint ships)."),
    estimate_model: Optional[str] = typer.Option(None, help="Catalog name or config.json/.gguf path for the "
                                                            "estimate (default: the served model name)."),
    workers: Optional[int] = typer.Option(None, help="Processes sending the load (default 1): concurrency slots or "
                                                     "arrivals of one seeded schedule are dealt out among them."),
    server_metrics: bool = flag_option("--server-metrics/--no-server-metrics", "Scrape the server's Prometheus "
                                       "/metrics (vLLM, SGLang, TGI, llama-server --metrics) before, during and after "
                                       "each run: server_metrics.jsonl and a server block in the summary.",
                                       default=True),
    metrics_interval: float = typer.Option(1.0, help="Seconds between /metrics scrapes during a run."),
    metrics_url: Optional[str] = typer.Option(None, help="Where the server's metrics are (default: the server root "
                                                         "of --url + /metrics)."),
    ray: Optional[str] = typer.Option(None, "--ray", is_flag=False, flag_value="local", metavar="[ADDRESS]",
                                      help="Send the load from --workers Ray actors (default 2): on the Ray cluster "
                                           "at ADDRESS (e.g. ray://head:10001 or auto), or alone (--ray) on a local "
                                           "Ray instance. Needs speedlimit[ray]."),
) -> None:
    """Load-test an OpenAI-compatible streaming server: TTFT, ITL, TPOT, E2E, throughput, goodput, errors."""
    # every input is checked here, before anything is created or sent
    if compare_estimate and not hardware:
        from speedlimit.catalog.profiles import saved_profile_names

        saved = saved_profile_names()
        mine = (f", or a profile calibrated here ({', '.join(saved[:5])}{', ...' if len(saved) > 5 else ''})" if saved
                else ", or `local` after `speedlimit verify` and `speedlimit calibrate` on the server's machine")
        raise SpeedlimitError(f"--compare-estimate needs --hardware NAME: a catalog name (`speedlimit hardware`){mine}")
    if compare_estimate:  # fail before the run, not after it
        from speedlimit.catalog import resolve_hardware, resolve_model

        from speedlimit.simulator.api import check_engine_spec

        resolve_hardware(hardware)
        check_engine_spec(replay_engine)
        if estimate_model:
            resolve_model(estimate_model)
        if engine is not None:
            from speedlimit.catalog import resolve_engine

            resolve_engine(engine)
        if weights is not None:
            from speedlimit.precision import parse_weights

            parse_weights(weights)
    for flag, value in (("tp", tp), ("dp", dp), ("ep", ep)):
        if value is not None and not 1 <= value <= MAX_TP:
            raise SpeedlimitError(f"--{flag} must be a whole number of GPUs from 1 to {MAX_TP}, got {value}")
    try:
        check_layout(tp or 1, 1, dp or 1, ep or 1)
    except ValueError as error:
        raise SpeedlimitError(str(error)) from None
    if not compare_estimate and any(v is not None for v in (engine, tp, dp, ep, weights, replay_engine)):
        raise SpeedlimitError("--engine, --tp, --dp, --ep, --weights and --replay-engine describe the server for "
                              "--compare-estimate: add --compare-estimate --hardware NAME")
    if not 0 < timeout < math.inf:
        raise SpeedlimitError("--timeout must be a finite number of seconds > 0")
    if not 0 < knee_fraction <= 1:
        raise SpeedlimitError("--knee-fraction must be in (0, 1]")
    if trace is not None and (sweep is not None or concurrency is not None or rate is not None):
        raise SpeedlimitError("--trace sets the arrivals: give no --concurrency, --rate or --sweep with it")
    if trace is not None:
        rate = math.inf  # a placeholder for LoadPlan (open loop); the trace's own times are used
    if sweep is None and concurrency is None and rate is None:
        concurrency = 1
    endpoint = Endpoint(url, model=model, api=api, api_key=api_key, include_usage=include_usage,
                        force_output=force_output, timeout_s=timeout, extra_body=_extra_body(extra_body))
    workload = WorkloadPlan(parse_length_spec(prompt_tokens), output_tokens, dataset, seed, prefix_tokens, trace,
                            time_scale, prefix_groups)
    slo_bounds = parse_slo(slo)
    sweep_spec = parse_sweep(sweep) if sweep else None
    if sweep_spec is None and concurrency is not None and rate is not None:
        raise SpeedlimitError("give exactly one of --concurrency (closed loop) or --rate (open loop)")
    base_plan = LoadPlan(concurrency=concurrency if sweep_spec is None else 1,
                         rate=rate if sweep_spec is None else None, burstiness=burstiness, requests=requests,
                         duration_s=duration, warmup=warmup)
    check_out_dir(out, force)
    from speedlimit.bench.workers import make_scale_out

    scale = make_scale_out(workers, None if ray in (None, "local") else ray, use_ray=ray is not None)
    stderr = Console(stderr=True)
    live = progress and stderr.is_terminal
    tracker = (lambda label, total: LiveProgress(stderr, label, total)) if live else None
    runner = BenchRunner(endpoint, workload, slo=slo_bounds, preflight=not skip_preflight, count_tokens=count_tokens,
                         tokenizer_path=tokenizer, progress=tracker, scale=scale, server_metrics=server_metrics,
                         metrics_interval_s=metrics_interval, metrics_url=metrics_url)
    if runner.trace is not None and requests is None and duration is None:
        base_plan.requests = len(runner.trace)  # the whole trace

    async def main() -> RunSummary | SweepSummary:
        with runner.stop_on_signals():
            async with runner:
                prepare_out_dir(out, force)
                if sweep_spec is not None:
                    return await runner.sweep(sweep_spec[0], sweep_spec[1], base_plan, out, knee_fraction)
                return (await runner.run(base_plan, out)).summary

    try:
        summary = run_async(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        where = f"; requests that finished are in {out / 'requests.jsonl'}" if out is not None else ""
        stderr.print(f"interrupted ({runner.interrupted or 'SIGINT'}) before a summary was written{where}",
                     highlight=False, soft_wrap=True)
        raise typer.Exit(code=130) from None
    results = runner.results
    runs = summary.points if isinstance(summary, SweepSummary) else [summary]
    comparison_error = None
    if compare_estimate:
        try:
            for point, result in zip(runs, results):
                point.estimate = replay_for(point, result.records, hardware=hardware, served_model=endpoint.model,
                                            estimate_model=estimate_model, engine=replay_engine, profile=engine,
                                            tp=tp, dp=dp, ep=ep, weights=weights)
        except SpeedlimitError as error:  # measured results still get printed (and are already on disk)
            comparison_error = error
        if out is not None:
            summary.save(out / "summary.json")
    if json_output:
        sys.stdout.write(json.dumps(summary.to_dict(), indent=2) + "\n")
    else:
        print_summary(Console(), summary)
    print_warnings(stderr, summary)
    if runner.interrupted is not None:
        print_interrupted(stderr, summary, out)
        raise typer.Exit(code=130)
    if comparison_error is not None:
        raise comparison_error
    failed = sum(point.failed for point in runs)
    if fail_on_error and failed:
        raise typer.Exit(code=1)
