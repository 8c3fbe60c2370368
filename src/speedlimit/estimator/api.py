"""`estimate()`: resolve what the user typed, run the roofline core once, return an `Estimate`.

This is the single source of truth that the CLI, the web API, bench's ``--compare-estimate`` and
verify's predictions all call; its ``to_dict()`` is exactly what ``speedlimit estimate --json`` prints.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
from speedlimit.architecture import Architecture
from speedlimit.artifacts import Artifact
from speedlimit.catalog import default_efficiency, resolve_hardware, resolve_model
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.hardware import Efficiency, Hardware
from speedlimit.precision import Precision, parse_precision

# Safety bounds that turn absurd input into an error rather than a silly number.
MAX_BATCH = 10_000_000
MAX_TOKENS = 100_000_000
MAX_TP = 4096
# The peak-FLOPs columns a matmul can run at (hardware.toml `flops` keys).
COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4", "int4")


class Estimate(Artifact):
    """Everything `estimate()` predicts for one configuration (seconds, bytes, FLOPs, tokens/s)."""

    KIND: ClassVar[str] = "estimate"

    model: str
    hardware: str
    weights: str
    weight_bits: float
    kv: str
    mode: Literal["ideal", "full"]
    batch: int
    prompt: int
    output: int
    tp: int
    # speed
    decode_tok_s: float  # per user
    itl_s: float  # inter-token latency, mean over the reply
    ttft_s: float | None  # None when the hardware has no FLOPs figure in ideal mode
    reply_s: float  # time to stream `output` tokens at ITL (the seed's "time for a 1,000-token reply")
    e2e_s: float | None  # TTFT + (output − 1) · ITL
    throughput_tok_s: float  # aggregate decode tokens/s across the batch
    # work per step
    bytes_per_token: float  # bytes streamed per generated token (step bytes ÷ batch)
    flops_per_token: float
    arithmetic_intensity: float  # FLOPs per byte of a decode step
    regime: Literal["memory", "compute"]
    critical_batch: float | None  # batch where decode turns compute-bound (None: never)
    # memory
    total_params: float
    active_params: float
    weights_bytes: float
    kv_bytes_per_token: float  # per context token of one sequence
    kv_cache_bytes: float  # whole batch at prompt + output tokens
    memory_bytes: float  # weights + KV cache
    memory_capacity_bytes: float | None  # usable across all tp devices
    fits: bool | None
    max_batch: float | None  # at prompt + output tokens (None: capacity unknown)
    # parallelism and cost
    tp_comm_s: float  # all-reduce time per decode step
    usd_per_million_tokens: float | None
    # what the estimate assumed
    bandwidth_Bps: float  # peak per device
    flops: float | None  # peak per device at the compute dtype
    bw_efficiency: float
    flops_efficiency: float
    step_overhead_s: float
    kernels_per_step: float  # kernels one decode step launches (what the default overhead is charged on)
    efficiency_basis: str


def _check_count(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpeedlimitError(f"--{name} must be a whole number, got {value!r}")
    if not math.isfinite(value) or value != int(value):
        raise SpeedlimitError(f"--{name} must be a whole number, got {value!r}")
    if not low <= value <= high:
        raise SpeedlimitError(f"--{name} must be between {low} and {high:,}, got {value:,}")
    return int(value)


def _check_fraction(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or not 0 < value <= 1:
        raise SpeedlimitError(f"--{name} must be a fraction in (0, 1], got {value}")
    return value


def cost_model(arch: Architecture, weights: Precision | None, kv: Precision) -> tuple[core.CostModel, float]:
    """The byte/FLOP coefficients of a model at a precision, and its weight bits per parameter."""
    exact = arch.weight_bytes if weights is None else None
    if weights is None and exact is None:
        weights = parse_precision("bf16")
    if exact is not None:
        embedding, head, dense, expert = exact.embedding, exact.lm_head or exact.embedding, exact.dense, exact.expert
        total = exact.embedding + exact.lm_head + exact.dense + arch.n_experts * exact.expert
        bits = 8.0 * total / max(arch.total_params, 1.0)
    else:
        b = weights.bytes_per_element
        embedding, head, dense, expert = arch.embedding_params * b, arch.head_params * b, arch.dense_params * b, arch.expert_params * b
        total = arch.total_params * b
        bits = weights.bits
    row_bytes = embedding / arch.vocab_size if arch.vocab_size else 0.0
    kv_b = kv.bytes_per_element
    cost = core.CostModel(
        head_bytes=head,
        dense_bytes=dense,
        expert_bytes=expert,
        n_experts=float(arch.n_experts),
        experts_per_token=float(arch.experts_per_token),
        embedding_row_bytes=row_bytes,
        total_weight_bytes=total,
        matmul_flops_per_token=2.0 * arch.matmul_params_per_token,
        kv_bytes_per_token_global=arch.kv_elements_per_token_global * kv_b,
        kv_bytes_per_token_local=arch.kv_elements_per_token_local * kv_b,
        window=float(arch.sliding_window) if arch.sliding_window else math.inf,
        attn_flops_per_ctx_global=arch.attn_flops_per_ctx_global,
        attn_flops_per_ctx_local=arch.attn_flops_per_ctx_local,
        activation_bytes_per_token=float(core.ACTIVATION_VECTORS_PER_LAYER * arch.n_layers * arch.hidden_size * core.ACTIVATION_BYTES),
        allreduce_bytes_per_token=float(arch.hidden_size * core.ACTIVATION_BYTES),
        allreduces_per_step=float(2 * arch.n_layers),
    )
    return cost, bits


def ideal_cost_model(cost: core.CostModel, arch: Architecture) -> core.CostModel:
    """The seed formula: every weight byte once per step, 2 FLOPs per parameter, nothing else."""
    return cost._replace(
        head_bytes=0.0,
        dense_bytes=cost.total_weight_bytes,
        expert_bytes=0.0,
        n_experts=0.0,
        embedding_row_bytes=0.0,
        matmul_flops_per_token=2.0 * arch.total_params,
        kv_bytes_per_token_global=0.0,
        kv_bytes_per_token_local=0.0,
        attn_flops_per_ctx_global=0.0,
        attn_flops_per_ctx_local=0.0,
        activation_bytes_per_token=0.0,
        allreduces_per_step=0.0,
    )


def machine_for(hardware: Hardware, efficiency: Efficiency, compute_dtype: str, tp: int, ideal: bool) -> core.Machine:
    bw_eff, flops_eff, overhead = (1.0, 1.0, 0.0) if ideal else (efficiency.bw_efficiency, efficiency.flops_efficiency, efficiency.step_overhead_s)
    return core.Machine(
        bandwidth_Bps=hardware.memory_bandwidth_Bps * bw_eff,
        flops=hardware.peak_flops(compute_dtype) * flops_eff,
        step_overhead_s=overhead,
        memory_bytes=hardware.memory_bytes if hardware.memory_bytes else math.nan,
        link_Bps=hardware.interconnect_Bps if hardware.interconnect_Bps else math.nan,
        tp=float(tp),
    )


def _finite_or_none(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


class StepModel(NamedTuple):
    """A model on hardware, resolved and validated: what the step-cost core needs, plus names for reports."""

    arch: Architecture
    device: Hardware
    cost: core.CostModel
    machine: core.Machine
    efficiency: Efficiency
    weights_name: str
    weight_bits: float
    kv_name: str
    compute_dtype: str
    tp: int
    ideal: bool

    def kv_budget_bytes(self) -> float:
        """Memory left for KV caches beside the weights, across the tp devices (inf: capacity unknown)."""
        free = float(core.usable_memory_bytes(self.machine) - self.cost.total_weight_bytes)
        return free if math.isfinite(free) else math.inf


def step_model(
    model: str | Architecture,
    hardware: str | Hardware,
    *,
    weights: str | float | None = None,
    kv: str | float = "fp16",
    compute: str | None = None,
    tp: int = 1,
    ideal: bool = False,
    bw_efficiency: float | None = None,
    flops_efficiency: float | None = None,
    step_overhead_s: float | None = None,
) -> StepModel:
    """Resolve a model and hardware (names, paths, sizes or objects) into the step-cost core's inputs."""
    arch = model if isinstance(model, Architecture) else resolve_model(model)
    device = hardware if isinstance(hardware, Hardware) else resolve_hardware(hardware)
    tp = _check_count("tp", tp, 1, MAX_TP)
    weight_precision = parse_precision(weights, what="weights") if weights is not None else None
    kv_precision = parse_precision(kv, what="kv")
    defaults = default_efficiency(device)
    if step_overhead_s is not None and (not math.isfinite(step_overhead_s) or not 0 <= step_overhead_s <= 1):
        raise SpeedlimitError(f"--step-overhead must be between 0 and 1 second, got {step_overhead_s}")
    efficiency = Efficiency(
        bw_efficiency=_check_fraction("bw-efficiency", bw_efficiency) or defaults.bw_efficiency,
        flops_efficiency=_check_fraction("flops-efficiency", flops_efficiency) or defaults.flops_efficiency,
        # an explicit overhead is the whole per-step cost; otherwise fixed + per-kernel defaults
        step_overhead_s=defaults.overhead_s(arch.decode_kernels) if step_overhead_s is None else step_overhead_s,
        basis=defaults.basis if bw_efficiency is None and flops_efficiency is None and step_overhead_s is None else "overridden",
    )
    cost, bits = cost_model(arch, weight_precision, kv_precision)
    weights_name = weight_precision.name if weight_precision else (arch.weight_bytes.file_type if arch.weight_bytes else "bf16")
    compute_dtype = weight_precision.compute_dtype if weight_precision else "bf16"
    if compute is not None:
        compute_dtype = str(compute).strip().lower()
        if compute_dtype not in COMPUTE_DTYPES:
            raise SpeedlimitError(f"--compute must be one of {', '.join(COMPUTE_DTYPES)}, got {compute!r}")
    if ideal:
        cost = ideal_cost_model(cost, arch)
    machine = machine_for(device, efficiency, compute_dtype, tp, ideal)
    return StepModel(arch, device, cost, machine, efficiency, weights_name, bits, kv_precision.name, compute_dtype, tp, ideal)


