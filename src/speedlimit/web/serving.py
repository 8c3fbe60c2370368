"""The web calculator's serving view: ``POST /api/simulate``, a load sweep through the serving simulator.

The body is the estimate's (`EstimateRequest`, i.e. the `Scenario` fields: model, hardware, weights, kv, tp, the
prompt and output lengths...) plus the load and the engine, named as on `speedlimit simulate`'s command line
(``load`` is the parameter of ``--sweep``, ``values`` its levels; ``batch`` and ``usd_per_hour`` are the estimate's
and play no part). The answer is the simulated sweep: per level TTFT and TPOT p50/p99, throughput and the queue; the
knee, the saturation throughput, the engine's saturation rate and the highest load meeting the SLOs; and the
`speedlimit simulate` command line that reproduces every level exactly.

Bounded work: one call simulates at most `STEP_BUDGET` engine steps and `TOKEN_BUDGET` generated tokens (both
estimated before anything runs), which is about a second on a 2-core machine. Without ``requests`` the requests per
level are what fits (at most `MAX_REQUESTS_PER_LEVEL`); a ``requests`` that does not fit, or a workload of which
not even `MIN_REQUESTS_PER_LEVEL` requests per level fit, is a 422 that says to use the command line instead.
"""

from __future__ import annotations

import math
import shlex
import time
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from speedlimit.bench.metrics import parse_slo
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator.api import resolve
from speedlimit.simulator.api import (SLO_ATTAINMENT, Workload, build_workload, engine_config, saturation_point,
                                      split_engine, sweep)
from speedlimit.simulator.engine import EngineConfig
from speedlimit.web.app import EstimateRequest  # the estimate's body: the Scenario fields and a pasted config

#: Engine steps one call may simulate (~4 µs each). The plan is an estimate made before running, so it aims at
#: `PLAN_SHARE` of the budget: closed-loop levels keep a little less than their concurrency in the batch.
STEP_BUDGET = 100_000
PLAN_SHARE = 0.75
#: Generated tokens one call may simulate (each is an inter-token gap that the summary pools).
TOKEN_BUDGET = 1_000_000
MIN_REQUESTS_PER_LEVEL = 8
MAX_REQUESTS_PER_LEVEL = 200
MAX_LEVELS = 12
#: Default rate levels, as fractions of the engine's saturation rate (the last two above it: the queue grows).
RATE_FRACTIONS = (0.1, 0.25, 0.5, 0.7, 0.85, 0.95, 1.1, 1.3)
FEWER_RATE_FRACTIONS = ((0.25, 0.5, 0.8, 0.95, 1.2), (0.5, 0.9, 1.2))


def _rate_levels(fractions: tuple[float, ...], saturation_rate: float) -> list[float]:
    return sorted({float(f"{f * saturation_rate:.3g}") for f in fractions if f * saturation_rate > 0}) or [saturation_rate]


