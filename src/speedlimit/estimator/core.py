"""The one step-cost model: what one engine step with a mixed batch reads, computes and costs in time.

Pure and numpy-broadcastable: every argument may be a Python float or a numpy array, and arrays broadcast, so
one call evaluates a whole sweep grid; with floats it takes a scalar fast path (the simulator calls it once per
engine step). A step is described by running sums over its sequences (`StepBatch`), so its cost is O(1) in the
number of sequences:

    step_s = max(bytes_read / (tp · achievable_BW), flops_priced / (tp · achievable_FLOPs))
             (+ the smaller of the two where a calibrated profile found they do not overlap: `stream_compute_seconds`)
             + per-step overhead + per-sequence overhead · sequences + tensor-parallel all-reduces
             + a weight conversion where the engine runs one before its GEMMs (`dequantize_seconds`)
             + on a CPU whose llama.cpp build's attention kernel was timed (fold C), that kernel, apart from the
               roofline: its FLOPs and KV reads leave the two terms above (`attention_kernel_seconds`)

flops_priced = matmul FLOPs / gemm_factor(tokens in the step) + attention FLOPs / attention_factor: the serving
engine's GEMMs reach a token-dependent fraction of the large-GEMM rate (`Machine.gemm_*`, two anchors, linear in
log2 tokens, flat outside) and its attention kernels their own (`Machine.attention_factor`); both are 1 unless an
engine profile (catalog/engines.toml) sets them. A routed expert's matmul is a GEMM over the tokens routed to it
(llama.cpp's `mul_mat_id` groups the step's rows by expert; fused-MoE kernels pad each expert's rows to a block), so
the experts' FLOPs are priced at gemm_factor(tokens per busy expert) (`expert_gemm_tokens`), unless the engine has a
fused-MoE rate of its own (`Machine.moe_factor`).

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

Parallelism beyond tensor parallelism (``Machine.pp``, ``dp``, ``ep``) changes what one evaluation of the formula
above covers, not the formula (`step_seconds`):

- data parallelism (``dp``): the step's sequences are spread evenly over ``dp`` replicas (one per sequence when
  fewer) that run in lockstep, each with its own KV cache; the formula prices one replica's share. Without expert
  parallelism every replica holds the whole model (SGLang's and vLLM's plain DP: "each replica has a full copy of
  the model", https://docs.sglang.io/advanced_features/dp_dpa_smg_guide.html).
- expert parallelism (``ep`` = tp · dp, vLLM's EP group: https://docs.vllm.ai/en/latest/serving/expert_parallel_deployment/):
  the routed experts are split over all tp · dp devices and the MoE layers see the tokens of every replica (DP
  attention, https://docs.sglang.io/advanced_features/dp_dpa_smg_guide.html): the experts read are the expected
  union over all replicas' tokens, a 1/ep share of it per device (uniform routing spreads it evenly). Each MoE layer
  swaps its tensor-parallel all-reduce for two all-to-alls (dispatch and combine,
  https://github.com/deepseek-ai/DeepEP): every token's hidden vector goes to each of its k experts' devices, of
  which (ep − 1)/ep are remote. FLOPs are unchanged (the same expert matmuls, balanced over the devices).
- pipeline parallelism (``pp``): the layers are split into ``pp`` stages of tp devices each, and a replica's
  sequences into min(sequences, pp) micro-batches in flight (vLLM runs one micro-batch per stage, its "virtual
  engines": https://github.com/vllm-project/vllm/issues/11945). One micro-batch passes every stage in turn, so its
  step is the whole model's step at the micro-batch (the sum of the stage times) plus pp − 1 activation sends
  (hidden · 2 bytes per token); the stages overlap on different micro-batches, so a cycle is never shorter than the
  micro-batches' time through the largest stage (stage time is taken proportional to its layers; an uneven split
  runs at the pace of the largest stage). With fewer sequences than stages the pipeline idles (the bubble of GPipe,
  https://arxiv.org/abs/1811.06965, and Megatron-LM, https://arxiv.org/abs/2104.04473). Every sequence gets one
  token per cycle: the cycle is the step time.
With pp = dp = ep = 1 every term above is exactly the tensor-parallel step.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from speedlimit.hardware import NUMA_POLICIES

# Fraction of device memory a serving engine may fill with weights + KV cache; the rest is the
# runtime, activations and fragmentation (vLLM's default gpu_memory_utilization is 0.9).
USABLE_MEMORY_FRACTION = 0.90
# Fixed cost of one small all-reduce by tensor-parallel size (the bytes' ring time over the link is added on top):
# sgl-project/sglang PR #2904 (H100, the custom all-reduce kernel, without CUDA graphs), 512-byte messages at TP 2 /
# 4 / 8: 0.0037 / 0.0048 / 0.0059 ms; interpolated in log2(tp) between them, TP 8's above (ASSUMED). Rule:
# benchmarks/accuracy/SOURCES.md, "Cited constant: a small all-reduce's latency by tensor-parallel size".
ALLREDUCE_LATENCY_BY_TP = ((2, 3.7e-6), (4, 4.8e-6), (8, 5.9e-6))
# Bytes of activation traffic per token per layer, in units of hidden_size elements at 16 bits:
# residual read/write, norms, q/k/v/o and MLP inputs/outputs (~10 hidden-sized vectors).
ACTIVATION_VECTORS_PER_LAYER = 10
ACTIVATION_BYTES = 2
# Latency of one small point-to-point send or all-to-all between devices (a pipeline stage's activations, an MoE
# dispatch): a 2-GPU all-reduce's, one exchange between two devices (ASSUMED; same rule).
SEND_LATENCY_S = ALLREDUCE_LATENCY_BY_TP[0][1]


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
    layers: float | np.ndarray = 0.0  # transformer layers that pipeline stages split (0: unknown, an even split)
    moe_layers: float | np.ndarray = 0.0  # layers with routed experts (two all-to-alls each under expert parallelism)
    # 2 · the routed-expert parameters one token multiplies (k experts), part of matmul_flops_per_token: an engine's
    # fused-MoE kernel may run at its own rate (`Machine.moe_factor`)
    expert_matmul_flops_per_token: float | np.ndarray = 0.0


class Machine(NamedTuple):
    """Achievable rates of one device, and how the devices share the model (tp · pp · dp devices; ep among them)."""

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
    # the routed experts' GEMM rate (a fused-MoE kernel) relative to `flops`; NaN: the dense GEMM curve's
    moe_factor: float | np.ndarray = math.nan
    pp: float | np.ndarray = 1.0  # pipeline stages (tp devices each)
    dp: float | np.ndarray = 1.0  # data-parallel replicas (attention, KV cache and batch share each)
    ep: float | np.ndarray = 1.0  # expert-parallel devices: 1, or tp · dp (the routed experts split over all of them)
    # the routed experts' bytes priced at this multiple of the others': an engine's fused-MoE kernel that streams the
    # experts' weights at a smaller fraction of the spec bandwidth than `bandwidth_Bps`'s (bw_efficiency / its own)
    moe_bytes_factor: float | np.ndarray = 1.0
    moe_bytes_tokens: float | np.ndarray = 0.0  # ... in a step whose MoE layers see at least this many tokens
    # seconds a step with more than `dequantize_tokens` tokens spends converting its quantized weights to fp16 in a
    # kernel of its own before the GEMMs (llama.cpp CUDA before MMQ became its default): added to the roofline
    dequantize_s: float | np.ndarray = 0.0
    dequantize_tokens: float | np.ndarray = math.inf
    # how far a step's weight/KV stream and its arithmetic overlap: 1, the roofline's max(memory, compute); 0, they
    # add (a CPU whose cores do the streaming and the multiply-accumulates in turn, as measured on the project's VMs:
    # benchmarks/README.md). Only a calibrated profile sets it, from the user's own measurements (`verify.fit`).
    stream_compute_overlap: float | np.ndarray = 1.0
    # a CPU attention kernel of its own (llama.cpp's flash attention on the CPU backend): FLOP/s it reaches on decode
    # tokens' and on prefill chunks' attention, the KV reads included (fold C). Finite: attention leaves the roofline
    # (its FLOPs and its KV-cache bytes) and its time is added to the step (`attention_kernel_seconds`); NaN: attention
    # rides the roofline with the matmuls at `attention_factor`
    attention_decode_flops: float | np.ndarray = math.nan
    attention_prefill_flops: float | np.ndarray = math.nan


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


def expert_gemm_tokens(cost: CostModel, tokens):
    """Tokens each busy routed expert multiplies when ``tokens`` tokens meet in a MoE layer: their k · tokens
    token-expert products over the expected experts they touch (uniform routing, `expected_experts_read`), at least
    1; ``tokens`` itself for a dense model (no expert FLOPs to price)."""
    touched = expected_experts_read(cost.n_experts, cost.experts_per_token, tokens)
    if _scalar(touched) and _scalar(tokens) and _scalar(cost.experts_per_token):
        return max(tokens * cost.experts_per_token / touched, 1.0) if touched > 0 else tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        per_expert = np.maximum(np.asarray(tokens) * cost.experts_per_token / np.where(touched > 0, touched, 1.0), 1.0)
    return np.where(np.asarray(touched) > 0, per_expert, tokens)


def weights_read_bytes(cost: CostModel, tokens, moe_group=1.0, moe_busy=None):
    """Weight bytes one forward pass over ``tokens`` tokens streams from memory.

    ``moe_group``: replicas whose tokens meet in the MoE layers (`moe_group`); this replica's devices read their
    1/moe_group share of the experts the whole group's tokens touch, ``tokens`` from each of ``moe_busy`` replicas
    (default: all of them; fewer when some replicas have no sequence).
    """
    return (cost.head_bytes + cost.dense_bytes + experts_read_bytes(cost, tokens, moe_group, moe_busy)
            + tokens * cost.embedding_row_bytes)


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


def step_bytes(cost: CostModel, step: StepBatch, moe_group=1.0, moe_busy=None):
    """Bytes one step streams from memory: weights once, KV caches, activations (``moe_group``, ``moe_busy``:
    `weights_read_bytes`)."""
    tokens = step.decode_sequences + step.prefill_tokens
    return (weights_read_bytes(cost, tokens, moe_group, moe_busy) + step_kv_bytes(cost, step)
            + tokens * cost.activation_bytes_per_token)


def attention_apart(machine: Machine):
    """Whether the step's attention is a kernel of its own (`Machine.attention_decode_flops` finite): True or False
    for a scalar machine (the callers' fast path tests for those two objects), else an array of bools."""
    rate = machine.attention_decode_flops
    return math.isfinite(rate) if _scalar(rate) else np.isfinite(rate)


def step_kv_bytes(cost: CostModel, step: StepBatch):
    """The KV-cache bytes a step reads and writes (part of `step_bytes`)."""
    return (cost.kv_bytes_per_token_global * (step.decode_context + step.prefill_context)
            + cost.kv_bytes_per_token_local * (step.decode_context_local + step.prefill_context_local))


def attention_kernel_seconds(cost: CostModel, machine: Machine, step: StepBatch):
    """The time of a step's attention where it is a kernel of its own (`attention_apart`), else 0: decode tokens'
    attention FLOPs at `Machine.attention_decode_flops`, prefill chunks' at `attention_prefill_flops`, over tp."""
    apart = attention_apart(machine)
    if apart is False:  # a scalar machine without the kernel (the simulator's every step): nothing to add
        return 0.0
    decode = cost.attn_flops_per_ctx_global * step.decode_context + cost.attn_flops_per_ctx_local * step.decode_context_local
    prefill = cost.attn_flops_per_ctx_global * step.prefill_pairs + cost.attn_flops_per_ctx_local * step.prefill_pairs_local
    if apart is True:
        return (decode / machine.attention_decode_flops + prefill / machine.attention_prefill_flops) / machine.tp
    with np.errstate(divide="ignore", invalid="ignore"):
        seconds = (decode / machine.attention_decode_flops + prefill / machine.attention_prefill_flops) / machine.tp
    return np.where(apart, seconds, 0.0)


def priced_bytes(cost: CostModel, machine: Machine, step: StepBatch, moe_group=1.0, moe_busy=None):
    """A step's bytes weighted by the engine's kernel rates: what `Machine.bandwidth_Bps` must stream in the step's
    time (`step_bytes`, with the routed experts' bytes at `Machine.moe_bytes_factor` times their count; without the
    KV cache's where attention is a kernel of its own, whose measured rate includes its reads)."""
    bytes_read = step_bytes(cost, step, moe_group, moe_busy)
    apart = attention_apart(machine)
    if apart is not False:
        bytes_read = bytes_read - _where(apart, step_kv_bytes(cost, step), 0.0)
    factor = machine.moe_bytes_factor
    if _scalar(factor) and factor == 1.0:
        return bytes_read
    tokens = step.decode_sequences + step.prefill_tokens
    busy = moe_group if moe_busy is None else moe_busy
    # the MoE layers see every busy replica's tokens
    factor = _where(tokens * busy >= machine.moe_bytes_tokens, factor, 1.0)
    return bytes_read + (factor - 1.0) * experts_read_bytes(cost, tokens, moe_group, moe_busy)


def experts_read_bytes(cost: CostModel, tokens, moe_group=1.0, moe_busy=None):
    """The routed experts' part of `weights_read_bytes`."""
    busy = moe_group if moe_busy is None else moe_busy
    return expected_experts_read(cost.n_experts, cost.experts_per_token, tokens * busy) / moe_group * cost.expert_bytes


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


def priced_flops(cost: CostModel, machine: Machine, step: StepBatch, expert_share=1.0):
    """A step's FLOPs weighted by the engine's kernel rates: what `Machine.flops` must execute in the step's time.

    ``expert_share``: the routed experts' FLOPs this replica's devices compute, as a multiple of its own tokens'
    (under expert parallelism they compute their share of every busy replica's tokens: busy / dp)."""
    tokens = step.decode_sequences + step.prefill_tokens
    gemm = gemm_factor(machine, tokens)
    attention = step_attention_flops(cost, step) / machine.attention_factor
    apart = attention_apart(machine)
    if apart is not False:  # priced by `attention_kernel_seconds` instead
        attention = _where(apart, 0.0, attention)
    priced = step_matmul_flops(cost, step) / gemm + attention
    moe = machine.moe_factor
    expert = tokens * cost.expert_matmul_flops_per_token  # each token multiplies its k experts once
    if _scalar(expert) and expert == 0.0:
        return priced  # a dense model
    # the experts meet every busy replica's tokens: expert_share · moe_group of this replica's
    rate = expert_rate(cost, machine, tokens * expert_share * moe_group(machine))
    return priced + expert * expert_share / rate - expert / gemm


def expert_rate(cost: CostModel, machine: Machine, meeting_tokens):
    """The routed experts' GEMM rate relative to `Machine.flops` when ``meeting_tokens`` tokens meet in a MoE layer:
    the engine's fused-MoE rate (`Machine.moe_factor`), or where it has none (NaN) its GEMM curve at the tokens each
    busy expert multiplies (`expert_gemm_tokens`)."""
    moe = machine.moe_factor
    if _scalar(moe) and not math.isnan(moe):
        return moe
    per_expert = gemm_factor(machine, expert_gemm_tokens(cost, meeting_tokens))
    if _scalar(moe):
        return per_expert
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(moe), per_expert, moe)


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


