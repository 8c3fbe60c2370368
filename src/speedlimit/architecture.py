"""Model architectures: what a transformer reads and computes per token, derived from its config.

This module owns the translation from a Hugging Face ``config.json`` (dict), a bare size such as
``"7B"``, or GGUF metadata into an `Architecture`: parameter groups (embedding, LM head, always-read
dense weights, routed experts), the KV-cache elements stored per token (GQA/MQA heads, MLA's
compressed latent, sliding-window layers), the attention FLOPs per context token and the number of
kernels one decode step launches (`decode_kernels_per_step`). It is pure:
reading files happens in `speedlimit.catalog` and `speedlimit.gguf_model`.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

from speedlimit.errors import SpeedlimitError

# Model types whose MLP is a plain up/down projection (2 matrices) rather than a gated one (3).
_UNGATED_MLP_TYPES = {"gpt2", "gpt_neox", "gptj", "opt", "falcon", "phi", "bloom", "starcoder2", "gpt_bigcode", "mpt"}
# Model types whose configs default to tied input/output embeddings when the key is absent.
_TIED_BY_DEFAULT_TYPES = {"gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "smollm3"}
# Model types that put biases on q/k/v.
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe"}
# Model types that RMS-normalise q and k per head before RoPE.
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2", "olmoe"}


@dataclass(frozen=True)
class WeightBytes:
    """Exact bytes of each parameter group, when a file tells us (GGUF)."""

    embedding: float
    lm_head: float  # 0 when tied
    dense: float
    expert: float  # one routed expert, summed over all MoE layers
    file_type: str = ""
    # every tensor type of the layers' matmul weights (the routed experts and the LM head apart), with its parameters,
    # most first (a K-quant mix's Q6_K tensors)
    matmul_types: tuple[tuple[str, float], ...] = ()

    @property
    def matmul_type(self) -> str:
        """The tensor type holding most of the layers' matmul weights: the file type's main type, except where
        llama-quantize fell back to another for rows its type cannot hold ("ncols not divisible by 256": a K-quant file
        of a model 576 or 896 wide is mostly Q5_0)."""
        return self.matmul_types[0][0] if self.matmul_types else ""


@dataclass(frozen=True)
class Architecture:
    """Per-token cost structure of a decoder-only transformer (counts, not bytes).

    ``expert_params`` is the size of ONE routed expert summed over all MoE layers, so reading
    ``u`` distinct experts per layer costs ``u * expert_params`` parameters.
    """

    name: str
    hidden_size: int
    n_layers: int
    vocab_size: int
    embedding_params: float
    lm_head_params: float  # 0 when the head is tied to the embedding
    dense_params: float  # read every step: attention, dense MLPs, shared experts, routers, norms
    expert_params: float = 0.0
    n_experts: int = 0
    experts_per_token: int = 0
    n_heads: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    kv_elements_per_token_global: float = 0.0  # K+V elements per context token, full-attention layers
    kv_elements_per_token_local: float = 0.0  # same for sliding-window layers
    sliding_window: int = 0
    attn_flops_per_ctx_global: float = 0.0  # FLOPs per (query token, context token), full-attention layers
    attn_flops_per_ctx_local: float = 0.0
    attention: str = "unknown"  # mha | gqa | mqa | mla | unknown
    max_context: int = 0
    decode_kernels: float = 0.0  # kernels one decode step launches (0: unknown, e.g. a bare size)
    source: str = ""
    weight_bytes: WeightBytes | None = field(default=None, compare=False)
    attention_params: float = 0.0  # the attention projections (and their biases) within dense_params (0: not split)
    n_moe_layers: int = 0  # layers with routed experts (0 in an MoE model: not known, taken as every layer)
    # linears (matmuls on weights) one decode step runs as a serving engine fuses them: per layer the attention
    # projections (MLA, decode absorbed: q_a + q_b or q_proj, kv_a, o; else fused qkv and o), the MLP (gate_up and down;
    # routed experts: the fused kernel's two grouped GEMMs; shared experts: gate_up and down). An engine that quantizes
    # each one's activations to fp8 in a kernel of its own launches this many more (0: unknown)
    decode_linears: float = 0.0
    # the --weights spelling the checkpoint ships in, from its config's quantization_config ("" : not quantized or not
    # known, so bf16): what the estimate prices when no --weights is given and no file gives exact bytes
    shipped_weights: str = ""

    @property
    def tied_embeddings(self) -> bool:
        return self.lm_head_params == 0 and self.embedding_params > 0

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def total_params(self) -> float:
        return self.embedding_params + self.lm_head_params + self.dense_params + self.n_experts * self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters touched per token (embeddings included, as model cards count them)."""
        return self.embedding_params + self.lm_head_params + self.dense_params + self.experts_per_token * self.expert_params

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (every layer of an MoE model whose split is not known; 0 for a dense one)."""
        return (self.n_moe_layers or self.n_layers) if self.is_moe else 0

    @property
    def head_params(self) -> float:
        """Parameters of the output projection, which reads the embedding matrix when tied."""
        return self.lm_head_params if self.lm_head_params else self.embedding_params

    @property
    def matmul_params_per_token(self) -> float:
        """Parameters multiplied per token (embedding lookup is a gather, the head is a matmul)."""
        return self.head_params + self.dense_params + self.experts_per_token * self.expert_params

    def kv_elements_per_token(self) -> float:
        return self.kv_elements_per_token_global + self.kv_elements_per_token_local


def attention_per_layer(n_heads: int, n_kv_heads: int, key_dim: int, value_dim: int, kv_lora_rank: int = 0, rope_dim: int = 0) -> tuple[int, int, str]:
    """(KV elements stored per token, attention FLOPs per context token, kind) for one layer.

    MLA stores one compressed latent plus the shared RoPE key per token, and with absorbed
    projections scores over (latent + rope) and reads values from the latent. Standard attention
    stores K and V for every KV head and does QK^T and softmax·V (2 FLOPs per multiply-add).
    """
    if kv_lora_rank:
        return kv_lora_rank + rope_dim, 2 * n_heads * (kv_lora_rank + rope_dim) + 2 * n_heads * kv_lora_rank, "mla"
    kind = "mha" if n_kv_heads == n_heads else ("mqa" if n_kv_heads == 1 else "gqa")
    return n_kv_heads * (key_dim + value_dim), 2 * n_heads * (key_dim + value_dim), kind


def layered_attention(n_layers: int, n_local: int, window: int, kv_per_layer: int, flops_per_layer: int) -> dict[str, Any]:
    """The `Architecture` attention fields for ``n_local`` sliding-window layers out of ``n_layers``."""
    n_global = n_layers - n_local
    return {
        "kv_elements_per_token_global": float(n_global * kv_per_layer),
        "kv_elements_per_token_local": float(n_local * kv_per_layer),
        "sliding_window": window if n_local else 0,
        "attn_flops_per_ctx_global": float(n_global * flops_per_layer),
        "attn_flops_per_ctx_local": float(n_local * flops_per_layer),
    }


# --------------------------------------------------------------------------------------------
# kernels per decode step
#
# Each op of a decode step is one kernel launch, and at batch 1 the small kernels cost more in
# launch and drain time than in data (see catalog/efficiency.toml, kernel_overhead_s). The counts
# are llama.cpp's decode graph, one compute node per kernel (views and reshapes launch nothing),
# read with GGML_SCHED_DEBUG=2 from tiny synthetic GGUFs of each family by
# `python benchmarks/kernel_counts.py` (llama-cpp-python 0.3.36); tests/verify/test_kernel_counts.py
# checks them against the engine. Other engines fuse more or less, but the structure is the same.
STEP_KERNELS = 6  # token embedding gather, final norm + scale, LM head, output-row gathers
DENSE_LAYER_KERNELS = 22  # 2 x (rms_norm, mul), q/k/v/o, 2 rope, 2 KV-cache writes, QK, softmax, PV, cont, gate/up, swiglu, down, 2 adds
QK_NORM_KERNELS = 4  # rms_norm + mul on q and on k (Qwen3, Gemma 3, OLMo 2)
# An MoE layer swaps the 3 MLP matvecs for the router matvec + 3 expert-indexed matvecs
# (mul_mat_id) and adds softmax, argsort (top-k), gather of the weights, the weighting mul and
# k - 1 adds that sum the experts: 4 + k more kernels than a dense layer.
MOE_LAYER_EXTRA_KERNELS = 4
MOE_TOPK_NORM_KERNELS = 3  # sum_rows, clamp, div: renormalising the top-k weights (Mixtral, Qwen3-MoE, DeepSeek)
MOE_EXPERT_BIAS_KERNELS = 4  # gpt-oss: 3 expert-bias adds (add_id) + the router bias
# Shared experts (DeepSeek, Qwen-MoE) are counted from llama.cpp's graph code, not measured:
# kernel_counts.py has no such family, and DeepSeek's MLA attention runs more ops than counted here.
SHARED_EXPERT_KERNELS = 5  # gate, up, swiglu, down, add
SHARED_EXPERT_GATE_KERNELS = 3  # Qwen-MoE's gate on the shared expert: matvec, sigmoid, mul


def decode_kernels_per_step(
    n_layers: int,
    *,
    n_moe_layers: int = 0,
    experts_per_token: int = 0,
    qk_norm: bool = False,
    attention_bias_tensors: int = 0,
    normalize_topk: bool = True,
    expert_bias: bool = False,
    shared_expert: bool = False,
    shared_expert_gate: bool = False,
) -> float:
    """Kernels one decode step launches: per-layer ops (dense or MoE) plus the step's own."""
    if n_layers <= 0:
        return 0.0
    layer = DENSE_LAYER_KERNELS + (QK_NORM_KERNELS if qk_norm else 0) + attention_bias_tensors
    moe_extra = MOE_LAYER_EXTRA_KERNELS + experts_per_token
    moe_extra += MOE_TOPK_NORM_KERNELS if normalize_topk else 0
    moe_extra += MOE_EXPERT_BIAS_KERNELS if expert_bias else 0
    moe_extra += SHARED_EXPERT_KERNELS if shared_expert else 0
    moe_extra += SHARED_EXPERT_GATE_KERNELS if shared_expert_gate else 0
    return float(STEP_KERNELS + n_layers * layer + n_moe_layers * moe_extra)