class SimulateRequest(EstimateRequest):
    """The estimate's body plus the load and the engine, named as on `speedlimit simulate`'s command line."""

    load: Literal["concurrency", "rate"] = Field(
        "concurrency", description="What the sweep varies: clients in flight (closed loop) or arrivals per "
                                   "second (Poisson).")
    values: list[float] | None = Field(
        None, description=f"The load levels (1 to {MAX_LEVELS}). Default: concurrency 1, 2, 4, … up to twice "
                          "max_seqs; rate: fractions of the engine's saturation rate, up to 1.3×.")
    requests: int | None = Field(None, ge=1, description="Requests per level (default: what fits the call's "
                                                         f"budget, at most {MAX_REQUESTS_PER_LEVEL}).")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed for arrival times (bench's draws).")
    scheduler: Literal["continuous", "serial"] | None = Field(
        None, description="continuous (batching, vLLM/llama-server) or serial (one request at a time); default: the "
                          "engine profile's (``engine``), with its defaults for the knobs below.")
    max_seqs: int | None = Field(None, ge=1, le=100_000, description="Running-sequence cap (default: the engine "
                                                                     "profile's).")
    max_batched_tokens: int | None = Field(None, ge=1, le=10_000_000,
                                           description="Token budget per step (default: the engine profile's).")
    chunked_prefill: bool | None = Field(None, description="Split prompts over steps within the token budget "
                                                           "(default: the engine profile's).")
    prefix_tokens: int = Field(0, ge=0, le=2**20, description="A shared prefix (a system prompt) of this many tokens "
                                                              "starts every prompt, added to prompt (bench's "
                                                              "--prefix-tokens).")
    prefix_caching: bool | None = Field(None, description="Reuse the cached KV blocks of the shared prefix (default: "
                                                          "the engine profile's).")
    slot_streams: bool = Field(False, description="llama.cpp's server started with --parallel N: each slot its own KV "
                                                  "stream, a step one forward pass per run of consecutive busy slots "
                                                  "(continuous scheduler, chunked prefill).")
    slot_similarity: float | None = Field(None, ge=0, le=1, description="llama-server (the llama.cpp engines, "
                                                                      "slot_streams): its --slot-prompt-similarity "
                                                                      "(default 0.1).")
    cache_ram: float | None = Field(None, ge=-1, le=2**40, description="llama-server: its --cache-ram prompt cache in "
                                                                       "MiB (0: off, -1: no limit; default 8192).")
    cache_idle_slots: bool | None = Field(None, description="llama-server: it saves idle slots' prompts to that cache "
                                                            "as each request starts (default: on).")
    slo: str | None = Field(None, max_length=200, description="Goodput SLO as on the command line, e.g. "
                                                              "ttft=1s,tpot=50ms (keys ttft itl tpot e2e).")

    @model_validator(mode="before")
    @classmethod
    def _scheduler_spelled_as_engine(cls, data: Any) -> Any:
        """``engine: continuous|serial`` (the spelling from before engine profiles) names the scheduler."""
        if isinstance(data, dict) and isinstance(data.get("engine"), str):
            engine, scheduler, _ = split_engine(data["engine"], data.get("scheduler"))
            if scheduler is not None and engine is None:
                data = {**data, "engine": None, "scheduler": scheduler}
        return data

    @field_validator("cache_ram")
    @classmethod
    def _cache_ram(cls, value: float | None) -> float | None:
        if value is not None and value < 0 and value != -1:
            raise ValueError(f"cache_ram is MiB from 0 (off) up, or -1 (no limit), got {value!r}")
        return value

    @field_validator("values")
    @classmethod
    def _levels(cls, values: list[float] | None) -> list[float] | None:
        if values is None:
            return None
        if not 1 <= len(values) <= MAX_LEVELS:
            raise ValueError(f"give 1 to {MAX_LEVELS} load levels, got {len(values)}")
        if any(not math.isfinite(v) or v <= 0 for v in values):
            raise ValueError("load levels must be positive finite numbers")
        return sorted(set(values))



def _per_request(prompt: int, output: int, engine: EngineConfig) -> float:
    """Steps one request needs alone: its decode steps and its prefill chunks."""
    return output + math.ceil(prompt / engine.max_batched_tokens)


def _slots_held(prompt: int, output: int, engine: EngineConfig) -> float:
    """How many sequences the engine can run at once: its cap, or what the KV cache holds at full length."""
    if not math.isfinite(engine.kv_capacity_tokens):
        return float(engine.slots)
    return float(max(1, min(engine.slots, engine.kv_capacity_tokens // (prompt + output))))


def _default_concurrency(engine: EngineConfig) -> list[float]:
    top = min(2 * engine.slots, 1024)
    return [float(2 ** k) for k in range(0, int(math.log2(top)) + 1)]


def _plan_requests(values: list[float], parameter: str, given: int | None, prompt: int, output: int,
                   engine: EngineConfig, saturation_rate: float | None, sat_steps: float,
                   replicas: int = 1) -> tuple[int, float]:
    """Requests per level that keep the call within the budgets, and the steps that is estimated to take (over all
    ``replicas`` data-parallel replicas, each running its share of the clients)."""
    per_request = _per_request(prompt, output, engine)
    held = _slots_held(prompt, output, engine)

    def batch_at(value: float) -> float:  # the running batch this level keeps, roughly
        if parameter == "concurrency":
            return max(1.0, min(value / replicas, held))
        share = value / saturation_rate if saturation_rate else 1.0
        return max(1.0, min(held, share * held))

    steps_per = sum(per_request / batch_at(v) for v in values)  # steps for one request at every level
    tokens_per = output * len(values)
    fits = int(min((PLAN_SHARE * STEP_BUDGET - sat_steps) / steps_per, TOKEN_BUDGET / tokens_per))
    if parameter == "concurrency":
        # a closed loop needs a few waves at its top level to show its steady state
        wanted = min(MAX_REQUESTS_PER_LEVEL, max(MIN_REQUESTS_PER_LEVEL, 3 * int(max(values))))
    else:
        wanted = MAX_REQUESTS_PER_LEVEL
    if given is not None:
        if given > fits:
            raise SpeedlimitError(
                f"requests {given:,} per level × {len(values)} levels is more than one web call simulates (here at "
                f"most {max(fits, 0):,} per level, about a second of work); lower requests or output, or run "
                "speedlimit simulate")
        return given, given * steps_per + sat_steps
    if fits < MIN_REQUESTS_PER_LEVEL:
        raise SpeedlimitError(
            f"{len(values)} levels of {MIN_REQUESTS_PER_LEVEL} requests with {output:,}-token outputs are more than one "
            f"web call simulates (about a second of work); lower output or the number of levels, or run "
            "speedlimit simulate")
    count = min(wanted, fits)
    return count, count * steps_per + sat_steps


def _saturation_requests(prompt: int, output: int, engine: EngineConfig) -> tuple[int, float]:
    """Requests for the closed-loop run that measures the saturation rate: a few waves of the engine's slots,
    within a third of the step budget."""
    held = _slots_held(prompt, output, engine)
    per_request = _per_request(prompt, output, engine)
    wanted = int(min(4000, max(200, 6 * engine.slots)))
    fits = int((PLAN_SHARE * STEP_BUDGET / 3) * held / per_request)
    if fits < max(MIN_REQUESTS_PER_LEVEL, 2 * held):
        raise SpeedlimitError(
            f"finding the saturation rate for {output:,}-token outputs is more than one web call simulates (about a "
            "second of work); lower output, sweep concurrency, or run speedlimit simulate")
    count = min(wanted, fits)
    return count, count * per_request / held


def _command_line(body: Any, scenario: Any, parameter: str, values: list[float], requests: int) -> str:
    """The `speedlimit simulate` command that runs the same levels (every per-level figure is identical)."""
    argv = ["speedlimit", "simulate", "-m", str(body.model if body.config is None else "CONFIG.json")]
    inputs = scenario.model_dump(exclude={"model", "batch", "prompt", "output", "usd_per_hour"})
    flags = {"hardware": "-H", "profile": "--profile", "bandwidth": "--bandwidth", "flops": "--flops",
             "memory": "--memory", "weights": "--weights", "kv": "--kv", "compute": "--compute", "tp": "--tp",
             "threads": "--threads", "numa": "--numa",
             "pp": "--pp", "dp": "--dp", "ep": "--ep",
             "bw_efficiency": "--bw-efficiency", "flops_efficiency": "--flops-efficiency",
             "step_overhead_s": "--step-overhead"}
    for field, flag in flags.items():
        value = inputs.get(field)
        if value is None or (field in ("tp", "pp", "dp", "ep") and value == 1):
            continue
        argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if inputs.get("ideal"):
        argv.append("--ideal")
    argv += ["--prompt-tokens", str(scenario.prompt), "--output-tokens", str(scenario.output),
             "--sweep", f"{parameter}=" + ",".join(f"{v:g}" for v in values), "--requests", str(requests)]
    if body.seed:
        argv += ["--seed", str(body.seed)]
    if body.engine:
        argv += ["--engine", str(body.engine)]
    if body.scheduler:
        argv += ["--scheduler", body.scheduler]
    if body.max_seqs is not None:
        argv += ["--max-seqs", str(body.max_seqs)]
    if body.max_batched_tokens is not None:
        argv += ["--max-batched-tokens", str(body.max_batched_tokens)]
    if body.chunked_prefill is not None:
        argv.append("--chunked-prefill" if body.chunked_prefill else "--no-chunked-prefill")
    if body.prefix_tokens:
        argv += ["--prefix-tokens", str(body.prefix_tokens)]
    if body.prefix_caching is not None:
        argv.append("--prefix-caching" if body.prefix_caching else "--no-prefix-caching")
    if body.slot_streams:
        argv.append("--slot-streams")
    if body.slot_similarity is not None:
        argv += ["--slot-similarity", f"{body.slot_similarity:g}"]
    if body.cache_ram is not None:
        argv += ["--cache-ram", f"{body.cache_ram:g}"]
    if body.cache_idle_slots is not None:
        argv.append("--cache-idle-slots" if body.cache_idle_slots else "--no-cache-idle-slots")
    if body.slo:
        argv += ["--slo", body.slo]
    return shlex.join(argv)


def _seconds(distribution: Any, quantile: str) -> float | None:
    return None if distribution is None else getattr(distribution, quantile)


def simulate_view(body: Any, scenario: Any) -> dict[str, Any]:
    """The serving view's answer for a validated body and its scenario."""
    started = time.perf_counter()
    if scenario.prompt < 1:
        raise SpeedlimitError("prompt must be at least 1 token for the serving simulation")
    slo = parse_slo(body.slo)
    step = resolve(scenario)
    engine = engine_config(body.scheduler, max_seqs=body.max_seqs, max_batched_tokens=body.max_batched_tokens,
                           chunked_prefill=body.chunked_prefill, step=step, prefix_caching=body.prefix_caching,
                           slot_streams=body.slot_streams, slot_similarity=body.slot_similarity,
                           cache_ram=body.cache_ram, cache_idle_slots=body.cache_idle_slots)
    parameter = body.load
    prompt, output = int(scenario.prompt), int(scenario.output)
    shared = int(body.prefix_tokens)
    planned = prompt + shared  # the budget plans every prompt whole (a cache hit only makes a level cheaper)
    saturation = None
    sat_steps = 0.0
    if parameter == "rate":
        sat_requests, sat_steps = _saturation_requests(planned, output, engine)
        probe = build_workload(concurrency=engine.slots, requests=sat_requests, prompt_tokens=prompt,
                               output_tokens=output, seed=body.seed, prefix_tokens=shared)
        saturation = saturation_point(step, engine, probe, requests=sat_requests)
        values = body.values or _rate_levels(RATE_FRACTIONS, saturation["request_s"])
    else:
        values = body.values or _default_concurrency(engine)
        if any(v != int(v) for v in values):
            raise SpeedlimitError("concurrency levels must be whole numbers")
        if max(values) > 100_000:
            raise SpeedlimitError("concurrency levels must be at most 100,000")
    plan = lambda levels: _plan_requests(levels, parameter, body.requests, planned, output, engine,  # noqa: E731
                                         saturation["request_s"] if saturation else None, sat_steps,
                                         int(scenario.dp))
    left_out: list[float] = []
    if parameter == "rate" and body.values is None:
        for fractions in FEWER_RATE_FRACTIONS:  # long outputs on a slow engine: fewer levels, or it would not fit
            try:
                plan(values)
                break
            except SpeedlimitError:
                values = _rate_levels(fractions, saturation["request_s"])
    if parameter == "concurrency" and body.values is None and body.requests is None:
        # a level with more clients than requests never reaches its concurrency: keep the levels the budget fills
        while len(values) > 3:
            try:
                if plan(values)[0] >= values[-1]:
                    break
            except SpeedlimitError:
                pass
            left_out.insert(0, values.pop())
    requests, planned_steps = plan(values)
    workloads: list[Workload] = [
        build_workload(**{parameter: int(v) if parameter == "concurrency" else v}, requests=requests,
                       prompt_tokens=prompt, output_tokens=output, seed=body.seed, prefix_tokens=shared, level=level)
        for level, v in enumerate(values)]
    summary, runs = sweep(step, engine, parameter, values, workloads, slo, saturation=saturation)
    points = []
    steps = 0
    for result in runs:
        s = result.summary
        sim = s.simulation or {}
        steps += sim.get("steps", 0)
        good = (s.goodput_requests >= SLO_ATTAINMENT * s.completed) if slo and s.completed else None
        points.append({
            "load": s.sweep_value, "completed": s.completed,
            "ttft_p50_s": _seconds(s.ttft_s, "p50"), "ttft_p99_s": _seconds(s.ttft_s, "p99"),
            "tpot_p50_s": _seconds(s.tpot_s, "p50"), "tpot_p99_s": _seconds(s.tpot_s, "p99"),
            "itl_p50_s": _seconds(s.itl_s, "p50"), "e2e_p50_s": _seconds(s.e2e_s, "p50"),
            "output_tok_s": s.output_tok_s, "request_s": s.request_s,
            "goodput_request_s": s.goodput_request_s if slo else None, "meets_slo": good,
            "batch_mean": sim.get("batch", {}).get("mean"), "queue_max": sim.get("queue", {}).get("max"),
            "kv_peak_fraction": sim.get("kv", {}).get("peak_fraction"), "saturated": bool(sim.get("saturated")),
            "prefix_cache_hit_rate": sim.get("prefix_cache_hit_rate"),
        })
    info = summary.sweep
    notes = []
    if saturation is not None:
        for point in points:
            if point["load"] > saturation["request_s"]:
                notes.append(f"rate {point['load']:g} req/s is above the engine's saturation rate "
                             f"{saturation['request_s']:.3g} req/s: the queue grows without bound (it reached "
                             f"{point['queue_max']:,} waiting after {requests:,} requests); its latencies grow with "
                             "the run's length")
    if left_out:
        notes.append(f"concurrency {', '.join(f'{v:g}' for v in left_out)} left out: {requests:,} requests per level "
                     f"(what one web call simulates with {output:,}-token outputs) cannot keep that many in flight; "
                     "give shorter outputs, or run the command below with more --requests")
    elif parameter == "concurrency" and values[-1] > requests:
        notes.append(f"only {requests:,} requests per level: concurrency above {requests:,} never has that many in "
                     "flight")
    if saturation is None and points and points[-1]["queue_max"]:
        top = points[-1]
        notes.append(f"at concurrency {top['load']:g} requests wait in the engine's queue (up to "
                     f"{top['queue_max']:,}): more clients than it runs at once add latency, not throughput")
    return {
        "parameter": parameter, "values": values, "requests_per_level": requests,
        "prompt": prompt, "prefix_tokens": shared, "output": output, "slo": slo, "points": points,
        "knee_load": info.knee_load, "knee_output_tok_s": info.knee_output_tok_s, "knee_fraction": info.knee_fraction,
        "saturation_output_tok_s": info.saturation_output_tok_s, "saturation_load": info.saturation_load,
        "saturation_request_s": saturation["request_s"] if saturation else None,
        "saturation_rate_output_tok_s": saturation["output_tok_s"] if saturation else None,
        "slo_max_load": info.slo_max_load, "notes": notes, "engine": summary.engine,
        "command": _command_line(body, scenario, parameter, values, requests),
        "work": {"steps": steps, "planned_steps": round(planned_steps), "step_budget": STEP_BUDGET,
                 "generated_tokens": requests * output * len(values), "token_budget": TOKEN_BUDGET,
                 "wall_s": time.perf_counter() - started},
    }
