"""`estimate()`: resolve a `Scenario` (what the user asked), run the roofline core once, return an `Estimate`.

This is the single source of truth that the CLI, the web API, bench's ``--compare-estimate`` and
verify's predictions all call; its ``to_dict()`` is exactly what ``speedlimit estimate --json`` prints.
`resolve` turns a validated scenario into a `StepModel` (architecture, device, cost model, machine): what
anything pricing steps (estimate, sweep, the curves, the simulator) evaluates. On a CPU with a known layout the
machine's bandwidth and FLOP/s are what one process reaches with the scenario's threads and NUMA policy
(`bandwidth_reach`, over `core.cpu_bandwidth_limits`), and the estimate says which bound that was.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, NamedTuple

from speedlimit.architecture import Architecture
from speedlimit.artifacts import Artifact
from speedlimit.catalog import default_efficiency, engine_for_device, resolve_engine, resolve_hardware, resolve_model
from speedlimit.engine_profile import KERNEL_PREFILL_TOKENS, EngineProfile
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.hardware import Efficiency, Hardware, custom_hardware
from speedlimit.precision import (WEIGHT_GROUPS, Precision, WeightFormats, is_shipped, main_tensor_type, parse_precision,
                                  parse_weights)
from speedlimit.scenario import COMPUTE_DTYPES, MAX_BATCH, MAX_TOKENS, MAX_TP, Scenario, scenario_from

__all__ = ["COMPUTE_DTYPES", "MAX_BATCH", "MAX_TOKENS", "MAX_TP", "BandwidthReach", "Estimate", "StepModel",
           "bandwidth_reach", "estimate", "estimate_scenario", "resolve", "step_model"]


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
    pp: int = 1
    dp: int = 1
    ep: int = 1
    devices: int = 1  # tp · pp · dp
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
    kv_bytes_per_token: float  # per context token of one sequence, over its tp devices (`kv_replicas` copies)
    kv_cache_bytes: float  # whole batch at prompt + output tokens
    memory_bytes: float  # weights + KV cache on all the devices (every data-parallel replica's weights)
    memory_capacity_bytes: float | None  # usable across all the devices
    fits: bool | None
    max_batch: float | None  # at prompt + output tokens (None: capacity unknown)
    # parallelism and cost
    tp_comm_s: float  # all-reduce time per decode step (of one micro-batch)
    usd_per_million_tokens: float | None
    # what the estimate assumed
    bandwidth_Bps: float  # peak per device
    flops: float | None  # peak per device at the compute dtype
    bw_efficiency: float
    flops_efficiency: float
    step_overhead_s: float
    kernels_per_step: float  # kernels one decode step launches (what the default overhead is charged on)
    efficiency_basis: str
    engine: str = "llama-cpp"  # the serving-engine profile (catalog/engines.toml)
    # the GGUF tensor type whose measured llama.cpp CPU kernel rates priced the matmuls (None: a fraction of the
    # dtype's peak did; then flops_efficiency is that fraction, else the kernels' rate over the dtype's peak)
    cpu_kernels: str | None = None
    # the prefill kernel rate per thread at the busy cores, as a fraction of its measured rate (prefill_thread_scaling)
    prefill_thread_efficiency: float = 1.0
    # the routed experts priced at the kernels' 1-token rate in every step (the engine multiplies each routed row as a
    # matrix-vector product: engines.toml expert_matvec)
    experts_as_matvecs: bool = False
    # the routed experts' tensor type where its kernel rates price them apart from `cpu_kernels`' (MXFP4_MOE: mxfp4)
    cpu_expert_kernels: str | None = None
    # a profile calibrated on one GGUF tensor type (`Hardware.kernel_type`): that type, and these weights' matmul rate
    # relative to the calibrated FLOP/s at one token a step and at the prefill size (their kernel rates' ratio, fold C)
    calibrated_kernels: str | None = None
    calibrated_kernel_factors: list[float] | None = None
    sequence_overhead_s: float = 0.0  # the engine's cost per running sequence per step
    # 1: the step costs the larger of its stream and its arithmetic (the roofline); below 1, a calibrated profile found
    # they overlap only that far (0: they add)
    stream_compute_overlap: float = 1.0
    # of ttft_s: the pass that converts quantized weights to fp16 before the prefill's GEMMs (llama.cpp CUDA of early 2024)
    ttft_dequantize_s: float = 0.0
    # of the mid-reply decode step: its attention as a kernel of its own (llama.cpp's CPU flash attention at its
    # measured rate, engines.toml attention_rates); 0 where attention rides the roofline with the matmuls
    attention_kernel_s: float = 0.0
    # the fraction of the peak bandwidth the engine's fused-MoE kernel reads the routed experts at, in steps whose MoE
    # layers see at least moe_bandwidth_tokens tokens (None: the experts' bytes at bw_efficiency like the others)
    moe_bandwidth_efficiency: float | None = None
    moe_bandwidth_tokens: float | None = None
    # the bandwidth the estimate priced (before bw_efficiency) and why: a CPU's threads and NUMA policy
    reached_bandwidth_Bps: float | None = None  # what one process reaches (CPUs: <= bandwidth_Bps); None: the peak
    bandwidth_basis: str = ""
    threads: int | None = None  # CPU threads the estimate assumed (None: not a CPU with a known layout)
    numa: str | None = None  # llama.cpp's NUMA policy the estimate assumed
    # per device and beyond tensor parallelism
    weights_per_device_bytes: float = 0.0  # on the fullest device (the largest pipeline stage)
    memory_per_device_bytes: float = 0.0  # weights + KV cache on the fullest device
    ep_comm_s: float = 0.0  # all-to-all time per decode step (of one micro-batch)
    pp_comm_s: float = 0.0  # pipeline activation sends per decode step (of one micro-batch)


def group_params(arch: Architecture) -> dict[str, float]:
    """Parameters resident in memory per weight group (`speedlimit.precision.WEIGHT_GROUPS`); they sum to total_params.

    ``experts`` counts every routed expert; a tied LM head is the embedding table (``lm_head`` 0).
    """
    attention = min(arch.attention_params, arch.dense_params)
    return {"attention": attention, "dense": arch.dense_params - attention, "experts": arch.n_experts * arch.expert_params,
            "embeddings": arch.embedding_params, "lm_head": arch.lm_head_params}


def matmul_params_by_group(arch: Architecture) -> dict[str, float]:
    """Parameters multiplied per token per weight group (a tied head multiplies the embedding table)."""
    attention = min(arch.attention_params, arch.dense_params)
    return {"attention": attention, "dense": arch.dense_params - attention,
            "experts": arch.experts_per_token * arch.expert_params,
            "embeddings": 0.0 if arch.lm_head_params else arch.embedding_params, "lm_head": arch.lm_head_params}


def check_weight_groups(arch: Architecture, weights: WeightFormats) -> None:
    """A per-group spelling must name groups the model prices apart, and a tied head takes the embeddings' format."""
    if "attention" in weights.explicit and arch.attention_params <= 0:
        raise SpeedlimitError(f"{arch.name}'s weights are not split into attention and the rest (a bare size, or a "
                              "file without attention tensors): set dense= instead of attention=")
    if "lm_head" in weights.explicit and arch.tied_embeddings and weights["lm_head"] != weights["embeddings"]:
        raise SpeedlimitError(f"{arch.name} ties its LM head to the embedding table: set embeddings= instead of lm_head=")


