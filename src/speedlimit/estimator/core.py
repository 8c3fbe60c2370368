"""The roofline core: pure, numpy-broadcastable functions of a `CostModel` and a `Machine`.

Nothing here does I/O or knows about names: every argument may be a Python float or a numpy array,
and arrays broadcast, so one call evaluates a whole sweep grid. The model of one forward step is

    step_s = max(bytes_read / (tp · achievable_BW), flops / (tp · achievable_FLOPs)) + overhead + all-reduce

where decode reads the always-read weights, the routed experts the batch touches (expected union)
and every sequence's KV cache, and prefill computes the whole prompt in one pass.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

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


class Machine(NamedTuple):
    """Achievable rates of one device, and how many devices share the model (tensor parallelism)."""

    bandwidth_Bps: float | np.ndarray  # achievable = peak · bw_efficiency
    flops: float | np.ndarray  # achievable = peak · flops_efficiency (NaN: unknown → memory roof only)
    step_overhead_s: float | np.ndarray
    memory_bytes: float | np.ndarray  # per device (NaN: unknown)
    link_Bps: float | np.ndarray  # per-direction device-to-device bandwidth (NaN: unknown)
    tp: float | np.ndarray = 1


# --------------------------------------------------------------------------------------------
# bytes and FLOPs


def expected_experts_read(n_experts, experts_per_token, tokens):
    """Expected number of distinct experts per MoE layer touched by ``tokens`` tokens.

    With uniform routing each token picks k of E experts, so an expert is missed by all tokens with
    probability (1 - k/E)^tokens: E · (1 - (1 - k/E)^tokens). Zero for dense models.
    """
    if np.ndim(n_experts) == 0 and not n_experts:
        return 0.0  # dense model: the common scalar case, without numpy overhead
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


def decode_bytes(cost: CostModel, batch, context):
    """Bytes read by one decode step: weights once, each sequence's KV cache, activations."""
    return weights_read_bytes(cost, batch) + batch * (kv_bytes_per_sequence(cost, context) + cost.activation_bytes_per_token)


def decode_flops(cost: CostModel, batch, context):
    """FLOPs of one decode step: matmuls per token plus attention over each sequence's context."""
    attention = cost.attn_flops_per_ctx_global * context + cost.attn_flops_per_ctx_local * np.minimum(context, cost.window)
    return batch * (cost.matmul_flops_per_token + attention)


def prefill_attention_flops(cost: CostModel, prompt):
    """Causal attention FLOPs of a prompt: query i attends to i tokens (at most the window)."""
    prompt = np.asarray(prompt, dtype=float)
    full = prompt * (prompt + 1) / 2
    window = np.minimum(cost.window, prompt)
    local = window * (window + 1) / 2 + (prompt - window) * window
    return cost.attn_flops_per_ctx_global * full + cost.attn_flops_per_ctx_local * local


# --------------------------------------------------------------------------------------------
# time


def allreduce_seconds(cost: CostModel, machine: Machine, tokens):
    """Tensor-parallel communication per step: ring all-reduces of the activations, 2 per layer."""
    if np.ndim(machine.tp) == 0 and machine.tp <= 1:
        return 0.0
    tp = np.asarray(machine.tp, dtype=float)
    ring = 2.0 * (tp - 1.0) / np.maximum(tp, 1.0) * tokens * cost.allreduce_bytes_per_token
    link = np.where(np.isfinite(machine.link_Bps), machine.link_Bps, np.inf)
    per_allreduce = ring / link + ALLREDUCE_LATENCY_S
    return np.where(tp > 1, cost.allreduces_per_step * per_allreduce, 0.0)


def roofline_seconds(bytes_read, flops, machine: Machine):
    """(memory time, compute time) of a step spread over ``tp`` devices; compute is 0 when FLOPs are unknown."""
    memory_s = bytes_read / (machine.tp * machine.bandwidth_Bps)
    if np.ndim(machine.flops) == 0:  # scalar fast path (one estimate)
        return memory_s, (flops / (machine.tp * machine.flops) if math.isfinite(machine.flops) else 0.0 * flops)
    compute_s = np.where(np.isfinite(machine.flops), flops / (machine.tp * np.where(np.isfinite(machine.flops), machine.flops, 1.0)), 0.0)
    return memory_s, compute_s


def decode_step_seconds(cost: CostModel, machine: Machine, batch, context):
    """Wall time of one decode step for ``batch`` sequences at ``context`` tokens each."""
    memory_s, compute_s = roofline_seconds(decode_bytes(cost, batch, context), decode_flops(cost, batch, context), machine)
    return np.maximum(memory_s, compute_s) + machine.step_overhead_s + allreduce_seconds(cost, machine, batch)


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
        memory_s, compute_s = roofline_seconds(decode_bytes(cost, batch, context), decode_flops(cost, batch, context), machine)
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


def prefill_seconds(cost: CostModel, machine: Machine, batch, prompt):
    """Time to prefill ``batch`` prompts of ``prompt`` tokens in one pass (the TTFT every one of them sees)."""
    tokens = batch * np.asarray(prompt, dtype=float)
    bytes_read = (
        weights_read_bytes(cost, tokens)
        + batch * kv_bytes_per_sequence(cost, prompt)  # KV written once
        + tokens * cost.activation_bytes_per_token
    )
    flops = tokens * cost.matmul_flops_per_token + batch * prefill_attention_flops(cost, prompt)
    memory_s, compute_s = roofline_seconds(bytes_read, flops, machine)
    return np.maximum(memory_s, compute_s) + machine.step_overhead_s + allreduce_seconds(cost, machine, tokens)


# --------------------------------------------------------------------------------------------
# capacity and regime


def critical_batch(cost: CostModel, machine: Machine, context, max_batch: float = 1e7):
    """Smallest batch at which a decode step turns compute-bound at ``context`` (inf if it never does).

    Dense models have a closed form: weights/BW = B · (flops/F − per-sequence bytes/BW). MoE models,
    whose weights read grow with the batch, are solved by a vectorized bisection in log space.
    """

    def compute_bound(batch):
        memory_s, compute_s = roofline_seconds(decode_bytes(cost, batch, context), decode_flops(cost, batch, context), machine)
        return compute_s >= memory_s

    shape = np.broadcast(*(np.asarray(v) for v in (*cost, *machine, context))).shape
    memory_per_sequence, compute_per_sequence = roofline_seconds(
        kv_bytes_per_sequence(cost, context) + cost.activation_bytes_per_token + cost.embedding_row_bytes,
        decode_flops(cost, 1.0, context),
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
    moe = np.broadcast_to(np.asarray(cost.n_experts) > 0, shape)
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
