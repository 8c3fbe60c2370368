"""The pure core of `speedlimit simulate`: a discrete-event simulation of a serving engine's scheduler, step by step.

No I/O and no pydantic objects in the loop: requests are plain Python lists indexed by request id, a step is a few
running sums, and every step's duration comes from the one step-cost model: a replica (`replica`) is a generator that
yields each step's running sums to its driver, which prices them (`run`: `estimator.core.step_seconds`; `run_lockstep`,
replicas that share their routed experts and so step together: `estimator.core.lockstep_step_seconds`).

The engine (vLLM-v1-like, and llama.cpp's server with ``--parallel N``):

- continuous batching: every running sequence that has finished its prefill decodes one token per step; sequences
  join (from the FIFO queue) and leave (when done) at every step;
- a cap on running sequences (``max_seqs``) and a per-step token budget (``max_batched_tokens``): decodes first,
  then the prefill chunks of running sequences, then new sequences from the queue while budget, slots and KV blocks
  last. With ``chunked_prefill`` a prompt may be split over steps; without it a prompt is computed whole in one
  step. With ``prefill_first`` a step either prefills (decodes pause) or decodes: whole prompts without chunked
  prefill (vLLM V0), chunks within the budget with it (SGLang, whose in-progress chunked prompt goes first; the
  budget bounds only a prefill step's prompt tokens, so it may be below ``max_seqs``); without
  it the prefills join the decodes' step while the token budget lasts (whole prompts: TensorRT-LLM's in-flight
  batching; chunks: vLLM V1);
- a paged KV cache (``block_size``-token blocks, ``kv_capacity_tokens`` in all): a sequence holds ceil(cached/block)
  blocks; when a running sequence needs a block and none is free, the most recently admitted sequence is preempted
  (its blocks freed, it goes back to the head of the queue and later recomputes its prompt plus the tokens it had
  generated, emitting its next token when that recompute ends);
- ``serial``: one request at a time (llama-cpp-python's server): the same loop with one slot;
- ``slot_streams``: llama.cpp's server started with ``--parallel N`` (and no ``--kv-unified``) gives each slot a KV
  stream of its own, and llama.cpp splits such a batch into micro-batches of consecutive sequence ids, each one
  forward pass that reads the weights again (vendored llama.cpp src/llama-kv-cache.cpp ``init_batch`` →
  src/llama-batch.cpp ``split_equal(n_ubatch, sequential=true)``: "accept only increasing sequence ids", and a
  micro-batch takes the same number of tokens from each of its sequences). A request takes the least recently
  used free slot, the highest-numbered among those never used (tools/server/server-context.cpp
  ``get_available_slot``: ``t_last_used <= t_last``); the server's batch holds the decode tokens in slot order, then
  the prompt tokens in slot order. So slots 0, 2 and 3 decoding together cost two passes (0 | 2, 3), and a prompt
  chunk whose slot follows a decoder's gives that micro-batch one of its tokens and runs the rest in passes of its
  own (``UBATCH_TOKENS`` at most). Priced as the sum of the passes' steps (`SplitStep`);
- ``prefix_caching`` (with a workload that says which prompts share leading tokens): a prefix cache of whole KV blocks,
  vLLM V1's and SGLang's. A request belongs to a *prefix group* whose members agree on their first ``shared`` tokens
  (a system prompt, a conversation's history); the group's blocks 0 … k−1 are a contiguous chain, or continue its
  parent group's chain after the parent's first blocks (every conversation after one system prompt). An admitted
  request takes references on the group's cached leading blocks, at most ``prompt − 1`` tokens (the last one is always
  computed, for its logits: vLLM's kv_cache_manager.py get_computed_blocks caps the hit at num_tokens − 1, SGLang's
  schedule_batch.py at input_len − 1), so its prefill starts after them, priced as `estimate`'s cached prefill, and
  they count once in KV use however many requests hold them. The shared blocks a request computes join the chain
  when they are scheduled (vLLM V1's allocate_slots caches the blocks of the tokens it schedules, so a request
  admitted later in the same step already hits them); a request that is not at the chain's end keeps its own copies,
  as an engine does not look again after admission. A block nobody holds stays cached but counts as free; the free
  blocks form one queue, least recently freed first (cached and anonymous alike), and an allocation takes from its
  head, evicting what a cached block held. A request frees its own blocks before its shared ones, so a chain is
  evicted from its deepest block up (https://docs.vllm.ai/en/latest/design/prefix_caching/: the free queue's head
  is evicted first and a finished request's blocks are freed tail first; SGLang's radix_cache.py evicts least
  recently used leaves). The queue holds runs of blocks, so the cache too costs O(1) per event, amortized. Not
  modelled: a preempted request's own blocks are not found again when it is readmitted (vLLM V1 would hit those
  still cached);
- ``prefix_caching`` with ``slot_streams`` or ``slot_prompts`` (llama-server, a KV stream per slot or one KV cache
  for all): llama-server's cache_prompt instead, which shares nothing between slots. A slot keeps the tokens of the
  request it last served (prompt and reply), and a new prompt computes only what follows their common prefix (all
  but its last token at most). A request takes the free slot whose tokens share the largest part of its prompt, above
  ``slot_similarity``, else the least recently used one; that one's prompt is saved to the host-memory prompt cache
  (``cache_ram_mib``) and replaced by a saved prompt that keeps at least a quarter of itself and more of both than
  the slot's own, and as each request starts every idle slot's prompt is copied there (``cache_idle_slots``), and
  cleared from the slot where one KV cache serves all; the oldest saved are evicted first
  (tools/server/server-context.cpp ``get_available_slot``, server-task.cpp ``server_prompt_cache``). Prompts are
  known by their prefix groups: two share their group's leading tokens, or their common parent's; the tokens a slot
  held before the run share nothing with the run's (bench draws each run's prompts and warm-ups apart) and are not
  counted in the cache's size.

A sequence with ``L`` tokens cached that decodes attends to ``L + 1`` keys (its new token too) and writes one KV entry,
so a reply of ``o`` tokens after a ``p``-token prompt decodes at contexts p+1 … p+o−1, exactly what `estimate`'s mean
ITL integrates. Per step, the running sums (Σ context, sliding-window Σ, blocks each decode needs) are kept
incrementally with per-step event buckets, so a step costs O(1) in the number of running sequences, plus O(1) per
event (a join, a finish, a preemption, a chunk).

Decoders live on a *decode clock*: the count of steps in which the decoders decoded. Every decoder decodes in every
decode step, and in none of the others (a prefill-only step of prefill-first scheduling pauses them all, as does a
step with no decoders), so a decoder's context, the block it needs and the decode step that ends it are all fixed
when it starts decoding, counted in decode steps, whatever prefill-only steps come in between.

The first token of a request is emitted at the end of the step that completes its prefill; each later token at the
end of the decode step that produced it (``RawRun.decode_steps`` lists the decode steps). A record's times are seconds
from the run's start.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core


#: llama.cpp's physical batch (``-ub``, ``n_ubatch``: 512 by default, common/common.h): the most tokens one pass of
#: `slot_streams`'s split takes
UBATCH_TOKENS = 512


class SplitStep(list):
    """One engine step that runs as several forward passes (`EngineConfig.slot_streams`): one `core.StepBatch` per
    pass; the step lasts their sum."""


@dataclass(frozen=True)
class EngineConfig:
    """How the simulated engine schedules. ``kv_capacity_tokens`` is the KV cache size in tokens (inf: unbounded)."""

    mode: Literal["continuous", "serial"] = "continuous"
    max_seqs: int = 256
    max_batched_tokens: int = 8192
    chunked_prefill: bool = True
    # a step either prefills (decodes pause) or decodes: vLLM V0 without chunked prefill (whole prompts), SGLang with
    # it (chunks within the budget); None: true without chunked prefill, false with it (mixed steps, vLLM V1)
    prefill_first: bool | None = None
    block_size: int = 16
    kv_capacity_tokens: float = math.inf
    prefix_caching: bool = False
    # llama-server with --parallel N: a KV stream per slot, a batch split into passes of consecutive slots (above)
    slot_streams: bool = False
    # slot streams: slots that requests before the run used on a fresh server (bench's --warmup requests, one at a
    # time): the highest-numbered, released before the run, so the server's LRU takes the never-used ones first
    slots_used: int = 0
    # slot streams: the slots that served requests before the run, least recently used first (llama-server's /slots,
    # as bench read it as the run began), in place of ``slots_used``'s fresh-server guess
    slot_history: tuple[int, ...] = ()
    # llama-server's prompt reuse (slot streams or slot_prompts, with prefix caching): its choice of a free slot by
    # the prompt it caches (a share of the new prompt above this picks it; 0: least recently used only), the
    # host-memory prompt cache it saves a slot's prompt to before giving the slot another (MiB; 0: off; inf: no
    # limit), and whether it also saves every idle slot's prompt there as it starts a request. The server's defaults (vendored llama.cpp common/common.h:
    # slot_prompt_similarity = 0.1f, cache_ram_mib = 8192, cache_idle_slots = true; its flags
    # --slot-prompt-similarity, --cache-ram, --cache-idle-slots)
    slot_similarity: float = 0.1
    cache_ram_mib: float = 8192.0
    cache_idle_slots: bool = True
    # llama-server without slot streams (--parallel auto: one KV cache for all slots) reuses prompts per slot too, and
    # saves and clears its idle slots as each request starts (server-context.cpp, TAG_IDLE_SLOT_CLEAR)
    slot_prompts: bool = False

    @property
    def prefills_alone(self) -> bool:
        """Whether a step that prefills runs no decodes (`prefill_first`, or its default for the chunking)."""
        return self.prefill_first if self.prefill_first is not None else not self.chunked_prefill

    @property
    def slots(self) -> int:
        return 1 if self.mode == "serial" else self.max_seqs

    @property
    def kv_blocks(self) -> float:
        return math.inf if not math.isfinite(self.kv_capacity_tokens) else float(int(self.kv_capacity_tokens // self.block_size))

    def check(self) -> "EngineConfig":
        if self.mode not in ("continuous", "serial"):
            raise SpeedlimitError(f"--engine must be continuous or serial, got {self.mode!r}")
        for name, value in (("max-seqs", self.max_seqs), ("max-batched-tokens", self.max_batched_tokens),
                            ("block-size", self.block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
                raise SpeedlimitError(f"--{name} must be a whole number between 1 and 10,000,000, got {value!r}")
        if self.max_batched_tokens < self.slots and not self.prefills_alone:
            raise SpeedlimitError(f"--max-batched-tokens ({self.max_batched_tokens}) must be at least --max-seqs "
                                  f"({self.slots}): every running sequence decodes one token per step")
        if isinstance(self.slots_used, bool) or not isinstance(self.slots_used, int) or not 0 <= self.slots_used <= self.slots:
            raise SpeedlimitError(f"slots_used must be a whole number between 0 and the slots ({self.slots}), got "
                                  f"{self.slots_used!r}")
        if self.slots_used and not self.slot_streams:
            raise SpeedlimitError("slots_used describes llama-server's slots before the run: it needs slot_streams=1")
        history = self.slot_history
        if not isinstance(history, tuple) or any(isinstance(s, bool) or not isinstance(s, int) for s in history):
            raise SpeedlimitError(f"slot_history must be slot numbers, least recently used first (e.g. "
                                  f"slot_history=7/6), got {history!r}")
        if len(set(history)) != len(history):
            raise SpeedlimitError(f"slot_history names a slot twice ({'/'.join(map(str, history))}): each slot was "
                                  "last used once")
        if any(not 0 <= s < self.slots for s in history):
            raise SpeedlimitError(f"slot_history names slot {next(s for s in history if not 0 <= s < self.slots)}, but "
                                  f"the engine has {self.slots} slot{'s' if self.slots > 1 else ''} (0-{self.slots - 1})")
        if history and not self.slot_streams:
            raise SpeedlimitError("slot_history describes llama-server's slots before the run: it needs slot_streams=1")
        if history and self.slots_used:
            raise SpeedlimitError("give slots_used or slot_history, not both: each says which slots were used before "
                                  "the run")
        for value, top, what in ((self.slot_similarity, 1.0, "slot_similarity must be a share from 0 (off) to 1"),
                                 (self.cache_ram_mib, math.inf, "cache_ram must be MiB from 0 (off) up, or -1 (no "
                                                                "limit)")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
                raise SpeedlimitError(f"{what}, got {value!r}")
        for name in ("cache_idle_slots", "slot_prompts"):
            if not isinstance(getattr(self, name), bool):
                raise SpeedlimitError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.slot_streams and (self.mode != "continuous" or self.prefills_alone):
            raise SpeedlimitError("slot streams are llama.cpp's server's --parallel slots: they need the continuous "
                                  "scheduler with mixed steps (chunked prefill, no prefill-first)")
        if not (self.kv_capacity_tokens > 0):
            raise SpeedlimitError(f"the KV cache holds no tokens ({self.kv_capacity_tokens!r}): the weights leave no "
                                  "memory for it; use more memory, --tp, fewer --weights bits or --kv-tokens")
        return self


@dataclass
class RawRun:
    """What one simulated run produced, as plain lists (records and summary are built from it afterwards)."""

    n: int  # requests issued
    prompt: list[int]
    output: list[int]
    arrival: list[float]
    scheduled: list[float]  # start of the first step that computed any of its tokens
    first_step: list[int]  # step whose end emitted the first token
    last_step: list[int]  # step whose end emitted the last token
    preemptions: list[int]
    # only preempted requests: one (a, b) per segment: it emitted at step a (its prefill or recompute ended), then at
    # every decode step in (a, b]
    segments: dict[int, list[tuple[int, int]]]
    end_times: list[float]  # end time of each step
    step_s: list[float]  # duration of each step
    step_batch: list[int]  # sequences in each step
    step_tokens: list[int]  # tokens computed in each step
    step_prefill: list[int]  # of which prefill tokens
    step_waiting: list[int]  # queue length during each step
    step_in_system: list[int]  # requests arrived and not finished, at the start of each step
    step_kv_blocks: list[int]  # KV blocks in use after each step
    kv_blocks: float
    decode_steps: list[int] = field(default_factory=list)  # the steps in which the decoders decoded, in order
    idle_s: float = 0.0  # time with nothing to run (open loop)
    prefix_cached: list[int] = field(default_factory=list)  # per request: tokens its first admission found cached
    # over every request's first admission: prompt tokens found cached, and prompt tokens looked up (vLLM V1 counts a
    # preempted request's readmission apart and does not export it: PrefixCacheStats.preempted_queries in
    # https://github.com/vllm-project/vllm/blob/main/vllm/v1/metrics/stats.py)
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    extra: dict = field(default_factory=dict)

    def emission_steps(self, rid: int) -> list[tuple[int, int]]:
        """One (a, b) per segment: the request emitted at step a, then at every decode step in (a, b]."""
        return self.segments.get(rid) or [(self.first_step[rid], self.last_step[rid])]

    def decode_range(self, a: int, b: int) -> tuple[int, int]:
        """The decode-step indices [i, j) of a segment (a, b): ``decode_steps[i:j]`` are the steps in (a, b]."""
        return bisect_right(self.decode_steps, a), bisect_right(self.decode_steps, b)

    def emitted(self, rid: int) -> list[int]:
        """Every step at whose end the request emitted a token, in order (one per output token)."""
        steps: list[int] = []
        for a, b in self.emission_steps(rid):
            i, j = self.decode_range(a, b)
            steps.append(a)
            steps.extend(self.decode_steps[i:j])
        return steps


def _blocks(tokens: int, block: int) -> int:
    return -(-tokens // block)


def slot_passes(decoders: list[tuple[int, int]], chunks: list[tuple[int, int, int]],
                window: float = math.inf) -> list[core.StepBatch]:
    """The forward passes llama.cpp runs for one step of a server whose slots have KV streams of their own
    (`EngineConfig.slot_streams`), each as a `core.StepBatch`: ``decoders`` (slot, tokens cached) decode one token
    each, ``chunks`` (slot, start, end) compute prompt tokens start … end-1. The batch holds the decode tokens in
    slot order, then the prompt tokens in slot order; a pass starts at the first sequence with tokens left, takes
    every later sequence (in batch order) whose slot is the last one's + 1, and the same number of tokens from each:
    as many as all have left, at most `UBATCH_TOKENS` in all (llama-batch.cpp ``split_equal``)."""
    order = [(slot, 1, cached, True) for slot, cached in sorted(decoders)]
    order += [(slot, end - start, start, False) for slot, start, end in sorted(chunks)]
    left = [n for _, n, _, _ in order]
    done = [0] * len(order)
    causal = core.causal_pairs  # an infinite window counts every earlier key
    passes: list[core.StepBatch] = []
    first = 0
    while first < len(order):
        if left[first] == 0:
            first += 1
            continue
        members = [first]
        for j in range(first + 1, len(order)):
            if len(members) >= UBATCH_TOKENS:
                break
            if left[j] and order[j][0] == order[members[-1]][0] + 1:
                members.append(j)
        rounds = max(1, min(min(left[j] for j in members), UBATCH_TOKENS // len(members)))
        n_dec = dec_ctx = dec_local = 0.0
        pf_seqs = pf_tokens = pf_ctx = pf_local = pf_pairs = pf_pairs_local = 0.0
        for j in members:
            _, _, base, decoder = order[j]
            if decoder:  # attends to its cached tokens and its own
                n_dec += 1
                dec_ctx += base + 1
                dec_local += min(base + 1, window)
            else:
                start = base + done[j]
                end = start + rounds
                pf_seqs += 1
                pf_tokens += rounds
                pf_ctx += end
                pf_pairs += causal(end) - causal(start)
                pf_local += min(end, window)
                pf_pairs_local += causal(end, window) - causal(start, window)
            left[j] -= rounds
            done[j] += rounds
        passes.append(core.StepBatch(n_dec, dec_ctx, dec_local, pf_seqs, pf_tokens, pf_ctx, pf_local, pf_pairs,
                                     pf_pairs_local))
    return passes


def run(cost: core.CostModel, machine: core.Machine, engine: EngineConfig, prompts: list[int], outputs: list[int],
        **workload) -> RawRun:
    """Simulate the engine serving a workload (`replica`'s arguments); returns per-request and per-step facts (no
    summaries). Every step is priced by `core.step_seconds`."""
    loop = replica(cost, engine, prompts, outputs, **workload)
    step_seconds = core.step_seconds
    StepBatch = core.StepBatch
    try:
        request = next(loop)
        while True:
            kind = request.__class__
            request = loop.send(step_seconds(cost, machine, request) if kind is StepBatch else
                                sum(step_seconds(cost, machine, part) for part in request) if kind is SplitStep
                                else request)
    except StopIteration as stop:
        return stop.value


def run_lockstep(cost: core.CostModel, machine: core.Machine, engine: EngineConfig,
                 shares: list[dict]) -> list[RawRun]:
    """Simulate ``machine.dp`` replicas that step together (`core.lockstep_step_seconds`: they share their routed
    experts, so every forward pass meets in one collective): ``shares`` holds each replica's workload as `replica`'s
    keyword arguments (``prompts``, ``outputs`` and the load). Each replica schedules its own batch with its own
    queue and KV cache; a step lasts as long as the slowest replica's, and a replica with nothing to run waits it
    out. Returns each replica's run, its times on the common clock."""
    if engine.slot_streams:
        raise SpeedlimitError("slot streams (llama.cpp's server) do not run as data-parallel replicas that step together")
    loops = [replica(cost, engine, **share) for share in shares]
    pending: list = [None] * len(loops)  # per replica: its next StepBatch, a wake-up time, or None (done)
    runs: list[RawRun | None] = [None] * len(loops)
    StepBatch = core.StepBatch
    now = 0.0

    def resume(r: int, value: float | None) -> None:  # None starts the replica (send(None) is next())
        try:
            pending[r] = loops[r].send(value)
        except StopIteration as stop:
            pending[r], runs[r] = None, stop.value

    for r in range(len(loops)):
        resume(r, None)

    while any(p is not None for p in pending):
        working = [r for r, p in enumerate(pending) if p is not None and p.__class__ is StepBatch]
        if working:
            dt = core.lockstep_step_seconds(cost, machine, [pending[r] for r in working])
            now += dt
            for r in working:
                resume(r, dt)
            for r, p in enumerate(pending):  # the replicas that waited: those whose next request arrived wake up
                if p is not None and p.__class__ is not StepBatch and p <= now:
                    resume(r, now)
        else:  # every replica waits for its next request: the clock jumps to the first
            now = max(now, min(p for p in pending if p is not None))
            for r, p in enumerate(pending):
                if p is not None and p <= now:
                    resume(r, now)
    return runs  # type: ignore[return-value]