_LOG2_TP, _TP_LATENCY_S = (np.log2([size for size, _ in ALLREDUCE_LATENCY_BY_TP]),
                           np.array([latency for _, latency in ALLREDUCE_LATENCY_BY_TP]))


@functools.lru_cache(maxsize=64)
def _allreduce_latency_scalar_s(tp: float) -> float:
    return float(np.interp(math.log2(tp), _LOG2_TP, _TP_LATENCY_S)) if tp > 1 else 0.0


def allreduce_latency_s(tp):
    """The fixed cost of one small all-reduce over ``tp`` devices (`ALLREDUCE_LATENCY_BY_TP`; 0 for one device)."""
    if _scalar(tp):
        return _allreduce_latency_scalar_s(float(tp))  # the simulator asks once a step with the same tp
    tp = np.asarray(tp, dtype=float)
    return np.where(tp > 1, np.interp(np.log2(np.maximum(tp, 1.0)), _LOG2_TP, _TP_LATENCY_S), 0.0)


def allreduce_seconds(cost: CostModel, machine: Machine, tokens):
    """Tensor-parallel communication per step: ring all-reduces of the activations, 2 per layer (under expert
    parallelism an MoE layer's second one is its all-to-alls instead, `alltoall_seconds`)."""
    tp = machine.tp
    count = cost.allreduces_per_step - _where(machine.ep > 1, cost.moe_layers, 0.0)
    if _scalar(tp):
        if tp <= 1:
            return 0.0
        if _scalar(machine.link_Bps) and _scalar(tokens):
            link = machine.link_Bps if math.isfinite(machine.link_Bps) else math.inf
            ring = 2.0 * (tp - 1.0) / tp * tokens * cost.allreduce_bytes_per_token
            return count * (ring / link + allreduce_latency_s(tp))
    tp = np.asarray(machine.tp, dtype=float)
    ring = 2.0 * (tp - 1.0) / np.maximum(tp, 1.0) * tokens * cost.allreduce_bytes_per_token
    link = np.where(np.isfinite(machine.link_Bps), machine.link_Bps, np.inf)
    per_allreduce = ring / link + allreduce_latency_s(tp)
    return np.where(tp > 1, count * per_allreduce, 0.0)


