"""GGUF input: architecture from metadata and exact tensor bytes, read by the `gguf` package."""

import numpy as np
import pytest
from gguf import GGUFWriter

from speedlimit.bundled import default_gguf_path
from speedlimit.catalog import catalog_model, resolve_model
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import estimate


def test_bundled_smollm2_matches_catalog_architecture():
    path = default_gguf_path()
    arch = resolve_model(str(path))
    catalog = catalog_model("smollm2-135m")
    assert arch.total_params == catalog.total_params
    assert arch.kv_elements_per_token() == catalog.kv_elements_per_token()
    assert arch.tied_embeddings and arch.n_layers == 30
    # exact bytes: the tensors sum to the file size minus its header and alignment padding
    total = arch.weight_bytes.embedding + arch.weight_bytes.dense
    assert 0.97 * path.stat().st_size < total < path.stat().st_size
    assert arch.weight_bytes.file_type == "q4_1"
    # the layers' matmul weights are all Q4_1 (the tied table, the LM head, is Q8_0 and left apart)
    assert arch.weight_bytes.matmul_types == (("q4_1", 30 * 576 * (576 * 2 + 192 * 2 + 1536 * 3)),)
    result = estimate(str(path), "apple-m1")
    assert result.weights == "q4_1" and 4.5 < result.weight_bits < 8


def _write_moe_gguf(path, n_experts=4, used=2, hidden=64, inter=32, layers=2, vocab=100):
    writer = GGUFWriter(str(path), "mixtral")
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_expert_count(n_experts)
    writer.add_expert_used_count(used)
    writer.add_context_length(4096)
    f32 = np.float32
    writer.add_tensor("token_embd.weight", np.zeros((vocab, hidden), f32))
    writer.add_tensor("output.weight", np.zeros((vocab, hidden), f32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((hidden, hidden), f32))
        writer.add_tensor(f"blk.{i}.attn_k.weight", np.zeros((hidden // 2, hidden), f32))
        writer.add_tensor(f"blk.{i}.attn_v.weight", np.zeros((hidden // 2, hidden), f32))
        writer.add_tensor(f"blk.{i}.attn_output.weight", np.zeros((hidden, hidden), f32))
        for name in ("gate", "up", "down"):
            writer.add_tensor(f"blk.{i}.ffn_{name}_exps.weight", np.zeros((n_experts, inter, hidden), f32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_synthetic_moe_gguf_groups_experts(tmp_path):
    path = tmp_path / "tiny-moe.gguf"
    _write_moe_gguf(path)
    arch = resolve_model(str(path))
    assert arch.n_experts == 4 and arch.experts_per_token == 2
    assert arch.expert_params == 2 * 3 * 32 * 64  # one expert across both layers
    assert arch.weight_bytes.expert == arch.expert_params * 4  # f32
    assert arch.lm_head_params == 100 * 64 and not arch.tied_embeddings
    assert arch.kv_elements_per_token() == 2 * 2 * 2 * 16  # layers × (K+V) × kv heads × head dim


@pytest.mark.parametrize("content", [b"", b"GGUF", b"GGUF\x03\x00\x00\x00garbage", b"not a gguf at all" * 10])
def test_malformed_gguf_is_one_line_error(tmp_path, content):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(SpeedlimitError) as error:
        resolve_model(str(path))
    assert "\n" not in str(error.value) and "broken.gguf" in str(error.value)


def test_missing_gguf(tmp_path):
    with pytest.raises(SpeedlimitError, match="no such GGUF file"):
        resolve_model(str(tmp_path / "absent.gguf"))


def test_gguf_attention_tensors_are_their_own_weight_group(tmp_path):
    path = tmp_path / "tiny-moe.gguf"
    _write_moe_gguf(path)
    arch = resolve_model(str(path))
    assert arch.attention_params == 2 * (64 * 64 * 2 + 32 * 64 * 2)  # q, output + k, v per layer
    # a per-group spelling replaces the file's exact bytes: attention at fp8, the rest at bf16
    mixed = estimate(str(path), "h100-sxm", weights="attention=fp8,default=bf16")
    assert mixed.weights_bytes == pytest.approx(arch.attention_params * 1 + (arch.total_params - arch.attention_params) * 2)


def _write_mixed_gguf(path, hidden=64, inter=128, layers=2, vocab=100):
    """A llama file typed Q4_K_M whose attention and gate/up weights fell back to Q5_0 and whose down projections are
    Q8_0, as llama-quantize does for rows it cannot hold as Q4_K (the GGUF header says MOSTLY_Q4_K_M, 15)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_context_length(4096)
    writer.add_file_type(15)
    f32 = np.float32

    def add(name, shape, qtype):
        data = quants.quantize(np.zeros(shape, f32), qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    add("token_embd.weight", (vocab, hidden), Q.Q8_0)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, f32))
        for name in ("q", "k", "v", "output"):
            add(f"blk.{i}.attn_{name}.weight", (hidden, hidden), Q.Q5_0)
        add(f"blk.{i}.ffn_gate.weight", (inter, hidden), Q.Q5_0)
        add(f"blk.{i}.ffn_up.weight", (inter, hidden), Q.Q5_0)
        add(f"blk.{i}.ffn_down.weight", (hidden, inter), Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_file_whose_tensors_fell_back_is_priced_at_its_tensors_kernels(tmp_path):
    """The CPU kernels price a file's own weights by the types its layers' matmul tensors hold, each at its own
    kernel's rate (llama.cpp multiplies each tensor with its type's kernel), not by the file type's main type."""
    from speedlimit.catalog import resolve_engine

    path = tmp_path / "mixed.gguf"
    _write_mixed_gguf(path)
    arch = resolve_model(str(path))
    assert arch.weight_bytes.file_type == "q4_k_m"
    assert arch.weight_bytes.matmul_types == (("q5_0", 2 * (4 * 64 * 64 + 2 * 128 * 64)), ("q8_0", 2 * 64 * 128))
    assert arch.weight_bytes.matmul_type == "q5_0"
    cpu = "amd-ryzen-9-7950x"
    result = estimate(str(path), cpu, prompt=512, output=2)
    engine = resolve_engine(result.engine)
    rates = [engine.kernel_rate(t) for t in ("q5_0", "q8_0")]
    share = 2 * 64 * 128 / (2 * (4 * 64 * 64 + 2 * 128 * 64) + 2 * 64 * 128)
    mixed = [1 / ((1 - share) / rates[0][k] + share / rates[1][k]) for k in (0, 1)]
    assert engine.mixed_kernel_rate(dict(arch.weight_bytes.matmul_types)) == pytest.approx(mixed)
    assert "each type at its own (q5_0 " in result.efficiency_basis
    assert f": {mixed[0]:.3g} (decode) / " in result.efficiency_basis  # the prefill's is scaled to 16 threads
    assert result.cpu_kernels == "q5_0"  # the type most of them hold names the kernels
    # --weights names a format: its own kernels, the file's types aside
    assert estimate(str(path), cpu, weights="q4_k_m", prompt=512, output=2).cpu_kernels == "q4_k"