def estimate(
    model: str | Architecture,
    hardware: str | Hardware,
    *,
    weights: str | float | None = None,
    kv: str | float = "fp16",
    compute: str | None = None,
    batch: int = 1,
    prompt: int = 512,
    output: int = 256,
    tp: int = 1,
    ideal: bool = False,
    bw_efficiency: float | None = None,
    flops_efficiency: float | None = None,
    step_overhead_s: float | None = None,
    usd_per_hour: float | None = None,
) -> Estimate:
    """Predict decode/prefill speed, latency, throughput and memory for one configuration.

    ``model``: catalog name, path to config.json or .gguf, bare size ("7B"), or an `Architecture`.
    ``hardware``: catalog name, calibrated profile name, or a `Hardware`. ``weights``: bits or a
    format name; None means the GGUF file's exact bytes, else bf16. ``compute``: the FLOPs column the
    matmuls run at (default: bf16, or fp8/fp32 for those weights). ``ideal``: the seed formula.
    """
    batch = _check_count("batch", batch, 1, MAX_BATCH)
    prompt = _check_count("prompt", prompt, 0, MAX_TOKENS)
    output = _check_count("output", output, 1, MAX_TOKENS)
    if usd_per_hour is not None and (not math.isfinite(usd_per_hour) or usd_per_hour < 0):
        raise SpeedlimitError(f"--usd-per-hour must be a non-negative number, got {usd_per_hour}")
    resolved = step_model(model, hardware, weights=weights, kv=kv, compute=compute, tp=tp, ideal=ideal,
                          bw_efficiency=bw_efficiency, flops_efficiency=flops_efficiency, step_overhead_s=step_overhead_s)
    arch, device, cost, machine, efficiency = resolved.arch, resolved.device, resolved.cost, resolved.machine, resolved.efficiency
    weights_name, bits, compute_dtype, tp = resolved.weights_name, resolved.weight_bits, resolved.compute_dtype, resolved.tp
    kv_name = resolved.kv_name

    end_context = prompt + output
    reply = core.reply_decode(cost, machine, batch, prompt, output)
    itl, step_bytes, step_flops = float(reply.itl_s), float(reply.step_bytes), float(reply.step_flops)
    mid_context = prompt + output / 2
    ttft = _finite_or_none(core.prefill_seconds(cost, machine, batch, prompt))
    if ideal and not math.isfinite(machine.flops):
        ttft = None
    kv_cache = float(core.kv_cache_bytes(cost, batch, end_context))
    weights_bytes = float(cost.total_weight_bytes)
    capacity = _finite_or_none(core.usable_memory_bytes(machine))
    throughput = batch / itl
    cost_per_m = None
    if usd_per_hour is not None:
        cost_per_m = usd_per_hour * tp / 3600.0 / throughput * 1e6
    return Estimate(
        model=arch.name,
        hardware=device.name,
        weights=weights_name,
        weight_bits=bits,
        kv=kv_name,
        mode="ideal" if ideal else "full",
        batch=batch,
        prompt=prompt,
        output=output,
        tp=tp,
        decode_tok_s=1.0 / itl,
        itl_s=itl,
        ttft_s=ttft,
        reply_s=output * itl,
        e2e_s=None if ttft is None else ttft + (output - 1) * itl,
        throughput_tok_s=throughput,
        bytes_per_token=step_bytes / batch,
        flops_per_token=step_flops / batch,
        arithmetic_intensity=step_flops / step_bytes,
        regime="compute" if reply.compute_bound else "memory",
        critical_batch=_finite_or_none(core.critical_batch(cost, machine, mid_context)),
        total_params=arch.total_params,
        active_params=arch.active_params,
        weights_bytes=weights_bytes,
        kv_bytes_per_token=float(core.kv_bytes_per_sequence(cost, 1.0)),
        kv_cache_bytes=kv_cache,
        memory_bytes=weights_bytes + kv_cache,
        memory_capacity_bytes=capacity,
        fits=None if capacity is None else weights_bytes + kv_cache <= capacity,
        max_batch=None if capacity is None else _finite_or_none(core.max_batch_that_fits(cost, machine, end_context)),
        tp_comm_s=float(core.allreduce_seconds(cost, machine, batch)),
        usd_per_million_tokens=cost_per_m,
        bandwidth_Bps=device.memory_bandwidth_Bps,
        flops=_finite_or_none(device.peak_flops(compute_dtype)),
        bw_efficiency=1.0 if ideal else efficiency.bw_efficiency,
        flops_efficiency=1.0 if ideal else efficiency.flops_efficiency,
        step_overhead_s=0.0 if ideal else efficiency.step_overhead_s,
        kernels_per_step=arch.decode_kernels,
        efficiency_basis="ideal: peak bandwidth and FLOPs, weights only" if ideal else efficiency.basis,
    )