def alltoall_seconds(cost: CostModel, machine: Machine, tokens):
    """Expert-parallel communication per step of one replica's ``tokens``: dispatch and combine in every MoE layer.

    The replica's tp devices share its tokens; each sends every token's hidden vector to its k experts' devices,
    (ep − 1)/ep of them remote, over its own link.
    """
    ep = machine.ep
    if _scalar(ep) and ep <= 1:
        return 0.0
    per_device = tokens / machine.tp * cost.experts_per_token * cost.allreduce_bytes_per_token * (ep - 1.0) / ep
    return _where(ep > 1, 2.0 * cost.moe_layers * (per_device / _link(machine) + SEND_LATENCY_S), 0.0)


def pipeline_send_seconds(cost: CostModel, machine: Machine, tokens):
    """Pipeline-parallel communication of one micro-batch of ``tokens``: its activations cross pp − 1 stage boundaries."""
    pp = machine.pp
    if _scalar(pp) and pp <= 1:
        return 0.0
    per_send = tokens * cost.allreduce_bytes_per_token / _link(machine) + SEND_LATENCY_S
    return _where(pp > 1, (pp - 1.0) * per_send, 0.0)


def _link(machine: Machine):
    """The device-to-device bandwidth; unknown (NaN) prices only the latency, as the all-reduce does."""
    link = machine.link_Bps
    if _scalar(link):
        return link if math.isfinite(link) else math.inf
    return np.where(np.isfinite(link), link, np.inf)