#: Bytes per element of the token-embedding table and the LM head when a whole model is in an fp8 format: the
#: engines' fp8 methods quantize linear layers and fused-MoE experts only, so the vocabulary tables keep the model's
#: 16-bit dtype (SGLang's and vLLM's Fp8Config.get_quant_method; benchmarks/accuracy/SOURCES.md, "Cited structure:
#: what an fp8 model keeps in 16 bits").
FP8_VOCABULARY_BYTES = 2.0


def vocabulary_bytes_per_element(weights: Precision) -> float:
    """Bytes per element of the embedding table and LM head of a model whose weights are all ``weights``."""
    return FP8_VOCABULARY_BYTES if weights.compute_dtype == "fp8" else weights.bytes_per_element


def cost_model(arch: Architecture, weights: Precision | WeightFormats | None, kv: Precision) -> tuple[core.CostModel, float]:
    """The byte/FLOP coefficients of a model at a precision, and its weight bits per parameter.

    ``weights``: one format, one per weight group (`WeightFormats`, summed per group even when they all agree: `resolve`
    passes one shared format as that format), or None (a GGUF file's exact bytes, else bf16).
    """
    exact = arch.weight_bytes if weights is None else None
    if weights is None and exact is None:
        weights = parse_precision("bf16")
    if exact is not None:
        embedding, head, dense, expert = exact.embedding, exact.lm_head or exact.embedding, exact.dense, exact.expert
        total = exact.embedding + exact.lm_head + exact.dense + arch.n_experts * exact.expert
        bits = 8.0 * total / max(arch.total_params, 1.0)
    elif isinstance(weights, WeightFormats):
        b = {group: weights[group].bytes_per_element for group in WEIGHT_GROUPS}
        params = group_params(arch)
        embedding, expert = arch.embedding_params * b["embeddings"], arch.expert_params * b["experts"]
        head = arch.lm_head_params * b["lm_head"] if arch.lm_head_params else embedding
        dense = params["attention"] * b["attention"] + params["dense"] * b["dense"]
        total = sum(params[group] * b[group] for group in WEIGHT_GROUPS)
        bits = 8.0 * total / max(arch.total_params, 1.0)
    else:
        b = weights.bytes_per_element
        vocab = vocabulary_bytes_per_element(weights)
        embedding, head, dense, expert = arch.embedding_params * vocab, arch.head_params * vocab, arch.dense_params * b, arch.expert_params * b
        total = arch.total_params * b + (arch.embedding_params + arch.lm_head_params) * (vocab - b)
        bits = 8.0 * total / max(arch.total_params, 1.0) if vocab != b else weights.bits
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
        head_flops_per_sequence=2.0 * arch.head_params,
        layers=float(arch.n_layers),
        moe_layers=float(arch.moe_layers),
        expert_matmul_flops_per_token=2.0 * arch.experts_per_token * arch.expert_params,
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
        head_flops_per_sequence=0.0,  # the seed formula: 2 FLOPs per parameter for every token
        expert_matmul_flops_per_token=0.0,
    )


def machine_for(hardware: Hardware, efficiency: Efficiency, compute_dtype: str, tp: int, ideal: bool, kernels: float = 0.0,
                peak_flops: float | None = None, reach: BandwidthReach | None = None, *, pp: int = 1, dp: int = 1,
                ep: int = 1) -> core.Machine:
    """The achievable rates of ``tp`` devices (per pipeline stage, ``pp`` stages, ``dp`` replicas, ``ep`` of them
    splitting the experts); a step launching ``kernels`` kernels costs `Efficiency.overhead_s`.

    ``peak_flops``: the matmuls' peak per device when it is not one dtype's (per-group weight formats).
    ``reach``: what one process reaches of a CPU's bandwidth and FLOPs (`bandwidth_reach`); ignored in ideal mode.
    """
    bw_eff, flops_eff, overhead = (1.0, 1.0, 0.0) if ideal else (efficiency.bw_efficiency, efficiency.flops_efficiency, efficiency.overhead_s(kernels))
    bandwidth, flops_share = hardware.memory_bandwidth_Bps, 1.0
    if reach is not None and not ideal:
        bandwidth, flops_share = reach.bandwidth_Bps, reach.core_fraction
    peak = hardware.peak_flops(compute_dtype) if peak_flops is None else peak_flops
    return core.Machine(
        bandwidth_Bps=bandwidth * bw_eff,
        flops=peak * flops_share * flops_eff,
        step_overhead_s=overhead,
        memory_bytes=hardware.memory_bytes if hardware.memory_bytes else math.nan,
        link_Bps=hardware.interconnect_Bps if hardware.interconnect_Bps else math.nan,
        tp=float(tp),
        pp=float(pp),
        dp=float(dp),
        ep=float(ep),
    )


class BandwidthReach(NamedTuple):
    """What one inference process reaches of a CPU machine (`core.cpu_bandwidth_limits`), and why, in words."""

    bandwidth_Bps: float  # peak-equivalent bandwidth, before bw_efficiency
    core_fraction: float  # of the machine's cores (and so of its peak FLOP/s) the threads run on
    threads: int
    numa: str
    basis: str


def bandwidth_reach(device: Hardware, threads: int | None = None, numa: str | None = None) -> BandwidthReach | None:
    """The bandwidth ``threads`` threads reach on ``device`` under llama.cpp's ``numa`` policy; None for a device
    without a CPU layout (GPUs, Apple SoCs, custom hardware: their peak stands).

    ``threads`` None: llama.cpp's default, every physical core of every socket (common_cpu_get_num_physical_cores
    counts the distinct thread-sibling sets of all CPUs). ``numa`` None: ``none`` (llama.cpp without --numa).
    """
    topology = device.topology
    if topology is None:
        if threads is not None or numa is not None:
            given = "--threads" if threads is not None else "--numa"
            why = (f"{device.name} is a {device.kind} device" if device.kind != "cpu" else
                   f"{device.name} has no core count (rerun `speedlimit verify` and `speedlimit calibrate` for a profile with one)")
            raise SpeedlimitError(f"{given} describes the threads of a CPU run, but {why}: leave it out")
        return None
    threads = topology.cores if threads is None else threads
    numa = numa or "none"
    limits = core.cpu_bandwidth_limits(device.memory_bandwidth_Bps, topology, threads, numa)
    reached = float(limits.reached_Bps)
    cores = int(float(limits.cores))
    return BandwidthReach(reached, cores / topology.cores, threads, numa,
                          _reach_basis(device, topology, limits, threads, numa, reached))


