"""The one step-cost model: what one engine step with a mixed batch reads, computes and costs in time.

Pure and numpy-broadcastable: every argument may be a Python float or a numpy array, and arrays broadcast, so
one call evaluates a whole sweep grid; with floats it takes a scalar fast path (the simulator calls it once per
engine step). A step is described by running sums over its sequences (`StepBatch`), so its cost is O(1) in the
number of sequences:

    step_s = max(bytes_read / (tp · achievable_BW), flops_priced / (tp · achievable_FLOPs))
             + per-step overhead + per-sequence overhead · sequences + tensor-parallel all-reduces

flops_priced = matmul FLOPs / gemm_factor(tokens in the step) + attention FLOPs / attention_factor: the serving
engine's GEMMs reach a token-dependent fraction of the large-GEMM rate (`Machine.gemm_*`, two anchors, linear in
log2 tokens, flat outside) and its attention kernels their own (`Machine.attention_factor`); both are 1 unless an
engine profile (catalog/engines.toml) sets them.

bytes_read = the weights touched once (MoE: the expected union of routed experts over the step's tokens)
           + every decode sequence's KV cache at its context + each prefill chunk's KV (the context before it,
             read, and its own tokens, written) + activations per token.
flops      = 2 · parameters per token · tokens + attention over each query's keys.

Decode-only (`decode_step`) and prefill-only (`prefill_step`) steps are special cases; `estimate`, `sweep`,
the curves, verify, calibrate and simulate all price steps through `step_seconds`.

On a CPU, the bandwidth one process reaches (`cpu_bandwidth_limits`) depends on how many cores its threads run on
and on which NUMA nodes hold the weights: the smallest of the threads' own rate, the memory of the nodes that
hold the weights, and the socket link that remote threads read through. `Machine.bandwidth_Bps` is that times
bw_efficiency.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from speedlimit.hardware import NUMA_POLICIES

# Fraction of device memory a serving engine may fill with weights + KV cache; the rest is the
# runtime, activations and fragmentation (vLLM's default gpu_memory_utilization is 0.9).
USABLE_MEMORY_FRACTION = 0.90
# Latency of one small all-reduce between GPUs (NCCL ring on NVLink is single-digit microseconds
# for decode-sized messages); bandwidth term is added on top.
ALLREDUCE_LATENCY_S = 5e-6
# Bytes of activation traffic per token per layer, in units of hidden_size elements at 16 bits:
# residual read/write, norms, q/k/v/o and MLP inputs/outputs (~10 hidden-sized vectors).
ACTIVATION_VECTORS_PER_LAYER = 10
ACTIVATION_BYTES = 2


class CostModel(NamedTuple):
    """What one model at one precision reads and computes (all fields broadcastable)."""

    head_bytes: float | np.ndarray  # LM head (or the tied embedding) read every step
    dense_bytes: float | np.ndarray  # attention, dense MLPs, shared experts, routers, norms
    expert_bytes: float | np.ndarray  # one routed expert summed over all MoE layers
    n_experts: float | np.ndarray
    experts_per_token: float | np.ndarray
    embedding_row_bytes: float | np.ndarray  # one token's embedding row (a gather)
    total_weight_bytes: float | np.ndarray  # everything resident in memory
    matmul_flops_per_token: float | np.ndarray  # 2 · parameters multiplied per token
    kv_bytes_per_token_global: float | np.ndarray  # per context token, full-attention layers
    kv_bytes_per_token_local: float | np.ndarray  # per context token, sliding-window layers
    window: float | np.ndarray  # sliding window in tokens (inf when none)
    attn_flops_per_ctx_global: float | np.ndarray
    attn_flops_per_ctx_local: float | np.ndarray
    activation_bytes_per_token: float | np.ndarray
    allreduce_bytes_per_token: float | np.ndarray  # one all-reduce message per token (hidden · 2 bytes)
    allreduces_per_step: float | np.ndarray  # 2 per layer under tensor parallelism
    # 2 · LM-head parameters, part of matmul_flops_per_token: engines compute logits only where they sample, one
    # position per sequence in a step, so a prefill chunk pays the head once, not once per prompt token (llama.cpp,
    # https://github.com/ggml-org/llama.cpp/blob/master/src/llama-batch.cpp: a batch without per-token output flags
    # "return[s] the output only for the last token")
    head_flops_per_sequence: float | np.ndarray = 0.0


class Machine(NamedTuple):
    """Achievable rates of one device, and how many devices share the model (tensor parallelism)."""

    bandwidth_Bps: float | np.ndarray  # achievable = peak · bw_efficiency
    flops: float | np.ndarray  # achievable = peak · flops_efficiency (NaN: unknown → memory roof only)
    step_overhead_s: float | np.ndarray
    memory_bytes: float | np.ndarray  # per device (NaN: unknown)
    link_Bps: float | np.ndarray  # per-direction device-to-device bandwidth (NaN: unknown)
    tp: float | np.ndarray = 1
    sequence_overhead_s: float | np.ndarray = 0.0  # per running sequence per step (engine bookkeeping, sampling)
    # the engine's GEMM rate relative to `flops`: gemm_factor_small at <= gemm_tokens_small tokens in the step,
    # gemm_factor_large at >= gemm_tokens_large, linear in log2(tokens) between
    gemm_tokens_small: float | np.ndarray = 1.0
    gemm_factor_small: float | np.ndarray = 1.0
    gemm_tokens_large: float | np.ndarray = 1.0
    gemm_factor_large: float | np.ndarray = 1.0
    attention_factor: float | np.ndarray = 1.0  # the attention kernels' rate relative to `flops`


class StepBatch(NamedTuple):
    """One engine step as running sums over its sequences (all fields broadcastable).

    A decode sequence at context c generates one token and attends to c keys (min(c, window) in sliding-window
    layers). A prefill chunk of n tokens that starts after s tokens of its prompt are cached attends causally:
    query i (s < i <= s + n) sees i keys, so it adds `causal_pairs(s + n) - causal_pairs(s)` (query, key) pairs,
    reads the KV of the s cached tokens and writes n.
    """

    decode_sequences: float | np.ndarray = 0.0
    decode_context: float | np.ndarray = 0.0  # Σ context over decode sequences
    decode_context_local: float | np.ndarray = 0.0  # Σ min(context, window)
    prefill_sequences: float | np.ndarray = 0.0
    prefill_tokens: float | np.ndarray = 0.0  # Σ chunk tokens
    prefill_context: float | np.ndarray = 0.0  # Σ (s + n): KV tokens each chunk reads or writes
    prefill_context_local: float | np.ndarray = 0.0  # Σ min(s + n, window)
    prefill_pairs: float | np.ndarray = 0.0  # Σ causal (query, key) pairs
    prefill_pairs_local: float | np.ndarray = 0.0  # the same within the window

    @property
    def tokens(self):
        return self.decode_sequences + self.prefill_tokens

    @property
    def sequences(self):
        return self.decode_sequences + self.prefill_sequences


# --------------------------------------------------------------------------------------------
# the bandwidth one process reaches on a CPU

class BandwidthLimits(NamedTuple):
    """What bounds the memory bandwidth one inference process reaches on a CPU machine (bytes/s, broadcastable).

    The process reaches the smallest of them (`reached_Bps`); inf means that bound does not apply.
    """

    threads_Bps: float | np.ndarray  # cores the threads run on × what one core streams (inf: per-core unknown)
    memory_Bps: float | np.ndarray  # peak of the NUMA nodes holding the weights
    link_Bps: float | np.ndarray  # what remote threads read through the socket links (inf: none read remotely)
    cores: float | np.ndarray  # physical cores the threads run on (hyperthreads add none)
    nodes: float | np.ndarray  # NUMA nodes holding the weights

    @property
    def reached_Bps(self):
        return np.minimum(np.minimum(self.threads_Bps, self.memory_Bps), self.link_Bps)


def cpu_bandwidth_limits(memory_bandwidth_Bps, topology, threads, numa: str = "none") -> BandwidthLimits:
    """The bounds on the bandwidth a process with ``threads`` threads reaches on a CPU machine.

    ``memory_bandwidth_Bps`` is the whole machine's peak (all sockets); ``topology`` a `speedlimit.hardware.CpuTopology`.
    Every NUMA node holds an equal share of the channels and the cores. Threads run on distinct physical cores while
    there are any (a second thread on a core adds no bandwidth), and each core streams ``per_core_Bps``.

    - ``none``: the weights are loaded by one thread, so first touch puts every page on one node, and the scheduler
      spreads the threads over all sockets: the reach is one node's memory, and each other socket reads its share
      (1/sockets of the bytes) through its link to that node, so the links carry at most sockets × link_Bps.
    - ``distribute``: threads round-robin over the nodes and fault in the pages they use, so each node serves its
      own threads: the reach is the memory of every node that has a thread.
    - ``isolate``: threads stay on the node the process started on, with the weights: one node's cores and memory.
    """
    if numa not in NUMA_POLICIES:
        raise ValueError(f"unknown NUMA policy {numa!r}: one of {', '.join(NUMA_POLICIES)}")
    sockets, per_socket = float(topology.sockets), float(topology.nodes_per_socket)
    nodes = sockets * per_socket
    node_Bps = np.asarray(memory_bandwidth_Bps, dtype=float) / nodes
    usable = topology.cores_per_socket / per_socket if numa == "isolate" else float(topology.cores)
    cores = np.minimum(np.asarray(threads, dtype=float), usable)
    per_core = topology.per_core_Bps
    threads_Bps = cores * per_core if math.isfinite(per_core) else np.full_like(cores, math.inf)
    if numa == "distribute":
        holding = np.minimum(nodes, cores)
        link = math.inf
    else:
        holding = np.ones_like(cores)
        remote = numa == "none" and sockets > 1 and math.isfinite(topology.link_Bps)
        link = sockets * topology.link_Bps if remote else math.inf
    return BandwidthLimits(threads_Bps=threads_Bps, memory_Bps=holding * node_Bps, link_Bps=np.full_like(cores, link),
                           cores=cores, nodes=holding)


# --------------------------------------------------------------------------------------------
# bytes and FLOPs


def _scalar(value) -> bool:
    """A plain Python or numpy scalar number: take the pure-Python path (numpy calls cost ~1 µs each)."""
    return value.__class__ in _SCALAR_TYPES


_SCALAR_TYPES = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})


def expected_experts_read(n_experts, experts_per_token, tokens):
    """Expected number of distinct experts per MoE layer touched by ``tokens`` tokens.

    With uniform routing each token picks k of E experts, so an expert is missed by all tokens with
    probability (1 - k/E)^tokens: E · (1 - (1 - k/E)^tokens). Zero for dense models.
    """
    if _scalar(n_experts):
        if not n_experts:
            return 0.0  # dense model: the common scalar case, without numpy overhead
        if _scalar(experts_per_token) and _scalar(tokens):
            return n_experts * (1.0 - (1.0 - experts_per_token / n_experts) ** tokens)
    n_experts = np.asarray(n_experts, dtype=float)
    picked = np.where(n_experts > 0, np.asarray(experts_per_token, dtype=float) / np.where(n_experts > 0, n_experts, 1.0), 0.0)
    miss = np.power(1.0 - picked, tokens)
    return np.where(n_experts > 0, n_experts * (1.0 - miss), 0.0)


def weights_read_bytes(cost: CostModel, tokens):
    """Weight bytes one forward pass over ``tokens`` tokens streams from memory."""
    experts = expected_experts_read(cost.n_experts, cost.experts_per_token, tokens)
    return cost.head_bytes + cost.dense_bytes + experts * cost.expert_bytes + tokens * cost.embedding_row_bytes


def kv_bytes_per_sequence(cost: CostModel, context):
    """KV-cache bytes one sequence holds at ``context`` tokens (sliding-window layers cap at the window)."""
    return cost.kv_bytes_per_token_global * context + cost.kv_bytes_per_token_local * np.minimum(context, cost.window)


def causal_pairs(tokens, window=math.inf):
    """(query, key) pairs of causal attention over the first ``tokens`` positions: query i sees min(i, window) keys."""
    if _scalar(tokens) and _scalar(window):  # scalar fast path
        w = min(window, tokens)
        return w * (w + 1) / 2 + (tokens - w) * w
    tokens = np.asarray(tokens, dtype=float)
    w = np.minimum(window, tokens)
    return w * (w + 1) / 2 + (tokens - w) * w


def _min(a, b):
    return min(a, b) if _scalar(a) and _scalar(b) else np.minimum(a, b)


def decode_batch(cost: CostModel, batch, context) -> StepBatch:
    """A decode-only step: ``batch`` sequences at ``context`` tokens each."""
    return StepBatch(decode_sequences=batch, decode_context=batch * context,
                     decode_context_local=batch * _min(context, cost.window))


def prefill_batch(cost: CostModel, batch, tokens, cached=0.0) -> StepBatch:
    """A prefill-only step: ``batch`` chunks of ``tokens`` tokens, each after ``cached`` tokens already in the cache."""
    end = cached + tokens
    return StepBatch(
        prefill_sequences=batch, prefill_tokens=batch * tokens,
        prefill_context=batch * end, prefill_context_local=batch * _min(end, cost.window),
        prefill_pairs=batch * (causal_pairs(end) - causal_pairs(cached)),
        prefill_pairs_local=batch * (causal_pairs(end, cost.window) - causal_pairs(cached, cost.window)),
    )


def step_bytes(cost: CostModel, step: StepBatch):
    """Bytes one step streams from memory: weights once, KV caches, activations."""
    kv = (cost.kv_bytes_per_token_global * (step.decode_context + step.prefill_context)
          + cost.kv_bytes_per_token_local * (step.decode_context_local + step.prefill_context_local))
    tokens = step.decode_sequences + step.prefill_tokens
    return weights_read_bytes(cost, tokens) + kv + tokens * cost.activation_bytes_per_token


def step_flops(cost: CostModel, step: StepBatch):
    """FLOPs of one step: matmuls per token plus attention per (query, key) pair."""
    return step_matmul_flops(cost, step) + step_attention_flops(cost, step)


def step_matmul_flops(cost: CostModel, step: StepBatch):
    body = (step.decode_sequences + step.prefill_tokens) * (cost.matmul_flops_per_token - cost.head_flops_per_sequence)
    return body + (step.decode_sequences + step.prefill_sequences) * cost.head_flops_per_sequence


def step_attention_flops(cost: CostModel, step: StepBatch):
    return (cost.attn_flops_per_ctx_global * (step.decode_context + step.prefill_pairs)
            + cost.attn_flops_per_ctx_local * (step.decode_context_local + step.prefill_pairs_local))


def gemm_factor(machine: Machine, tokens):
    """The engine's GEMM rate at ``tokens`` tokens per step, relative to `Machine.flops` (1 without a profile)."""
    t0, f0, t1, f1 = machine.gemm_tokens_small, machine.gemm_factor_small, machine.gemm_tokens_large, machine.gemm_factor_large
    if _scalar(t0) and _scalar(f0) and _scalar(t1) and _scalar(f1) and _scalar(tokens):
        if f0 == f1 or tokens <= t0:
            return f0
        if tokens >= t1:
            return f1
        return f0 + (f1 - f0) * (math.log2(tokens) - math.log2(t0)) / (math.log2(t1) - math.log2(t0))
    with np.errstate(divide="ignore", invalid="ignore"):
        span = np.log2(t1) - np.log2(t0)
        w = np.where(span > 0, (np.log2(np.maximum(tokens, 1e-300)) - np.log2(t0)) / np.where(span > 0, span, 1.0),
                     np.asarray(tokens) >= t1)
    return f0 + (f1 - f0) * np.clip(w, 0.0, 1.0)