def _where(condition, a, b):
    if isinstance(condition, (bool, np.bool_)):
        return a if condition else b
    return np.where(condition, a, b)


def moe_group(machine: Machine):
    """Replicas whose tokens meet in the MoE layers: all dp of them under expert parallelism, else each its own."""
    return _where(machine.ep > 1, machine.dp, 1.0)


def moe_busy(machine: Machine, sequences):
    """Of the `moe_group`, the replicas that bring tokens to a step of ``sequences`` sequences (`busy_replicas`)."""
    return _where(machine.ep > 1, busy_replicas(machine, sequences), 1.0)


def pipeline_imbalance(cost: CostModel, machine: Machine):
    """The largest stage's layers × pp ÷ layers (1 when pp divides the layers, or the layer count is unknown)."""
    layers, pp = cost.layers, machine.pp
    if _scalar(layers) and _scalar(pp):
        return math.ceil(layers / pp) * pp / layers if layers > 0 else 1.0
    layers = np.asarray(layers, dtype=float)
    known = layers > 0
    safe = np.where(known, layers, 1.0)
    return np.where(known, np.ceil(safe / pp) * pp / safe, 1.0)


def busy_replicas(machine: Machine, sequences):
    """Data-parallel replicas with work: all dp of them, or one per sequence when there are fewer (at least 1)."""
    if _scalar(sequences) and _scalar(machine.dp):
        return min(max(sequences, 1.0), machine.dp)
    return np.clip(sequences, 1.0, machine.dp)


