"""Kernels per decode step: counted from the architecture, charged at the per-kernel cost."""

import pytest

from speedlimit.architecture import DENSE_LAYER_KERNELS, STEP_KERNELS, decode_kernels_per_step
from speedlimit.bundled import default_gguf_path
from speedlimit.catalog import default_efficiency, resolve_hardware, resolve_model
from speedlimit.estimator import estimate


@pytest.mark.parametrize(
    ("model", "kernels"),
    [
        ("llama-2-7b", 6 + 32 * 22),  # dense Llama
        ("qwen2.5-7b", 6 + 28 * 25),  # + q/k/v bias adds
        ("qwen3-8b", 6 + 36 * 26),  # + q/k RMS norms
        ("mixtral-8x7b", 6 + 32 * 31),  # MoE top-2: 22 + 4 + 2 + 3 (top-k renormalisation)
        ("qwen3-30b-a3b", 6 + 48 * 41),  # MoE top-8 with q/k norms: 26 + 4 + 8 + 3
        ("gpt-oss-20b", 6 + 24 * 38),  # MoE top-4, attention/expert/router biases, no renormalisation
    ],
)
def test_catalog_models_count_the_kernels_llama_cpp_launches(model, kernels):
    assert resolve_model(model).decode_kernels == kernels


def test_gguf_and_config_agree_and_bare_sizes_have_none():
    assert resolve_model(str(default_gguf_path())).decode_kernels == resolve_model("smollm2-135m").decode_kernels == STEP_KERNELS + 30 * DENSE_LAYER_KERNELS
    assert resolve_model("7B").decode_kernels == 0
    assert decode_kernels_per_step(0) == 0


def test_moe_layers_add_router_and_expert_kernels_per_selected_expert():
    dense = decode_kernels_per_step(10)
    assert decode_kernels_per_step(10, n_moe_layers=10, experts_per_token=2, normalize_topk=False) == dense + 10 * (4 + 2)
    assert decode_kernels_per_step(10, n_moe_layers=5, experts_per_token=8) == dense + 5 * (4 + 8 + 3)


def test_default_overhead_is_kernels_times_the_per_kernel_cost():
    for device in ("h100-sxm", "apple-m2-ultra"):
        efficiency = default_efficiency(resolve_hardware(device))
        for model in ("llama-2-7b", "qwen3-30b-a3b"):
            result = estimate(model, device)
            assert result.step_overhead_s == pytest.approx(efficiency.kernel_overhead_s * resolve_model(model).decode_kernels)
    # an explicit overhead replaces the kernel term
    assert estimate("llama-2-7b", "h100-sxm", step_overhead_s=0.001).step_overhead_s == pytest.approx(0.001)