def priced_flops(cost: CostModel, machine: Machine, step: StepBatch):
    """A step's FLOPs weighted by the engine's kernel rates: what `Machine.flops` must execute in the step's time."""
    tokens = step.decode_sequences + step.prefill_tokens
    return step_matmul_flops(cost, step) / gemm_factor(machine, tokens) + step_attention_flops(cost, step) / machine.attention_factor


def decode_bytes(cost: CostModel, batch, context):
    """Bytes read by one decode step of ``batch`` sequences at ``context`` tokens."""
    return step_bytes(cost, decode_batch(cost, batch, context))


def decode_flops(cost: CostModel, batch, context):
    """FLOPs of one decode step of ``batch`` sequences at ``context`` tokens."""
    return step_flops(cost, decode_batch(cost, batch, context))


def prefill_bytes(cost: CostModel, batch, prompt):
    """Bytes read (and KV written) by prefilling ``batch`` prompts of ``prompt`` tokens in one pass."""
    return step_bytes(cost, prefill_batch(cost, batch, prompt))


def prefill_flops(cost: CostModel, batch, prompt):
    """FLOPs of prefilling ``batch`` prompts of ``prompt`` tokens in one pass."""
    return step_flops(cost, prefill_batch(cost, batch, prompt))


# --------------------------------------------------------------------------------------------
# time