def micro_batches(machine: Machine, sequences):
    """Micro-batches one replica's step is split into: one per pipeline stage, at most one per sequence, at least 1."""
    per_replica = sequences / busy_replicas(machine, sequences)
    if _scalar(per_replica) and _scalar(machine.pp):
        return min(max(per_replica, 1.0), machine.pp)
    return np.clip(per_replica, 1.0, machine.pp)


def micro_step(machine: Machine, step: StepBatch) -> tuple[StepBatch, float | np.ndarray]:
    """(the micro-batch one replica's pipeline runs at a time, micro-batches per replica): the step's running sums
    spread evenly over the busy replicas and their micro-batches."""
    count = micro_batches(machine, step.sequences)
    share = busy_replicas(machine, step.sequences) * count
    if _scalar(share) and share == 1:
        return step, count
    return StepBatch(*(value / share for value in step)), count


def roofline_seconds(bytes_read, flops, machine: Machine):
    """(memory time, compute time) of a step spread over ``tp`` devices; compute is 0 when FLOPs are unknown."""
    memory_s = bytes_read / (machine.tp * machine.bandwidth_Bps)
    rate = machine.flops
    if _scalar(rate):  # scalar fast path (one estimate, one simulated step)
        return memory_s, (flops / (machine.tp * rate) if math.isfinite(rate) else 0.0 * flops)
    compute_s = np.where(np.isfinite(machine.flops), flops / (machine.tp * np.where(np.isfinite(machine.flops), machine.flops, 1.0)), 0.0)
    return memory_s, compute_s


def dequantize_seconds(machine: Machine, tokens):
    """The weight conversion a step of ``tokens`` tokens runs before its GEMMs (`Machine.dequantize_s`), else 0."""
    if _scalar(tokens) and _scalar(machine.dequantize_tokens):
        return machine.dequantize_s if tokens > machine.dequantize_tokens else 0.0
    return np.where(np.asarray(tokens) > machine.dequantize_tokens, machine.dequantize_s, 0.0)