def replica(cost: core.CostModel, engine: EngineConfig, prompts: list[int], outputs: list[int], *,
            arrivals: list[float] | None = None, concurrency: int | None = None, requests: int | None = None,
            duration_s: float | None = None, prefix_group: list[int] | None = None,
            shared_tokens: list[int] | None = None, group_parent: dict[int, tuple[int, int]] | None = None):
    """One engine replica serving a workload, as a generator its driver (`run`, `run_lockstep`) prices: it yields
    each step's `core.StepBatch` and is sent the step's duration, or, idle in an open loop, yields the time of its next
    request and is sent the clock's time when it resumes (that time or later); it returns its `RawRun`.

    Open loop: ``arrivals`` (seconds, non-decreasing), request i has ``prompts[i]``/``outputs[i]``; with
    ``duration_s`` only arrivals before it are sent. Closed loop: ``concurrency`` clients each send the next request
    (lengths cycling through ``prompts``/``outputs``) as soon as their previous one ends, ``requests`` in all, or
    until ``duration_s`` (no request starts after it). ``prefix_group``/``shared_tokens`` (per entry of ``prompts``,
    None: no sharing): the prefix group of each request (−1: none) and how many of its leading tokens every member of
    the group has in common; with ``engine.prefix_caching`` they are cached and reused. ``group_parent``: {group:
    (parent group, tokens)}: the group's members start with the parent's first ``tokens`` (a system prompt shared by
    every conversation), so its chain continues the parent's.
    """
    engine.check()
    block = engine.block_size
    total_blocks = engine.kv_blocks
    free_blocks = total_blocks
    slots = engine.slots
    budget_max = engine.max_batched_tokens
    chunked = engine.chunked_prefill
    prefill_first = engine.prefills_alone
    window = float(cost.window)
    windowed = math.isfinite(window)
    pool = len(prompts)
    if pool == 0:
        raise SpeedlimitError("the workload has no requests")
    longest = max(p + o for p, o in zip(prompts, outputs))
    if math.isfinite(total_blocks) and _blocks(longest - 1, block) > total_blocks:
        raise SpeedlimitError(
            f"a request of {longest:,} tokens (prompt + output) can never be admitted: the KV cache holds "
            f"{int(total_blocks * block):,} tokens ({int(total_blocks):,} blocks of {block}); shorten the prompt "
            "or output, or give the cache more memory")
    if not chunked and max(prompts) + max(outputs) - 1 > budget_max:
        raise SpeedlimitError(
            f"without chunked prefill a prompt is computed in one step, but a prompt (plus recompute) of up to "
            f"{max(prompts) + max(outputs) - 1:,} tokens exceeds --max-batched-tokens {budget_max:,}: raise it or "
            "use --chunked-prefill")

    caching = engine.prefix_caching and prefix_group is not None and shared_tokens is not None
    if caching and not (len(prefix_group) == len(shared_tokens) == pool):
        raise SpeedlimitError("the workload's prefix groups do not match its prompts (one group and shared length "
                              "each)")
    streams = engine.slot_streams
    # the shared cache of KV blocks (vLLM, SGLang); llama-server's slots each reuse only the prompt they hold
    slot_reuse = caching and (streams or engine.slot_prompts)
    chain = caching and not slot_reuse
    tracking = streams or slot_reuse  # which slot each request runs in
    evicting = chain and math.isfinite(total_blocks)
    parents = dict(group_parent or {}) if caching else {}
    if any(p in parents or p < 0 or g < 0 for g, (p, _) in parents.items()):
        raise SpeedlimitError("a prefix group's parent must be a group without a parent")

    closed = arrivals is None
    # per-request state (lists grow as requests are issued)
    R_prompt: list[int] = []
    R_output: list[int] = []
    R_arrival: list[float] = []
    R_sched: list[float] = []
    R_first: list[int] = []
    R_last: list[int] = []
    R_pre: list[int] = []
    R_gen: list[int] = []  # tokens generated so far
    R_target: list[int] = []  # tokens to compute before the next token is emitted (prompt, or prompt + generated)
    R_done: list[int] = []  # tokens computed (cached) toward target
    R_s0: list[int] = []  # decode step (decode clock) at which the current decode segment began
    R_L0: list[int] = []  # tokens cached at that decode step
    R_seg: list[int] = []  # segment id: bumps at each preemption, so stale events are skipped
    R_emit0: list[int] = []  # first emitting step of the current segment
    segments: dict[int, list[tuple[int, int]]] = {}
    R_group: list[int] = []  # prefix group (-1: none)
    R_share: list[int] = []  # leading blocks it has in common with its group
    R_gh: list[int] = []  # its group's chain held, up to this block (its group's base: none)
    R_ph: list[int] = []  # its group's parent's chain held, up to this block (the rest of its blocks are its own)
    R_cached: list[int] = []  # tokens its first admission found cached
    # prefix groups, in absolute block indices: the chain's cached blocks base … cached-1 (held by someone, or free
    # and evictable), held: the furthest any running member holds, holders: {held up to: members}
    g_cached: dict[int, int] = {}
    g_held: dict[int, int] = {}
    g_holders: dict[int, dict[int, int]] = {}
    # a group may continue another's chain: its blocks start at g_base (its parent's shared part; 0: its own chain)
    g_base: dict[int, int] = {}
    g_parent: dict[int, int] = {}
    # the free blocks, least recently freed first: runs [group, lo, hi] (group -1: blocks holding nothing reusable;
    # else the group's chain blocks lo … hi-1, evicted from hi down); g_runs: each group's live runs, oldest (deepest
    # blocks) first
    free_runs: deque[list] = deque([[-1, 0, int(total_blocks)]]) if evicting else deque()
    g_runs: dict[int, deque[list]] = {}
    hit_tokens = 0
    query_tokens = 0
    R_stok: list[int] = []  # slot reuse: leading tokens it has in common with its group
    if chain:
        for g in set(prefix_group) | {p for p, _ in parents.values()}:
            base = parents[g][1] // block if g in parents else 0
            g_base[g] = g_cached[g] = g_held[g] = base
            g_holders[g], g_runs[g] = {}, deque()
            if g in parents:
                g_parent[g] = parents[g][0]

    def issue(at: float, index: int) -> int:
        rid = len(R_prompt)
        R_prompt.append(prompts[index % pool])
        R_output.append(outputs[index % pool])
        R_arrival.append(at)
        R_sched.append(-1.0)
        R_first.append(-1)
        R_last.append(-1)
        R_pre.append(0)
        R_gen.append(0)
        R_target.append(prompts[index % pool])
        R_done.append(0)
        R_s0.append(0)
        R_L0.append(0)
        R_seg.append(0)
        R_emit0.append(-1)
        if caching:
            R_group.append(prefix_group[index % pool])
            R_stok.append(shared_tokens[index % pool])
            R_share.append(shared_tokens[index % pool] // block)
            R_gh.append(g_base.get(prefix_group[index % pool], 0))
            R_ph.append(0)
            R_cached.append(-1)
        return rid

    waiting: deque[int] = deque()
    running: dict[int, None] = {}  # admission order (the tail is the preemption victim)
    prefilling: dict[int, None] = {}  # running, not yet emitting
    decoding: dict[int, None] = {}
    # keyed by the decode clock d (decode steps so far), never by the step: decoders only advance in decode steps
    finish_at: dict[int, list[tuple[int, int]]] = {}  # decode step -> [(rid, seg)] that emit their last token in it
    cross_at: dict[int, list[tuple[int, int]]] = {}  # decode step -> decoders whose context reaches the window then
    residue = [0] * block  # decoders by (L0 - s0) % block: those with r == -d % block need a block at decode step d
    decode_steps: list[int] = []  # decode step d ran as step decode_steps[d]
    sum_ctx = 0  # Σ (cached + 1) over decoders at the current step
    sum_local = 0.0  # Σ min(cached + 1, window)
    n_below = 0  # decoders whose context is still below the window

    end_times: list[float] = []
    step_s_list: list[float] = []
    step_batch: list[int] = []
    step_tokens: list[int] = []
    step_prefill: list[int] = []
    step_waiting: list[int] = []
    step_in_system: list[int] = []
    step_kv: list[int] = []
    step_passes: list[int] = []  # forward passes per step (slot streams only)

    # llama-server's slots (`EngineConfig.slot_streams`): each running request's slot; when each free slot was last
    # released (-1: never), and so which one the next request takes
    slot_of: dict[int, int] = {}
    released_at: list[float] = [-1.0] * (slots if tracking else 0)
    # before the run, least recently used first: the server's own account, else slots_used's warm-ups on a fresh
    # server, one at a time (slot N-1, then N-2, ...)
    history = engine.slot_history or tuple(range(slots - 1, slots - 1 - engine.slots_used, -1))
    for order, used in enumerate(history if streams else ()):
        released_at[used] = -0.5 + order * 1e-6
    free_slots: set[int] = set(range(slots)) if tracking else set()
    slot_log: list[int] = []  # the slot of each admission, in order (llama-server logs the same: "launch_slot_: id N")
    # llama-server's prompt reuse (`slot_reuse`): what each slot's KV holds (a request's prompt and reply; EMPTY; or
    # FOREIGN, a request's from before the run, sharing nothing with this run's prompts, as bench draws each run's
    # prompts and warm-ups apart), and the host-memory prompt cache: the saved prompts, oldest first, and the tokens
    # they hold
    EMPTY, FOREIGN = -1, -2
    slot_holds: list[int] = [EMPTY] * (slots if tracking else 0)
    for used in history if streams else ():
        slot_holds[used] = FOREIGN
    saved: dict[int, None] = {}
    saved_tokens = 0
    kv_token_bytes = float(core.kv_bytes_per_sequence(cost, 1.0)) if slot_reuse else 0.0
    saved_cap = (engine.cache_ram_mib * 2.0**20 / kv_token_bytes if kv_token_bytes > 0 else math.inf) \
        if engine.cache_ram_mib > 0 else 0.0

    def lru_slot() -> int:
        # least recently used; of those never used, the highest-numbered; of those released in one step, the first
        # released (the server releases them in slot order)
        return min(free_slots, key=lambda k: (released_at[k], k if released_at[k] >= 0 else -k))

    def common(rid: int, other: int) -> int:
        """Leading tokens two requests' prompts have in common: their group's shared part, or their common parent's."""
        g, h = R_group[rid], R_group[other]
        if g < 0 or h < 0:
            return 0
        if g == h:
            return min(R_stok[rid], R_stok[other])
        root_g = parents.get(g, (g, R_stok[rid]))
        root_h = parents.get(h, (h, R_stok[other]))
        return min(root_g[1], root_h[1]) if root_g[0] == root_h[0] else 0

    def holds(rid: int) -> int:  # tokens a finished request leaves in its slot: its prompt and reply but the last token
        return R_prompt[rid] + R_output[rid] - 1

    def pick_slot(rid: int) -> tuple[int, int, bool]:
        """llama-server's choice for the request (tools/server/server-context.cpp ``get_available_slot``): the free
        slot whose cached tokens share the largest part of its prompt, above ``slot_similarity`` (the first such in
        slot order), else the least recently used. Returns (slot, the request whose tokens the slot will hold when the
        prompt starts, whether the slot's prompt is saved to the prompt cache and a better one loaded from it): the
        server does so for a least-recently-used pick, or where the kept part is under half the slot's prompt."""
        prompt = R_target[rid]
        best, share = -1, 0.0
        if engine.slot_similarity > 0 and R_group[rid] >= 0:
            for slot in sorted(free_slots):
                held = slot_holds[slot]
                if held >= 0:
                    f = common(rid, held) / prompt
                    if f > share and f > engine.slot_similarity:
                        best, share = slot, f
        if best >= 0:
            held = slot_holds[best]
            refresh = share * prompt / holds(held) < 0.5
        else:
            best = lru_slot()
            held = slot_holds[best]
            refresh = True
        if refresh and saved_cap > 0 and R_group[rid] >= 0:
            held = loaded(rid, held)
        return best, held, refresh

    def loaded(rid: int, held: int) -> int:
        """The prompt a refreshed slot holds after the server's prompt cache is searched (tools/server/server-task.cpp
        ``server_prompt_cache::load``): a saved prompt that keeps at least a quarter of itself and more of itself and
        of the new prompt than the slot's own; the first such, in the cache's order, unless a later one keeps more of
        both. Saving the slot's own first may evict the oldest saved ones (``alloc`` makes room)."""
        prompt = R_target[rid]
        base = common(rid, held) if held >= 0 else 0
        keep_best = base / holds(held) if held >= 0 else (-1.0 if held == EMPTY else 0.0)
        sim_best = base / prompt
        evicted = 0
        if savable(held):
            excess = saved_tokens + holds(held) - saved_cap
            for old in saved:
                if excess <= 0:
                    break
                excess -= holds(old)
                evicted += 1
        pick = held
        for i, other in enumerate(saved):
            if i < evicted:
                continue
            shared = common(rid, other)
            keep = shared / holds(other)
            if keep >= 0.25 and keep > keep_best and shared / prompt > sim_best:
                keep_best, sim_best, pick = keep, shared / prompt, other
        return pick

    def savable(held: int) -> bool:
        """Whether `save` adds the prompt: a request's, not there already, no larger than the cache."""
        return saved_cap > 0 and held >= 0 and held not in saved and holds(held) <= saved_cap

    def unsave(held: int) -> None:
        nonlocal saved_tokens
        del saved[held]
        saved_tokens -= holds(held)

    def save(held: int) -> None:
        """A slot's prompt copied to the prompt cache (server-task.cpp ``server_prompt_cache::alloc``), where
        `savable`; the oldest saved make room."""
        nonlocal saved_tokens
        if not savable(held):
            return
        while saved and saved_tokens + holds(held) > saved_cap:
            unsave(next(iter(saved)))
        saved[held] = None
        saved_tokens += holds(held)

    def take_slot(rid: int, choice: tuple[int, int, bool] | None = None) -> None:
        slot = lru_slot() if choice is None else choice[0]
        free_slots.discard(slot)
        slot_of[rid] = slot
        slot_log.append(slot)
        if choice is None:
            return
        _, held, refresh = choice
        own = slot_holds[slot]
        if refresh:
            save(own)
        if held != own and held in saved:  # loaded into the slot: it leaves the cache
            unsave(held)
        slot_holds[slot] = rid
        if engine.cache_idle_slots and saved_cap > 0:  # the request started: every idle slot's prompt is saved
            for idle in sorted(free_slots):
                save(slot_holds[idle])
                if not streams:  # one KV cache for all slots: the idle ones are cleared to make room
                    slot_holds[idle] = EMPTY

    def free_slot(rid: int, dropped: bool = False) -> None:
        slot = slot_of.pop(rid)
        released_at[slot] = now
        free_slots.add(slot)
        if dropped and slot_reuse:  # preempted: its tokens are gone
            slot_holds[slot] = EMPTY

    issued = 0
    completed = 0
    # a closed loop's next request is sent as its client's previous reply ends, and reaches the server while the next
    # step runs (an engine with work starts that step at once; the client needs a round trip), so it joins the step
    # after (llama-server and vLLM alike read new requests between steps). An engine left idle starts on it at once.
    returned: list[int] = []  # sent as the last step ended
    held: list[int] = []  # sent as the one before ended: they arrived during the last step
    if closed:
        limit = requests if requests is not None else math.inf
        while issued < min(concurrency, limit):
            waiting.append(issue(0.0, issued))
            issued += 1
    else:
        limit = len(arrivals)
        if duration_s is not None:
            limit = sum(1 for a in arrivals if a < duration_s) or 1
    next_arrival = 0
    now = 0.0
    idle_s = 0.0
    step = 0
    StepBatch = core.StepBatch
    causal = core.causal_pairs
    inf = math.inf

    def ctx_now(rid: int, d: int) -> int:  # cached tokens of a decoder at the start of decode step d
        return R_L0[rid] + d - R_s0[rid]

    def drop_decoder(rid: int, d: int) -> int:
        """Remove a decoder (finished in decode step d-1, or preempted before decode step d); returns its cached
        tokens."""
        nonlocal sum_ctx, sum_local, n_below
        cached = ctx_now(rid, d)
        del decoding[rid]
        residue[(R_L0[rid] - R_s0[rid]) % block] -= 1
        sum_ctx -= cached + 1
        if windowed:
            sum_local -= min(cached + 1, window)
            if cached + 1 < window:
                n_below -= 1
        return cached

    def take(n: int) -> None:
        """``n`` blocks leave the free queue from its head; a cached chain block taken is evicted."""
        while n > 0:
            head = free_runs[0]
            size = head[2] - head[1]
            if size > n:
                head[2] -= n
                if head[0] >= 0:
                    g_cached[head[0]] -= n
                return
            free_runs.popleft()
            if size > 0 and head[0] >= 0:  # a run emptied by a hit was already dropped from g_runs
                g_cached[head[0]] -= size
                g_runs[head[0]].popleft()
            n -= size

    def hit_blocks(rid: int) -> int:
        """Leading blocks of the request found cached (through its parent's chain first): never its last token, whose
        logits it needs."""
        g = R_group[rid]
        if g < 0:
            return 0
        cap = (R_target[rid] - 1) // block
        base = g_base[g]
        if base and g_cached[g_parent[g]] < base:
            return min(g_cached[g_parent[g]], cap)
        return min(g_cached[g], R_share[rid], cap)

    def unheld(rid: int, h: int) -> int:
        """Of the request's h cached leading blocks, those nobody holds (free until it takes them)."""
        g = R_group[rid]
        base = g_base[g]
        if not base:
            return max(0, h - g_held[g])
        return max(0, min(h, base) - g_held[g_parent[g]]) + max(0, h - max(base, g_held[g]))

    def hold_in(g: int, end: int) -> None:
        """A reference on group g's chain blocks up to ``end`` (all cached); those nobody held leave the free queue
        (from its middle: the group's newest runs, its shallowest blocks)."""
        nonlocal free_blocks
        top = g_held[g]
        if end > top:
            free_blocks -= end - top
            g_held[g] = end
            if evicting:
                runs = g_runs[g]
                while runs and runs[-1][1] < end:
                    if runs[-1][2] <= end:
                        runs[-1][1] = runs[-1][2]
                        runs.pop()
                    else:
                        runs[-1][1] = end
                        break
        holders = g_holders[g]
        holders[end] = holders.get(end, 0) + 1

    def hold(rid: int, h: int) -> None:
        """The request takes references on its h leading blocks: its parent's chain below its group's base, then its
        group's."""
        g = R_group[rid]
        base = g_base[g]
        if base:
            R_ph[rid] = min(h, base)
            hold_in(g_parent[g], R_ph[rid])
        if h > base:
            hold_in(g, h)
            R_gh[rid] = h

    def extend_in(g: int, held: int, new: int) -> bool:
        """A member holding group g's chain up to ``held`` has scheduled its blocks up to ``new``: they join the
        chain when the member is at its end (else they are its own copies, as an engine does not look again after
        admission)."""
        if new <= held or held != g_cached[g]:
            return False
        holders = g_holders[g]
        if held > g_base[g]:
            holders[held] -= 1
            if not holders[held]:
                del holders[held]
        holders[new] = holders.get(new, 0) + 1
        g_cached[g] = g_held[g] = new
        return True

    def extend(rid: int, end: int) -> None:
        """A chunk up to token ``end`` is scheduled: the shared blocks it fills join the chains."""
        g = R_group[rid]
        base = g_base[g]
        blocks = end // block
        if base and extend_in(g_parent[g], R_ph[rid], min(base, blocks)):
            R_ph[rid] = min(base, blocks)
        if extend_in(g, R_gh[rid], min(R_share[rid], blocks)):
            R_gh[rid] = min(R_share[rid], blocks)

    def release_in(g: int, held: int) -> None:
        """A member holding group g's chain up to ``held`` lets go; the blocks no one else holds stay cached."""
        nonlocal free_blocks
        holders = g_holders[g]
        holders[held] -= 1
        if holders[held]:
            return
        del holders[held]
        top = g_held[g]
        if held == top:
            new = max(holders, default=g_base[g])
            g_held[g] = new
            free_blocks += top - new
            if evicting:
                freed = [g, new, top]
                free_runs.append(freed)
                g_runs[g].append(freed)

    def release(rid: int, tokens: int) -> None:
        """A request holding ``tokens`` in the cache leaves it: its own blocks are freed first (tail first, as vLLM
        frees them), then its group's chain, then its parent's (deepest first)."""
        nonlocal free_blocks
        g = R_group[rid]
        base = g_base[g] if g >= 0 else 0
        held, parent_held = R_gh[rid], R_ph[rid]
        own = _blocks(tokens, block) - (held - base) - parent_held
        free_blocks += own
        if evicting and own > 0:
            if free_runs and free_runs[-1][0] < 0:
                free_runs[-1][2] += own
            else:
                free_runs.append([-1, 0, own])
        if held > base:
            release_in(g, held)
            R_gh[rid] = base
        if parent_held:
            release_in(g_parent[g], parent_held)
            R_ph[rid] = 0

    def preempt(rid: int) -> None:
        nonlocal free_blocks
        if rid in decoding:  # it emitted at its segment's first step, then in every decode step since
            d = len(decode_steps)  # the decode step about to run
            cached = drop_decoder(rid, d)
            if d > R_s0[rid]:
                R_gen[rid] += d - R_s0[rid]
                R_last[rid] = decode_steps[d - 1]
            segments.setdefault(rid, []).append((R_emit0[rid], R_last[rid]))
        else:  # still prefilling: nothing emitted since its last segment closed
            cached = R_done[rid]
            del prefilling[rid]
        del running[rid]
        if tracking:
            free_slot(rid, dropped=True)
        if chain:
            release(rid, cached)
        else:
            free_blocks += _blocks(cached, block)
        R_seg[rid] += 1
        R_pre[rid] += 1
        R_done[rid] = 0
        R_target[rid] = R_prompt[rid] + R_gen[rid]
        R_emit0[rid] = -1
        waiting.appendleft(rid)

    while True:
        if not closed:
            while next_arrival < limit and arrivals[next_arrival] <= now:
                waiting.append(issue(arrivals[next_arrival], next_arrival))
                next_arrival += 1
                issued += 1
        elif held or returned:
            waiting.extend(held)
            held = []
            if running or waiting:  # the engine starts its next step before they reach it
                held, returned = returned, []
            else:
                waiting.extend(returned)
                returned = []
        if not running and not waiting:
            if not closed and next_arrival < limit:
                woke = yield arrivals[next_arrival]
                idle_s += woke - now
                now = woke
                continue
            break
        s = step
        budget = budget_max
        completed_before = completed
        # --- decodes: every decoder, one token; blocks for those crossing a block boundary ------------------
        prefill_only = False
        if prefill_first and chunked and prefilling:
            # a prompt's next chunk runs before the decodes (SGLang's chunked request), if a block is free for it
            # (else the decodes run and free some, as SGLang's prefill adder forms no batch without room)
            done = R_done[next(iter(prefilling))]
            prefill_only = free_blocks >= _blocks(done + 1, block) - _blocks(done, block)
        elif prefill_first and waiting and len(running) < slots:
            head = waiting[0]
            h = hit_blocks(head) if chain else 0
            start = h * block
            first = R_target[head] - start if not chunked else min(R_target[head] - start, budget_max)
            need = _blocks(start + first, block) - h + (unheld(head, h) if h else 0)
            prefill_only = free_blocks >= need  # prefill-first: decodes wait while a prompt can start
        n_dec = 0
        d = len(decode_steps)  # the decode clock: this step is decode step d if the decoders decode in it
        if decoding and not prefill_only:
            need = residue[(-d) % block]
            while need > free_blocks:
                victim = next(reversed(running))
                if victim in decoding and (ctx_now(victim, d) % block) == 0:
                    need -= 1
                preempt(victim)
            free_blocks -= need
            if evicting:
                take(need)
            n_dec = len(decoding)
            budget -= n_dec
        # --- prefill chunks: running sequences first, then new ones from the queue ----------------------------
        pf_seqs = 0
        pf_tokens = 0
        pf_ctx = 0.0
        pf_local = 0.0
        pf_pairs = 0.0
        pf_pairs_local = 0.0
        chunks: list[tuple[int, int]] = []
        if prefill_only or not prefill_first:
            for rid in list(prefilling):
                if budget <= 0:
                    break
                if rid not in prefilling:  # preempted below to make room
                    continue
                done = R_done[rid]
                n = min(R_target[rid] - done, budget)
                need = _blocks(done + n, block) - _blocks(done, block)
                # make room by preempting later-admitted prefills (decoders of this step are already counted)
                while need > free_blocks and next(reversed(running)) != rid and next(reversed(running)) in prefilling:
                    preempt(next(reversed(running)))
                if need > free_blocks:
                    n = int(free_blocks * block + (-done) % block)
                    if n <= 0:
                        continue
                    need = _blocks(done + n, block) - _blocks(done, block)
                free_blocks -= need
                if evicting:
                    take(need)
                if chain and R_group[rid] >= 0:
                    extend(rid, done + n)
                chunks.append((rid, n))
                budget -= n
            while waiting and budget > 0 and len(running) < slots:
                rid = waiting[0]
                choice = pick_slot(rid) if slot_reuse else None
                h = hit_blocks(rid) if chain else 0
                # the prefill starts after the cached blocks; a llama-server slot reuses the tokens the prompt has in
                # common with the one it holds (all but the last, whose logits it needs: server-context.cpp
                # [TAG_PROMPT_LOGITS]), in its own KV stream, so its blocks are its own
                holder = choice[1] if choice is not None else EMPTY
                start = (h * block if choice is None else
                         min(common(rid, holder), R_target[rid] - 1) if holder >= 0 else 0)
                n = R_target[rid] - start if not chunked else min(R_target[rid] - start, budget)
                if n > budget:
                    break
                need = _blocks(start + n, block) - h
                reuse = unheld(rid, h) if h else 0  # cached blocks nobody holds: free until taken
                if need + reuse > free_blocks:
                    break
                waiting.popleft()
                if caching:
                    if h:
                        hold(rid, h)
                    R_done[rid] = start
                    if R_cached[rid] < 0:  # first admission: a readmission's lookup is counted apart by vLLM V1
                        R_cached[rid] = start
                        hit_tokens += start
                        query_tokens += R_target[rid]
                free_blocks -= need
                if evicting:
                    take(need)
                if chain and R_group[rid] >= 0:
                    extend(rid, start + n)
                running[rid] = None
                prefilling[rid] = None
                if tracking:
                    take_slot(rid, choice)
                if R_sched[rid] < 0:
                    R_sched[rid] = now
                chunks.append((rid, n))
                budget -= n
        spans: list[tuple[int, int, int]] = []  # (rid, start, end) of each prompt chunk (slot streams only)
        for rid, n in chunks:
            start = R_done[rid]
            end = start + n
            R_done[rid] = end
            if streams:
                spans.append((rid, start, end))
            pf_seqs += 1
            pf_tokens += n
            pf_ctx += end
            pf_pairs += causal(end) - causal(start)
            if windowed:
                pf_local += min(end, window)
                pf_pairs_local += causal(end, window) - causal(start, window)
        if not windowed:
            pf_local = pf_ctx
            pf_pairs_local = pf_pairs
        if n_dec == 0 and pf_seqs == 0:
            # nothing could run: only possible when the queue head waits for blocks that nothing will free
            raise SpeedlimitError("the simulated engine stalled: the queued request does not fit in the KV cache")
        batch = StepBatch(n_dec, float(sum_ctx) if n_dec else 0.0,
                          (sum_local if windowed else float(sum_ctx)) if n_dec else 0.0,
                          pf_seqs, pf_tokens, pf_ctx, pf_local, pf_pairs, pf_pairs_local)
        if streams:
            passes = slot_passes([(slot_of[rid], ctx_now(rid, d)) for rid in decoding] if n_dec else [],
                                 [(slot_of[rid], start, end) for rid, start, end in spans], window)
            step_passes.append(len(passes))
            if len(passes) > 1:
                batch = SplitStep(passes)
        dt = yield batch
        now += dt
        end_times.append(now)
        step_s_list.append(dt)
        step_batch.append(n_dec + pf_seqs)
        step_tokens.append(n_dec + pf_tokens)
        step_prefill.append(pf_tokens)
        step_waiting.append(len(waiting))
        step_in_system.append(issued - completed_before)
        # --- after the step: decoders advance, some finish; completed prefills emit ---------------------------
        if n_dec:
            decode_steps.append(s)
            sum_ctx += n_dec
            if windowed:
                sum_local += n_below
                for rid, seg in cross_at.pop(d + 1, ()):
                    if R_seg[rid] == seg and rid in decoding:
                        n_below -= 1
            for rid, seg in finish_at.pop(d, ()):
                if R_seg[rid] != seg or rid not in decoding:
                    continue
                cached = drop_decoder(rid, d + 1)
                if chain:
                    release(rid, cached)
                else:
                    free_blocks += _blocks(cached, block)
                del running[rid]
                if tracking:
                    free_slot(rid)
                R_gen[rid] = R_output[rid]
                R_last[rid] = s
                completed += 1
                if closed and issued < limit and (duration_s is None or now < duration_s):
                    returned.append(issue(now, issued))
                    issued += 1
        for rid, n in chunks:
            if R_done[rid] < R_target[rid]:
                continue
            del prefilling[rid]
            if R_first[rid] < 0:
                R_first[rid] = s
            R_emit0[rid] = s
            R_gen[rid] += 1
            R_last[rid] = s
            if R_gen[rid] >= R_output[rid]:
                del running[rid]
                if tracking:
                    free_slot(rid)
                if chain:
                    release(rid, R_done[rid])
                else:
                    free_blocks += _blocks(R_done[rid], block)
                completed += 1
                if closed and issued < limit and (duration_s is None or now < duration_s):
                    returned.append(issue(now, issued))
                    issued += 1
                continue
            # becomes a decoder from the next decode step
            cached = R_done[rid]
            d0 = len(decode_steps)
            R_s0[rid] = d0
            R_L0[rid] = cached
            decoding[rid] = None
            residue[(cached - d0) % block] += 1
            sum_ctx += cached + 1
            seg = R_seg[rid]
            finish_at.setdefault(d0 + R_output[rid] - R_gen[rid] - 1, []).append((rid, seg))
            if windowed:
                sum_local += min(cached + 1, window)
                if cached + 1 < window:
                    n_below += 1
                    cross_at.setdefault(d0 + int(window) - cached - 1, []).append((rid, seg))
        step_kv.append(0 if total_blocks == inf else int(total_blocks - free_blocks))
        step += 1

    n = len(R_prompt)
    for rid, parts in segments.items():  # close the last segment of every preempted request
        parts.append((R_emit0[rid], R_last[rid]))
    return RawRun(n=n, prompt=R_prompt, output=R_output, arrival=R_arrival, scheduled=R_sched, first_step=R_first,
                  last_step=R_last, preemptions=R_pre, segments=segments, end_times=end_times, step_s=step_s_list, step_batch=step_batch,
                  step_tokens=step_tokens, step_prefill=step_prefill, step_waiting=step_waiting, step_in_system=step_in_system,
                  step_kv_blocks=step_kv, kv_blocks=total_blocks, decode_steps=decode_steps, idle_s=idle_s,
                  prefix_cached=R_cached, prefix_hit_tokens=hit_tokens, prefix_query_tokens=query_tokens,
                  extra={"step_passes": step_passes, "slots": slot_log} if streams else
                  {"slots": slot_log} if tracking else {})