def allreduce_seconds(cost: CostModel, machine: Machine, tokens):
    """Tensor-parallel communication per step: ring all-reduces of the activations, 2 per layer."""
    tp = machine.tp
    if _scalar(tp):
        if tp <= 1:
            return 0.0
        if _scalar(machine.link_Bps) and _scalar(tokens):
            link = machine.link_Bps if math.isfinite(machine.link_Bps) else math.inf
            ring = 2.0 * (tp - 1.0) / tp * tokens * cost.allreduce_bytes_per_token
            return cost.allreduces_per_step * (ring / link + ALLREDUCE_LATENCY_S)
    tp = np.asarray(machine.tp, dtype=float)
    ring = 2.0 * (tp - 1.0) / np.maximum(tp, 1.0) * tokens * cost.allreduce_bytes_per_token
    link = np.where(np.isfinite(machine.link_Bps), machine.link_Bps, np.inf)
    per_allreduce = ring / link + ALLREDUCE_LATENCY_S
    return np.where(tp > 1, cost.allreduces_per_step * per_allreduce, 0.0)


def roofline_seconds(bytes_read, flops, machine: Machine):
    """(memory time, compute time) of a step spread over ``tp`` devices; compute is 0 when FLOPs are unknown."""
    memory_s = bytes_read / (machine.tp * machine.bandwidth_Bps)
    rate = machine.flops
    if _scalar(rate):  # scalar fast path (one estimate, one simulated step)
        return memory_s, (flops / (machine.tp * rate) if math.isfinite(rate) else 0.0 * flops)
    compute_s = np.where(np.isfinite(machine.flops), flops / (machine.tp * np.where(np.isfinite(machine.flops), machine.flops, 1.0)), 0.0)
    return memory_s, compute_s