def stream_compute_seconds(memory_s, compute_s, overlap=1.0):
    """The time of a step's stream and arithmetic together: the larger of the two, plus the part of the smaller that
    does not overlap it (``overlap`` 1: the roofline's max; 0: their sum)."""
    if _scalar(memory_s) and _scalar(compute_s) and _scalar(overlap):
        longer, shorter = (memory_s, compute_s) if memory_s >= compute_s else (compute_s, memory_s)
        return longer if overlap == 1 else longer + (1.0 - overlap) * shorter
    return np.maximum(memory_s, compute_s) + (1.0 - np.asarray(overlap)) * np.minimum(memory_s, compute_s)


def step_time(bytes_read, flops, machine: Machine, comm_s=0.0, sequences=0.0, tokens=0.0, kernel_s=0.0):
    """Wall time of a step of ``tokens`` tokens that reads ``bytes_read`` and computes ``flops`` (whole step, all tp
    devices), plus ``kernel_s`` of kernels priced apart from the roofline (`attention_kernel_seconds`)."""
    memory_s, compute_s = roofline_seconds(bytes_read, flops, machine)
    roof_s = stream_compute_seconds(memory_s, compute_s, machine.stream_compute_overlap)
    return (roof_s + machine.step_overhead_s + machine.sequence_overhead_s * sequences + comm_s
            + dequantize_seconds(machine, tokens) + kernel_s)


def step_seconds(cost: CostModel, machine: Machine, step: StepBatch):
    """Wall time of one engine step with a mixed batch of decode sequences and prefill chunks (on all the devices):
    in a pipeline, the steady cycle in which every sequence advances once."""
    if _scalar(machine.pp) and _scalar(machine.dp) and _scalar(machine.ep) and machine.pp == machine.dp == machine.ep == 1:
        # one replica, one stage, no expert parallelism: the same price without the pipeline bookkeeping (the
        # simulator calls this once per step; tests check it equals the general path)
        tokens = step.decode_sequences + step.prefill_tokens
        return step_time(priced_bytes(cost, machine, step), priced_flops(cost, machine, step), machine,
                         allreduce_seconds(cost, machine, tokens), step.decode_sequences + step.prefill_sequences, tokens,
                         attention_kernel_seconds(cost, machine, step))
    micro_s, send_s, count = micro_step_seconds(cost, machine, step)
    return pipeline_cycle_seconds(cost, machine, micro_s, send_s, count)


def lockstep_step_seconds(cost: CostModel, machine: Machine, steps) -> float:
    """Wall time of one step of ``machine.dp`` replicas that share their routed experts (``ep`` > 1) and so step
    together, each running its own batch: ``steps``, one `StepBatch` per replica with work (scalars; pp = 1).

    A lockstep step lasts as long as its slowest replica's. Each replica is priced as `step_seconds` prices one
    replica's share of a symmetric step, except that its share of the routed experts comes from every replica's
    tokens: the experts read are the expected union over all the tokens, 1/dp of them per replica, and the experts'
    FLOPs are all the tokens' over dp replicas, at the rate of a GEMM over the tokens each busy expert multiplies
    (`expert_gemm_tokens` of all the tokens) where the engine has no fused-MoE rate (its own batch prices its
    attention, dense weights, KV and communication). With every working replica running the same
    batch this is exactly `step_seconds` of the whole group. A replica without work waits the step out (its empty
    forward, which joins the MoE collectives, is never the slowest)."""
    dp = float(machine.dp)
    if not steps:
        raise ValueError("a lockstep step needs at least one replica with work")
    group_tokens = 0.0
    for step in steps:
        group_tokens += step.decode_sequences + step.prefill_tokens
    per_replica = group_tokens / dp  # the experts' tokens each replica's devices multiply
    factor = machine.moe_bytes_factor if group_tokens >= machine.moe_bytes_tokens else 1.0
    group_expert_bytes = experts_read_bytes(cost, group_tokens, dp, 1.0)
    group_expert_flops = per_replica * cost.expert_matmul_flops_per_token / expert_rate(cost, machine, group_tokens)
    slowest = 0.0
    for step in steps:
        tokens = step.decode_sequences + step.prefill_tokens
        own_expert_bytes = experts_read_bytes(cost, tokens)
        # what priced_flops (expert_share 1) put in for this replica's own experts, taken out again
        own_expert_flops = (tokens * cost.expert_matmul_flops_per_token
                            / expert_rate(cost, machine, tokens * moe_group(machine)))
        bytes_read = step_bytes(cost, step) - own_expert_bytes + factor * group_expert_bytes
        if attention_apart(machine):  # its KV reads are the attention kernel's (`attention_kernel_seconds`)
            bytes_read -= step_kv_bytes(cost, step)
        flops = priced_flops(cost, machine, step) - own_expert_flops + group_expert_flops
        comm_s = allreduce_seconds(cost, machine, tokens) + alltoall_seconds(cost, machine, tokens)
        slowest = max(slowest, step_time(bytes_read, flops, machine, comm_s, step.sequences, tokens,
                                         attention_kernel_seconds(cost, machine, step)))
    return slowest