# --------------------------------------------------------------------------------------------
# bare sizes


_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d*)?(?:e[+-]?\d+)?)\s*(?P<unit>[kmbt]?)\s*$", re.IGNORECASE)
_UNIT = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_param_count(text: str) -> float | None:
    """``"7B"`` → 7e9, ``"70e9"`` → 7e10, ``"135M"`` → 1.35e8; None if the text is not a size."""
    match = _SIZE.match(text)
    if not match:
        return None
    value = float(match.group("num")) * _UNIT[match.group("unit").lower()]
    return value


# A bare size below this is a typo (0.0000001B), not a model.
MIN_BARE_PARAMS = 1e6


def architecture_from_param_count(params: float, name: str | None = None) -> Architecture:
    """A dense model known only by its parameter count: every parameter is read per token, no KV model."""
    if not math.isfinite(params) or params <= 0:
        raise SpeedlimitError(f"model size must be a positive number of parameters, got {params:g}")
    if params < MIN_BARE_PARAMS:
        raise SpeedlimitError(f"model size {params:.3g} parameters is too small for a language model (< 1M); use e.g. 135M or 7B")
    if params > 1e15:
        raise SpeedlimitError(f"model size {params:.3g} parameters is absurd (> 1e15); use e.g. 7B or 70e9")
    return Architecture(
        name=name or _format_params(params),
        hidden_size=0,
        n_layers=0,
        vocab_size=0,
        embedding_params=0.0,
        lm_head_params=0.0,
        dense_params=float(params),
        source="parameter count only (dense; no KV cache or attention model)",
    )