def step_time(bytes_read, flops, machine: Machine, comm_s=0.0, sequences=0.0):
    """Wall time of a step that reads ``bytes_read`` and computes ``flops`` (whole step, all tp devices)."""
    memory_s, compute_s = roofline_seconds(bytes_read, flops, machine)
    roof_s = max(memory_s, compute_s) if _scalar(memory_s) and _scalar(compute_s) else np.maximum(memory_s, compute_s)
    return roof_s + machine.step_overhead_s + machine.sequence_overhead_s * sequences + comm_s


def step_seconds(cost: CostModel, machine: Machine, step: StepBatch):
    """Wall time of one engine step with a mixed batch of decode sequences and prefill chunks."""
    tokens = step.decode_sequences + step.prefill_tokens
    return step_time(step_bytes(cost, step), priced_flops(cost, machine, step), machine,
                     allreduce_seconds(cost, machine, tokens), step.decode_sequences + step.prefill_sequences)


def decode_step_seconds(cost: CostModel, machine: Machine, batch, context):
    """Wall time of one decode step for ``batch`` sequences at ``context`` tokens each."""
    return step_seconds(cost, machine, decode_batch(cost, batch, context))


def mean_decode_step_seconds(cost: CostModel, machine: Machine, batch, context_start, context_end):
    """Mean decode step time while the context grows from ``context_start`` to ``context_end``.

    The step time is piecewise linear in the context (kinks where a sliding window fills and where
    the step turns from memory- to compute-bound), so the trapezoid rule over those breakpoints is
    the exact mean, at the cost of six evaluations instead of one per generated token.
    """
    start = np.asarray(context_start, dtype=float)
    end = np.maximum(np.asarray(context_end, dtype=float), start)
    knee = np.clip(cost.window, start, end)

    def gap(context):  # memory minus compute time: linear on each side of the window knee
        memory_s, compute_s = roofline_seconds(decode_bytes(cost, batch, context),
                                               priced_flops(cost, machine, decode_batch(cost, batch, context)), machine)
        return memory_s - compute_s

    def crossing(lo, hi):
        g_lo, g_hi = gap(lo), gap(hi)
        changes = (g_lo * g_hi) < 0
        with np.errstate(divide="ignore", invalid="ignore"):
            at = lo + (hi - lo) * g_lo / np.where(changes, g_lo - g_hi, 1.0)
        return np.where(changes, at, lo)

    points = np.sort(np.stack(np.broadcast_arrays(start, end, knee, crossing(start, knee), crossing(knee, end))), axis=0)
    times = [decode_step_seconds(cost, machine, batch, point) for point in points]
    area = sum((times[i + 1] + times[i]) / 2 * (points[i + 1] - points[i]) for i in range(len(points) - 1))
    span = end - start
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(span > 0, area / np.where(span > 0, span, 1.0), times[0])