def micro_step_seconds(cost: CostModel, machine: Machine, step: StepBatch):
    """(one micro-batch through the whole model, its stage sends, micro-batches per replica) for ``step``."""
    micro, count = micro_step(machine, step)
    tokens = micro.decode_sequences + micro.prefill_tokens
    comm_s = allreduce_seconds(cost, machine, tokens) + alltoall_seconds(cost, machine, tokens)
    bytes_read, flops = _replica_work(cost, machine, micro, step.sequences)
    micro_s = step_time(bytes_read, flops, machine, comm_s, micro.decode_sequences + micro.prefill_sequences, tokens,
                        attention_kernel_seconds(cost, machine, micro))
    return micro_s, pipeline_send_seconds(cost, machine, tokens), count


def pipeline_cycle_seconds(cost: CostModel, machine: Machine, micro_s, send_s, count):
    """The pipeline's cycle: one micro-batch through every stage and send (``micro_s`` + ``send_s``), or, when
    that is shorter, ``count`` micro-batches through the largest stage; both ``micro_s`` when pp = 1."""
    through = micro_s + send_s
    largest = count * pipeline_imbalance(cost, machine) * micro_s / machine.pp
    if _scalar(through) and _scalar(largest):
        return max(through, largest)
    return np.maximum(through, largest)


def step_roofline(cost: CostModel, machine: Machine, step: StepBatch):
    """(memory time, compute time) of the micro-batch one replica's pipeline runs for ``step`` (the whole step
    when pp = dp = 1): which roof binds."""
    micro, _ = micro_step(machine, step)
    return roofline_seconds(*_replica_work(cost, machine, micro, step.sequences), machine)


def _replica_work(cost: CostModel, machine: Machine, micro: StepBatch, sequences):
    """(bytes read, priced FLOPs) of one busy replica's micro-batch in a step of ``sequences`` sequences: under expert
    parallelism its devices read and compute their 1/dp share of the experts all the busy replicas' tokens touch."""
    group, busy = moe_group(machine), moe_busy(machine, sequences)
    return priced_bytes(cost, machine, micro, group, busy), priced_flops(cost, machine, micro, busy / group)


def parallel_step_work(cost: CostModel, machine: Machine, step: StepBatch):
    """(bytes read, FLOPs) of ``step`` summed over all replicas and micro-batches (`step_bytes`, `step_flops`
    when pp = dp = 1)."""
    micro, count = micro_step(machine, step)
    share = busy_replicas(machine, step.sequences) * count
    bytes_read = step_bytes(cost, micro, moe_group(machine), moe_busy(machine, step.sequences))
    return bytes_read * share, step_flops(cost, micro) * share


def decode_step_seconds(cost: CostModel, machine: Machine, batch, context):
    """Wall time of one decode step for ``batch`` sequences at ``context`` tokens each."""
    return step_seconds(cost, machine, decode_batch(cost, batch, context))


def mean_decode_step_seconds(cost: CostModel, machine: Machine, batch, context_start, context_end):
    """Mean decode step time while the context grows from ``context_start`` to ``context_end``.

    The step time is piecewise linear in the context (kinks where a sliding window fills and where
    the step turns from memory- to compute-bound), so the trapezoid rule over those breakpoints is
    the exact mean, at the cost of six evaluations instead of one per generated token. (A pipeline split unevenly
    adds one kink, where its largest stage starts to set the cycle; the trapezoid is within 1e-6 of the mean there.)
    """
    start = np.asarray(context_start, dtype=float)
    end = np.maximum(np.asarray(context_end, dtype=float), start)
    knee = np.clip(cost.window, start, end)

    def gap(context):  # memory minus compute time: linear on each side of the window knee
        memory_s, compute_s = step_roofline(cost, machine, decode_batch(cost, batch, context))
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
    bytes_read, flops = parallel_step_work(cost, machine, decode_batch(cost, batch, mid))
    memory_s, compute_s = step_roofline(cost, machine, decode_batch(cost, batch, mid))
    compute_bound = compute_s > memory_s if _scalar(memory_s) and _scalar(compute_s) else np.asarray(compute_s) > np.asarray(memory_s)
    return ReplyDecode(mean_decode_step_seconds(cost, machine, batch, prompt, prompt + output), bytes_read, flops, compute_bound)


