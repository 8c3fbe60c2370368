"""Serving-engine profiles: what an engine (llama.cpp, vLLM, SGLang, TensorRT-LLM, ...) changes in a step's cost, and
the scheduler it runs by default.

`EngineProfile` is the validated record of one ``catalog/engines.toml`` table; every value in it is a `Sourced`
(the value and its public source, or the fold it was fitted on). A value the profile leaves out is None: the
device kind's default (``catalog/efficiency.toml``) applies. Pure: no I/O (the catalog loads the file).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from speedlimit.hardware import Hardware

GIB = 2**30
#: A tensor type holding less than this share of a file's matmul parameters may lack a measured kernel rate in a mix
#: (`EngineProfile.mixed_kernel_rate`): its time is lost in the rounding of the others'.
MIX_NEGLIGIBLE = 0.01
# the prompt length at which a kernel_rates prefill figure is measured (llama-bench pp512)
KERNEL_PREFILL_TOKENS = 512


def _check_points(points: Any, unit: str, counts: str, highest: float) -> list:
    """A curve of [count, fraction] points: counts increasing from 1, fractions in (0, highest]."""
    if not isinstance(points, list) or not points or any(
            not isinstance(p, list) or len(p) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p)
            for p in points):
        raise ValueError(f"must be a list of [{unit}, fraction] points")
    xs = [p[0] for p in points]
    if xs != sorted(xs) or len(set(xs)) != len(xs) or xs[0] < 1:
        raise ValueError(f"points must have increasing {counts} >= 1")
    if not all(0 < p[1] <= highest for p in points):
        raise ValueError(f"fractions must be in (0, {highest:g}]")
    return points


class Sourced(BaseModel):
    """One profile value with where it comes from: a public ``source`` or the ``fitted`` fold (exactly one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: Any
    source: str | None = Field(None, min_length=8)
    fitted: str | None = Field(None, min_length=1)
    # device-dependent scheduler defaults (vLLM, SGLang): [[GiB, value], ...], the value of the highest tier the
    # device's memory reaches (`value` below the first tier, or when the memory is unknown)
    by_memory_gib: list[tuple[float, Any]] | None = None
    # devices (a lower-case fragment of the catalog key or name) that keep `value` whatever their memory
    # (vLLM: A100s keep its small defaults)
    except_devices: list[str] | None = None
    # SGLang: at most this fraction of the KV cache's capacity in tokens
    kv_tokens_fraction: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _one_basis(self) -> Sourced:
        if (self.source is None) == (self.fitted is None):
            raise ValueError("give exactly one of source = \"<public page and what it says>\" or fitted = \"<fold>\"")
        if self.by_memory_gib is not None:
            tiers = [gib for gib, _ in self.by_memory_gib]
            if not tiers or not all(math.isfinite(gib) and gib > 0 for gib in tiers) or tiers != sorted(set(tiers)):
                raise ValueError("by_memory_gib must be [GiB, value] tiers with increasing GiB > 0")
        if self.except_devices is not None and (self.by_memory_gib is None or not all(
                isinstance(name, str) and name.strip() for name in self.except_devices)):
            raise ValueError("except_devices names devices (non-empty text) exempt from by_memory_gib, and needs it")
        return self

    def values(self) -> list[Any]:
        """Every value the field can take (its base value and each memory tier's)."""
        return [self.value] + [value for _, value in self.by_memory_gib or ()]

    @property
    def basis(self) -> str:
        """Where the value comes from, in words: its public source, or the fold it was fitted on."""
        return self.source if self.source is not None else f"fitted on fold {self.fitted}"

    def at(self, memory_bytes: float | None = None, kv_tokens: float | None = None, device: Hardware | None = None) -> Any:
        """The value on a device with ``memory_bytes`` (None: unknown → the base value), ``device`` exempt from the
        tiers when its catalog key or name holds one of ``except_devices``, capped by the KV rule."""
        value = self.value
        names = f"{device.key} {device.name}".lower() if device is not None else ""
        exempt = any(name.lower() in names for name in self.except_devices or ())
        if memory_bytes is not None and math.isfinite(memory_bytes) and not exempt:
            for gib, tier_value in self.by_memory_gib or ():
                if memory_bytes >= gib * GIB:
                    value = tier_value
        if self.kv_tokens_fraction is not None and kv_tokens is not None and math.isfinite(kv_tokens):
            value = max(1, min(value, int(kv_tokens * self.kv_tokens_fraction)))
        return value


def _value(field: Sourced | None) -> Any:
    return None if field is None else field.value


class EngineProfile(BaseModel):
    """One serving engine as the estimator and the simulator see it (see ``catalog/engines.toml`` for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    name: str
    version: str = Field(min_length=4)
    homepage: str = ""
    aliases: list[str] = Field(default_factory=list)
    devices: list[Literal["cpu", "apple", "gpu", "custom"]]
    inherits: str | None = None
    # the profile this engine runs as on AMD GPUs (its ROCm build runs other kernels), where the catalog has one;
    # not inherited: a profile names its own
    rocm_profile: str | None = None
    # the versions of the engine, as its server reports them (prefixes of vLLM's /version, SGLang's
    # /get_server_info), that this profile describes: a bench replay of such a server runs it; not inherited
    server_versions: list[str] = Field(default_factory=list)
    # scheduler
    mode: Sourced
    max_seqs: Sourced
    max_batched_tokens: Sourced
    # where the data-parallel replicas share their experts (SGLang's --enable-dp-attention), each replica's token
    # budget is max_batched_tokens divided by this: a whole number, or "dp" (the data-parallel size); None: undivided
    dp_attention_chunk_divisor: Sourced | None = None
    chunked_prefill: Sourced
    # without chunked prefill: True = a step prefills whole prompts and decodes pause (vLLM V0's prefill-first);
    # False = whole prompts join the decodes' step within the token budget (TensorRT-LLM's in-flight batching)
    prefill_first: Sourced | None = None
    prefix_caching: Sourced
    # the prefix cache is per slot (llama-server's cache_prompt: a slot reuses the tokens of the request it last
    # served, and a host-memory prompt cache), not one block cache for all; None: one for all
    slot_prompts: Sourced | None = None
    kv: Sourced
    # the KV format it runs with fp8 weights (a vendor's FP8 checkpoint and its recommended config); None: `kv`
    fp8_weights_kv: Sourced | None = None
    # step costs (None: the device kind's default)
    cuda_graphs: Sourced | None = None
    kernel_fraction: Sourced | None = None
    kernel_overhead_s: Sourced | None = None
    step_overhead_s: Sourced | None = None
    sequence_overhead_s: Sourced | None = None
    attention_efficiency: Sourced | None = None
    gemm_efficiency: Sourced | None = None
    # the same curve for weights that compute in fp8, where a source measures the engine's FP8 GEMMs apart: they reach
    # a smaller fraction of their (twice as high) peak than bf16 GEMMs do of theirs; None: gemm_efficiency
    fp8_gemm_efficiency: Sourced | None = None
    # the fraction of the fp8 peak its fused-MoE kernel reaches on the routed experts' GEMMs (weights computing in
    # fp8), where a source times that kernel apart; None: the experts ride the GEMM curve
    fp8_moe_gemm_efficiency: Sourced | None = None
    # the fraction of the spec memory bandwidth at which that kernel streams the routed experts' fp8 weights, where a
    # source times it where the weight reads bound it; None: the experts' bytes at the device kind's bw_efficiency
    fp8_moe_bandwidth_efficiency: Sourced | None = None
    # ... in a step whose MoE layers see at least this many tokens (where the source measured it); None: every step
    fp8_moe_bandwidth_tokens: Sourced | None = None
    # true: with weights that compute in fp8 it quantizes each linear's activations in a kernel of its own before the
    # GEMM (one more launch per linear, `Architecture.decode_linears`); None: no such launches counted
    fp8_activation_quant_kernels: Sourced | None = None
    # the peak-FLOPs column its GEMMs of f16 and dequantized low-bit weights run at, where a device lists one
    # (llama.cpp CUDA: "fp16_acc16", cuBLAS with fp16 accumulation); None: the weights' compute dtype
    half_gemm_dtype: Sourced | None = None
    # a step with more tokens than this converts each quantized weight matrix to fp16 with a kernel of its own before
    # a cuBLAS GEMM (llama.cpp CUDA builds before MMQ became the default); None: quantized weights are multiplied as
    # they are stored
    dequantize_gemm_tokens: Sourced | None = None
    # CPU matmul kernel rates per GGUF tensor type, multiply-accumulates per cycle per thread: [decode (one token),
    # prefill (KERNEL_PREFILL_TOKENS tokens)]; None: the device kind's FLOP/s efficiency
    kernel_rates: Sourced | None = None
    # true: its CPU backend multiplies each routed expert's rows one at a time (matrix-vector products), so where a
    # type has kernel_rates the routed experts run at its 1-token rate in every step; None / false: on the GEMM curve
    expert_matvec: Sourced | None = None
    # how the prefill kernel rate per thread holds up as threads are added, as [threads, fraction of the rate at the
    # first point's count] points (the kernel rates' own count first); None: every thread at the measured rate
    prefill_thread_scaling: Sourced | None = None
    # its CPU flash-attention kernel's rate, multiply-accumulates (query heads x cached tokens x (key + value width))
    # per cycle per thread: [decode (one query token), prefill (a 512-token chunk)], the KV reads included; where the
    # kernel rates price the matmuls, attention is then a kernel of its own at this rate; None (or false, for a build
    # whose parent profile has them): attention FLOPs ride the roofline with the matmuls
    attention_rates: Sourced | None = None

    @field_validator("mode")
    @classmethod
    def _mode(cls, field: Sourced) -> Sourced:
        if field.value not in ("continuous", "serial"):
            raise ValueError(f"mode must be continuous or serial, got {field.value!r}")
        return field

    @field_validator("max_seqs", "max_batched_tokens", "fp8_moe_bandwidth_tokens", "dequantize_gemm_tokens")
    @classmethod
    def _count(cls, field: Sourced | None) -> Sourced | None:
        if field is None:
            return field
        for value in field.values():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"must be a whole number >= 1, got {value!r}")
        return field

    @field_validator("dp_attention_chunk_divisor")
    @classmethod
    def _divisor(cls, field: Sourced | None) -> Sourced | None:
        if field is not None and field.value != "dp" and (
                isinstance(field.value, bool) or not isinstance(field.value, int) or field.value < 1):
            raise ValueError(f'must be a whole number >= 1 or "dp", got {field.value!r}')
        return field

    @model_validator(mode="after")
    def _device_rules_on_counts(self) -> EngineProfile:
        # the device-memory and KV rules are the scheduler caps' (SGLang's and vLLM's defaults); elsewhere they
        # would be ignored, so they are refused
        for name, sourced in self.sourced_values().items():
            if name not in ("max_seqs", "max_batched_tokens") and (
                    sourced.by_memory_gib is not None or sourced.kv_tokens_fraction is not None):
                raise ValueError(f"{name}: by_memory_gib and kv_tokens_fraction apply to max_seqs and max_batched_tokens only")
        return self

    @field_validator("chunked_prefill", "prefill_first", "prefix_caching", "slot_prompts", "cuda_graphs",
                     "fp8_activation_quant_kernels", "expert_matvec")
    @classmethod
    def _flag(cls, field: Sourced | None) -> Sourced | None:
        if field is not None and not isinstance(field.value, bool):
            raise ValueError(f"must be true or false, got {field.value!r}")
        return field

    @field_validator("kernel_fraction", "attention_efficiency", "fp8_moe_gemm_efficiency", "fp8_moe_bandwidth_efficiency")
    @classmethod
    def _fraction(cls, field: Sourced | None) -> Sourced | None:
        if field is not None and (isinstance(field.value, bool) or not isinstance(field.value, (int, float))
                                  or not 0 < field.value <= 1):
            raise ValueError(f"must be a fraction in (0, 1], got {field.value!r}")
        return field

    @field_validator("kernel_overhead_s", "step_overhead_s", "sequence_overhead_s")
    @classmethod
    def _seconds(cls, field: Sourced | None) -> Sourced | None:
        if field is not None and (isinstance(field.value, bool) or not isinstance(field.value, (int, float))
                                  or not 0 <= field.value <= 0.1):
            raise ValueError(f"must be seconds in [0, 0.1], got {field.value!r}")
        return field

    @field_validator("half_gemm_dtype")
    @classmethod
    def _gemm_dtype(cls, field: Sourced | None) -> Sourced | None:
        if field is not None and field.value not in ("fp16_acc16",):
            raise ValueError(f"must be fp16_acc16, got {field.value!r}")
        return field

    @field_validator("kv", "fp8_weights_kv")
    @classmethod
    def _kv_name(cls, field: Sourced | None) -> Sourced | None:
        if field is not None and (not isinstance(field.value, str) or not field.value):
            raise ValueError(f"must be a KV format name (fp16, bf16, fp8, ...), got {field.value!r}")
        return field

    @field_validator("gemm_efficiency", "fp8_gemm_efficiency")
    @classmethod
    def _curve(cls, field: Sourced | None) -> Sourced | None:
        if field is None:
            return field
        points = _check_points(field.value, "tokens", "token counts", highest=1)
        if len(points) > 2:
            raise ValueError("at most two [tokens, fraction] anchors: the step model interpolates between two")
        return field

    @field_validator("kernel_rates")
    @classmethod
    def _kernel_rates(cls, field: Sourced | None) -> Sourced | None:
        if field is None:
            return field
        if not isinstance(field.value, dict) or not field.value:
            raise ValueError("must be a table of GGUF tensor type = [decode, prefill] MACs per cycle per thread")
        for name, pair in field.value.items():
            if not isinstance(pair, list) or len(pair) != 2 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1024 for v in pair):
                raise ValueError(f"{name}: must be [decode, prefill] MACs per cycle per thread, each in (0, 1024]")
        return field

    @field_validator("attention_rates")
    @classmethod
    def _attention_rates(cls, field: Sourced | None) -> Sourced | None:
        if field is not None and field.value is not False and not (
                isinstance(field.value, list) and len(field.value) == 2 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1024 for v in field.value)):
            raise ValueError("must be [decode, prefill] MACs per cycle per thread, each in (0, 1024], or false (not "
                             "measured for this build, where a parent profile has them)")
        return field

    @field_validator("prefill_thread_scaling")
    @classmethod
    def _thread_scaling(cls, field: Sourced | None) -> Sourced | None:
        if field is not None:
            _check_points(field.value, "threads", "thread counts", highest=2)
        return field

    # ---- what the estimator and simulator read

    def prefill_thread_efficiency(self, threads: float) -> float:
        """The prefill kernel rate per thread at ``threads`` busy, as a fraction of the rate the kernel rates were
        measured at: interpolated in log2(threads) between the measured points, flat outside them; 1 without any."""
        points = _value(self.prefill_thread_scaling)
        if not points:
            return 1.0
        if threads <= points[0][0]:
            return float(points[0][1])
        for (lo_n, lo_e), (hi_n, hi_e) in zip(points, points[1:]):
            if threads <= hi_n:
                share = math.log2(threads / lo_n) / math.log2(hi_n / lo_n)
                return float(lo_e + (hi_e - lo_e) * share)
        return float(points[-1][1])

    def kernel_rate(self, tensor_type: str | None) -> tuple[float, float] | None:
        """(decode, prefill) MACs per cycle per thread of the CPU kernels for ``tensor_type``; None: not measured."""
        rates = _value(self.kernel_rates) or {}
        pair = rates.get(tensor_type) if tensor_type else None
        return None if pair is None else (float(pair[0]), float(pair[1]))

    def mixed_kernel_rate(self, mix: dict[str, float]) -> tuple[float, float] | None:
        """(decode, prefill) MACs per cycle per thread of matmuls whose weights are spread over tensor types as ``mix``
        says (type -> parameters): each type's share at its own kernel's rate, so the time adds (a harmonic mean).
        Types under `MIX_NEGLIGIBLE` of the parameters without a measured rate (a router's f32) are left out; None
        where a larger share has no measured rate."""
        total = sum(mix.values())
        rated = {t: (p, self.kernel_rate(t)) for t, p in mix.items() if p > 0}
        if not total > 0 or any(pair is None and p >= MIX_NEGLIGIBLE * total for p, pair in rated.values()):
            return None
        shares = [(p, pair) for p, pair in rated.values() if pair is not None]
        counted = sum(p for p, _ in shares)
        return (counted / sum(p / pair[0] for p, pair in shares), counted / sum(p / pair[1] for p, pair in shares))

    def attention_rate(self) -> tuple[float, float] | None:
        """(decode, prefill) MACs per cycle per thread of its CPU attention kernel; None: not measured."""
        rates = _value(self.attention_rates)
        return None if not rates else (float(rates[0]), float(rates[1]))

    @property
    def experts_as_matvecs(self) -> bool:
        """Whether its CPU backend multiplies each routed expert's rows one at a time (`expert_matvec`)."""
        return bool(_value(self.expert_matvec))

    @property
    def gemm_points(self) -> tuple[tuple[float, float], ...]:
        return self.gemm_points_for(None)

    def gemm_points_for(self, compute_dtype: str | None) -> tuple[tuple[float, float], ...]:
        """The GEMM-efficiency anchors for weights that compute in ``compute_dtype`` (fp8: its own curve, if any)."""
        curve = self.fp8_gemm_efficiency if compute_dtype == "fp8" and self.fp8_gemm_efficiency is not None else self.gemm_efficiency
        return tuple((float(t), float(e)) for t, e in (_value(curve) or []))

    def moe_gemm_efficiency_for(self, compute_dtype: str | None) -> float | None:
        """The fused-MoE kernel's fraction of the peak for weights that compute in ``compute_dtype``; None: no figure
        of its own (the routed experts are priced on the GEMM curve)."""
        if compute_dtype == "fp8" and self.fp8_moe_gemm_efficiency is not None:
            return float(self.fp8_moe_gemm_efficiency.value)
        return None

    def moe_bandwidth_efficiency_for(self, compute_dtype: str | None) -> tuple[float, float] | None:
        """(the fraction of the spec bandwidth the fused-MoE kernel streams the routed experts' weights at, the fewest
        tokens in the step's MoE layers it applies from) for weights that compute in ``compute_dtype``; None: no figure
        of its own (the device kind's bw_efficiency)."""
        if compute_dtype == "fp8" and self.fp8_moe_bandwidth_efficiency is not None:
            tokens = self.fp8_moe_bandwidth_tokens
            return float(self.fp8_moe_bandwidth_efficiency.value), float(tokens.value) if tokens is not None else 0.0
        return None

    def decode_kernels(self, arch_kernels: float, arch_linears: float, weights_compute_dtype: str | None) -> float:
        """Kernels one decode step launches: llama.cpp's count for the model times the profile's kernel fraction, plus
        one activation-quantization launch per linear where the profile quantizes fp8 activations on their own."""
        kernels = arch_kernels * (self.kernel_fraction.value if self.kernel_fraction else 1.0)
        if weights_compute_dtype == "fp8" and _value(self.fp8_activation_quant_kernels):
            kernels += arch_linears
        return kernels

    def batched_tokens_per_replica(self, tokens: int, dp: int) -> int:
        """The token budget of one of ``dp`` data-parallel replicas that share their experts, from the engine's
        ``tokens`` (SGLang divides its chunked-prefill size under data-parallel attention)."""
        divisor = _value(self.dp_attention_chunk_divisor)
        if divisor is None or dp <= 1:
            return tokens
        return max(1, tokens // (dp if divisor == "dp" else divisor))

    def default_kv(self, weights_compute_dtype: str | None) -> str:
        """The KV format it runs by default with weights that compute in ``weights_compute_dtype`` (None: unknown)."""
        if self.fp8_weights_kv is not None and weights_compute_dtype == "fp8":
            return self.fp8_weights_kv.value
        return self.kv.value

    def sourced_values(self) -> dict[str, Sourced]:
        """Every value the profile gives (name → `Sourced`)."""
        return {name: getattr(self, name) for name in type(self).model_fields
                if isinstance(getattr(self, name), Sourced)}

    def record(self) -> dict[str, Any]:
        """The profile as plain data (``GET /api/engines`` and ``speedlimit engines --json``): every value with its
        source or fitted fold, and device-dependent scheduler defaults with their rule."""
        values = {}
        for field, sourced in self.sourced_values().items():
            value = {"value": sourced.value, "source": sourced.source, "fitted": sourced.fitted}
            if sourced.by_memory_gib is not None:
                value["by_memory_gib"] = [[gib, tier] for gib, tier in sourced.by_memory_gib]
            if sourced.except_devices is not None:
                value["except_devices"] = list(sourced.except_devices)
            if sourced.kv_tokens_fraction is not None:
                value["kv_tokens_fraction"] = sourced.kv_tokens_fraction
            values[field] = value
        return {"name": self.key, "label": self.name, "version": self.version, "aliases": list(self.aliases),
                "inherits": self.inherits, "rocm_profile": self.rocm_profile, "homepage": self.homepage, "devices": list(self.devices), "values": values}


def gemm_efficiency_at(points: tuple[tuple[float, float], ...], tokens: float) -> float:
    """The curve's fraction at ``tokens``: linear in log2(tokens) between points, flat beyond the ends."""
    if not points:
        return math.nan
    if tokens <= points[0][0]:
        return points[0][1]
    for (t0, e0), (t1, e1) in zip(points, points[1:]):
        if tokens <= t1:
            w = (math.log2(tokens) - math.log2(t0)) / (math.log2(t1) - math.log2(t0))
            return e0 + w * (e1 - e0)
    return points[-1][1]