def _format_params(params: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= scale:
            return f"{params / scale:g}{unit}"
    return f"{params:g}"


# --------------------------------------------------------------------------------------------
# Hugging Face configs


def _flatten_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Llama 4, Gemma 3) nest the language model under ``text_config``."""
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)
        return merged
    return config


# Largest plausible value of each count a config.json or GGUF file gives. Beyond them the file is wrong (or
# crafted): a GGUF with block_count = 2**40 would otherwise loop "forever" over its layers.
MAX_HIDDEN = 1 << 20
MAX_LAYERS = 10_000
MAX_HEADS = 1 << 16
MAX_VOCAB = 1 << 27
MAX_INTERMEDIATE = 1 << 24
MAX_EXPERTS = 1 << 16
MAX_CONTEXT = 1 << 31
MAX_PARAMS = 1e15
MAX_NAME_CHARS = 200


def bounded_count(value: Any, what: str, low: int = 0, high: int = MAX_CONTEXT) -> int:
    """A whole number in [low, high] read from a file, else a `SpeedlimitError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value != int(value):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise SpeedlimitError(f"{what} must be a whole number, got {shown}")
    if not low <= value <= high:
        raise SpeedlimitError(f"{what} = {value:,} is absurd (outside {low:,} to {high:,}): is this the right file?")
    return int(value)


def _int(config: dict[str, Any], *keys: str, default: int | None = None, low: int = 0, high: int = MAX_CONTEXT) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return bounded_count(value, f"config key {key!r}", low, high)
    if default is None:
        raise SpeedlimitError(f"config is missing {' / '.join(repr(k) for k in keys)}: is this a decoder-only LLM config.json?")
    return default


def check_total_params(arch: Architecture) -> Architecture:
    """The architecture, unless its parameter count is zero or absurd (a wrong or crafted file)."""
    if not 0 < arch.total_params <= MAX_PARAMS:
        raise SpeedlimitError(f"{arch.name} has {arch.total_params:.3g} parameters: not a plausible model (1 to {MAX_PARAMS:g})")
    return arch


def display_name(value: Any) -> str:
    """A model name taken from a file, cut to `MAX_NAME_CHARS` (it ends up in table titles and JSON)."""
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 1] + "…"


def _local_layer_count(config: dict[str, Any], model_type: str, n_layers: int) -> tuple[int, int]:
    """(number of sliding-window layers, window) from the config's own conventions."""
    window = _int(config, "sliding_window", default=0) if config.get("sliding_window") is not False else 0
    if model_type.startswith("qwen") and not config.get("use_sliding_window", False):
        return 0, 0
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        n_local = sum(1 for kind in layer_types[:n_layers] if "sliding" in str(kind) or "chunked" in str(kind))
        return (n_local, window) if window else (0, 0)
    if not window:
        return 0, 0
    if model_type == "gemma2":
        return (n_layers + 1) // 2, window  # alternating local/global, local first
    if model_type.startswith("gemma3"):
        pattern = _int(config, "sliding_window_pattern", default=6, low=1, high=MAX_LAYERS)
        return sum(1 for i in range(n_layers) if (i + 1) % pattern), window
    if window >= _int(config, "max_position_embeddings", default=0) > 0:
        return 0, 0  # a window as long as the context changes nothing
    return n_layers, window


def architecture_from_hf_config(config: dict[str, Any], name: str = "", source: str = "") -> Architecture:
    """Derive an `Architecture` from a Hugging Face ``config.json`` dict.

    Handles dense (Llama, Mistral, Qwen, Gemma, Phi-3, SmolLM), GQA/MQA, sliding-window layers, MoE
    (Mixtral, Qwen-MoE, DeepSeek, gpt-oss, Llama 4: routed + shared experts, leading dense layers) and
    DeepSeek's multi-head latent attention (MLA).
    """
    if not isinstance(config, dict):
        raise SpeedlimitError("config must be a JSON object (a Hugging Face config.json)")
    config = _flatten_config(config)
    model_type = str(config.get("model_type", "")).lower()
    hidden = _int(config, "hidden_size", "n_embd", "d_model", low=1, high=MAX_HIDDEN)
    n_layers = _int(config, "num_hidden_layers", "n_layer", "num_layers", low=1, high=MAX_LAYERS)
    n_heads = _int(config, "num_attention_heads", "n_head", low=1, high=MAX_HEADS)
    n_kv_heads = _int(config, "num_key_value_heads", "num_kv_heads", default=n_heads, low=1, high=MAX_HEADS)
    vocab = _int(config, "vocab_size", low=1, high=MAX_VOCAB)
    if n_heads % n_kv_heads:
        raise SpeedlimitError(f"num_attention_heads ({n_heads}) is not a multiple of num_key_value_heads ({n_kv_heads})")
    head_dim = _int(config, "head_dim", default=max(hidden // n_heads, 1), low=1, high=MAX_HIDDEN)
    intermediate = _int(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden, low=1, high=MAX_INTERMEDIATE)
    tied_default = model_type in _TIED_BY_DEFAULT_TYPES
    tied = bool(config.get("tie_word_embeddings", tied_default))
    mlp_matrices = 2 if model_type in _UNGATED_MLP_TYPES else 3

    # --- attention ------------------------------------------------------------------------
    attention_bias_tensors = 0
    kv_lora_rank = _int(config, "kv_lora_rank", default=0, high=MAX_HIDDEN)
    if kv_lora_rank:  # DeepSeek multi-head latent attention
        q_lora_rank = _int(config, "q_lora_rank", default=0, high=MAX_HIDDEN)
        rope_dim = _int(config, "qk_rope_head_dim", high=MAX_HIDDEN)
        nope_dim = _int(config, "qk_nope_head_dim", high=MAX_HIDDEN)
        v_head_dim = _int(config, "v_head_dim", default=nope_dim, high=MAX_HIDDEN)
        q_head = nope_dim + rope_dim
        if q_lora_rank:
            q_params = hidden * q_lora_rank + q_lora_rank + q_lora_rank * n_heads * q_head
        else:
            q_params = hidden * n_heads * q_head
        kv_params = hidden * (kv_lora_rank + rope_dim) + kv_lora_rank + kv_lora_rank * n_heads * (nope_dim + v_head_dim)
        attn_params = q_params + kv_params + n_heads * v_head_dim * hidden
    else:
        rope_dim = q_lora_rank = 0
        attn_params = hidden * n_heads * head_dim + 2 * hidden * n_kv_heads * head_dim + n_heads * head_dim * hidden
        if config.get("attention_bias") or model_type in _QKV_BIAS_TYPES:
            attn_params += n_heads * head_dim + 2 * n_kv_heads * head_dim
        # bias adds: q, k, v and o with attention_bias; q, k, v only for Qwen2's built-in biases
        attention_bias_tensors = 4 if config.get("attention_bias") else (3 if model_type in _QKV_BIAS_TYPES else 0)
    kv_elements_per_layer, attn_flops_per_ctx_layer, attention = attention_per_layer(
        n_heads, n_kv_heads, head_dim, head_dim, kv_lora_rank, rope_dim
    )
    norm_params_per_layer = 2 * hidden

    # --- MLP / experts ----------------------------------------------------------------------
    n_experts = _int(config, "n_routed_experts", "num_local_experts", "num_experts", default=0, high=MAX_EXPERTS)
    experts_per_token = _int(config, "num_experts_per_tok", "experts_per_token", "num_experts_per_token", default=0, high=MAX_EXPERTS)
    if n_experts and not experts_per_token:
        raise SpeedlimitError("MoE config has experts but no num_experts_per_tok")
    if experts_per_token > n_experts:
        raise SpeedlimitError(f"num_experts_per_tok ({experts_per_token}) exceeds the number of experts ({n_experts})")
    dense_mlp = mlp_matrices * hidden * intermediate
    if n_experts:
        expert_inter = _int(config, "moe_intermediate_size", default=intermediate, low=1, high=MAX_INTERMEDIATE)
        expert_layer_params = mlp_matrices * hidden * expert_inter
        if config.get("mlp_bias") or model_type == "gpt_oss":
            expert_layer_params += 2 * expert_inter + hidden  # gate/up and down biases
        shared = _int(config, "n_shared_experts", default=0, high=MAX_EXPERTS) * mlp_matrices * hidden * expert_inter
        shared += mlp_matrices * hidden * _int(config, "shared_expert_intermediate_size", default=0, high=MAX_INTERMEDIATE)
        if model_type.startswith("llama4"):
            shared = mlp_matrices * hidden * expert_inter  # one shared expert per MoE layer
            dense_mlp = mlp_matrices * hidden * _int(config, "intermediate_size_mlp", default=intermediate, high=MAX_INTERMEDIATE)
        router = hidden * n_experts
        moe_layers = _moe_layer_indices(config, model_type, n_layers)
        n_moe = len(moe_layers)
        shared_expert = bool(shared)
        dense_params = n_layers * (attn_params + norm_params_per_layer) + (n_layers - n_moe) * dense_mlp + n_moe * (shared + router)
        expert_params = float(n_moe * expert_layer_params)
    else:
        dense_params = n_layers * (attn_params + norm_params_per_layer + dense_mlp)
        expert_params = 0.0
        n_moe, shared_expert = 0, False
    dense_params += hidden  # final norm
    decode_kernels = decode_kernels_per_step(
        n_layers,
        n_moe_layers=n_moe,
        experts_per_token=experts_per_token,
        qk_norm=model_type in _QK_NORM_TYPES,
        attention_bias_tensors=attention_bias_tensors,
        # gpt-oss softmaxes the selected logits instead; Qwen-MoE configs say norm_topk_prob
        normalize_topk=model_type != "gpt_oss" and bool(config.get("norm_topk_prob", True)),
        expert_bias=model_type == "gpt_oss",
        shared_expert=shared_expert,
        shared_expert_gate=shared_expert and model_type.startswith("qwen2_moe"),
    )

    # MLA decodes with kv_b absorbed into its attention matmuls; a query LoRA splits q into q_a and q_b
    attention_linears = (3 + (1 if q_lora_rank else 0)) if kv_lora_rank else 2
    decode_linears = n_layers * (attention_linears + 2) + (2 * n_moe if shared_expert else 0)

    n_local, window = _local_layer_count(config, model_type, n_layers)
    embedding = vocab * hidden
    return check_total_params(Architecture(
        name=display_name(name or config.get("_name_or_path") or model_type or "config"),
        hidden_size=hidden,
        n_layers=n_layers,
        vocab_size=vocab,
        embedding_params=float(embedding),
        lm_head_params=0.0 if tied else float(embedding),
        dense_params=float(dense_params),
        expert_params=expert_params,
        n_experts=n_experts,
        experts_per_token=experts_per_token,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        **layered_attention(n_layers, n_local, window, kv_elements_per_layer, attn_flops_per_ctx_layer),
        attention=attention,
        max_context=_int(config, "max_position_embeddings", default=0),
        decode_kernels=decode_kernels,
        decode_linears=float(decode_linears),
        source=source,
        attention_params=float(n_layers * attn_params),
        n_moe_layers=n_moe,
        shipped_weights=shipped_weights(config, is_moe=n_experts > 0),
    ))


# quantization_config.quant_method values whose checkpoints store every quantized matrix as plain fp8 (block or
# channel scales add a few bits per thousand weights): DeepSeek-V3/R1's block-scaled e4m3, FBGEMM's per-channel fp8
_FP8_QUANT_METHODS = frozenset({"fp8", "fbgemm_fp8"})


def shipped_weights(config: dict[str, Any], *, is_moe: bool) -> str:
    """The --weights spelling a Hugging Face checkpoint ships in, from its ``quantization_config`` ("": unquantized or a
    method not modelled here, priced as bf16).

    ``fp8`` / ``fbgemm_fp8`` -> fp8. ``mxfp4`` (gpt-oss) quantizes the routed experts and keeps the modules it lists in
    ``modules_to_not_convert`` (attention, router, embeddings, head) in the 16-bit dtype: experts=mxfp4,default=bf16.
    """
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return ""
    method = str(quant.get("quant_method", "")).lower()
    if method in _FP8_QUANT_METHODS:
        return "fp8"
    if method == "mxfp4" and is_moe:
        return "experts=mxfp4,default=bf16"
    return ""


def _moe_layer_indices(config: dict[str, Any], model_type: str, n_layers: int) -> list[int]:
    """Which layers hold routed experts, per each family's config keys."""
    first_dense = _int(config, "first_k_dense_replace", default=0, high=MAX_LAYERS)
    freq = _int(config, "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", default=1, low=1, high=MAX_LAYERS)
    listed = config.get("mlp_only_layers") or []
    mlp_only = {bounded_count(i, "config key 'mlp_only_layers'", high=MAX_LAYERS) for i in (listed if isinstance(listed, list) else [listed])}
    layers = []
    for i in range(n_layers):
        if i < first_dense or i in mlp_only:
            continue
        if model_type.startswith("llama4"):
            if (i + 1) % freq:
                continue
        elif i % freq:
            continue
        layers.append(i)
    return layers
