"""Catalog facts: parameter counts against published figures, KV bytes per token by hand, hardware rows and the
memory capacities (the driver's readout where one is cited, else the vendor's nominal figure)."""

import math
import re

import pytest

from speedlimit.catalog import catalog_hardware, catalog_model, hardware_entries, hardware_names, model_entries, model_names
from speedlimit.estimator import core, estimate
from speedlimit.simulator.api import engine_config, resolve

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
    assert device.memory_bytes and 1e9 < device.memory_bytes < 2e13  # a dual-socket EPYC server holds 12 TB
    if device.socket_link_Bps is not None:
        assert entry["link_source"].startswith("http")
    if device.per_core_bandwidth_Bps is not None:  # a published measurement, cited (hardware.toml's header)
        assert entry["per_core_source"].startswith("http") and "per_core_source" in entry["notes"]
    assert math.isfinite(device.peak_flops("bf16")) and device.peak_flops("bf16") > 1e11


MIB = 1024 * 1024
READOUTS = [key for key, entry in hardware_entries().items() if "memory_source" in entry]


def test_the_cited_readouts_cover_the_common_gpus() -> None:
    assert {"h100-sxm", "a100-sxm-80gb", "l40s", "l4", "rtx-4090", "rtx-3090"} <= set(READOUTS)


@pytest.mark.parametrize("key", READOUTS)
def test_a_cited_readout_is_a_url_and_whole_bytes(key: str) -> None:
    entry = hardware_entries()[key]
    assert entry["memory_source"].startswith("https://")
    memory = catalog_hardware(key).memory_bytes
    assert memory == int(memory)
    assert entry["memory_bytes"] == int(entry["memory_bytes"])  # written as bytes, not rounded to a GB figure
    # a readout is within 10% of the nominal figure the name states in GB, when it states one
    nominal = re.search(r"(\d+)\s?GB", entry["name"])
    if nominal:
        assert 0.95 * float(nominal.group(1)) * 1e9 <= memory <= 1.10 * float(nominal.group(1)) * 1e9

def test_h100_is_the_81559_mib_nvidia_smi_reports() -> None:
    assert catalog_hardware("h100-sxm").memory_bytes == 81559 * MIB


def test_the_kv_cache_gets_the_engines_fraction_of_the_reported_memory() -> None:
    step = resolve("llama-3.3-70b", "h100-sxm", tp=2, weights="fp8", engine="tensorrt-llm")
    free = 2 * 81559 * MIB * core.USABLE_MEMORY_FRACTION - step.cost.total_weight_bytes
    per_token = float(core.kv_bytes_per_sequence(step.cost, 1.0))
    assert engine_config(step=step).kv_capacity_tokens == math.floor(free / per_token)
