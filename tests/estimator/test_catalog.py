"""Catalog facts: parameter counts against published figures, KV bytes per token by hand, hardware rows."""

import math

import pytest

from speedlimit.catalog import catalog_hardware, catalog_model, hardware_entries, hardware_names, model_entries, model_names
from speedlimit.estimator import estimate

REQUIRED_MODELS = [
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-72b", "gemma-2-9b", "phi-3-mini",
    "deepseek-v3", "gpt-oss-120b", "smollm2-135m", "gemma-3-270m",
]  # fmt: skip
REQUIRED_HARDWARE = [
    "h200", "h100-sxm", "h100-pcie", "a100-sxm-80gb", "a100-40gb", "l40s", "l4", "a10g", "rtx-3090", "rtx-4090",
    "rtx-5090", "b200", "mi300x", "mi325x", "apple-m1", "apple-m1-pro", "apple-m1-max", "apple-m1-ultra", "apple-m2",
    "apple-m2-pro", "apple-m2-max", "apple-m2-ultra", "apple-m3", "apple-m3-pro", "apple-m3-max", "apple-m4",
    "apple-m4-pro", "apple-m4-max",
]  # fmt: skip


def test_required_entries_present():
    assert set(REQUIRED_MODELS) <= set(model_names())
    assert set(REQUIRED_HARDWARE) <= set(hardware_names())
    assert sum(1 for key in hardware_names() if catalog_hardware(key).kind == "cpu") >= 2


@pytest.mark.parametrize("key", model_names())
def test_parameter_count_matches_published(key):
    entry = model_entries()[key]
    arch = catalog_model(key)
    assert entry["source"].startswith("https://")
    assert arch.total_params == pytest.approx(entry["published_params"], rel=0.02)
    if "published_active_params" in entry:
        active = arch.active_params if entry.get("published_active_includes_embedding", True) else arch.active_params - arch.embedding_params
        assert active == pytest.approx(entry["published_active_params"], rel=0.02)


@pytest.mark.parametrize(
    ("key", "kv_bytes"),
    [
        ("llama-3.1-8b", 32 * 2 * 8 * 128 * 2),  # GQA: 32 layers × (K+V) × 8 kv heads × 128 dims × fp16
        ("llama-2-7b", 32 * 2 * 32 * 128 * 2),  # MHA
        ("mixtral-8x7b", 32 * 2 * 8 * 128 * 2),  # MoE does not change attention
        ("deepseek-v3", 61 * (512 + 64) * 2),  # MLA: compressed latent + shared RoPE key per layer
        ("gemma-3-270m", 18 * 2 * 1 * 256 * 2),  # MQA, head_dim 256
    ],
)
def test_kv_bytes_per_token_by_hand(key, kv_bytes):
    assert estimate(key, "h100-sxm", kv="fp16").kv_bytes_per_token == kv_bytes


def test_moe_active_params_and_union():
    mixtral = catalog_model("mixtral-8x7b")
    assert mixtral.n_experts == 8 and mixtral.experts_per_token == 2
    single = estimate("mixtral-8x7b", "h100-sxm", batch=1)
    many = estimate("mixtral-8x7b", "h100-sxm", batch=64)
    # batch 1 reads 2 of 8 experts; a large batch reads (almost) all of them
    assert single.bytes_per_token < 0.35 * single.weights_bytes
    assert many.bytes_per_token * 64 > 0.95 * many.weights_bytes


def test_tied_embeddings_and_windows():
    assert catalog_model("smollm2-135m").tied_embeddings
    assert not catalog_model("llama-3.1-8b").tied_embeddings
    gemma = catalog_model("gemma-2-9b")
    assert gemma.sliding_window == 4096 and gemma.kv_elements_per_token_local > 0
    assert catalog_model("qwen2.5-7b").sliding_window == 0  # use_sliding_window = false


@pytest.mark.parametrize("key", hardware_names())
def test_hardware_rows_are_complete(key):
    device = catalog_hardware(key)
    entry = hardware_entries()[key]
    assert entry["source"].startswith("http")
    assert 1e10 < device.memory_bandwidth_Bps < 1e14
    assert device.memory_bytes and 1e9 < device.memory_bytes < 1e13
    assert math.isfinite(device.peak_flops("bf16")) and device.peak_flops("bf16") > 1e11
