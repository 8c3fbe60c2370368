"""GGUF files as estimator input: architecture from metadata, exact bytes from every tensor.

Reading is done by the `gguf` package (`GGUFReader`, memory-mapped, so a 40 GB file costs nothing
to open); this module only maps llama.cpp's metadata keys onto an `Architecture` and sums the real
tensor byte sizes into embedding / LM head / always-read / per-expert groups.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import gguf

from speedlimit.architecture import (
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    Architecture,
    WeightBytes,
    attention_per_layer,
    bounded_count,
    check_total_params,
    decode_kernels_per_step,
    display_name,
    layered_attention,
)
from speedlimit.errors import SpeedlimitError


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    if isinstance(value, list):  # per-layer arrays (e.g. head_count_kv): use the most common value
        numbers = [v for v in value if isinstance(v, (int, float))]
        return Counter(numbers).most_common(1)[0][0] if numbers else None
    return value


def read_gguf(path: Path) -> gguf.GGUFReader:
    """Open a GGUF file, turning every failure into a one-line `SpeedlimitError`."""
    path = Path(path).expanduser()
    try:
        if not path.is_file():
            raise SpeedlimitError(f"no such GGUF file: {path}")
        return gguf.GGUFReader(path, "r")
    except SpeedlimitError:
        raise
    except Exception as error:  # the reader raises ValueError/struct errors/IndexError on bad files
        raise SpeedlimitError(f"{path} is not a readable GGUF file ({type(error).__name__}: {str(error)[:200]})") from None


def architecture_from_gguf(path: Path) -> Architecture:
    """Architecture and exact weight bytes of a ``.gguf`` file."""
    reader = read_gguf(path)
    try:
        return _architecture(reader, Path(path))
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, AttributeError) as error:  # a crafted header
        raise SpeedlimitError(f"{path} is not a readable GGUF model ({type(error).__name__}: {str(error)[:200]})") from None


def _architecture(reader: gguf.GGUFReader, path: Path) -> Architecture:
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise SpeedlimitError(f"{path} has no general.architecture: is it a model GGUF?")

    def meta(suffix: str, default: int, high: int, low: int = 0) -> int:
        """A count from the metadata, bounded: a crafted file must not make us loop 2**40 times."""
        value = _field(reader, f"{arch}.{suffix}")
        return default if value is None else bounded_count(value, f"{path.name}: {arch}.{suffix}", low, high)

    n_layers = meta("block_count", 0, MAX_LAYERS)
    hidden = meta("embedding_length", 0, MAX_HIDDEN)
    n_heads = meta("attention.head_count", 0, MAX_HEADS)
    if not (n_layers and hidden and n_heads):
        raise SpeedlimitError(f"{path} lacks {arch}.block_count/embedding_length/attention.head_count metadata")
    n_kv_heads = meta("attention.head_count_kv", n_heads, MAX_HEADS) or n_heads
    key_length = meta("attention.key_length", max(hidden // n_heads, 1), MAX_HIDDEN, low=1)
    value_length = meta("attention.value_length", key_length, MAX_HIDDEN, low=1)
    n_experts = meta("expert_count", 0, MAX_EXPERTS)
    experts_per_token = min(meta("expert_used_count", 0, MAX_EXPERTS), n_experts)
    kv_lora_rank = meta("attention.kv_lora_rank", 0, MAX_HIDDEN)
    window = meta("attention.sliding_window", 0, MAX_CONTEXT)

    names = {tensor.name for tensor in reader.tensors}
    embedding = lm_head = dense = experts = 0.0
    embedding_bytes = lm_head_bytes = dense_bytes = expert_bytes = 0.0
    attention_params = 0.0  # the part of `dense` in attention projections (a per-group --weights prices it apart)
    types: Counter[str] = Counter()
    # the layers' 2-D weights the matmuls read, the routed experts and the LM head apart (a prefill multiplies the LM
    # head for one position only, and its table is often another type: Q8_0 or Q6_K)
    matmul_types: Counter[str] = Counter()
    vocab = 0
    for tensor in reader.tensors:
        name, n_elements, n_bytes = tensor.name, float(tensor.n_elements), float(tensor.n_bytes)
        types[tensor.tensor_type.name.lower()] += int(n_elements)
        if name.startswith("blk.") and name.endswith(".weight") and len(tensor.shape) >= 2 and "_exps" not in name:
            matmul_types[tensor.tensor_type.name.lower()] += int(n_elements)
        if name == "token_embd.weight":
            embedding, embedding_bytes = n_elements, n_bytes
            vocab = int(max(tensor.shape))
        elif name == "output.weight":
            lm_head, lm_head_bytes = n_elements, n_bytes
        elif "_exps" in name:  # stacked routed experts; shared experts are "_shexp"
            experts += n_elements
            expert_bytes += n_bytes
        else:
            dense += n_elements
            dense_bytes += n_bytes
            if ".attn_" in name and "norm" not in name:  # q/k/v/output projections (MLA's too) and their biases
                attention_params += n_elements
    if not reader.tensors:
        raise SpeedlimitError(f"{path} contains no tensors")
    if n_experts:
        experts /= n_experts
        expert_bytes /= n_experts
    else:
        experts_per_token = 0

    kv_per_layer, attn_flops_per_layer, attention = attention_per_layer(
        n_heads, n_kv_heads, key_length, value_length, kv_lora_rank, meta("rope.dimension_count", 64, MAX_HIDDEN)
    )
    # GGUF marks sliding-window models by window size; layer patterns are per-architecture in llama.cpp.
    local_fraction = {"gemma2": 0.5, "gemma3": 5 / 6, "gpt-oss": 0.5, "gpt_oss": 0.5}.get(arch, 1.0 if window else 0.0)
    n_local = round(n_layers * local_fraction) if window else 0
    main_type = types.most_common(1)[0][0] if types else ""
    # kernels per decode step, from which tensors exist (layer 0 stands for all; MoE layers counted)
    n_moe_layers = sum(1 for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" in names) if n_experts else 0
    normalize = _field(reader, f"{arch}.expert_weights_norm")
    decode_kernels = decode_kernels_per_step(
        n_layers,
        n_moe_layers=n_moe_layers,
        experts_per_token=experts_per_token,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        attention_bias_tensors=sum(f"blk.0.attn_{t}.bias" in names for t in ("q", "k", "v", "output")),
        # llama.cpp renormalises the top-k weights unless the file says not to (gpt-oss and Qwen2-MoE never do)
        normalize_topk=bool(normalize) if normalize is not None else arch not in ("gpt-oss", "qwen2moe"),
        expert_bias=any(f"blk.{i}.ffn_up_exps.bias" in names for i in range(n_layers)),
        shared_expert=any(f"blk.{i}.ffn_up_shexp.weight" in names for i in range(n_layers)),
        shared_expert_gate=any(f"blk.{i}.ffn_gate_inp_shexp.weight" in names for i in range(n_layers)),
    )
    file_type = _file_type_name(_field(reader, "general.file_type")) or main_type
    return check_total_params(Architecture(
        name=display_name(_field(reader, "general.name") or Path(path).stem),
        hidden_size=hidden,
        n_layers=n_layers,
        vocab_size=vocab,
        embedding_params=embedding,
        lm_head_params=lm_head,
        dense_params=dense,
        expert_params=experts,
        n_experts=n_experts,
        experts_per_token=experts_per_token,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=key_length,
        **layered_attention(n_layers, n_local, window, kv_per_layer, attn_flops_per_layer),
        attention=attention,
        max_context=meta("context_length", 0, MAX_CONTEXT),
        decode_kernels=decode_kernels,
        source=str(path),
        weight_bytes=WeightBytes(
            embedding=embedding_bytes, lm_head=lm_head_bytes, dense=dense_bytes, expert=expert_bytes, file_type=file_type,
            matmul_types=tuple((t, float(n)) for t, n in matmul_types.most_common()),
        ),
        attention_params=attention_params,
    ))


def _file_type_name(value: Any) -> str:
    if value is None:
        return ""
    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
    except (ValueError, TypeError, OverflowError):
        return ""
