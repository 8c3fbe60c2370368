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