class ReplyDecode(NamedTuple):
    """Decode over a whole reply: the mean step (ITL) and the work of the mid-context step."""

    itl_s: float | np.ndarray  # mean decode step while the context grows over the reply
    step_bytes: float | np.ndarray  # bytes of the step at the mean context
    step_flops: float | np.ndarray
    compute_bound: bool | np.ndarray  # the mean-context step is compute-bound


def reply_decode(cost: CostModel, machine: Machine, batch, prompt, output) -> ReplyDecode:
    """``batch`` sequences generating ``output`` tokens after ``prompt``: what estimate, sweep and curves report."""
    mid = prompt + output / 2
    bytes_read, flops = decode_bytes(cost, batch, mid), decode_flops(cost, batch, mid)
    memory_s, compute_s = roofline_seconds(bytes_read, priced_flops(cost, machine, decode_batch(cost, batch, mid)), machine)
    compute_bound = compute_s > memory_s if _scalar(memory_s) and _scalar(compute_s) else np.asarray(compute_s) > np.asarray(memory_s)
    return ReplyDecode(mean_decode_step_seconds(cost, machine, batch, prompt, prompt + output), bytes_read, flops, compute_bound)


def prefill_seconds(cost: CostModel, machine: Machine, batch, prompt):
    """Time to prefill ``batch`` prompts of ``prompt`` tokens in one pass (the TTFT every one of them sees)."""
    return step_seconds(cost, machine, prefill_batch(cost, batch, prompt))