def prefill_seconds(cost: CostModel, machine: Machine, batch, prompt):
    """Time to prefill ``batch`` prompts of ``prompt`` tokens in one pass (the TTFT every one of them sees).

    In a pipeline that starts empty the last micro-batch enters a stage after the others, so it finishes one
    largest-stage time per earlier micro-batch after the first (GPipe's fill: (m + pp − 1) stage times).
    """
    micro_s, send_s, count = micro_step_seconds(cost, machine, prefill_batch(cost, batch, prompt))
    fill_s = (count - 1) * pipeline_imbalance(cost, machine) * micro_s / machine.pp
    return micro_s + send_s + _where(count > 1, fill_s, 0.0)


# --------------------------------------------------------------------------------------------
# capacity and regime


def critical_batch(cost: CostModel, machine: Machine, context, max_batch: float = 1e7):
    """Smallest batch at which a decode step turns compute-bound at ``context`` (inf if it never does).

    Dense models have a closed form: weights/BW = B · (flops/F − per-sequence bytes/BW) for the micro-batch B one
    replica's pipeline runs, dp · pp of them in the whole batch. MoE models, whose weights read grow with the batch,
    are solved by a vectorized bisection in log space.
    """

    def compute_bound(batch):
        memory_s, compute_s = step_roofline(cost, machine, decode_batch(cost, batch, context))
        return compute_s >= memory_s

    shape = np.broadcast(*(np.asarray(v) for v in (*cost, *machine, context))).shape
    memory_per_sequence, compute_per_sequence = roofline_seconds(
        _where(attention_apart(machine), 0.0, kv_bytes_per_sequence(cost, context)) + cost.activation_bytes_per_token
        + cost.embedding_row_bytes,
        priced_flops(cost, machine, decode_batch(cost, 1.0, context)),
        machine,
    )
    fixed_s, _ = roofline_seconds(cost.head_bytes + cost.dense_bytes, 0.0, machine)
    slope = compute_per_sequence - memory_per_sequence
    with np.errstate(divide="ignore", invalid="ignore"):
        micro = np.maximum(np.ceil(fixed_s / np.where(slope > 0, slope, 1.0)), 1.0)
        closed = np.where(slope > 0, micro * machine.dp * machine.pp, np.inf)
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
    """Memory for weights and KV cache on one stage of one replica: its tp devices."""
    return machine.memory_bytes * machine.tp * USABLE_MEMORY_FRACTION


def stage_weight_bytes(cost: CostModel, machine: Machine):
    """Weight bytes the largest pipeline stage of one replica holds over its tp devices: its share of the layers,
    and under expert parallelism only its 1/dp share of the routed experts (the rest live on the other replicas)."""
    experts = cost.n_experts * cost.expert_bytes
    weights = cost.total_weight_bytes - experts * (1.0 - 1.0 / moe_group(machine))
    return weights * pipeline_imbalance(cost, machine) / machine.pp


def stage_kv_bytes(cost: CostModel, machine: Machine, batch, context):
    """KV-cache bytes the largest pipeline stage of the fullest replica holds: its layers' share of ⌈batch / dp⌉
    sequences."""
    share = math.ceil(batch / machine.dp) if _scalar(batch) and _scalar(machine.dp) else np.ceil(batch / machine.dp)
    return kv_cache_bytes(cost, share, context) * pipeline_imbalance(cost, machine) / machine.pp


def resident_bytes(cost: CostModel, machine: Machine, batch, context):
    """Weights and KV cache on all the devices together: every replica's weights (the routed experts once under
    expert parallelism) and every sequence's KV cache."""
    experts = cost.n_experts * cost.expert_bytes
    weights = (cost.total_weight_bytes - experts * (1.0 - 1.0 / moe_group(machine))) * machine.dp
    return weights + kv_cache_bytes(cost, batch, context)


def memory_fits(cost: CostModel, machine: Machine, batch, context):
    """The fullest stage's weights and KV cache fit its devices' usable memory (False when capacity is unknown)."""
    return stage_weight_bytes(cost, machine) + stage_kv_bytes(cost, machine, batch, context) <= usable_memory_bytes(machine)


def max_batch_that_fits(cost: CostModel, machine: Machine, context):
    """Most sequences of ``context`` tokens whose KV cache fits beside the weights (0 if the weights don't),
    over all replicas."""
    free = usable_memory_bytes(machine) - stage_weight_bytes(cost, machine)
    per_sequence = kv_bytes_per_sequence(cost, context) * pipeline_imbalance(cost, machine) / machine.pp
    with np.errstate(divide="ignore", invalid="ignore"):
        count = np.floor(free / per_sequence) * machine.dp
    return np.where(free <= 0, 0.0, np.where(per_sequence > 0, count, np.inf))