def _gbs(value: float) -> str:
    return f"{value / 1e9:,.4g} GB/s"


def _reach_basis(device: Hardware, topology: Any, limits: core.BandwidthLimits, threads: int, numa: str,
                 reached: float) -> str:
    cores = int(float(limits.cores))
    sockets = f"{topology.sockets} socket{'s' if topology.sockets > 1 else ''}"
    nodes = topology.sockets * topology.nodes_per_socket
    layout = sockets + (f" ({nodes} NUMA nodes)" if topology.nodes_per_socket > 1 else "")
    if nodes > 1:
        layout += f", numa {numa}"
    run = f"{threads} thread{'s' if threads != 1 else ''}" + (f" on {cores} cores" if cores != threads else "")
    memory = float(limits.memory_Bps)
    holding = int(float(limits.nodes))
    where = ("the machine's memory" if holding == nodes else "one NUMA node's memory" if holding == 1 else
             f"the memory of the {holding} NUMA nodes that have threads")
    bounds = {"threads": float(limits.threads_Bps), "memory": memory, "link": float(limits.link_Bps)}
    binding = min(bounds, key=lambda name: bounds[name])
    if binding == "threads":
        why = (f"bound by {cores} core{'s' if cores != 1 else ''} × {_gbs(topology.per_core_Bps)} per core, short of "
               f"{where} ({_gbs(memory)})")
    elif binding == "link":
        why = (f"bound by the socket link: each other socket reads its 1/{topology.sockets} of the weights through "
               f"{_gbs(topology.link_Bps)} per direction, short of {where} ({_gbs(memory)})")
    else:
        why = f"bound by {where}"
    if numa == "none" and nodes > 1:
        why += "; without --numa the weights sit on the one node whose thread loaded them"
    usable = topology.cores_per_socket // topology.nodes_per_socket if numa == "isolate" else topology.cores
    if not math.isfinite(topology.per_core_Bps) and threads < usable:
        why += "; no per-core bandwidth figure, so fewer threads are priced as fewer FLOP/s only"
    summed = "" if reached >= device.memory_bandwidth_Bps else f" of the {_gbs(device.memory_bandwidth_Bps)} summed peak"
    return f"{layout}: {run} reach{'es' if threads == 1 else ''} {_gbs(reached)}{summed}, {why}"