# --------------------------------------------------------------------------------------------
# capacity and regime


def critical_batch(cost: CostModel, machine: Machine, context, max_batch: float = 1e7):
    """Smallest batch at which a decode step turns compute-bound at ``context`` (inf if it never does).

    Dense models have a closed form: weights/BW = B · (flops/F − per-sequence bytes/BW). MoE models,
    whose weights read grow with the batch, are solved by a vectorized bisection in log space.
    """

    def compute_bound(batch):
        memory_s, compute_s = roofline_seconds(decode_bytes(cost, batch, context),
                                               priced_flops(cost, machine, decode_batch(cost, batch, context)), machine)
        return compute_s >= memory_s

    shape = np.broadcast(*(np.asarray(v) for v in (*cost, *machine, context))).shape
    memory_per_sequence, compute_per_sequence = roofline_seconds(
        kv_bytes_per_sequence(cost, context) + cost.activation_bytes_per_token + cost.embedding_row_bytes,
        priced_flops(cost, machine, decode_batch(cost, 1.0, context)),
        machine,
    )
    fixed_s, _ = roofline_seconds(cost.head_bytes + cost.dense_bytes, 0.0, machine)
    slope = compute_per_sequence - memory_per_sequence
    with np.errstate(divide="ignore", invalid="ignore"):
        closed = np.where(slope > 0, np.maximum(np.ceil(fixed_s / np.where(slope > 0, slope, 1.0)), 1.0), np.inf)
    finite = np.isfinite(closed) & (closed <= max_batch)
    closed = np.where(finite, closed, np.inf)
    # guard the ceiling against rounding: the answer is bound, the batch below it is not
    closed = np.where(finite & (closed > 1) & compute_bound(np.where(finite, closed - 1, 1.0)), closed - 1, closed)
    closed = np.where(finite & ~compute_bound(np.where(finite, closed, 1.0)), closed + 1, closed)
    # MoE weights read grow with the batch, and a token-dependent GEMM rate bends the line: bisect both
    moe = np.broadcast_to((np.asarray(cost.n_experts) > 0)
                          | (np.asarray(machine.gemm_factor_small) != np.asarray(machine.gemm_factor_large)), shape)
    if not np.any(moe):
        return np.broadcast_to(closed, shape) if shape else closed

    lo = np.zeros(shape)  # log2 batch: memory-bound at 2**lo unless already compute-bound at 1
    hi = np.full(shape, np.log2(max_batch))
    at_one = compute_bound(np.ones(shape))
    never = ~compute_bound(np.full(shape, max_batch))
    for _ in range(48):
        mid = (lo + hi) / 2
        bound = compute_bound(np.exp2(mid))
        hi = np.where(bound, mid, hi)
        lo = np.where(bound, lo, mid)
    bisected = np.where(at_one, 1.0, np.where(never, np.inf, np.ceil(np.exp2(hi) - 1e-9)))
    return np.where(moe, bisected, closed)


def kv_cache_bytes(cost: CostModel, batch, context):
    return batch * kv_bytes_per_sequence(cost, context)


def usable_memory_bytes(machine: Machine):
    return machine.memory_bytes * machine.tp * USABLE_MEMORY_FRACTION


def max_batch_that_fits(cost: CostModel, machine: Machine, context):
    """Most sequences of ``context`` tokens whose KV cache fits beside the weights (0 if the weights don't)."""
    free = usable_memory_bytes(machine) - cost.total_weight_bytes
    per_sequence = kv_bytes_per_sequence(cost, context)
    with np.errstate(divide="ignore", invalid="ignore"):
        count = np.floor(free / per_sequence)
    return np.where(free <= 0, 0.0, np.where(per_sequence > 0, count, np.inf))
