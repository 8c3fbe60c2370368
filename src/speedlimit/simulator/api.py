"""`simulate()`: resolve a scenario, build bench's workload, run the engine core, return bench's typed artifacts.

The workload is bench's, draw for draw: prompt lengths from the same seeded generator (`numpy.random.default_rng([seed,
0])`), open-loop arrival times from `bench.workload.arrival_offsets_s`, closed-loop clients that send the next request
when one ends, dataset rows shuffled the same way. Records are `RequestRecord`s and the summary comes from
`bench.metrics.summarize`, so every definition (TTFT, ITL, TPOT, E2E, goodput, throughput over first send → last end)
is the one bench uses. Shared prefixes are bench's too: ``--prefix-tokens`` starts every prompt with one of
``--prefix-groups`` seeded texts (prompt i gets text i mod groups), and a dataset conversation's turns each repeat the
turns before them; with the engine's prefix caching on, the engine reuses them.

Data parallelism (``--dp N``, `run_replicas`): N replicas of the engine, each one tp (× pp) devices with
its own scheduler, queue and KV cache (`replica_step`), behind a front end that deals requests round-robin
(`ROUTING`, `route_workload`); each replica's share runs through the engine core on its own, and the replicas' records
merge into one run (one summary, and the simulation block's per-replica figures). With ``--ep`` too the replicas share
their routed experts and step together (`coupled`, `engine.run_lockstep`): each still schedules its own batch, and a
step lasts as long as the slowest replica's (SGLang's DP attention, vLLM's DP + EP).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from speedlimit.artifacts import LoadInfo, RequestRecord, RunSummary, SweepInfo, SweepSummary
from speedlimit.bench.metrics import find_knee, parse_slo, summarize
from speedlimit.bench.workload import (LengthSpec, _dataset_order, arrival_offsets_s, checked_seed, level_seed,
                                      load_dataset, parse_length_spec)
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.engine_profile import EngineProfile
from speedlimit.estimator.api import StepModel, step_model
from speedlimit.simulator.engine import EngineConfig, RawRun, run, run_lockstep

#: Defaults per engine mode: vLLM's online-serving scheduler (256 sequences, 8,192 tokens per step, chunked
#: prefill) and llama-cpp-python's server (one request at a time, prompts evaluated in n_batch = 512-token calls).
ENGINE_DEFAULTS = {"continuous": {"max_seqs": 256, "max_batched_tokens": 8192},
                   "serial": {"max_seqs": 1, "max_batched_tokens": 512}}
#: Points kept of each over-time series in the summary's `simulation.timeline`.
TIMELINE_POINTS = 200
#: A sweep point meets the SLOs when at least this fraction of its completed requests meet every bound (the p99
#: request is good).
SLO_ATTAINMENT = 0.99
#: Requests in the closed-loop run that measures the saturation rate (at concurrency = the engine's slots).
SATURATION_REQUESTS = (200, 4000)
MAX_REQUESTS = 10_000_000
#: Latest send time an open-loop workload may have (about 32 years): beyond it times lose their nanoseconds.
MAX_SIMULATED_S = 1e9


@dataclass
class Workload:
    """What the clients send: per-request prompt/output lengths (cycled in closed loop), and the load."""

    prompts: list[int]
    outputs: list[int]
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    arrivals: list[float] | None = None  # open loop: send times (seconds from start)
    seed: int = 0
    describe: dict[str, Any] | None = None
    trace: str | None = None  # --trace: the replayed trace file (arrivals at its recorded times)
    time_scale: float | None = None
    # per prompt: its prefix group (-1: none) and the leading tokens it has in common with that group (None: no prompt
    # shares anything)
    prefix_group: list[int] | None = None
    shared_tokens: list[int] | None = None
    prefix_parent: dict[int, tuple[int, int]] | None = None  # {group: (parent group, tokens)}: a chain continued
    indices: list[int] | None = None  # a replay: each prompt's request index in the measured run

    def load_info(self) -> LoadInfo:
        return LoadInfo(concurrency=self.concurrency, rate=self.rate, burstiness=self.burstiness,
                        requests=self.requests, duration_s=self.duration_s, trace=self.trace,
                        time_scale=self.time_scale)

    def prefix_args(self) -> dict[str, Any]:
        """What the engine core needs to know of the shared prefixes (`engine.run`'s keyword arguments)."""
        return {"prefix_group": self.prefix_group, "shared_tokens": self.shared_tokens,
                "group_parent": self.prefix_parent}


@dataclass
class Simulation:
    """One simulated run: the summary (bench's `RunSummary`, ``source="simulate"``) and its per-request records."""

    summary: RunSummary
    records: list[RequestRecord]
    raw: RawRun  # the engine's run (--dp > 1: replica 0's; every replica's in `replica_raws`)
    replica_raws: list[RawRun] | None = None  # --dp > 1: each replica that got requests, in replica order


# --------------------------------------------------------------------------------------------
# inputs


def _whole(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value != int(value) or not low <= value <= high:
        raise SpeedlimitError(f"--{name} must be a whole number between {low:,} and {high:,}, got {value!r}")
    return int(value)


def _length_spec(value: Any, what: str) -> LengthSpec:
    spec = value if isinstance(value, LengthSpec) else parse_length_spec(str(value))
    if spec.kind == "fixed" or spec.kind == "uniform":
        _whole(what, spec.a, 1, 10_000_000)
    if spec.kind == "uniform":
        _whole(what, spec.b, 1, 10_000_000)
    if spec.kind == "normal" and (spec.a > 10_000_000 or spec.b > 10_000_000):
        raise SpeedlimitError(f"--{what} {value!r} is absurdly long")
    return spec


def replica_step(step: StepModel) -> tuple[StepModel, int]:
    """(one data-parallel replica's step model, the replicas): a replica is tp (× pp) devices with its own
    scheduler, queue and KV cache. Independent replicas (no --ep) each hold the whole model, so their step costs and
    KV capacity are the dp = 1 ones (`core.Machine.dp` spreads a step over replicas in lockstep; the simulator runs
    each replica's own steps instead).

    With --ep the MoE layers of all the replicas form one expert-parallel group that every forward pass synchronizes
    ("expert layers across all ranks are required to synchronize during every forward pass",
    https://docs.vllm.ai/en/latest/serving/data_parallel_deployment/; SGLang's DP attention likewise: "each rank
    schedules attention work locally while all ranks still participate in the same MoE collective",
    https://github.com/sgl-project/sglang/pull/35017): the replicas are coupled (`coupled`), and the step model keeps
    the whole group (dp and ep), whose per-replica KV budget already counts only the replica's share of the
    experts; `run_lockstep` steps them together."""
    replicas = int(step.machine.dp)
    if replicas == 1 or coupled(step):
        return step, replicas
    return step._replace(machine=step.machine._replace(dp=1.0)), replicas


def coupled(step: StepModel) -> bool:
    """Whether the data-parallel replicas share their routed experts (--dp with --ep) and so step together."""
    machine = step.machine
    if machine.dp > 1 and machine.ep > 1 and machine.pp > 1:
        raise SpeedlimitError(f"--dp {int(machine.dp)} with --ep {int(machine.ep)} and --pp {int(machine.pp)}: simulate "
                              "steps expert-sharing replicas together only without pipeline stages; drop --pp, or "
                              "use estimate (it prices the whole layout)")
    return machine.dp > 1 and machine.ep > 1


def engine_config(mode: str | None = None, *, max_seqs: int | None = None, max_batched_tokens: int | None = None,
                  chunked_prefill: bool | None = None, block_size: int = 16, kv_tokens: float | None = None,
                  step: StepModel | None = None, profile: EngineProfile | None = None,
                  use_profile: bool = True, prefix_caching: bool | None = None,
                  slot_streams: bool = False, slots_used: int = 0,
                  slot_history: tuple[int, ...] = (), slot_similarity: float | None = None,
                  cache_ram: float | None = None, cache_idle_slots: bool | None = None) -> EngineConfig:
    """An engine's scheduler: explicit options over the engine profile's defaults (``profile``, else ``step``'s
    engine; vLLM's and SGLang's depend on the device's memory and the KV capacity); with ``mode`` given
    (continuous or serial), that scheduler's generic defaults instead. The KV capacity from memory beside the weights (one data-parallel replica's). ``use_profile=False``: the mode's generic defaults only.
    ``slot_similarity``, ``cache_ram`` (MiB; -1: no limit) and ``cache_idle_slots``: llama-server's flags of those
    names, which decide how its slots reuse prompts (`EngineConfig`; the server's defaults where None)."""
    # replicas that share their experts step together (SGLang's DP attention), and some engines split their token
    # budget among them
    lockstep_replicas = int(step.machine.dp) if step is not None and coupled(step) else 1
    if step is not None:
        step, _ = replica_step(step)  # one replica's scheduler and KV cache
    if profile is None and step is not None:
        profile = step.engine
    if not use_profile or mode is not None:  # a scheduler named explicitly runs on its generic defaults
        profile = None
    if mode is None:
        mode = profile.mode.value if profile is not None else "continuous"
    mode = str(mode).strip().lower()
    if mode not in ENGINE_DEFAULTS:
        raise SpeedlimitError(f"--scheduler must be continuous or serial, got {mode!r}")
    defaults = dict(ENGINE_DEFAULTS[mode])
    if mode == "serial" and max_seqs not in (None, 1):
        raise SpeedlimitError("the serial scheduler runs one request at a time: drop --max-seqs or use --scheduler continuous")
    block_size = _whole("block-size", block_size, 1, 65_536)
    prefill_first = None  # the generic scheduler: prefill-first without chunked prefill (vLLM V0), mixed with it (V1)
    slot_prompts = False  # llama-server's per-slot prompt reuse
    if kv_tokens is not None:
        capacity = float(_whole("kv-tokens", kv_tokens, 1, 10**12))
    elif step is not None:
        per_token = float(core.kv_bytes_per_sequence(step.cost, 1.0))
        budget = step.kv_budget_bytes()
        if budget <= 0:
            raise SpeedlimitError(f"{step.arch.name} does not fit on {step.devices} × {step.device.name}: the weights leave "
                                  "no memory for the KV cache (try --tp, fewer --weights bits)")
        capacity = math.floor(budget / per_token) if per_token > 0 and math.isfinite(budget) else math.inf
    else:
        capacity = math.inf
    if profile is not None:
        memory = step.device.memory_bytes if step is not None else None
        device = step.device if step is not None else None
        defaults = {"max_seqs": profile.max_seqs.at(memory, capacity, device),
                    "max_batched_tokens": profile.batched_tokens_per_replica(profile.max_batched_tokens.at(memory, device=device),
                                                                             lockstep_replicas)}
        if chunked_prefill is None:
            chunked_prefill = bool(profile.chunked_prefill.value)
        if profile.prefill_first is not None:
            prefill_first = bool(profile.prefill_first.value)
        if prefix_caching is None:
            prefix_caching = bool(profile.prefix_caching.value)
        slot_prompts = profile.slot_prompts is not None and bool(profile.slot_prompts.value)
    max_seqs = _whole("max-seqs", defaults["max_seqs"] if max_seqs is None else max_seqs, 1, 1_000_000)
    tokens = _whole("max-batched-tokens", defaults["max_batched_tokens"] if max_batched_tokens is None
                    else max_batched_tokens, 1, 10_000_000)
    config = EngineConfig(mode=mode, max_seqs=max_seqs, max_batched_tokens=tokens,
                          chunked_prefill=True if chunked_prefill is None else bool(chunked_prefill),
                          prefill_first=prefill_first,
                          block_size=block_size, kv_capacity_tokens=capacity,
                          prefix_caching=bool(prefix_caching), slot_streams=bool(slot_streams), slots_used=slots_used,
                          slot_history=tuple(slot_history), slot_prompts=slot_prompts,
                          **_slot_cache_options(bool(slot_streams) or slot_prompts, slot_similarity, cache_ram,
                                                cache_idle_slots))
    if slot_streams and lockstep_replicas > 1:
        raise SpeedlimitError("--slot-streams (llama.cpp's server slots) does not combine with data-parallel replicas "
                              "that step together")
    if max_batched_tokens is None and mode == "continuous" and tokens < max_seqs and not config.prefills_alone:
        # a step that mixes decodes with prefills must hold every running sequence's decode (vLLM requires
        # max_num_batched_tokens >= max_num_seqs); where prefill steps run alone the budget is theirs only
        config = replace(config, max_batched_tokens=max_seqs)
    return config.check()


def _slot_cache_options(slots: bool, slot_similarity: float | None, cache_ram: float | None,
                        cache_idle_slots: bool | None) -> dict[str, Any]:
    """`EngineConfig`'s fields for llama-server's prompt reuse flags that were given (--cache-ram -1, the server's
    "no limit", is an unbounded cache); ``slots``: whether the engine is llama-server's (slot streams, or a profile
    whose prompts are reused per slot)."""
    given = {k: v for k, v in (("slot_similarity", slot_similarity), ("cache_ram_mib", cache_ram),
                               ("cache_idle_slots", cache_idle_slots)) if v is not None}
    if given and not slots:
        raise SpeedlimitError("slot_similarity, cache_ram and cache_idle_slots are llama-server's slot flags: they "
                              "need slot_streams=1 (--slot-streams) or a llama.cpp engine")
    if given.get("cache_ram_mib") == -1:
        given["cache_ram_mib"] = math.inf
    return given


def split_engine(engine: Any, scheduler: str | None = None) -> tuple[Any, str | None, bool]:
    """(engine profile name, scheduler mode, whether the profile's scheduler defaults apply).

    The spelling from before engine profiles, ``engine="continuous"|"serial"``, names a generic scheduler (256
    sequences and 8,192 tokens per step, or one request at a time) on the default engine's step costs."""
    if isinstance(engine, str) and engine.strip().lower() in ENGINE_DEFAULTS:
        if scheduler is not None and scheduler.strip().lower() != engine.strip().lower():
            raise SpeedlimitError(f"--engine {engine} and --scheduler {scheduler} conflict: give the scheduler once")
        return None, engine.strip().lower(), False
    return engine, scheduler, True


def _shared_prefixes(workload: Workload, prefix_tokens: Any, prefix_groups: Any,
                     conversations: list[int | None] | None = None) -> Workload:
    """What the prompts share, as bench sends them: with ``prefix_tokens``, each prompt grows by one of
    ``prefix_groups`` texts of that length (prompt i gets text i mod groups, bench's `add_shared_prefix`); a dataset
    conversation's turn has its whole prompt in common with the conversation's later turns (bench sends each turn
    after the turns before it), unless several prefixes start its turns (request i gets prefix i mod groups, so
    consecutive turns start differently and share only their prefix). A conversation is its own group, whose chain
    continues the one prefix's when there is one (every conversation starts with it)."""
    from speedlimit.bench.runner import MAX_TOKENS

    prefix_tokens = _whole("prefix-tokens", prefix_tokens, 0, MAX_TOKENS)
    prefix_groups = _whole("prefix-groups", prefix_groups, 1, MAX_REQUESTS)
    if prefix_groups > 1 and not prefix_tokens:
        raise SpeedlimitError(f"--prefix-groups {prefix_groups} needs --prefix-tokens: the length of each group's "
                              "prefix")
    if prefix_groups > 1:  # consecutive turns start with different prefixes: no history in common
        conversations = None
    chats = conversations is not None and any(c is not None for c in conversations)
    if not prefix_tokens and not chats:
        return workload
    prompts = [p + prefix_tokens for p in workload.prompts]
    group = [i % prefix_groups if prefix_tokens else -1 for i in range(len(prompts))]
    shared = [prefix_tokens] * len(prompts)
    parents: dict[int, tuple[int, int]] = {}
    for i, conversation in enumerate(conversations or ()):
        if conversation is not None:
            group[i], shared[i] = prefix_groups + conversation, prompts[i]
            if prefix_tokens:
                parents[group[i]] = (0, prefix_tokens)
    workload.prompts, workload.prefix_group, workload.shared_tokens = prompts, group, shared
    workload.prefix_parent = parents or None
    if prefix_tokens and workload.describe is not None:
        workload.describe.update(prefix_tokens=prefix_tokens, prefix_groups=prefix_groups)
    return workload


def _trace_workload(path: Path, time_scale: float, requests: int | None, duration_s: float | None,
                    dataset: Any, concurrency: Any, rate: Any, seed: int) -> Workload:
    """bench --trace's workload: the trace's first ``requests`` rows (all by default) at their recorded times ×
    ``time_scale``, each with its recorded prompt and output lengths."""
    from speedlimit.bench.workload import load_trace, trace_offsets_s

    if concurrency is not None or rate is not None or dataset is not None or duration_s is not None:
        raise SpeedlimitError("--trace sets the arrivals and lengths: give no --concurrency, --rate, --duration, "
                              "--dataset or --sweep with it")
    rows = load_trace(path)
    if requests is not None:
        rows = rows[:_whole("requests", requests, 1, MAX_REQUESTS)]
    arrivals = trace_offsets_s(rows, time_scale)
    if arrivals[-1] > MAX_SIMULATED_S:
        raise SpeedlimitError(f"--trace {path} × --time-scale {time_scale:g} spans {arrivals[-1]:.3g} s of simulated "
                              f"time (at most {MAX_SIMULATED_S:.0e} s): lower --time-scale")
    return Workload(prompts=[r.prompt_tokens for r in rows], outputs=[r.output_tokens for r in rows],
                    requests=len(rows), arrivals=arrivals, seed=seed, trace=str(path), time_scale=time_scale,
                    describe={"prompt_tokens": f"trace {path}", "output_tokens": f"trace {path}", "dataset": None,
                              "trace": str(path), "time_scale": time_scale, "seed": seed})


def build_workload(*, concurrency: int | None = None, rate: float | None = None, burstiness: float = 1.0,
                   requests: int | None = None, duration_s: float | None = None, prompt_tokens: Any = 128,
                   output_tokens: Any = 64, dataset: Path | str | None = None, seed: int = 0,
                   trace: Path | str | None = None, time_scale: float = 1.0, prefix_tokens: int = 0,
                   prefix_groups: int = 1, level: int = 0) -> Workload:
    """Bench's workload for these options, draw for draw (same seed → same lengths and arrival times as bench).
    ``trace``: bench's --trace, every request at its recorded time and with its recorded lengths. ``prefix_tokens``,
    ``prefix_groups``: bench's shared prefixes (`_shared_prefixes`). ``level``: the sweep level, whose lengths bench
    draws from `level_seed` (its arrivals from ``seed``)."""
    from speedlimit.bench.runner import LoadPlan  # validates the load options exactly as bench does

    if trace is not None:
        return _shared_prefixes(_trace_workload(Path(trace), time_scale, requests, duration_s, dataset, concurrency,
                                                rate, seed), prefix_tokens, prefix_groups)
    if concurrency is None and rate is None:
        concurrency = 1
    if concurrency is not None:
        concurrency = _whole("concurrency", concurrency, 1, 1_000_000)
    if rate is not None and not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate == rate):
        raise SpeedlimitError(f"--rate must be a number of requests per second, got {rate!r}")
    if rate is not None and math.isfinite(rate) and rate > 1e9:
        raise SpeedlimitError(f"--rate {rate:g} is absurd (at most 1e9 requests/s; inf sends all at once)")
    if burstiness is None or not math.isfinite(burstiness) or not 0 < burstiness <= 1e6:
        raise SpeedlimitError(f"--burstiness must be a positive number, got {burstiness!r}")
    if requests is not None:
        requests = _whole("requests", requests, 1, MAX_REQUESTS)
    if duration_s is not None and (not math.isfinite(duration_s) or not 0 < duration_s <= 1e7):
        raise SpeedlimitError(f"--duration must be between 0 and 1e7 seconds, got {duration_s!r}")
    seed = checked_seed(seed)
    plan = LoadPlan(concurrency=concurrency, rate=rate, burstiness=burstiness, requests=requests,
                    duration_s=duration_s)
    if plan.rate is not None and plan.duration_s is not None and math.isinf(plan.rate):
        raise SpeedlimitError("--rate inf sends everything at once: give --requests, not --duration")
    n_requests = plan.request_count  # bench's: requests, or what --rate × --duration can send
    prompt_spec = _length_spec(prompt_tokens, "prompt-tokens")
    pool = plan.pool_size(prompt_spec.mean)  # bench's prompt pool; requests past it reuse the lengths in turn
    draw_seed = level_seed(seed, level)
    rng = np.random.default_rng([draw_seed, 0])
    default_output = _length_spec(output_tokens, "output-tokens")
    conversations: list[int | None] | None = None
    if dataset is not None:
        rows = load_dataset(Path(dataset))
        order = _dataset_order(rows, rng)  # bench's order: shuffled, a conversation's turns kept together
        prompts, outputs, conversations = [], [], []
        fallback = default_output.sample(pool, np.random.default_rng([draw_seed, 3]))
        for i in range(pool):
            row = rows[int(order[i % len(rows)])]
            prompts.append(max(1, _dataset_prompt_tokens(row)))
            conversations.append(row.get("_conversation"))
            given = row.get("output_tokens") or row.get("max_tokens")
            outputs.append(_whole("output-tokens", given, 1, 10_000_000) if given is not None else fallback[i])
        prompt_text = f"dataset {dataset}"
    else:
        prompts = prompt_spec.sample(pool, rng)  # exactly bench's draw
        outputs = default_output.sample(pool, np.random.default_rng([draw_seed, 3]))
        prompt_text = str(prompt_tokens)
    arrivals = None
    if plan.rate is not None:
        arrivals = arrival_offsets_s(n_requests, plan.rate, plan.burstiness, seed)
        sent = arrivals if plan.duration_s is None else [a for a in arrivals if a < plan.duration_s]
        last = max(sent, default=0.0)
        if not math.isfinite(last) or last > MAX_SIMULATED_S:
            raise SpeedlimitError(f"--rate {plan.rate:g} spreads {n_requests:,} requests over {last:.3g} s of simulated "
                                  f"time (at most {MAX_SIMULATED_S:.0e} s): raise the rate or send fewer requests")
    workload = Workload(prompts=prompts, outputs=outputs, concurrency=plan.concurrency, rate=plan.rate,
                        burstiness=plan.burstiness, requests=plan.requests, duration_s=plan.duration_s,
                        arrivals=arrivals, seed=seed,
                        describe={"prompt_tokens": prompt_text, "output_tokens": str(output_tokens),
                                  "dataset": str(dataset) if dataset else None, "seed": seed, "prompt_seed": draw_seed})
    return _shared_prefixes(workload, prefix_tokens, prefix_groups, conversations)


def _dataset_prompt_tokens(row: dict[str, Any]) -> int:
    """A dataset row's prompt length: its own `prompt_tokens` if given, else words (bench's count without a tokenizer)."""
    given = row.get("prompt_tokens")
    if given is not None:
        return _whole("prompt_tokens in the dataset", given, 1, 10_000_000)
    text = row.get("prompt") or row.get("text") or ""
    if not text and isinstance(row.get("messages"), list):
        text = "\n".join(str(m.get("content", "")) for m in row["messages"] if isinstance(m, dict))
    return len(str(text).split())


# --------------------------------------------------------------------------------------------
# running


def run_workload(step: StepModel, engine: EngineConfig, workload: Workload, slo: dict[str, float] | None = None,
                 *, saturation: dict[str, float] | None = None, timeline_points: int = TIMELINE_POINTS) -> Simulation:
    """Simulate ``workload`` on ``engine`` for the model/hardware ``step``; records and bench's summary (with --dp,
    `run_replicas`)."""
    if step.machine.dp > 1:
        return run_replicas(step, engine, workload, slo, saturation=saturation, timeline_points=timeline_points)
    collecting = gc.isenabled()
    gc.disable()  # the run allocates ~1e5-1e6 containers that all live to the end: no cycles for the GC to find
    try:
        raw = run(step.cost, step.machine, engine, workload.prompts, workload.outputs, arrivals=workload.arrivals,
                  concurrency=workload.concurrency, requests=workload.requests, duration_s=workload.duration_s,
                  **workload.prefix_args())
        records = build_records(raw)
    finally:
        if collecting:
            gc.enable()
    duration = _duration(raw)
    open_loop = workload.arrivals is not None
    if open_loop and saturation is None:
        saturation = saturation_point(step, engine, workload)
    info = _simulation_block(raw, engine, workload, saturation, timeline_points)
    summary = summarize(records, duration, slo or {}, source="simulate", offered_load=workload.load_info(),
                        engine=_engine_block(step, engine, workload), simulation=info)
    return Simulation(summary, records, raw)


def _duration(raw: RawRun) -> float:
    first = min(raw.arrival) if raw.arrival else 0.0
    last = max((raw.end_times[s] for s in raw.last_step if s >= 0), default=first)
    return last - first


def build_records(raw: RawRun, indices: Sequence[int] | None = None) -> list[RequestRecord]:
    """Bench's records of a simulated run (built once at the end; ITL gaps share the step-gap float objects).
    ``indices``: each request's index in the records (default: its id in ``raw``)."""
    ends = raw.end_times
    steps = raw.decode_steps
    # gaps[i]: end of decode step i-1 → end of decode step i, the gap a sequence that decoded in both sees (prefill-only
    # steps in between, whose pause the sequence waits out, included)
    gaps = [0.0] + [ends[steps[i]] - ends[steps[i - 1]] for i in range(1, len(steps))]
    construct = RequestRecord.trusted
    fields = {"index", "start_ns", "end_ns", "ttft_s", "itl_s", "e2e_s", "prompt_tokens", "output_tokens",
              "output_chunks", "token_count_source", "prompt_token_source", "finish_reason", "queue_s", "prefill_s",
              "decode_s", "preemptions"}
    records = []
    for rid in range(raw.n):
        arrival = raw.arrival[rid]
        first_time = ends[raw.first_step[rid]]
        end_time = ends[raw.last_step[rid]]
        itl = []
        previous = None
        for a, b in raw.emission_steps(rid):  # a token at the end of step a, then one per decode step in (a, b]
            if previous is not None:
                itl.append(ends[a] - ends[previous])
            i, j = raw.decode_range(a, b)
            if j > i:
                itl.append(ends[steps[i]] - ends[a])
                itl.extend(gaps[i + 1:j])
            previous = b
        output = raw.output[rid]
        records.append(construct({
            "index": rid if indices is None else indices[rid], "start_ns": int(arrival * 1e9 + 0.5), "end_ns": int(end_time * 1e9 + 0.5),
            "ttft_s": first_time - arrival, "itl_s": itl, "e2e_s": end_time - arrival, "prompt_tokens": raw.prompt[rid],
            "output_tokens": output, "output_chunks": output, "token_count_source": "simulated",
            "prompt_token_source": "simulated", "finish_reason": "length", "queue_s": raw.scheduled[rid] - arrival,
            "prefill_s": first_time - raw.scheduled[rid], "decode_s": end_time - first_time,
            "preemptions": raw.preemptions[rid]}, fields))
    return records


def saturation_point(step: StepModel, engine: EngineConfig, workload: Workload,
                     requests: int | None = None) -> dict[str, float]:
    """The engine's sustainable rate for this workload: a closed-loop run with every slot busy, in steady state
    (completions between the 20th and 80th percentile, so the fill and the drain don't count). ``requests``: the
    run's length (default: six waves of the engine's slots, within `SATURATION_REQUESTS`). With --dp, the replicas'
    (round-robin routing keeps every replica's share equal: one replica's rate × the replicas)."""
    step, replicas = replica_step(step)
    slots = engine.slots
    low, high = SATURATION_REQUESTS
    n = int(min(high, max(low, 6 * slots))) if requests is None else _whole("requests", requests, 1, MAX_REQUESTS)
    load = dict(prompts=workload.prompts, outputs=workload.outputs, concurrency=slots, requests=n,
                **workload.prefix_args())
    if coupled(step):  # every replica saturated, stepping together: replica 0's rate stands for each
        raw = run_lockstep(step.cost, step.machine, engine, [load] * replicas)[0]
    else:
        raw = run(step.cost, step.machine, engine, **load)
    ends = sorted(raw.end_times[s] for s in raw.last_step)
    a, b = int(0.2 * len(ends)), int(0.8 * len(ends)) - 1
    if b <= a or ends[b] <= ends[a]:
        request_s = len(ends) / ends[-1]
    else:
        request_s = (b - a) / (ends[b] - ends[a])
    mean_output = sum(raw.output) / len(raw.output)
    if replicas > 1:
        request_s *= replicas
    return {"request_s": request_s, "output_tok_s": request_s * mean_output, "concurrency": slots * replicas}


def saturation_note(summary: RunSummary) -> str | None:
    """For a simulated open-loop run above the engine's saturation rate: that the queue grows without bound, and the
    saturation rate (None for any other run, bench's included)."""
    sim = summary.simulation or {}
    if not sim.get("saturated") or sim.get("saturation_request_s") is None:
        return None
    rate = summary.offered_load.rate if summary.offered_load else None
    offered = "the offered rate" if rate is None else f"the offered rate {rate:g} req/s"
    return (f"{offered} exceeds the engine's saturation rate "
            f"{sim['saturation_request_s']:.3g} req/s ({sim['saturation_output_tok_s']:,.0f} output tok/s): the queue "
            f"grows without bound (it reached {sim['queue']['max']:,} waiting); latencies grow with the run's length")


def _series(values: Sequence[float], idx: np.ndarray, digits: int = 4) -> list[float]:
    array = np.asarray(values, dtype=float)[idx]
    return [round(float(v), digits) for v in array]


def _simulation_block(raw: RawRun, engine: EngineConfig, workload: Workload, saturation: dict[str, float] | None,
                      points: int) -> dict[str, Any]:
    """What bench can't see: steps, batch and tokens per step, queue and KV over time, the time split, saturation."""
    ends = np.asarray(raw.end_times, dtype=float)
    steps = len(ends)
    dt = np.asarray(raw.step_s, dtype=float)
    busy = float(dt.sum())
    batch = np.asarray(raw.step_batch, dtype=float)
    tokens = np.asarray(raw.step_tokens, dtype=float)
    waiting = np.asarray(raw.step_waiting, dtype=float)
    kv = np.asarray(raw.step_kv_blocks, dtype=float)
    weight = dt / busy if busy > 0 else np.full(steps, 1.0 / max(steps, 1))
    capacity_tokens = engine.kv_capacity_tokens
    kv_fraction = kv / raw.kv_blocks if math.isfinite(raw.kv_blocks) else None
    idx = np.unique(np.linspace(0, steps - 1, min(points, steps)).round().astype(int)) if steps else np.array([], int)
    n = raw.n
    queue = [raw.scheduled[i] - raw.arrival[i] for i in range(n)]
    block: dict[str, Any] = {
        "steps": steps,
        "simulated_s": float(ends[-1]) if steps else 0.0,
        "idle_s": raw.idle_s,
        "batch": {"mean": float((batch * weight).sum()), "max": int(batch.max()) if steps else 0},
        "tokens_per_step": {"mean": float(tokens.mean()) if steps else 0.0, "max": int(tokens.max()) if steps else 0},
        "prefill_token_share": float(np.sum(raw.step_prefill) / tokens.sum()) if steps and tokens.sum() else 0.0,
        "in_system": {"mean": float((np.asarray(raw.step_in_system, dtype=float) * weight).sum())},
        "queue": {"mean": float((waiting * weight).sum()), "max": int(waiting.max()) if steps else 0,
                  "mean_wait_s": float(np.mean(queue)) if n else 0.0},
        "kv": {"capacity_tokens": capacity_tokens if math.isfinite(capacity_tokens) else None,
               "block_size": engine.block_size,
               "mean_fraction": float((kv_fraction * weight).sum()) if kv_fraction is not None and steps else None,
               "peak_fraction": float(kv_fraction.max()) if kv_fraction is not None and steps else None},
        "time_split": {"queue_s": float(np.mean(queue)) if n else None,
                       "prefill_s": float(np.mean([raw.end_times[raw.first_step[i]] - raw.scheduled[i] for i in range(n)]))
                       if n else None,
                       "decode_s": float(np.mean([raw.end_times[raw.last_step[i]] - raw.end_times[raw.first_step[i]]
                                                  for i in range(n)])) if n else None},
        "preemptions": int(sum(raw.preemptions)),
        "preempted_requests": len(raw.segments),
        # bench's server-metrics name: prompt tokens found cached / prompt tokens looked up, at each request's first
        # admission (as vLLM exports it); None when the engine caches no prefixes
        "prefix_cache_hit_rate": (raw.prefix_hit_tokens / raw.prefix_query_tokens if raw.prefix_query_tokens else 0.0)
        if engine.prefix_caching else None,
        "saturated": False,
        "timeline": {
            "t_s": _series(ends, idx, 6), "batch": _series(batch, idx), "tokens": _series(tokens, idx),
            "queue": _series(waiting, idx),
            "kv_fraction": _series(kv_fraction, idx) if kv_fraction is not None else None,
        },
    }
    return _saturation_fields(block, workload, saturation)


def _saturation_fields(block: dict[str, Any], workload: Workload, saturation: dict[str, float] | None) -> dict[str, Any]:
    """The simulation block's saturation rate (open loop) and whether the load saturates the engine."""
    if workload.arrivals is not None and saturation is not None:
        rate = workload.rate if workload.rate is not None else math.inf
        block["saturation_request_s"] = saturation["request_s"]
        block["saturation_output_tok_s"] = saturation["output_tok_s"]
        block["saturated"] = bool(rate > saturation["request_s"])
    elif workload.concurrency is not None:
        # closed loop: the engine is full when clients outnumber its slots or the KV cache holds them back
        block["saturated"] = bool(block["queue"]["mean"] >= 0.5)
    return block


# --------------------------------------------------------------------------------------------
# data-parallel replicas (--dp)

#: How the front end spreads requests over the replicas: round-robin, SGLang's default data-parallel load balancing
#: (ServerArgs.load_balance_method = "round_robin", https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/server_args.py,
#: dispatched by its data_parallel_controller.py). vLLM's API server instead sends each request to the engine with
#: the least 4 × waiting + running requests (DPLBAsyncMPClient in vllm/v1/engine/core_client.py); that choice
#: depends on every replica's state at each arrival, which independent replica runs cannot see, so it is not modelled.
ROUTING = "round-robin"


def route_workload(workload: Workload, replicas: int) -> list[Workload]:
    """Each busy replica's share of ``workload`` under round-robin routing; replica r of the B busy ones serves the
    workload's requests r, r + B, r + 2B, … (its local request j is request j·B + r, with that request's lengths and
    prefix group).

    Open loop: the requests in arrival order (those sent before ``duration_s``), dealt in turn; B = min(replicas,
    requests). Closed loop at concurrency C: the C clients split as evenly as possible over B = min(replicas, C,
    requests) replicas (the first C mod B get one more), each replica running its own closed loop with its clients
    over its dealt share of the requests (or until ``duration_s``). With C a multiple of B every replica runs the
    same closed loop as one engine at C / B."""
    pool = len(workload.prompts)
    if workload.arrivals is not None:
        arrivals = workload.arrivals
        if workload.duration_s is not None:
            arrivals = arrivals[:sum(1 for a in arrivals if a < workload.duration_s) or 1]  # what one engine sends
        busy = min(replicas, len(arrivals))
    else:
        busy = min(replicas, workload.concurrency, workload.requests or replicas)
    shares = []
    for r in range(busy):
        take = [(j * busy + r) % pool for j in range(pool)]  # period pool in j: the engine cycles prompts the same
        share = replace(workload, prompts=[workload.prompts[i] for i in take],
                        outputs=[workload.outputs[i] for i in take], indices=None)
        if workload.prefix_group is not None:
            share.prefix_group = [workload.prefix_group[i] for i in take]
        if workload.shared_tokens is not None:
            share.shared_tokens = [workload.shared_tokens[i] for i in take]
        if workload.arrivals is not None:
            share.arrivals, share.duration_s = arrivals[r::busy], None
            share.requests = len(share.arrivals)
        else:
            share.concurrency = workload.concurrency // busy + (r < workload.concurrency % busy)
            if workload.requests is not None:
                share.requests = len(range(r, workload.requests, busy))
        shares.append(share)
    return shares


def run_replicas(step: StepModel, engine: EngineConfig, workload: Workload, slo: dict[str, float] | None = None,
                 *, saturation: dict[str, float] | None = None, timeline_points: int = TIMELINE_POINTS) -> Simulation:
    """``workload`` on ``step.machine.dp`` data-parallel replicas of ``engine`` (`route_workload`), each a run of the
    engine core on one replica's step model (`replica_step`; independent runs, or stepped together when the replicas
    share their experts: `coupled`), merged into one run in bench's terms: the
    records of every replica (request index: the request's rank in routing order, j·B + r for replica r's j-th;
    times from the common start), one summary over them, and a simulation block with per-replica figures."""
    one, replicas = replica_step(step)
    shares = route_workload(workload, replicas)
    collecting = gc.isenabled()
    gc.disable()  # as run_workload: the runs' containers all live to the end
    try:
        loads = [dict(prompts=share.prompts, outputs=share.outputs, arrivals=share.arrivals,
                      concurrency=share.concurrency, requests=share.requests, duration_s=share.duration_s,
                      **share.prefix_args()) for share in shares]
        if coupled(step):
            raws = run_lockstep(one.cost, one.machine, engine, loads)
        else:
            raws = [run(one.cost, one.machine, engine, **load) for load in loads]
        busy = len(raws)
        routed = sorted(j * busy + r for r, raw in enumerate(raws) for j in range(raw.n))
        rank = {g: k for k, g in enumerate(routed)} if routed[-1] != len(routed) - 1 else None  # gaps: renumber
        records: list[RequestRecord] = []
        for r, raw in enumerate(raws):
            ids = range(r, r + raw.n * busy, busy)
            records.extend(build_records(raw, ids if rank is None else [rank[g] for g in ids]))
        records.sort(key=lambda record: record.index)
    finally:
        if collecting:
            gc.enable()
    first = min(min(raw.arrival) for raw in raws)
    last = max(max((raw.end_times[s] for s in raw.last_step if s >= 0), default=first) for raw in raws)
    if workload.arrivals is not None and saturation is None:
        saturation = saturation_point(step, engine, workload)
    blocks = [_simulation_block(raw, engine, share, None, timeline_points) for raw, share in zip(raws, shares)]
    info = _saturation_fields(_replicas_block(blocks, raws, engine, replicas, coupled(step)), workload, saturation)
    summary = summarize(records, last - first, slo or {}, source="simulate", offered_load=workload.load_info(),
                        engine=_engine_block(step, engine, workload), simulation=info)
    return Simulation(summary, records, raws[0], raws)


def _replicas_block(blocks: list[dict[str, Any]], raws: list[RawRun], engine: EngineConfig,
                    replicas: int, lockstep: bool = False) -> dict[str, Any]:
    """One simulation block for the replicas: batch, tokens per step, queue, requests in the system and KV use per
    replica (means of the busy replicas' means, maxima over them), steps and preemptions in all, request times
    averaged over every request, the timeline of replica 0; each busy replica's own figures in ``per_replica``."""
    counts = [raw.n for raw in raws]
    total = sum(counts)

    def mean(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else float(np.mean(values))

    def per_request(values: list[float | None]) -> float | None:
        pairs = [(v, n) for v, n in zip(values, counts) if n]
        return None if not pairs or any(v is None for v, _ in pairs) else sum(v * n for v, n in pairs) / total

    tokens = sum(sum(raw.step_tokens) for raw in raws)
    hits, queries = sum(raw.prefix_hit_tokens for raw in raws), sum(raw.prefix_query_tokens for raw in raws)
    kv = blocks[0]["kv"]
    return {
        "replicas": replicas,
        "replicas_with_requests": len(raws),
        "routing": ROUTING,
        "lockstep": lockstep,  # the replicas share their experts (--ep) and step together
        "steps": sum(b["steps"] for b in blocks),
        "simulated_s": max(b["simulated_s"] for b in blocks),
        "idle_s": mean([b["idle_s"] for b in blocks]),
        "batch": {"mean": mean([b["batch"]["mean"] for b in blocks]), "max": max(b["batch"]["max"] for b in blocks)},
        "tokens_per_step": {"mean": mean([b["tokens_per_step"]["mean"] for b in blocks]),
                            "max": max(b["tokens_per_step"]["max"] for b in blocks)},
        "prefill_token_share": float(sum(sum(raw.step_prefill) for raw in raws) / tokens) if tokens else 0.0,
        "in_system": {"mean": mean([b["in_system"]["mean"] for b in blocks])},
        "queue": {"mean": mean([b["queue"]["mean"] for b in blocks]), "max": max(b["queue"]["max"] for b in blocks),
                  "mean_wait_s": per_request([b["queue"]["mean_wait_s"] for b in blocks]) or 0.0},
        "kv": {"capacity_tokens": kv["capacity_tokens"], "block_size": kv["block_size"],
               "mean_fraction": mean([b["kv"]["mean_fraction"] for b in blocks]),
               "peak_fraction": None if kv["peak_fraction"] is None else max(b["kv"]["peak_fraction"] for b in blocks)},
        "time_split": {key: per_request([b["time_split"][key] for b in blocks])
                       for key in ("queue_s", "prefill_s", "decode_s")},
        "preemptions": sum(b["preemptions"] for b in blocks),
        "preempted_requests": sum(b["preempted_requests"] for b in blocks),
        "prefix_cache_hit_rate": (hits / queries if queries else 0.0) if engine.prefix_caching else None,
        "saturated": False,
        "timeline": blocks[0]["timeline"],
        "timeline_replica": 0,
        "per_replica": [{"requests": n, "steps": b["steps"], "simulated_s": b["simulated_s"], "batch": b["batch"],
                         "queue": {"mean": b["queue"]["mean"], "max": b["queue"]["max"]},
                         "kv": {"mean_fraction": b["kv"]["mean_fraction"], "peak_fraction": b["kv"]["peak_fraction"]},
                         "preemptions": b["preemptions"]} for b, n in zip(blocks, counts)],
    }


def _engine_block(step: StepModel, engine: EngineConfig, workload: Workload) -> dict[str, Any]:
    return {
        "model": step.arch.name, "hardware": step.device.name, "weights": step.weights_name, "kv": step.kv_name,
        "tp": step.tp, "engine": step.engine.key if step.engine is not None else None, "mode": engine.mode, "max_seqs": engine.slots, "max_batched_tokens": engine.max_batched_tokens,
        "chunked_prefill": engine.chunked_prefill, "prefill_first": engine.prefills_alone,
        "prefix_caching": engine.prefix_caching,
        **({"slot_streams": True} if engine.slot_streams else {}),
        **({"slots_used": engine.slots_used} if engine.slots_used else {}),
        **({"slot_history": list(engine.slot_history)} if engine.slot_history else {}),
        **({"slot_similarity": engine.slot_similarity,
            "cache_ram_mib": engine.cache_ram_mib if math.isfinite(engine.cache_ram_mib) else None,
            "cache_idle_slots": engine.cache_idle_slots}
           if (engine.slot_streams or engine.slot_prompts) and engine.prefix_caching else {}),
        "block_size": engine.block_size,
        "kv_capacity_tokens": engine.kv_capacity_tokens if math.isfinite(engine.kv_capacity_tokens) else None,
        "bw_efficiency": step.efficiency.bw_efficiency, "flops_efficiency": step.flops_efficiency,
        "step_overhead_s": float(step.machine.step_overhead_s),
        "sequence_overhead_s": float(step.machine.sequence_overhead_s), "ideal": step.ideal,
        "workload": workload.describe,
        **({"dp": int(step.machine.dp), "routing": ROUTING} if step.machine.dp > 1 else {}),
    }


def with_sequence_overhead(step: StepModel, sequence_overhead_s: float | None) -> StepModel:
    """The resolved model on hardware with the engine's cost per running sequence per step."""
    if sequence_overhead_s is None:
        return step
    if not math.isfinite(sequence_overhead_s) or not 0 <= sequence_overhead_s <= 1:
        raise SpeedlimitError(f"--sequence-overhead must be between 0 and 1 second, got {sequence_overhead_s}")
    return step._replace(machine=step.machine._replace(sequence_overhead_s=float(sequence_overhead_s)))


def resolve(model: Any, hardware: Any, *, sequence_overhead_s: float | None = None, **inputs: Any) -> StepModel:
    """The model on the hardware, resolved as `estimate` resolves it (``inputs``: the `Scenario` fields weights, kv,
    compute, tp, threads, numa, ideal, bw_efficiency, flops_efficiency, step_overhead_s), with the engine's per-sequence overhead."""
    inputs = {k: v for k, v in inputs.items() if v is not None or k in ("weights",)}
    return with_sequence_overhead(step_model(model, hardware, **inputs), sequence_overhead_s)


def _slo(slo: Any) -> dict[str, float]:
    return parse_slo(slo) if isinstance(slo, str) or slo is None else dict(slo)


def simulate(model: Any, hardware: Any, *, weights=None, kv=None, compute=None, tp: int = 1, pp: int = 1, ep: int = 1,
             dp: int = 1, ideal: bool = False, threads: int | None = None, numa: str | None = None,
             bw_efficiency: float | None = None, flops_efficiency: float | None = None,
             step_overhead_s: float | None = None, sequence_overhead_s: float | None = None,
             concurrency: int | None = None, rate: float | None = None, burstiness: float = 1.0,
             requests: int | None = None, duration_s: float | None = None, prompt_tokens: Any = 128,
             output_tokens: Any = 64, dataset: Path | str | None = None, seed: int = 0,
             trace: Path | str | None = None, time_scale: float = 1.0, engine: str | None = None, scheduler: str | None = None, max_seqs: int | None = None,
             max_batched_tokens: int | None = None, chunked_prefill: bool | None = None, block_size: int = 16,
             kv_tokens: int | None = None, slo: str | dict[str, float] | None = None, prefix_tokens: int = 0,
             prefix_groups: int = 1, prefix_caching: bool | None = None, slot_streams: bool = False,
             slot_similarity: float | None = None, cache_ram: float | None = None,
             cache_idle_slots: bool | None = None) -> Simulation:
    """Predict a serving engine under load, in bench's terms: records and a `RunSummary` (``source="simulate"``).

    Model/hardware/precision/parallelism (tp, pp, ep; dp: replicas, `run_replicas`, stepping together with ep) as
    `estimate`; load and workload as `speedlimit bench` (closed loop with ``concurrency`` or open loop with ``rate``;
    ``requests`` or ``duration_s``; bench's length distributions or a dataset; ``seed``; ``prefix_tokens`` shared by
    every prompt, one text per ``prefix_groups``); the serving
    ``engine`` (a catalog/engines.toml profile: its step costs and scheduler defaults) and the scheduler's knobs
    (``prefix_caching`` too), which override the profile's; ``slot_streams``: llama.cpp's server with ``--parallel N``,
    each slot its own KV stream (`EngineConfig.slot_streams`), and its prompt reuse flags (``slot_similarity``,
    ``cache_ram``, ``cache_idle_slots``; `engine_config`); ``slo`` for goodput ("ttft=500ms,tpot=50ms").
    """
    engine, scheduler, use_profile = split_engine(engine, scheduler)
    step = resolve(model, hardware, weights=weights, kv=kv, compute=compute, tp=tp, pp=pp, ep=ep, dp=dp, ideal=ideal,
                   threads=threads, numa=numa, bw_efficiency=bw_efficiency, flops_efficiency=flops_efficiency,
                   step_overhead_s=step_overhead_s,
                   sequence_overhead_s=sequence_overhead_s, engine=engine)
    config = engine_config(scheduler, max_seqs=max_seqs, max_batched_tokens=max_batched_tokens,
                           chunked_prefill=chunked_prefill, block_size=block_size, kv_tokens=kv_tokens, step=step,
                           use_profile=use_profile, prefix_caching=prefix_caching, slot_streams=slot_streams,
                           slot_similarity=slot_similarity, cache_ram=cache_ram, cache_idle_slots=cache_idle_slots)
    workload = build_workload(concurrency=concurrency, rate=rate, burstiness=burstiness, requests=requests,
                              duration_s=duration_s, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                              dataset=dataset, seed=seed, trace=trace, time_scale=time_scale,
                              prefix_tokens=prefix_tokens, prefix_groups=prefix_groups)
    return run_workload(step, config, workload, _slo(slo))


def sweep(step: StepModel, engine: EngineConfig, parameter: str, values: Sequence[float],
          workloads: Sequence[Workload], slo: dict[str, float] | None = None,
          knee_fraction: float = 0.9, *, saturation: dict[str, float] | None = None
          ) -> tuple[SweepSummary, list[Simulation]]:
    """One simulated run per load level (``workloads[i]`` at ``values[i]``), the knee, the saturation throughput
    and the highest load that meets the SLOs (≥ 99% of its requests meet every bound, and so does every lower load).
    ``saturation``: the engine's saturation rate (`saturation_point`) when already measured."""
    runs: list[Simulation] = []
    for value, workload in zip(values, workloads):
        if workload.arrivals is not None and saturation is None:
            saturation = saturation_point(step, engine, workload)
        result = run_workload(step, engine, workload, slo, saturation=saturation)
        result.summary.sweep_value = value
        runs.append(result)
    points = [r.summary for r in runs]
    knee = find_knee(list(values), [p.output_tok_s for p in points], knee_fraction)
    slo_max = None
    if slo:
        for point in sorted(points, key=lambda p: p.sweep_value):
            if point.completed and point.goodput_requests >= SLO_ATTAINMENT * point.completed:
                slo_max = point.sweep_value
            else:
                break
    info = SweepInfo(parameter=parameter, values=list(values), slo_max_load=slo_max, **knee)
    return SweepSummary(sweep=info, points=points, engine=points[0].engine if points else None), runs


# --------------------------------------------------------------------------------------------
# replaying a measured run (bench --compare-estimate)

def _spec_flag(value: str) -> bool:
    """An engine-spec switch: 1, true, yes or on (anything else is off)."""
    return value.strip().lower() in ("1", "true", "yes", "on")


ENGINE_SPEC_KEYS = {"max_seqs": int, "max_batched_tokens": int, "kv_tokens": int, "block_size": int,
                    "chunked_prefill": _spec_flag, "prefix_caching": _spec_flag, "slot_streams": _spec_flag,
                    "slots_used": int, "slot_history": lambda v: tuple(int(s) for s in v.split("/") if s.strip()),
                    "slot_similarity": float, "cache_ram": float, "cache_idle_slots": _spec_flag,
                    "step_overhead": float, "sequence_overhead": float}


def slot_history_option(history: Sequence[int]) -> str:
    """The engine-spec option that says which slots were used before a run, least recently used first (the form
    ``ENGINE_SPEC_KEYS['slot_history']`` parses)."""
    return "slot_history=" + "/".join(str(slot) for slot in history)


def parse_engine_spec(text: str | None) -> dict[str, Any]:
    """'continuous,max_seqs=8,max_batched_tokens=2048,kv_tokens=8192' or 'serial' -> engine options; a spec of
    options alone ('max_seqs=4') keeps the engine's own scheduler (``mode`` None: its profile's, else continuous)."""
    parts = [p.strip() for p in str(text or "").split(",") if p.strip()]
    if parts and "=" in parts[0]:
        parts = [""] + parts
    if not parts:
        parts = [""]
    options: dict[str, Any] = {"mode": parts[0].lower() or None}
    if options["mode"] is not None and options["mode"] not in ENGINE_DEFAULTS:
        raise SpeedlimitError(f"bad engine {text!r}: start with continuous or serial, or give key=value options "
                              f"alone ({', '.join(ENGINE_SPEC_KEYS)})")
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or key not in ENGINE_SPEC_KEYS:
            raise SpeedlimitError(f"bad engine option {part!r}: use key=value with keys {', '.join(ENGINE_SPEC_KEYS)}")
        try:
            options[key] = ENGINE_SPEC_KEYS[key](value)
        except ValueError:
            raise SpeedlimitError(f"bad engine option {part!r}: {value!r} is not a number") from None
    return options


def check_engine_spec(text: str | None) -> dict[str, Any]:
    """``text`` parsed (`parse_engine_spec`) and checked as far as it can be before a run: the scheduler the options
    describe on as many slots as they name (else the most `EngineConfig.check` takes), so that options which cannot
    describe any server (slots_used without slot_streams, a slot named twice in slot_history) fail before bench
    sends a request, not at the replay after it. What depends on the server (its slot count) is checked at the
    replay."""
    options = parse_engine_spec(text)
    mode = options.get("mode") or "continuous"
    slots = options.get("max_seqs") or (1 if mode == "serial" else 10_000_000)
    # the token budget is the profile's or the server's until the replay: not checked here
    EngineConfig(mode=mode, max_seqs=slots, max_batched_tokens=max(options.get("max_batched_tokens") or 0, slots),
                 chunked_prefill=options.get("chunked_prefill", True), slot_streams=bool(options.get("slot_streams")),
                 slots_used=options.get("slots_used", 0), slot_history=options.get("slot_history", ()),
                 # whether the engine is llama-server's is the replay's to know (its profile): checked there
                 **_slot_cache_options(True, options.get("slot_similarity"), options.get("cache_ram"),
                                       options.get("cache_idle_slots"))).check()
    return options


def replay_workload(records: Sequence[RequestRecord], load: LoadInfo | None, prefix_tokens: int = 0,
                    prefix_groups: int = 1, conversations: Sequence[int | None] | None = None) -> Workload:
    """The workload a measured run sent: each completed request's prompt and output tokens, and the same load
    (closed loop: its concurrency, requests issued in the same order; open loop: the measured send times).
    ``prefix_tokens``/``prefix_groups``: the run's --prefix-tokens/--prefix-groups, request i starting with prefix
    i mod groups (exact while requests did not cycle through bench's prompt pool). ``conversations``: the dataset
    conversation of each row in the order bench sent them (`replay_conversations`; request i sent row i mod rows), whose
    turns each hold the turns before them, as `_shared_prefixes` shares them (the measured prompts already hold the
    prefix)."""
    workload = _replay_workload(records, load)
    chats = conversations is not None and prefix_groups <= 1 and any(c is not None for c in conversations)
    if not prefix_tokens and not chats:
        return workload
    groups = _whole("prefix-groups", prefix_groups, 1, MAX_REQUESTS)
    group = [index % groups if prefix_tokens else -1 for index in workload.indices]
    shared = [min(prefix_tokens, prompt) for prompt in workload.prompts]
    parents: dict[int, tuple[int, int]] = {}
    for i, index in enumerate(workload.indices if chats else ()):
        conversation = conversations[index % len(conversations)]
        if conversation is not None:
            group[i], shared[i] = groups + conversation, workload.prompts[i]
            if prefix_tokens:
                parents[group[i]] = (0, prefix_tokens)
    workload.prefix_group, workload.shared_tokens, workload.prefix_parent = group, shared, parents or None
    return workload


def replay_conversations(sent: dict[str, Any]) -> list[int | None] | None:
    """The dataset conversation of each row, in the order bench sent the rows, from a run's workload block (its
    ``dataset`` and ``prompt_seed``: bench's `_dataset_order`); None where the run sent no conversations, or its
    dataset can no longer be read (`SpeedlimitError` is not raised: the replay goes on without them)."""
    path, seed = sent.get("dataset"), sent.get("prompt_seed")
    if not path or seed is None:
        return None
    try:
        rows = load_dataset(Path(path))
        order = _dataset_order(rows, np.random.default_rng([checked_seed(seed), 0]))
    except (SpeedlimitError, OSError, ValueError, TypeError):
        return None
    conversations = [rows[int(i)].get("_conversation") for i in order]
    return conversations if any(c is not None for c in conversations) else None


def _replay_workload(records: Sequence[RequestRecord], load: LoadInfo | None) -> Workload:
    done = [r for r in records if r.ok and r.output_tokens and r.prompt_tokens is not None]
    if not done:
        raise SpeedlimitError("the run has no completed request with known prompt and output tokens to replay")
    concurrency = load.concurrency if load is not None else None
    if concurrency:
        done.sort(key=lambda r: r.index)
        return Workload(prompts=[max(1, r.prompt_tokens) for r in done], outputs=[r.output_tokens for r in done],
                        concurrency=int(concurrency), requests=len(done), indices=[r.index for r in done],
                        describe={"replay": "closed loop", "requests": len(done)})
    done.sort(key=lambda r: (r.start_ns, r.index))
    first = done[0].start_ns
    return Workload(prompts=[max(1, r.prompt_tokens) for r in done], outputs=[r.output_tokens for r in done],
                    rate=load.rate if load is not None else None, burstiness=load.burstiness if load else 1.0,
                    requests=len(done), arrivals=[(r.start_ns - first) / 1e9 for r in done],
                    indices=[r.index for r in done],
                    describe={"replay": "open loop, measured send times", "requests": len(done)})


def replay(records: Sequence[RequestRecord], load: LoadInfo | None, model: Any, hardware: Any,
           engine: str | None = None, slo: dict[str, float] | None = None, prefix_tokens: int = 0,
           prefix_groups: int = 1, *, profile: Any = None, tp: int = 1, dp: int = 1, ep: int = 1,
           weights: Any = None, conversations: Sequence[int | None] | None = None) -> Simulation:
    """Simulate exactly the workload a bench run sent, on ``engine`` (a spec for `parse_engine_spec`), with the
    run's shared prefixes (`replay_workload`). ``profile`` (an engines.toml name), ``tp``, ``dp``, ``ep`` and
    ``weights``: the deployment the server ran, as `simulate` takes them; with a profile its step costs and scheduler
    defaults apply (a spec's mode, continuous or serial, swaps in that generic scheduler), without one a generic
    continuous scheduler on the default engine's step costs."""
    options = parse_engine_spec(engine)
    inputs: dict[str, Any] = {"tp": tp, "dp": dp, "ep": ep}
    if profile is not None:
        inputs["engine"] = profile
    if weights is not None:
        inputs["weights"] = weights
    step = resolve(model, hardware, step_overhead_s=options.pop("step_overhead", None),
                   sequence_overhead_s=options.pop("sequence_overhead", None), **inputs)
    mode = options.pop("mode")
    use_profile = profile is not None
    config = engine_config(mode if mode is not None or use_profile else "continuous", step=step,
                           use_profile=use_profile, **options)
    return run_workload(step, config, replay_workload(records, load, prefix_tokens, prefix_groups, conversations), slo)