def _finite_or_none(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


class KernelRate(NamedTuple):
    """llama.cpp's CPU matmul kernels for one tensor type on one machine (`cpu_kernel_rate`)."""

    tensor_type: str
    peak_flops: float  # whole machine (every core at the busy cores' clock), the faster of the two kernels
    decode_factor: float  # decode kernel's rate / peak (one token per step)
    prefill_factor: float  # prefill kernel's rate / peak (KERNEL_PREFILL_TOKENS tokens per step)
    clock_hz: float
    basis: str
    prefill_thread_efficiency: float = 1.0  # what of the measured prefill rate per thread the busy cores keep
    # the routed experts' 1-token kernel's rate / peak: the type's own decode rate, or where a MoE file keeps its
    # experts in another type (MXFP4_MOE: experts mxfp4, the rest q8_0), that type's (`expert_type`)
    expert_factor: float = math.nan
    expert_type: str | None = None


class StepModel(NamedTuple):
    """A model on hardware, resolved and validated: what the step-cost core needs, plus names for reports."""

    arch: Architecture
    device: Hardware
    cost: core.CostModel
    machine: core.Machine
    efficiency: Efficiency  # achievable fractions, fixed and per-kernel overheads (ignored in ideal mode)
    weights_name: str
    weight_bits: float
    kv_name: str
    compute_dtype: str
    tp: int
    ideal: bool
    engine: EngineProfile | None = None  # the serving engine whose costs and scheduler the step model carries
    peak_flops: float = math.nan  # peak FLOP/s per device of the matmuls (at compute_dtype, or mixed per group)
    reach: BandwidthReach | None = None  # what one process reaches of a CPU machine (None: the device's peak)
    # llama.cpp's measured CPU kernel rate, where it prices the matmuls instead of `efficiency.flops_efficiency` x
    # `peak_flops` (which stay the kind's fraction of the dtype's peak: what a calibrated profile is relative to)
    kernel_rate: KernelRate | None = None
    kernels_per_step: float = 0.0  # kernels one decode step launches (`EngineProfile.decode_kernels`)
    # a calibrated CPU profile's FLOP/s carried to these weights (`calibrated_kernel_transfer`): (the calibrated type,
    # the 1-token factor, the prefill factor, these weights' type)
    kernel_transfer: tuple[str, float, float, str] | None = None

    @property
    def flops_efficiency(self) -> float:
        """The matmuls' priced rate as a fraction of `peak_flops`: at the faster CPU kernel (a 512-token prefill)
        where a kernel rate prices them, else the efficiency's (it can exceed 1: llama.cpp's int8 kernels outrun the
        bf16 peak the catalog prices dequantized weights at)."""
        if self.kernel_rate is not None and self.peak_flops > 0:
            return self.kernel_rate.peak_flops / self.peak_flops
        return self.efficiency.flops_efficiency

    @property
    def step_overhead_s(self) -> float:
        """Fixed cost of one decode step (per-step + per-kernel), as the machine charges it."""
        return float(self.machine.step_overhead_s)

    @property
    def devices(self) -> int:
        """Devices the deployment spans (tp · pp · dp)."""
        return int(self.machine.tp * self.machine.pp * self.machine.dp)

    def kv_budget_bytes(self) -> float:
        """Memory left for one replica's KV caches beside the weights, across its devices, in bytes of whole-model KV
        (each pipeline stage holds its layers' share; inf: capacity unknown)."""
        free = core.usable_memory_bytes(self.machine) - core.stage_weight_bytes(self.cost, self.machine)
        free = float(free * self.machine.pp / core.pipeline_imbalance(self.cost, self.machine))
        return free if math.isfinite(free) else math.inf


def _weights_compute_dtype(weights: Precision | WeightFormats | None) -> str | None:
    """The compute dtype every weight group shares (None: none given, or groups that differ)."""
    if weights is None:
        return None
    if isinstance(weights, WeightFormats):
        dtypes = {fmt.compute_dtype for fmt in weights.formats}
        return dtypes.pop() if len(dtypes) == 1 else None
    return weights.compute_dtype


def shipped_format(arch: Architecture) -> Precision | WeightFormats | None:
    """The format a checkpoint ships in (its config's quantization_config), where no file gives exact bytes; None:
    the file's bytes, or bf16."""
    if arch.weight_bytes is not None or not arch.shipped_weights:
        return None
    return parse_weights(arch.shipped_weights)


def chosen_weights(arch: Architecture, given: str | float | None) -> Precision | WeightFormats | None:
    """The weights a scenario prices: the format given, else (none given, or ``shipped``) the checkpoint's own."""
    return shipped_format(arch) if given is None or is_shipped(given) else parse_weights(given)


def weights_label(arch: Architecture, weights: Precision | WeightFormats | None) -> str:
    """The name a result gives its weights: the format's, else a .gguf file's type, else bf16."""
    return weights.name if weights else (arch.weight_bytes.file_type if arch.weight_bytes else "bf16")


def resolve(scenario: Scenario) -> StepModel:
    """Look up the model, hardware and engine a scenario names, check they go together, and build its cost model and machine."""
    arch = scenario.model if isinstance(scenario.model, Architecture) else resolve_model(scenario.model)
    device = _hardware(scenario)
    # a profile calibrated on a bench sweep names the engine it measured: its default engine
    engine = engine_for_device(resolve_engine(scenario.engine if scenario.engine is not None
                                              else getattr(device, "engine", None)), device)
    if device.kind not in engine.devices:
        raise SpeedlimitError(f"--engine {engine.key} runs on {', '.join(engine.devices)} devices, not on {device.name} "
                              f"({device.kind}); pick another engine (llama.cpp runs everywhere)")
    _check_tensor_parallel(arch, scenario.tp)
    _check_pipeline_parallel(arch, scenario.pp)
    _check_expert_parallel(arch, scenario.ep)
    weights = chosen_weights(arch, scenario.weights)
    if isinstance(weights, WeightFormats):
        check_weight_groups(arch, weights)
        # one format named per group is that format, unless the spelling names the vocabulary tables (an fp8 model
        # keeps them in 16 bits: `vocabulary_bytes_per_element`)
        if weights.uniform is not None and not weights.explicit & {"embeddings", "lm_head"}:
            weights = weights.uniform
    weights_dtype = _weights_compute_dtype(weights)
    kv = parse_precision(scenario.kv if scenario.kv is not None else engine.default_kv(weights_dtype), what="kv")
    efficiency, terms = engine_efficiency(scenario, device, engine, weights_dtype)
    cost, bits = cost_model(arch, weights, kv)
    replicas = kv_replicas(arch, scenario.tp)
    if replicas > 1:
        cost = cost._replace(kv_bytes_per_token_global=cost.kv_bytes_per_token_global * replicas,
                             kv_bytes_per_token_local=cost.kv_bytes_per_token_local * replicas)
    weights_name = weights_label(arch, weights)
    compute_dtype, peak_flops = compute_rate(arch, device, weights, scenario.compute)
    if not scenario.ideal and scenario.compute is None:
        compute_dtype, peak_flops = engine_gemm_rate(engine, device, weights, compute_dtype, peak_flops)
    if scenario.ideal:
        cost = ideal_cost_model(cost, arch)
    kernels = engine.decode_kernels(arch.decode_kernels, arch.decode_linears, weights_dtype)
    reach = None if scenario.ideal else bandwidth_reach(device, scenario.threads, scenario.numa)
    mix = file_matmul_mix(arch, weights)
    rate = None if scenario.ideal or scenario.compute is not None else cpu_kernel_rate(
        engine, device, kernel_types(arch, weights, engine), reach, scenario, mix)
    priced_efficiency, priced_peak = efficiency, peak_flops
    transfer = (None if rate is not None or scenario.ideal or scenario.compute is not None
                or scenario.flops_efficiency is not None
                or engine.kernel_rates is None or not engine.kernel_rates.value  # llama.cpp's CPU builds only
                else calibrated_kernel_transfer(device, arch, weights, mix))
    if transfer is not None:  # a calibrated CPU's fitted FLOP/s, carried to these weights' kernels
        terms.update(gemm_tokens_small=1.0, gemm_factor_small=transfer[0],
                     gemm_tokens_large=float(KERNEL_PREFILL_TOKENS), gemm_factor_large=transfer[1])
        if arch.n_experts and transfer[2] is not None:
            terms["moe_factor"] = transfer[2]
        efficiency = efficiency.model_copy(update={"basis": f"{efficiency.basis}; {transfer[3]}"})
    if rate is not None:  # the kernels' measured rate replaces the kind's fraction of the dtype's peak
        efficiency = efficiency.model_copy(update={"basis": f"{rate.basis}; {efficiency.basis}"})
        priced_efficiency, priced_peak = efficiency.model_copy(update={"flops_efficiency": 1.0}), rate.peak_flops
        terms.update(gemm_tokens_small=1.0, gemm_factor_small=rate.decode_factor,
                     gemm_tokens_large=float(KERNEL_PREFILL_TOKENS), gemm_factor_large=rate.prefill_factor)
        if arch.n_experts and engine.experts_as_matvecs:
            terms["moe_factor"] = rate.expert_factor  # each routed row a matrix-vector product
    # the build's flash-attention kernel timed apart (fold C), or the one a calibrated profile was fitted with
    attention = (cpu_attention_flops(engine, rate, reach, device) if rate is not None else
                 None if scenario.ideal or scenario.flops_efficiency is not None else
                 calibrated_attention_flops(device, reach))
    if attention is not None:
        terms.update(attention_decode_flops=attention[0], attention_prefill_flops=attention[1])
        efficiency = efficiency.model_copy(update={"basis": f"{efficiency.basis}; {attention[2]}"})
    if "attention_factor" in terms:
        # the profiles' attention efficiencies are FlashAttention's bf16/fp16 rates: attention runs on the bf16 peak
        # whatever the weights compute in (an fp8 model's GEMMs get twice that peak, its attention does not)
        bf16_peak = device.peak_flops("bf16")
        if math.isfinite(bf16_peak) and bf16_peak > 0 and math.isfinite(priced_peak) and priced_peak > 0:
            terms["attention_factor"] *= bf16_peak / priced_peak
    machine = machine_for(device, priced_efficiency, compute_dtype, scenario.tp, scenario.ideal, kernels, priced_peak,
                          reach, pp=scenario.pp, dp=scenario.dp, ep=scenario.ep)
    if not scenario.ideal:
        machine = machine._replace(**terms, **dequantize_terms(engine, cost, bits, machine))
    return StepModel(arch, device, cost, machine, efficiency, weights_name, bits, kv.name, compute_dtype, scenario.tp,
                     scenario.ideal, engine, peak_flops, reach, rate, kernels,
                     (device.kernel_type, transfer[0], transfer[1], transfer[4]) if transfer is not None else None)


# weights stored at fewer bits per parameter than this are a quantized type: the widest GGUF quantized type, q8_0,
# stores 8.5 bits, and a 16-bit float file averages within a few percent of 16 (its norms in f32, its size over a
# catalog parameter count)
QUANTIZED_BELOW_BITS = 12.0


def dequantize_terms(engine: EngineProfile, cost: core.CostModel, bits: float, machine: core.Machine) -> dict[str, float]:
    """`core.Machine`'s weight-conversion terms where ``engine`` converts quantized weights to fp16 before its GEMMs in
    large steps (`EngineProfile.dequantize_gemm_tokens`): one pass that reads the layers' quantized weights and writes
    them as fp16, at the achievable bandwidth, spread over the tp devices. The LM head is left out (a prefill computes
    one position's logits); every routed expert is counted (a large step touches them all). Nothing for 16-bit or
    wider weights, which are multiplied as stored: weights given only as bits per parameter (a file's size over its
    parameters, a little off 16 for an f16 file) count as quantized below `QUANTIZED_BELOW_BITS`."""
    tokens = engine.dequantize_gemm_tokens
    if tokens is None or not bits < QUANTIZED_BELOW_BITS:
        return {}
    stored = float(cost.dense_bytes + cost.n_experts * cost.expert_bytes)
    converted = stored * 16.0 / bits
    return {"dequantize_s": (stored + converted) / (machine.tp * machine.bandwidth_Bps),
            "dequantize_tokens": float(tokens.value)}


def kernel_types(arch: Architecture, weights: Precision | WeightFormats | None,
                 engine: EngineProfile) -> tuple[str, str] | None:
    """(the dense matmuls' GGUF tensor type, the routed experts') whose CPU kernel rates price these weights, or None.

    One format: its main tensor type for both (a .gguf file's own: the type its matmul tensors mostly hold,
    `WeightBytes.matmul_type`). Per-group formats: every matmul group but the routed experts must share
    one type, and the experts may keep another only where ``engine`` multiplies them as matrix-vector products
    (`EngineProfile.experts_as_matvecs`), so that they run at their own type's 1-token rate whatever the dense curve does
    (MXFP4_MOE: experts mxfp4, the rest q8_0; SOURCES.md, "Fold C amendment 7"); any other mix is None."""
    own_file = weights is None
    if weights is None:  # a .gguf file's own type (its per-group spelling where it has one), else bf16
        try:
            weights = parse_weights(weights_label(arch, None))
        except SpeedlimitError:
            return None
    if not isinstance(weights, WeightFormats):
        tensor_type = main_tensor_type(weights.name)
        if own_file and arch.weight_bytes is not None and arch.weight_bytes.matmul_type:
            # the type the file's matmul tensors mostly hold, where llama-quantize fell back from its file type
            tensor_type = main_tensor_type(arch.weight_bytes.matmul_type) or tensor_type
        return (tensor_type, tensor_type) if tensor_type else None
    used = [group for group, params in matmul_params_by_group(arch).items() if params > 0]
    dense = {main_tensor_type(weights[group].name) for group in used if group != "experts"}
    experts = main_tensor_type(weights["experts"].name) if "experts" in used else None
    if len(dense) != 1 or None in dense:
        return None
    (dense_type,) = dense
    if experts is None:  # a dense model, or experts in a format without GGUF kernels (fp8)
        return None if "experts" in used else (dense_type, dense_type)
    if experts == dense_type:
        return dense_type, dense_type
    return (dense_type, experts) if engine.experts_as_matvecs else None


def file_matmul_mix(arch: Architecture, weights: Precision | WeightFormats | None) -> dict[str, float] | None:
    """A .gguf file's own weights (no --weights): its layers' matmul weights by tensor type
    (`WeightBytes.matmul_types`: a K-quant mix's Q6_K tensors, the types llama-quantize fell back to; one type in
    most files); None for any other weights."""
    found = arch.weight_bytes.matmul_types if weights is None and arch.weight_bytes is not None else ()
    return dict(found) if found else None


def cpu_kernel_rate(engine: EngineProfile, device: Hardware, types: tuple[str, str] | None,
                    reach: BandwidthReach | None, scenario: Scenario,
                    mix: dict[str, float] | None = None) -> KernelRate | None:
    """The FLOP/s llama.cpp's CPU kernels reach for these weights on ``device`` with ``reach``'s cores busy, where
    the engine profile measured their tensor types (``types``: the dense matmuls', the routed experts', from
    `kernel_types`) and the catalog gives the CPU's clocks; None otherwise (then the CPU kind's fraction of the
    dtype's peak applies), and whenever an explicit or calibrated FLOP/s efficiency stands (it is a fraction of the
    dtype's peak, which a kernel rate would silently redefine).

    A rate is multiply-accumulates per cycle per thread, so the machine's FLOP/s are 2 x rate x busy cores x their
    clock (`Hardware.core_clock_hz`); hyperthreads add none. Every factor is relative to the fastest rate used.
    ``mix``: a file's matmul tensors by type (`file_matmul_mix`), priced each at its own type's rate where all are
    measured (`EngineProfile.mixed_kernel_rate`).
    """
    topology = device.topology
    if (reach is None or topology is None or types is None or scenario.flops_efficiency is not None
            or (device.calibrated_at is not None and device.flops_efficiency is not None)):
        return None
    tensor_type, expert_type = types
    mixed = engine.mixed_kernel_rate(mix) if mix and len(mix) > 1 else None
    pair, expert_pair = mixed or engine.kernel_rate(tensor_type), engine.kernel_rate(expert_type)
    busy = reach.core_fraction * topology.cores
    clock = device.core_clock_hz(busy)
    if pair is None or expert_pair is None or not math.isfinite(clock):
        return None
    decode, prefill = pair
    expert_decode = expert_pair[0]
    # the prefill rate was measured at a few threads; at many, llama.cpp's threads wait on each other more
    scaling = engine.prefill_thread_efficiency(busy)
    prefill *= scaling
    fastest = max(decode, prefill, expert_decode)
    scaled = ("" if scaling == 1.0 else
              f", prefill x {scaling:.3g} at {busy:g} threads (prefill_thread_scaling, {engine.prefill_thread_scaling.basis})")
    experts = ("" if expert_type == tensor_type else
               f", the routed experts' {expert_type} kernel {expert_decode:.3g} (decode)")
    kinds = (f"{tensor_type} kernels" if mixed is None else
             "kernels of the file's matmul tensors, each type at its own (" + ", ".join(
                 f"{t} {p / sum(mix.values()):.0%}" for t, p in mix.items()) + ")")
    basis = (f"{engine.name}'s {kinds}: {decode:.3g} (decode) / {prefill:.3g} (prefill) MACs per cycle "
             f"per thread{experts} (catalog/engines.toml kernel_rates, {engine.kernel_rates.basis}{scaled}) at "
             f"{clock / 1e9:.2f} GHz with {busy:g} core{'s' if busy != 1 else ''} busy")
    return KernelRate(tensor_type, 2.0 * fastest * clock * topology.cores, decode / fastest, prefill / fastest, clock, basis,
                      scaling, expert_decode / fastest, expert_type)


def calibrated_kernel_transfer(device: Hardware, arch: Architecture, weights: Precision | WeightFormats | None,
                               mix: dict[str, float] | None = None) -> tuple[float, float, float | None, str, str] | None:
    """A profile calibrated on a verify run fitted one FLOP/s, for the tensor type of the model it ran
    (`Hardware.kernel_type`) on the build whose kernel rates `Hardware.kernel_profile` names. These weights' matmuls
    run at that FLOP/s times the ratio of their own kernel rate to the calibrated type's, as that profile measured
    both (fold C), at one token a step and at its prefill size (the GEMM curve between, as `core.gemm_factor` reads
    it); the routed experts, where that build multiplies them as matrix-vector products, at their 1-token rate's
    ratio. Where the calibration recorded its file's matmul tensors by type (`Hardware.kernel_mix`), it and these
    weights' file (``mix``, `file_matmul_mix`) count each type at its own rate (`EngineProfile.mixed_kernel_rate`).
    Returns (1-token factor, prefill factor, expert factor or None, the basis, these weights' tensor type), the factors
    relative to the calibrated FLOP/s: 1, 1, 1 for the calibrated weights themselves. None where there is nothing to
    carry over (no such profile, or a type it did not measure: the calibrated FLOP/s then prices the weights flat)."""
    if device.calibrated_at is None or device.flops_efficiency is None or not device.kernel_profile \
            or not device.kernel_type:
        return None
    try:
        engine = resolve_engine(device.kernel_profile)
    except SpeedlimitError:
        return None
    types = kernel_types(arch, weights, engine)
    # a calibration that recorded its file's types is compared type by type with these weights' file; one that did not
    # (a verify result from before it recorded them) type against type
    counted = bool(device.kernel_mix)
    calibrated = ((engine.mixed_kernel_rate(device.kernel_mix) if counted else None)
                  or engine.kernel_rate(device.kernel_type))
    if types is None or calibrated is None:
        return None
    tensor_type, expert_type = types
    own = (engine.mixed_kernel_rate(mix) if counted and mix else None) or engine.kernel_rate(tensor_type)
    experts = engine.kernel_rate(expert_type)
    if own is None or experts is None:
        return None
    factors = (own[0] / calibrated[0], own[1] / calibrated[1])
    expert = experts[0] / calibrated[0] if engine.experts_as_matvecs else None
    basis = (f"{tensor_type} matmuls at the calibrated {device.kernel_type} FLOP/s x {factors[0]:.3g} (1 token) / "
             f"{factors[1]:.3g} (prefill): the ratio of their kernel rates in {engine.name} (catalog/engines.toml "
             f"kernel_rates, {engine.kernel_rates.basis})")
    return factors[0], factors[1], expert, basis, tensor_type


def cpu_attention_flops(engine: EngineProfile, rate: KernelRate, reach: BandwidthReach,
                        device: Hardware) -> tuple[float, float, str] | None:
    """(decode, prefill) FLOP/s of ``engine``'s CPU attention kernel on ``device`` with ``reach``'s cores busy at the
    matmul kernels' clock, and the basis in words; None where the profile measured none (then attention rides the
    roofline). A rate is multiply-accumulates per cycle per thread (`EngineProfile.attention_rates`)."""
    measured = engine.attention_rate()
    if measured is None or device.topology is None:
        return None
    busy = reach.core_fraction * device.topology.cores
    decode, prefill = (2.0 * r * busy * rate.clock_hz for r in measured)
    basis = (f"attention: {engine.name}'s flash-attention kernel, {measured[0]:.3g} (decode) / {measured[1]:.3g} "
             f"(prefill) MACs per cycle per thread (catalog/engines.toml attention_rates, {engine.attention_rates.basis}), "
             "a kernel of its own")
    return decode, prefill, basis


def calibrated_attention_flops(device: Hardware, reach: BandwidthReach | None) -> tuple[float, float, str] | None:
    """(decode, prefill) FLOP/s of the attention kernel a calibrated CPU profile was fitted with, at ``reach``'s busy
    cores, and the basis in words; None for any other device."""
    per_core = device.attention_flops_per_core
    if device.calibrated_at is None or per_core is None or reach is None or device.topology is None:
        return None
    busy = reach.core_fraction * device.topology.cores
    return (per_core[0] * busy, per_core[1] * busy,
            f"attention: llama.cpp's CPU attention kernel as calibrated, {per_core[0] / 1e9:.3g} (decode) / "
            f"{per_core[1] / 1e9:.3g} (prefill) GFLOP/s per busy core, a kernel of its own")


def compute_rate(arch: Architecture, device: Hardware, weights: Precision | WeightFormats | None,
                 compute: str | None) -> tuple[str, float]:
    """(compute dtype, peak FLOP/s per device) of the matmuls.

    One format (or ``--compute``) runs every matmul in one dtype. Per-group formats that compute in different dtypes
    (fp8 experts, bf16 attention) run each group's matmuls at its own rate: the peak is the rate at which the
    per-token matmul FLOPs finish, Σ params / Σ (params_g / peak_g), and the dtype is named ``mixed``.
    """
    if compute or not isinstance(weights, WeightFormats):
        dtype = compute or (weights.compute_dtype if weights else "bf16")
        return dtype, device.peak_flops(dtype)
    params = matmul_params_by_group(arch)
    dtypes = {group: weights[group].compute_dtype for group in WEIGHT_GROUPS if params[group] > 0}
    if len(set(dtypes.values())) <= 1:
        dtype = next(iter(dtypes.values()), "bf16")
        return dtype, device.peak_flops(dtype)
    seconds_per_flop = sum(params[group] / device.peak_flops(dtype) for group, dtype in dtypes.items())
    return "mixed", sum(params[group] for group in dtypes) / seconds_per_flop


def engine_gemm_rate(engine: EngineProfile, device: Hardware, weights: Precision | WeightFormats | None,
                     compute_dtype: str, peak_flops: float) -> tuple[str, float]:
    """(compute dtype, peak FLOP/s) of ``engine``'s own GEMMs where its profile names a column for them.

    llama.cpp's CUDA backend multiplies f16 and dequantized low-bit weights with cuBLAS accumulating in fp16
    (``half_gemm_dtype = "fp16_acc16"``); bf16 weights accumulate in fp32. A device that lists no such column (every
    non-GeForce card: the same rate) keeps its fp16 peak. ``--compute`` and ``--ideal`` never come here.
    """
    column = engine.half_gemm_dtype.value if engine.half_gemm_dtype else None
    if (column is None or column not in device.flops or compute_dtype != "bf16" or not isinstance(weights, Precision)
            or weights.name == "bf16"):
        return compute_dtype, peak_flops
    return column, device.flops[column]


def engine_efficiency(scenario: Scenario, device: Hardware, engine: EngineProfile,
                      weights_compute_dtype: str | None = None) -> tuple[Efficiency, dict[str, float]]:
    """The achievable fractions and overheads of ``engine`` on ``device``, and the engine's extra `core.Machine` terms.

    ``weights_compute_dtype`` picks the engine's GEMM curve (fp8 weights: its fp8 curve where the profile has one).

    Precedence, per value: the scenario's flag, then a calibrated profile's fitted value, then the engine profile,
    then the device kind's default (catalog/efficiency.toml). An explicit --flops-efficiency (or a calibrated one)
    is a flat GEMM rate; an explicit --step-overhead is the whole per-step cost.
    """
    defaults = default_efficiency(device)
    calibrated = device.calibrated_at is not None
    terms: dict[str, float] = {}
    flops_efficiency = scenario.flops_efficiency or (device.flops_efficiency if calibrated else None)
    points = engine.gemm_points_for(weights_compute_dtype)
    if flops_efficiency is None and points:
        flops_efficiency = max(e for _, e in points)
        (t0, e0), (t1, e1) = points[0], points[-1]
        terms.update(gemm_tokens_small=t0, gemm_factor_small=e0 / flops_efficiency,
                     gemm_tokens_large=t1, gemm_factor_large=e1 / flops_efficiency)
        moe = engine.moe_gemm_efficiency_for(weights_compute_dtype)
        if moe is not None:  # the engine's fused-MoE kernel, timed apart from its dense GEMMs
            terms["moe_factor"] = moe / flops_efficiency
    flops_efficiency = flops_efficiency or defaults.flops_efficiency
    if engine.attention_efficiency is not None and scenario.flops_efficiency is None and not calibrated:
        terms["attention_factor"] = engine.attention_efficiency.value / flops_efficiency
    if calibrated and device.sequence_overhead_s is not None:  # fitted on this deployment's bench sweep
        terms["sequence_overhead_s"] = float(device.sequence_overhead_s)
    elif engine.sequence_overhead_s is not None:
        terms["sequence_overhead_s"] = float(engine.sequence_overhead_s.value)
    if calibrated and device.stream_compute_overlap is not None:  # which step structure fitted its measurements
        terms["stream_compute_overlap"] = float(device.stream_compute_overlap)
    if scenario.step_overhead_s is not None:  # an explicit overhead is the whole per-step cost
        step_s, kernel_s = scenario.step_overhead_s, 0.0
    elif calibrated and device.step_overhead_s is not None:  # measured on the deployment: the whole per-step cost
        step_s, kernel_s = defaults.step_overhead_s, defaults.kernel_overhead_s
    else:
        step_s = engine.step_overhead_s.value if engine.step_overhead_s else defaults.step_overhead_s
        kernel_s = engine.kernel_overhead_s.value if engine.kernel_overhead_s else defaults.kernel_overhead_s
    moe_bandwidth = engine.moe_bandwidth_efficiency_for(weights_compute_dtype)
    if moe_bandwidth is not None and scenario.bw_efficiency is None and not calibrated:
        # the fused-MoE kernel streams the experts' weights at its own fraction of the spec bandwidth
        terms["moe_bytes_factor"] = defaults.bw_efficiency / moe_bandwidth[0]
        terms["moe_bytes_tokens"] = moe_bandwidth[1]
    overridden = (scenario.bw_efficiency, scenario.flops_efficiency, scenario.step_overhead_s) != (None, None, None)
    basis = "overridden" if overridden else defaults.basis
    if terms or engine.step_overhead_s or engine.kernel_overhead_s:
        basis += f"; engine {engine.name}, {engine.version} (catalog/engines.toml)"
    efficiency = Efficiency(
        bw_efficiency=scenario.bw_efficiency or defaults.bw_efficiency,
        flops_efficiency=flops_efficiency,
        step_overhead_s=step_s,
        kernel_overhead_s=kernel_s,
        basis=basis,
    )
    return efficiency, terms


def step_model(model: str | Architecture, hardware: str | Hardware | None = None, **inputs: Any) -> StepModel:
    """Resolve a model and hardware (names, paths, sizes or objects) into the step-cost core's inputs.

    ``inputs``: the `Scenario` fields that shape a step (weights, kv, compute, tp, ideal, efficiencies, ...).
    """
    return resolve(scenario_from(model=model, hardware=hardware, **inputs))


def _hardware(scenario: Scenario) -> Hardware:
    if scenario.bandwidth is not None:
        return custom_hardware(scenario.bandwidth, scenario.flops, scenario.memory)
    if isinstance(scenario.hardware, Hardware):
        return scenario.hardware
    if scenario.profile is not None:
        from speedlimit.catalog.profiles import load_profile_hardware

        profile = load_profile_hardware(scenario.profile)
        if profile is None:
            raise SpeedlimitError(f"no calibrated profile {scenario.profile!r}: `speedlimit calibrate --name {scenario.profile}` writes one")
        return profile
    return resolve_hardware(scenario.hardware)


def _check_tensor_parallel(arch: Architecture, tp: int) -> None:
    """Tensor parallelism splits attention heads across devices: they must divide (KV heads may be replicated)."""
    if tp <= 1 or not arch.n_heads:
        return
    if arch.n_heads % tp:
        raise SpeedlimitError(f"--tp {tp} does not divide {arch.name}'s {arch.n_heads} attention heads; "
                              f"use a divisor of {arch.n_heads}")
    if arch.n_kv_heads and arch.n_kv_heads % tp and tp % arch.n_kv_heads:
        raise SpeedlimitError(f"--tp {tp} cannot split or replicate {arch.name}'s {arch.n_kv_heads} KV heads; "
                              f"use a divisor or multiple of {arch.n_kv_heads}")


def kv_replicas(arch: Architecture, tp: int) -> int:
    """Copies of the KV cache that tensor parallelism keeps over its ``tp`` devices.

    Heads split over the devices, so KV heads fewer than ``tp`` are replicated (tp / KV heads copies of each, as
    vLLM's QKVParallelLinear does), and MLA's one latent per token, shared by every head, is on every device
    ("MLA ... only [has] one KV head ... tensor parallelism on 8 GPUs ... lead[s] to redundant KV cache",
    https://docs.sglang.io/advanced_features/dp_dpa_smg_guide.html): what data-parallel attention (--dp) avoids.
    """
    if tp <= 1:
        return 1
    if arch.attention == "mla":
        return tp
    if arch.n_kv_heads and tp > arch.n_kv_heads:
        return tp // arch.n_kv_heads
    return 1


def _check_pipeline_parallel(arch: Architecture, pp: int) -> None:
    """Pipeline parallelism splits the layers into stages: no more stages than layers (an uneven split is priced
    at its largest stage)."""
    if pp > 1 and arch.n_layers and pp > arch.n_layers:
        raise SpeedlimitError(f"--pp {pp} is more stages than {arch.name}'s {arch.n_layers} layers; "
                              f"use at most {arch.n_layers}")


def _check_expert_parallel(arch: Architecture, ep: int) -> None:
    """Expert parallelism splits routed experts: the model must have them, at least one per device."""
    if ep <= 1:
        return
    if not arch.is_moe:
        raise SpeedlimitError(f"--ep {ep}: {arch.name} is a dense model with no experts to split; drop --ep "
                              "(or split it with --tp, --pp)")
    if ep > arch.n_experts:
        raise SpeedlimitError(f"--ep {ep} is more devices than {arch.name}'s {arch.n_experts} experts per layer; "
                              f"use --tp × --dp of at most {arch.n_experts}, or --ep 1")


def estimate(model: str | Architecture, hardware: str | Hardware | None = None, **inputs: Any) -> Estimate:
    """Predict decode/prefill speed, latency, throughput and memory for one configuration.

    ``model``: catalog name, path to config.json or .gguf, bare size ("7B"), or an `Architecture`.
    ``hardware``: catalog name, calibrated profile name, or a `Hardware` (or give ``bandwidth=``). The other
    keyword arguments are the `Scenario` fields (weights, kv, compute, batch, prompt, output, tp, pp, dp, ep, ideal,
    bw_efficiency, flops_efficiency, step_overhead_s, usd_per_hour, ...); bad ones raise `SpeedlimitError`.
    """
    return estimate_scenario(scenario_from(model=model, hardware=hardware, **inputs))


def estimate_scenario(scenario: Scenario) -> Estimate:
    """`estimate` of an already validated `Scenario`."""
    resolved = resolve(scenario)
    arch, device, cost, machine, efficiency = resolved.arch, resolved.device, resolved.cost, resolved.machine, resolved.efficiency
    reach = resolved.reach
    batch, prompt, output, tp, ideal = scenario.batch, scenario.prompt, scenario.output, scenario.tp, scenario.ideal

    end_context = prompt + output
    reply = core.reply_decode(cost, machine, batch, prompt, output)
    itl, step_bytes, step_flops = float(reply.itl_s), float(reply.step_bytes), float(reply.step_flops)
    if not (math.isfinite(itl) and itl > 0):
        raise SpeedlimitError(f"{arch.name} on {device.name} gives no finite step time (ITL {itl}): check the sizes given")
    mid_context = prompt + output / 2
    ttft = _finite_or_none(core.prefill_seconds(cost, machine, batch, prompt))
    if ideal and not math.isfinite(machine.flops):
        ttft = None
    kv_cache = float(core.kv_cache_bytes(cost, batch, end_context))
    weights_bytes = float(cost.total_weight_bytes)
    devices = scenario.devices
    stage_capacity = _finite_or_none(core.usable_memory_bytes(machine))
    capacity = None if stage_capacity is None else stage_capacity * scenario.pp * scenario.dp
    stage_weights = float(core.stage_weight_bytes(cost, machine))
    stage_memory = stage_weights + float(core.stage_kv_bytes(cost, machine, batch, end_context))
    micro, _ = core.micro_step(machine, core.decode_batch(cost, float(batch), mid_context))
    micro_tokens = micro.tokens
    throughput = batch / itl
    cost_per_m = None
    if scenario.usd_per_hour is not None:
        cost_per_m = scenario.usd_per_hour * devices / 3600.0 / throughput * 1e6
    return Estimate(
        model=arch.name,
        hardware=device.name,
        weights=resolved.weights_name,
        weight_bits=resolved.weight_bits,
        kv=resolved.kv_name,
        mode="ideal" if ideal else "full",
        batch=batch,
        prompt=prompt,
        output=output,
        tp=tp,
        pp=scenario.pp,
        dp=scenario.dp,
        ep=scenario.ep,
        devices=devices,
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
        memory_bytes=float(core.resident_bytes(cost, machine, batch, end_context)),
        memory_capacity_bytes=capacity,
        fits=None if capacity is None else bool(core.memory_fits(cost, machine, batch, end_context)),
        max_batch=None if capacity is None else _finite_or_none(core.max_batch_that_fits(cost, machine, end_context)),
        tp_comm_s=float(core.allreduce_seconds(cost, machine, micro_tokens)),
        usd_per_million_tokens=cost_per_m,
        bandwidth_Bps=device.memory_bandwidth_Bps,
        flops=_finite_or_none(resolved.peak_flops),
        bw_efficiency=1.0 if ideal else efficiency.bw_efficiency,
        flops_efficiency=1.0 if ideal else resolved.flops_efficiency,
        step_overhead_s=0.0 if ideal else resolved.step_overhead_s,
        kernels_per_step=resolved.kernels_per_step,
        efficiency_basis="ideal: peak bandwidth and FLOPs, weights only" if ideal else efficiency.basis,
        engine=resolved.engine.key,
        cpu_kernels=resolved.kernel_rate.tensor_type if resolved.kernel_rate and not ideal else None,
        prefill_thread_efficiency=resolved.kernel_rate.prefill_thread_efficiency if resolved.kernel_rate and not ideal else 1.0,
        experts_as_matvecs=bool(resolved.kernel_rate and not ideal and cost.n_experts and not math.isnan(machine.moe_factor)),
        cpu_expert_kernels=(resolved.kernel_rate.expert_type if resolved.kernel_rate and not ideal
                            and resolved.kernel_rate.expert_type != resolved.kernel_rate.tensor_type else None),
        calibrated_kernels=resolved.kernel_transfer[0] if resolved.kernel_transfer and not ideal else None,
        calibrated_kernel_factors=(list(resolved.kernel_transfer[1:3]) if resolved.kernel_transfer and not ideal
                                   else None),
        sequence_overhead_s=float(machine.sequence_overhead_s),
        stream_compute_overlap=float(machine.stream_compute_overlap),
        attention_kernel_s=float(core.attention_kernel_seconds(cost, machine, micro)),
        ttft_dequantize_s=0.0 if ideal or ttft is None else float(core.dequantize_seconds(
            machine, core.micro_step(machine, core.prefill_batch(cost, float(batch), float(prompt)))[0].tokens)),
        moe_bandwidth_efficiency=(efficiency.bw_efficiency / float(machine.moe_bytes_factor)
                                  if machine.moe_bytes_factor != 1.0 and not ideal else None),
        moe_bandwidth_tokens=float(machine.moe_bytes_tokens) if machine.moe_bytes_factor != 1.0 and not ideal else None,
        reached_bandwidth_Bps=reach.bandwidth_Bps if reach else None,
        bandwidth_basis=reach.basis if reach else ("peak (ideal: the seed formula)" if ideal else "the device's peak"),
        threads=reach.threads if reach else None,
        numa=reach.numa if reach else None,
        weights_per_device_bytes=stage_weights / tp,
        memory_per_device_bytes=stage_memory / tp,
        ep_comm_s=float(core.alltoall_seconds(cost, machine, micro_tokens)),
        pp_comm_s=float(core.pipeline_send_seconds(cost, machine, micro_tokens)),
    )
