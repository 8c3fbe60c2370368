"""Engine profiles (catalog/engines.toml): the loader, every value's source, and what an engine does to a step's cost."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from speedlimit.catalog import (
    DEFAULT_ENGINE,
    catalog_engine,
    default_efficiency,
    engine_entries,
    engine_for_device,
    engine_names,
    resolve_engine,
    resolve_hardware,
    resolve_model,
)
from speedlimit.cli import app
from speedlimit.engine_profile import EngineProfile, Sourced, gemm_efficiency_at
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.estimator.api import estimate, step_model

ISSUE_ENGINES = ("llama-cpp", "llama-cpp-cpu", "llama-cpp-cuda", "llama-cpp-metal", "llama-cpp-vulkan", "llama-cpp-rocm",
                 "llama-cpp-python", "vllm", "sglang", "tensorrt-llm")
runner = CliRunner()


def test_catalog_holds_the_issue_engines() -> None:
    assert set(ISSUE_ENGINES) <= set(engine_names())
    assert DEFAULT_ENGINE == "llama-cpp"


@pytest.mark.parametrize("key", sorted(engine_entries()))
def test_every_value_names_its_source_or_fold(key: str) -> None:
    profile = catalog_engine(key)
    assert profile.version and len(profile.version) >= 4  # names the engine version it describes
    values = profile.sourced_values()
    for field in ("mode", "max_seqs", "max_batched_tokens", "chunked_prefill", "prefix_caching", "kv"):
        assert field in values, f"{key} has no {field}"
    for field, sourced in values.items():
        assert (sourced.source is None) != (sourced.fitted is None), f"{key}.{field}"
        if sourced.source is not None:
            assert "http" in sourced.source or "benchmarks/" in sourced.source or "llama" in sourced.source, \
                f"{key}.{field}: {sourced.source!r} names no public page"
        else:
            # fold A: published rows of the fit fold; fold C: the project's own CPU kernel runs; fold D: published engine-version
            # step figures outside fold B (benchmarks/accuracy/SOURCES.md);
            # never fold B, the held-out published rows
            assert sourced.fitted in ("A", "C", "D"), f"{key}.{field} fitted on {sourced.fitted!r}: only folds A, C and D may be fitted on"


def test_raw_file_gives_every_value_as_a_sourced_table() -> None:
    import tomllib
    from importlib import resources

    raw = tomllib.loads(resources.files("speedlimit.catalog").joinpath("engines.toml").read_text(encoding="utf-8"))
    metadata = {"name", "aliases", "version", "homepage", "devices", "inherits", "rocm_profile",
                "server_versions"}
    for key, entry in raw.items():
        for field, value in entry.items():
            if field not in metadata:
                assert isinstance(value, dict) and ("source" in value or "fitted" in value), f"{key}.{field}"


def test_a_value_without_a_source_is_rejected() -> None:
    with pytest.raises(ValueError, match="source"):
        Sourced(value=1)
    with pytest.raises(ValueError, match="exactly one"):
        Sourced(value=1, source="https://example.org/x", fitted="A")


def test_names_and_aliases_resolve() -> None:
    assert resolve_engine(None).key == "llama-cpp"
    assert resolve_engine("llama.cpp").key == "llama-cpp"
    assert resolve_engine("llama.cpp-vulkan").key == "llama-cpp-vulkan"
    assert resolve_engine("vLLM").key == "vllm"
    assert resolve_engine("trt-llm").key == "tensorrt-llm"


def test_unknown_engine_is_one_line_listing_the_known_ones() -> None:
    with pytest.raises(SpeedlimitError) as caught:
        resolve_engine("vllmm")
    message = str(caught.value)
    assert "\n" not in message and "did you mean" in message
    for key in ISSUE_ENGINES:
        assert key in message


def test_default_engine_picks_the_backend_from_the_device() -> None:
    default = resolve_engine(None)
    assert engine_for_device(default, resolve_hardware("h100-sxm")).key == "llama-cpp-cuda"
    assert engine_for_device(default, resolve_hardware("mi300x")).key == "llama-cpp-rocm"
    apple = next(k for k in ("m2-ultra", "m1-max", "m3-max") if _exists(k))
    assert engine_for_device(default, resolve_hardware(apple)).key == "llama-cpp-metal"
    assert engine_for_device(resolve_engine("vllm"), resolve_hardware("h100-sxm")).key == "vllm"


def test_an_engine_with_a_rocm_build_runs_it_on_amd_gpus() -> None:
    """vLLM 0.7's ROCm build is its own profile (other kernels, its own fitted floor): `--engine vllm-0.7` runs it on
    an AMD GPU and the CUDA build elsewhere; the link is not inherited, so the ROCm profile stays itself, and a
    modified copy of the CUDA profile stays that copy off AMD."""
    early = resolve_engine("vllm-0.7")
    assert early.rocm_profile == "vllm-0.7-rocm"
    assert engine_for_device(early, resolve_hardware("mi300x")).key == "vllm-0.7-rocm"
    assert engine_for_device(early, resolve_hardware("h200")).key == "vllm-0.7"
    rocm = resolve_engine("vllm-0.7-rocm")
    assert rocm.inherits == "vllm-0.7" and rocm.rocm_profile is None
    assert engine_for_device(rocm, resolve_hardware("mi300x")) is rocm
    copy = early.model_copy(update={"name": "a copy"})
    assert engine_for_device(copy, resolve_hardware("h100-sxm")) is copy
    # the fitted floors differ, everything else is inherited
    assert rocm.kernel_overhead_s.value != early.kernel_overhead_s.value
    assert rocm.max_seqs == early.max_seqs and rocm.fp8_moe_gemm_efficiency == early.fp8_moe_gemm_efficiency
    on_amd = estimate("deepseek-r1", "mi300x", weights="fp8", tp=8, engine="vllm-0.7")
    assert on_amd.engine == "vllm-0.7-rocm"
    assert estimate("deepseek-r1", "h200", weights="fp8", tp=8, engine="vllm-0.7").engine == "vllm-0.7"


def test_sglang_0_4_runs_its_rocm_build_on_amd_gpus() -> None:
    """SGLang 0.4's ROCm build has its own fitted floor (fold D amendment 4); the rest is the CUDA profile's."""
    early = resolve_engine("sglang-0.4")
    assert early.rocm_profile == "sglang-0.4-rocm"
    rocm = resolve_engine("sglang-0.4-rocm")
    assert rocm.inherits == "sglang-0.4" and rocm.rocm_profile is None
    assert engine_for_device(early, resolve_hardware("mi300x")) == rocm
    assert engine_for_device(early, resolve_hardware("h200")).key == "sglang-0.4"
    assert rocm.kernel_overhead_s.value != early.kernel_overhead_s.value
    assert rocm.sequence_overhead_s.value == early.sequence_overhead_s.value
    assert rocm.fp8_moe_gemm_efficiency == early.fp8_moe_gemm_efficiency and rocm.prefill_first == early.prefill_first
    assert estimate("deepseek-r1", "mi300x", weights="fp8", tp=8, engine="sglang-0.4").engine == "sglang-0.4-rocm"


def test_every_rocm_build_named_is_a_gpu_profile() -> None:
    """A `rocm_profile` names a catalog profile that runs on GPUs and names no further build of its own."""
    for key in engine_names():
        target = catalog_engine(key).rocm_profile
        if target is not None:
            assert "gpu" in catalog_engine(target).devices and catalog_engine(target).rocm_profile is None


def _exists(name: str) -> bool:
    try:
        resolve_hardware(name)
        return True
    except SpeedlimitError:
        return False


def test_vllm_scheduler_defaults_depend_on_device_memory() -> None:
    vllm = catalog_engine("vllm")
    assert vllm.max_seqs.at(80e9) == 1024 and vllm.max_batched_tokens.at(80e9) == 8192
    assert vllm.max_seqs.at(24e9) == 256 and vllm.max_batched_tokens.at(24e9) == 2048
    # vLLM keeps its small defaults on A100s whatever their memory (arg_utils.py get_batch_defaults)
    a100 = resolve_hardware("a100-sxm-80gb")
    assert vllm.max_seqs.at(a100.memory_bytes, device=a100) == 256
    sglang = catalog_engine("sglang")
    assert sglang.max_seqs.at(80e9, kv_tokens=1000) == 500


@pytest.mark.parametrize(("device", "late", "early"), [
    ("rtx-4090", 2048, 2048),  # 24 GiB: below both versions' first tier
    ("a100-40gb", 4096, 8192),  # 40 GiB: late 2025's 35-60 GiB tier
    ("l40s", 4096, 8192),
    ("h100-sxm", 8192, 8192),
    ("h200", 8192, 8192),  # 131 GiB: below 160
    ("b200", 16384, 8192),
    ("mi300x", 16384, 8192),
])
def test_sglang_chunked_prefill_budget_by_version_and_memory(device: str, late: int, early: int) -> None:
    """SGLang's chunked_prefill_size: 0.5.6's five memory tiers; 0.4.x's 2,048 below 25,000 MiB, else 8,192."""
    memory = resolve_hardware(device).memory_bytes
    assert catalog_engine("sglang").max_batched_tokens.at(memory) == late
    assert catalog_engine("sglang-0.4").max_batched_tokens.at(memory) == early
    assert catalog_engine("sglang-0.4-rocm").max_batched_tokens.at(memory) == early
    # an unknown device memory takes the base value
    assert catalog_engine("sglang").max_batched_tokens.at(None) == 2048


def test_memory_tiers_pick_the_highest_reached() -> None:
    tiers = Sourced(value=1, by_memory_gib=[[10, 2], [20, 3]], source="https://example.org/x")
    gib = 2**30
    assert [tiers.at(m * gib) for m in (5, 10, 15, 20, 500)] == [1, 2, 2, 3, 3]
    assert tiers.at(math.inf) == 1 and tiers.at(math.nan) == 1  # not a memory size: the base value
    exempt = Sourced(value=1, by_memory_gib=[[10, 2]], except_devices=["a100"], source="https://example.org/x")
    a100, h100 = resolve_hardware("a100-sxm-80gb"), resolve_hardware("h100-sxm")
    assert exempt.at(80 * gib, device=a100) == 1 and exempt.at(80 * gib, device=h100) == 2


@pytest.mark.parametrize("bad", [
    {"by_memory_gib": [[20, 2], [10, 3]]},  # tiers out of order
    {"by_memory_gib": [[10, 2], [10, 3]]},  # a tier twice
    {"by_memory_gib": [[0, 2]]},
    {"by_memory_gib": []},
    {"except_devices": ["a100"]},  # an exemption without tiers
    {"by_memory_gib": [[10, 2]], "except_devices": [" "]},
])
def test_memory_tiers_are_checked(bad: dict) -> None:
    with pytest.raises(ValueError):
        Sourced(value=1, source="https://example.org/x", **bad)


def test_device_rules_belong_to_the_scheduler_caps() -> None:
    base = dict(catalog_engine("sglang").model_dump())
    base["kernel_fraction"] = {"value": 0.5, "by_memory_gib": [[10, 0.6]], "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="max_seqs and max_batched_tokens only"):
        EngineProfile.model_validate(base)
    base = dict(catalog_engine("sglang").model_dump())
    base["max_batched_tokens"] = {"value": 2048, "by_memory_gib": [[10, 0]], "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="whole number"):
        EngineProfile.model_validate(base)


@pytest.mark.parametrize("bad", [0, 1.5, "tp", True])
def test_dp_attention_chunk_divisor_is_checked(bad) -> None:
    base = dict(catalog_engine("sglang").model_dump())
    base["dp_attention_chunk_divisor"] = {"value": bad, "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="whole number >= 1 or"):
        EngineProfile.model_validate(base)


@pytest.mark.parametrize("bad", [[1.0], [0.0, 5.0], [1.0, 2000.0], [True, 1.0], "fast", True, {"decode": 1.0}])
def test_attention_rates_are_checked(bad) -> None:
    base = dict(catalog_engine("llama-cpp-cpu").model_dump())
    base["attention_rates"] = {"value": bad, "fitted": "C"}
    with pytest.raises(ValueError, match=r"\[decode, prefill\] MACs per cycle per thread"):
        EngineProfile.model_validate(base)
    base["attention_rates"] = {"value": False, "source": "not measured for this build"}
    assert EngineProfile.model_validate(base).attention_rate() is None


def test_sglang_divides_its_budget_among_data_parallel_attention_ranks() -> None:
    """SGLang with --enable-dp-attention (replicas sharing their experts): 0.5.6 divides chunked_prefill_size by the
    data-parallel size, 0.4.x halves it; independent replicas and an explicit budget are not divided."""
    from speedlimit.simulator.api import engine_config

    def budget(engine: str, **layout) -> int:
        return engine_config(step=step_model("deepseek-r1", "h200", engine=engine, **layout)).max_batched_tokens

    assert budget("sglang", tp=1, dp=8, ep=8) == 8192 // 8
    assert budget("sglang-0.4", tp=1, dp=8, ep=8) == 8192 // 2
    assert budget("sglang-0.4", tp=8) == 8192
    assert budget("vllm", tp=1, dp=8, ep=8) == 8192  # vLLM's data-parallel ranks keep the whole budget
    assert budget("sglang", tp=8, dp=2) == 8192  # independent replicas (no shared experts)
    explicit = engine_config(step=step_model("deepseek-r1", "h200", engine="sglang", tp=1, dp=8, ep=8),
                             max_batched_tokens=4096)
    assert explicit.max_batched_tokens == 4096


def test_a_prefill_alone_engine_may_budget_fewer_tokens_than_running_sequences() -> None:
    """SGLang's budget bounds a prefill step's prompt tokens (its decode batch holds every running request), so it
    may be below the running cap; a mixed-step engine's budget must hold every running sequence's decode."""
    from speedlimit.simulator.api import engine_config

    sglang = engine_config(step=step_model("llama-3.1-8b", "rtx-4090", weights="int4", engine="sglang"))
    assert sglang.prefills_alone and sglang.max_batched_tokens == 2048 < sglang.max_seqs
    vllm = engine_config(step=step_model("llama-3.1-8b", "h100-sxm", engine="vllm"), max_seqs=4096)
    assert vllm.max_batched_tokens == 8192  # given max_seqs 4096, the default 8,192 still holds them
    with pytest.raises(SpeedlimitError, match="must be at least --max-seqs"):
        engine_config(step=step_model("llama-3.1-8b", "h100-sxm", engine="vllm"), max_seqs=4096, max_batched_tokens=1024)
    raised = engine_config(step=step_model("llama-3.1-8b", "h100-sxm", engine="vllm"), max_seqs=10000)
    assert raised.max_batched_tokens == 10000  # a mixed-step default is raised to the running cap


def test_sglang_dp_attention_prompts_share_a_prefill_step_only_within_the_rank_budget() -> None:
    """Two 3,200-token prompts reaching one SGLang 0.4 rank together: with the rank's halved budget (4,096) the second
    waits out the first's prefill step; with 8,192 given explicitly they share one."""
    from speedlimit.simulator.api import build_workload, engine_config, run_workload

    step = step_model("mixtral-8x7b", "h200", engine="sglang-0.4", tp=1, dp=2, ep=2)
    ttft = {}
    for tokens in (None, 8192):
        workload = build_workload(rate=1.0, requests=3, seed=0)
        # round-robin: requests 0 and 2 go to rank 0, request 1 to rank 1
        workload.arrivals, workload.prompts, workload.outputs = [0.0, 0.0, 0.0], [3200, 16, 3200], [4, 4, 4]
        first, _, third = run_workload(step, engine_config(step=step, max_batched_tokens=tokens), workload).records
        ttft[tokens] = (first.ttft_s, third.ttft_s)
    assert engine_config(step=step).max_batched_tokens == 4096
    assert ttft[8192][1] == pytest.approx(ttft[8192][0])  # one prefill step for both
    assert ttft[None][1] > 1.5 * ttft[None][0]  # the second prompt's prefill is a step of its own


def test_gemm_curve_interpolates_in_log_tokens() -> None:
    points = ((1024.0, 0.5), (4096.0, 0.7))
    assert gemm_efficiency_at(points, 1) == 0.5
    assert gemm_efficiency_at(points, 2048) == pytest.approx(0.6)
    assert gemm_efficiency_at(points, 1e6) == 0.7
    machine = core.Machine(1e12, 1e15, 0.0, math.nan, math.nan, gemm_tokens_small=1024, gemm_factor_small=0.5 / 0.7,
                           gemm_tokens_large=4096, gemm_factor_large=1.0)
    assert core.gemm_factor(machine, 2048.0) == pytest.approx(0.6 / 0.7)
    import numpy as np

    vector = core.gemm_factor(machine._replace(gemm_tokens_small=np.array([1024.0])), np.array([1.0, 2048.0, 1e6]))
    assert vector == pytest.approx([0.5 / 0.7, 0.6 / 0.7, 1.0])


def test_default_engine_prices_exactly_as_without_profiles() -> None:
    """The default engine is its device's backend: llama.cpp's per-kernel cost, the device kind's bandwidth fraction."""
    implicit = estimate("llama-3.1-8b", "h100-sxm", batch=8, prompt=512, output=128)
    explicit = estimate("llama-3.1-8b", "h100-sxm", batch=8, prompt=512, output=128, engine="llama.cpp-cuda")
    assert implicit.itl_s == explicit.itl_s and implicit.ttft_s == explicit.ttft_s
    assert implicit.engine == "llama-cpp-cuda" and implicit.kv == "fp16"
    assert implicit.step_overhead_s == pytest.approx(3e-6 * implicit.kernels_per_step)


def test_cuda_graph_engines_pay_a_floor_per_fused_kernel() -> None:
    """A replayed CUDA graph drops the CPU's launches, not each node's floor on the GPU: the late-2025 engines pay the
    fold-D fit (SOURCES.md, fold D amendment 5) per kernel of their fused layer, less than llama.cpp's launches."""
    llama = estimate("llama-3.1-70b", "h100-sxm", tp=4, batch=1, prompt=512, output=128)
    vllm = estimate("llama-3.1-70b", "h100-sxm", tp=4, batch=1, prompt=512, output=128, engine="vllm")
    assert llama.step_overhead_s > 1e-3  # the issue's 5.3 ms of kernel launches per step
    floor_s = resolve_engine("vllm").kernel_overhead_s
    assert floor_s.fitted == "D" and floor_s.value > 0
    assert vllm.step_overhead_s == pytest.approx(floor_s.value * vllm.kernels_per_step)
    assert 0 < vllm.step_overhead_s < llama.step_overhead_s
    for engine in ("sglang", "tensorrt-llm"):  # one floor, shared (ASSUMED in the rule)
        assert resolve_engine(engine).kernel_overhead_s.value == floor_s.value
    assert vllm.kernels_per_step == pytest.approx(0.45 * llama.kernels_per_step)
    assert vllm.itl_s < llama.itl_s
    assert vllm.engine == "vllm" and vllm.kv == "bf16"


def test_per_sequence_cost_grows_the_step_with_the_batch() -> None:
    one = step_model("llama-3.1-8b", "h100-sxm", engine="vllm")
    assert one.machine.sequence_overhead_s == pytest.approx(12.7e-6)
    cost, machine = one.cost, one.machine
    without = machine._replace(sequence_overhead_s=0.0)
    for batch in (1.0, 64.0):
        gap = core.decode_step_seconds(cost, machine, batch, 1024.0) - core.decode_step_seconds(cost, without, batch, 1024.0)
        assert gap == pytest.approx(12.7e-6 * batch)


def test_engine_gemm_efficiency_prices_prefill() -> None:
    """vLLM's GEMMs are priced at the cuBLAS figures (0.75-0.77 of peak), the llama.cpp default at its one flat rate."""
    llama = step_model("llama-3.1-8b", "h100-sxm")
    vllm = step_model("llama-3.1-8b", "h100-sxm", engine="vllm")
    assert llama.machine.gemm_factor_small == llama.machine.gemm_factor_large == 1.0
    assert vllm.efficiency.flops_efficiency == pytest.approx(0.766)
    assert core.gemm_factor(vllm.machine, 4096.0) == pytest.approx(0.751 / 0.766)
    assert vllm.machine.attention_factor == pytest.approx(0.62 / 0.766)
    long_prompt = core.prefill_batch(llama.cost, 1.0, 8192.0)
    assert core.step_seconds(vllm.cost, vllm.machine, long_prompt) < core.step_seconds(llama.cost, llama.machine, long_prompt)
    # an explicit --flops-efficiency is a flat rate: the engine's curve and attention rate step aside
    flat = step_model("llama-3.1-8b", "h100-sxm", engine="vllm", flops_efficiency=0.5)
    assert flat.machine.gemm_factor_small == flat.machine.gemm_factor_large == flat.machine.attention_factor == 1.0


def test_fp8_weights_run_the_engines_fp8_gemm_curve_and_attention_stays_at_the_bf16_peak() -> None:
    """FP8 GEMMs reach a smaller fraction of their (doubled) peak than bf16 GEMMs (the profiles' cited fp8 curves),
    and attention runs on the bf16 tensor cores whatever the weights: its rate is the same for both."""
    bf16 = step_model("llama-3.1-70b", "h100-sxm", engine="vllm", weights="bf16")
    fp8 = step_model("llama-3.1-70b", "h100-sxm", engine="vllm", weights="fp8")
    curve = catalog_engine("vllm").fp8_gemm_efficiency.value
    assert fp8.efficiency.flops_efficiency == pytest.approx(max(e for _, e in curve))
    assert bf16.efficiency.flops_efficiency == pytest.approx(0.766)  # the bf16 curve, unchanged
    for tokens in (512.0, 4096.0):
        fp8_rate = fp8.machine.flops * core.gemm_factor(fp8.machine, tokens)
        bf16_rate = bf16.machine.flops * core.gemm_factor(bf16.machine, tokens)
        assert 1.0 < fp8_rate / bf16_rate < 1.6  # fp8 GEMMs are faster, but well short of 2x
    attention = [m.machine.flops * m.machine.attention_factor for m in (bf16, fp8)]
    assert attention[1] == pytest.approx(attention[0]) == pytest.approx(0.62 * resolve_hardware("h100-sxm").peak_flops("bf16"))
    # an engine without an fp8 curve prices fp8 GEMMs on its one curve
    llama = step_model("llama-3.1-70b", "h100-sxm", engine="llama.cpp", weights="fp8")
    assert catalog_engine("llama-cpp-cuda").fp8_gemm_efficiency is None
    assert llama.efficiency.flops_efficiency == pytest.approx(catalog_engine("llama-cpp-cuda").gemm_points[0][1])


def test_default_llama_cpp_on_an_nvidia_gpu_prices_gemms_at_the_fitted_efficiency() -> None:
    """llama.cpp's CUDA and Metal GEMM efficiencies are fold-A fits (benchmarks/accuracy/score.py checks them): the
    default engine on an NVIDIA GPU or an Apple chip prices prefill with its own; vLLM keeps its cited cuBLAS curve,
    other backends (ROCm) the kind's fraction."""
    cuda = catalog_engine("llama-cpp-cuda")
    (tokens, fitted), = cuda.gemm_points  # one point: a flat rate
    assert 0 < fitted < default_efficiency(resolve_hardware("h100-pcie")).flops_efficiency
    assert cuda.gemm_efficiency.fitted == "A" and cuda.gemm_efficiency.source is None
    default = estimate("llama-3.1-8b", "h100-pcie", weights="q4_k_m", prompt=512)
    assert default.engine == "llama-cpp-cuda" and default.flops_efficiency == pytest.approx(fitted)
    model = step_model("llama-3.1-8b", "h100-pcie", weights="q4_k_m", prompt=512)
    assert model.machine.gemm_factor_small == model.machine.gemm_factor_large == model.machine.attention_factor == 1.0
    assert model.machine.flops == pytest.approx(fitted * model.peak_flops)
    # prefill is compute-bound at 512 tokens: its time scales with 1 / the GEMM rate; decode is memory-bound, unchanged
    kind = estimate("llama-3.1-8b", "h100-pcie", weights="q4_k_m", prompt=512, flops_efficiency=0.60)
    assert default.ttft_s > kind.ttft_s and default.itl_s == pytest.approx(kind.itl_s, rel=1e-12)
    vllm = estimate("llama-3.1-8b", "h100-pcie", weights="q4_k_m", prompt=512, engine="vllm")
    assert vllm.flops_efficiency == pytest.approx(0.766) and vllm.ttft_s < default.ttft_s
    for engine in ("sglang", "tensorrt-llm"):
        assert estimate("llama-3.1-8b", "h100-pcie", engine=engine).flops_efficiency == pytest.approx(0.766)
    rocm = estimate("llama-3.1-8b", "mi300x", weights="q4_k_m", prompt=512)
    assert rocm.engine == "llama-cpp-rocm" and rocm.flops_efficiency == default_efficiency(resolve_hardware("mi300x")).flops_efficiency
    apple = next(k for k in ("m2-ultra", "m1-max", "m3-max") if _exists(k))
    metal = estimate("llama-3.1-8b", apple, weights="q4_k_m", prompt=512)
    metal_profile = catalog_engine("llama-cpp-metal")
    (_, metal_fitted), = metal_profile.gemm_points
    assert metal_profile.gemm_efficiency.fitted == "A" and metal_fitted != default_efficiency(resolve_hardware(apple)).flops_efficiency
    assert metal.engine == "llama-cpp-metal" and metal.flops_efficiency == pytest.approx(metal_fitted)
    ideal = estimate("llama-3.1-8b", "h100-pcie", weights="q4_k_m", prompt=512, ideal=True)
    assert ideal.flops_efficiency == 1.0
    assert ideal.ttft_s == estimate("llama-3.1-8b", "h100-pcie", weights="q4_k_m", prompt=512, ideal=True, engine="vllm").ttft_s


def test_llama_cpp_cuda_runs_f16_and_dequantized_gemms_at_a_geforce_cards_fp16_accumulate_rate() -> None:
    """llama.cpp's cuBLAS GEMMs accumulate in fp16 (ggml-cuda.cu): on a GeForce card, which lists that rate at twice
    its fp16-with-fp32-accumulate rate, f16 and quantized weights run at it; bf16 weights, other engines, other cards
    (no such column: the same rate), --compute and --ideal keep the weights' compute dtype."""
    card = resolve_hardware("rtx-4090")
    assert card.flops["fp16_acc16"] == pytest.approx(2 * card.flops["fp16"], rel=1e-3)  # 330.3 vs 165.2
    for weights in ("q4_k_m", "f16", "q8_0"):
        model = step_model("llama-3.1-8b", "rtx-4090", weights=weights)
        assert model.compute_dtype == "fp16_acc16" and model.peak_flops == card.flops["fp16_acc16"]
    assert step_model("llama-3.1-8b", "rtx-4090", weights="bf16").peak_flops == card.flops["bf16"]
    assert step_model("llama-3.1-8b", "rtx-4090", weights="q4_k_m", engine="vllm").peak_flops == card.flops["bf16"]
    assert step_model("llama-3.1-8b", "rtx-4090", weights="q4_k_m", compute="fp16").peak_flops == card.flops["fp16"]
    assert step_model("llama-3.1-8b", "rtx-4090", weights="q4_k_m", ideal=True).peak_flops == card.flops["bf16"]
    h100 = step_model("llama-3.1-8b", "h100-pcie", weights="q4_k_m")
    assert h100.compute_dtype == "bf16" and h100.peak_flops == resolve_hardware("h100-pcie").flops["bf16"]
    # twice the peak at the same fitted fraction: a compute-bound prefill takes less time, decode is unchanged
    fast = estimate("llama-3.1-8b", "rtx-4090", weights="q4_k_m", prompt=2048)
    slow = estimate("llama-3.1-8b", "rtx-4090", weights="q4_k_m", prompt=2048, compute="fp16")
    assert fast.ttft_s < 0.75 * slow.ttft_s and fast.itl_s == pytest.approx(slow.itl_s, rel=1e-9)


def test_early_2024_llama_cpp_cuda_converts_quantized_weights_to_fp16_before_large_gemms() -> None:
    """llama.cpp CUDA builds before PR #8075 (cited in engines.toml): a step of more than 32 tokens first converts
    each quantized matrix to fp16 (reads it, writes 2 bytes per weight) in a kernel of its own; f16 weights and steps
    of at most 32 tokens pay nothing, and the late-2025 profile never does."""
    early = catalog_engine("llama-cpp-cuda-2024")
    assert early.dequantize_gemm_tokens.value == 32 and "8075" in early.dequantize_gemm_tokens.source
    assert catalog_engine("llama-cpp-cuda").dequantize_gemm_tokens is None
    assert early.gemm_points == catalog_engine("llama-cpp-cuda").gemm_points  # the same cuBLAS fp16 rate
    model = step_model("llama-2-7b", "rtx-3090", weights="q4_0", engine="llama-cpp-cuda-2024")
    stored = model.cost.dense_bytes + model.cost.n_experts * model.cost.expert_bytes
    expected = (stored + stored * 16 / model.weight_bits) / model.machine.bandwidth_Bps
    assert model.machine.dequantize_s == pytest.approx(expected, rel=1e-12) and model.machine.dequantize_tokens == 32
    assert 16e9 < stored + stored * 16 / model.weight_bits < 17e9  # 3.6 GB of q4_0 read, 13.0 GB of fp16 written

    def ttft(engine: str, weights: str | float, prompt: int) -> float:
        return estimate("llama-2-7b", "rtx-3090", weights=weights, prompt=prompt, output=1, engine=engine).ttft_s

    assert ttft("llama-cpp-cuda-2024", "q4_0", 512) - ttft("llama-cpp-cuda", "q4_0", 512) == pytest.approx(expected, rel=1e-9)
    assert ttft("llama-cpp-cuda-2024", "q4_0", 32) == ttft("llama-cpp-cuda", "q4_0", 32)
    shown = estimate("llama-2-7b", "rtx-3090", weights="q4_0", prompt=512, engine="llama-cpp-cuda-2024")
    assert shown.ttft_dequantize_s == pytest.approx(expected, rel=1e-12)  # what the TTFT row explains
    assert estimate("llama-2-7b", "rtx-3090", weights="q4_0", prompt=32, engine="llama-cpp-cuda-2024").ttft_dequantize_s == 0
    assert estimate("llama-2-7b", "rtx-3090", weights="q4_0", prompt=512).ttft_dequantize_s == 0
    assert ttft("llama-cpp-cuda-2024", "f16", 512) == ttft("llama-cpp-cuda", "f16", 512)
    # weights given as a file's bits per parameter: an f16 file (a little under 16) is not converted, a q4_0 file is
    assert ttft("llama-cpp-cuda-2024", 15.998, 512) == ttft("llama-cpp-cuda", 15.998, 512)
    assert ttft("llama-cpp-cuda-2024", 4.54, 512) > ttft("llama-cpp-cuda", 4.54, 512)
    decode = estimate("llama-2-7b", "rtx-3090", weights="q4_0", engine="llama-cpp-cuda-2024", batch=32)
    assert decode.itl_s == estimate("llama-2-7b", "rtx-3090", weights="q4_0", engine="llama-cpp-cuda", batch=32).itl_s


def test_the_weight_conversion_is_priced_alike_on_every_path() -> None:
    """`core.dequantize_seconds` on arrays equals it on scalars, and a pipeline of one stage prices it as one device."""
    machine = step_model("llama-2-7b", "rtx-3090", weights="q4_0", engine="llama-cpp-cuda-2024").machine
    tokens = np.array([1.0, 32.0, 33.0, 512.0])
    assert list(core.dequantize_seconds(machine, tokens)) == [core.dequantize_seconds(machine, float(t)) for t in tokens]
    assert core.dequantize_seconds(machine, 33.0) == machine.dequantize_s > 0
    model = step_model("llama-2-7b", "rtx-3090", weights="q4_0", engine="llama-cpp-cuda-2024")
    step = core.StepBatch(prefill_sequences=1.0, prefill_tokens=512.0, prefill_context=512.0,
                          prefill_pairs=float(core.causal_pairs(512.0)))
    fast = core.step_seconds(model.cost, model.machine, step)
    general = core.micro_step_seconds(model.cost, model.machine, step)[0]
    assert fast == pytest.approx(general, rel=1e-12)


def test_critical_batch_with_a_token_dependent_gemm_rate_is_the_first_compute_bound_batch() -> None:
    step = step_model("llama-3.1-8b", "h100-sxm", engine="vllm")
    machine = step.machine._replace(gemm_tokens_small=16.0, gemm_factor_small=0.3, gemm_tokens_large=1024.0)
    found = float(core.critical_batch(step.cost, machine, 64.0))
    assert math.isfinite(found)

    def bound(batch: float) -> bool:
        work = core.decode_batch(step.cost, batch, 64.0)
        memory_s, compute_s = core.roofline_seconds(core.step_bytes(step.cost, work), core.priced_flops(step.cost, machine, work), machine)
        return compute_s >= memory_s

    assert bound(found) and not bound(found - 1)


def test_engine_must_run_on_the_device() -> None:
    with pytest.raises(SpeedlimitError, match="runs on gpu"):
        estimate("llama-3.1-8b", "m2-ultra" if _exists("m2-ultra") else "m1-max", engine="vllm")


@pytest.mark.parametrize("command", [
    ["estimate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "vllm", "--json"],
    ["sweep", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "sglang", "--batch", "1,8"],
    ["simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "tensorrt-llm", "--requests", "8",
     "--concurrency", "4", "--json"],
])
def test_cli_accepts_engine(command: list[str]) -> None:
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", [
    ["estimate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "warp"],
    ["sweep", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "warp"],
    ["simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "warp", "--requests", "2"],
])
def test_cli_unknown_engine_is_one_line_and_exit_2(command: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "speedlimit.cli", *command], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown --engine" in lines[0] and "vllm" in lines[0]


def test_estimate_json_names_the_engine() -> None:
    result = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--engine", "vllm", "--json"])
    data = json.loads(result.output)
    floor_s = resolve_engine("vllm").kernel_overhead_s.value  # per fused kernel under CUDA graphs (fold D)
    assert data["engine"] == "vllm" and data["sequence_overhead_s"] > 0
    assert data["step_overhead_s"] == pytest.approx(floor_s * data["kernels_per_step"])


def test_simulate_takes_the_scheduler_from_the_profile() -> None:
    from speedlimit.simulator.api import simulate

    vllm = simulate("llama-3.1-8b", "h100-sxm", engine="vllm", concurrency=2, requests=4).summary.engine
    assert (vllm["engine"], vllm["max_seqs"], vllm["max_batched_tokens"], vllm["chunked_prefill"]) == ("vllm", 1024, 8192, True)
    trt = simulate("llama-3.1-8b", "h100-sxm", engine="tensorrt-llm", concurrency=2, requests=4).summary.engine
    assert (trt["max_seqs"], trt["max_batched_tokens"], trt["chunked_prefill"]) == (2048, 8192, False)
    lcp = simulate("llama-3.1-8b", "h100-sxm", engine="llama-cpp-python", concurrency=2, requests=4).summary.engine
    assert (lcp["mode"], lcp["max_seqs"], lcp["max_batched_tokens"]) == ("serial", 1, 512)
    default = simulate("llama-3.1-8b", "h100-sxm", concurrency=2, requests=4).summary.engine
    assert (default["engine"], default["max_seqs"], default["max_batched_tokens"]) == ("llama-cpp-cuda", 4, 2048)
    # explicit knobs override the profile
    override = simulate("llama-3.1-8b", "h100-sxm", engine="vllm", max_seqs=8, chunked_prefill=False,
                        concurrency=2, requests=4).summary.engine
    assert (override["max_seqs"], override["max_batched_tokens"], override["chunked_prefill"]) == (8, 8192, False)
    # the spelling from before profiles: a generic scheduler
    legacy = simulate("llama-3.1-8b", "h100-sxm", engine="continuous", concurrency=2, requests=4).summary.engine
    assert (legacy["max_seqs"], legacy["max_batched_tokens"]) == (256, 8192)


def test_simulate_engine_changes_tpot_in_the_expected_direction() -> None:
    from speedlimit.simulator.api import simulate

    common = dict(concurrency=1, requests=4, prompt_tokens=128, output_tokens=32)
    llama = simulate("llama-3.1-70b", "h100-sxm", tp=4, max_seqs=1, **common).summary
    vllm = simulate("llama-3.1-70b", "h100-sxm", tp=4, engine="vllm", max_seqs=1, **common).summary
    assert vllm.tpot_s.mean < llama.tpot_s.mean


def test_web_api_accepts_engine() -> None:
    fastapi = pytest.importorskip("fastapi")  # noqa: F841
    from fastapi.testclient import TestClient

    from speedlimit.web.app import create_app

    client = TestClient(create_app())
    body = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "vllm"}
    response = client.post("/api/estimate", json=body)
    assert response.status_code == 200 and response.json()["engine"] == "vllm"
    assert client.post("/api/curve", json=body).status_code == 200
    bad = client.post("/api/estimate", json={**body, "engine": "warp"})
    assert bad.status_code == 422 and "unknown" in bad.json()["detail"] and "vllm" in bad.json()["detail"]
    # no kv in the body (the page's "engine default"): the engine's own default for these weights
    trt = client.post("/api/estimate", json={**body, "engine": "tensorrt-llm", "weights": "fp8"}).json()
    assert trt["kv"] == "fp8"
    engines = client.get("/api/engines").json()
    assert {e["name"] for e in engines} >= set(ISSUE_ENGINES)
    assert all(v["source"] or v["fitted"] for e in engines for v in e["values"].values())


def test_profile_validation_rejects_bad_values() -> None:
    base = dict(catalog_engine("vllm").model_dump())
    base["max_seqs"] = {"value": 0, "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="whole number"):
        EngineProfile.model_validate(base)
    base = dict(catalog_engine("vllm").model_dump())
    base["dequantize_gemm_tokens"] = {"value": 0.5, "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="whole number"):
        EngineProfile.model_validate(base)


def test_gemm_curve_has_at_most_two_anchors() -> None:
    base = dict(catalog_engine("vllm").model_dump())
    base["gemm_efficiency"] = {"value": [[1, 0.1], [2, 0.2], [3, 0.3]], "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="two"):
        EngineProfile.model_validate(base)


def test_tensorrt_llm_runs_fp8_weights_with_an_fp8_kv_cache() -> None:
    """NVIDIA's recommended TensorRT-LLM config for its FP8 checkpoints sets an fp8 KV cache (engines.toml
    fp8_weights_kv): half the KV bytes per token of bf16 weights' cache, so twice the sequences fit."""
    fp8 = estimate("llama-3.3-70b", "h100-sxm", weights="fp8", engine="tensorrt-llm", tp=2)
    bf16 = estimate("llama-3.3-70b", "h100-sxm", weights="bf16", engine="tensorrt-llm", tp=2)
    assert (fp8.kv, bf16.kv) == ("fp8", "bf16")
    assert fp8.kv_bytes_per_token == pytest.approx(bf16.kv_bytes_per_token / 2)
    # an explicit --kv wins; engines without the rule keep their one default
    assert estimate("llama-3.3-70b", "h100-sxm", weights="fp8", engine="tensorrt-llm", tp=2, kv="bf16").kv == "bf16"
    assert estimate("llama-3.3-70b", "h100-sxm", weights="fp8", engine="vllm", tp=2).kv == "bf16"
    assert estimate("llama-3.1-8b", "h100-sxm", weights="q4_k_m").kv == "fp16"
    # one format per group: the rule applies only when every group computes in fp8
    mixed = estimate("llama-3.1-8b", "h100-sxm", weights="attention=bf16,default=fp8", engine="tensorrt-llm")
    assert mixed.kv == "bf16"


def test_simulate_takes_the_kv_format_from_the_engine_as_estimate_does() -> None:
    from speedlimit.simulator.api import simulate

    run = simulate("llama-3.3-70b", "h100-sxm", weights="fp8", tp=2, engine="tensorrt-llm", concurrency=2, requests=2,
                   prompt_tokens=64, output_tokens=4)
    assert run.summary.engine["kv"] == "fp8"
    fp16 = simulate("llama-3.3-70b", "h100-sxm", weights="fp8", tp=2, engine="tensorrt-llm", kv="fp16", concurrency=2,
                    requests=2, prompt_tokens=64, output_tokens=4)
    assert fp16.summary.engine["kv"] == "fp16"
    assert run.summary.engine["kv_capacity_tokens"] == pytest.approx(2 * fp16.summary.engine["kv_capacity_tokens"], rel=0.01)


def test_profile_kv_formats_must_be_names() -> None:
    base = dict(catalog_engine("tensorrt-llm").model_dump())
    base["fp8_weights_kv"] = {"value": 8, "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="KV format name"):
        EngineProfile.model_validate(base)


# versioned profiles: an older engine build, its own measured or fitted values over its base's
# (versioned profile -> its base, and the version its sourced values must name)
VERSIONED = {"sglang-0.4": ("sglang", "0.4"), "llama-cpp-cpu-b3441": ("llama-cpp-cpu", "3441"), "vllm-0.7": ("vllm", "0.7"),
             "llama-cpp-cuda-2024": ("llama-cpp-cuda", "8075")}


@pytest.mark.parametrize("key", sorted(VERSIONED))
def test_a_versioned_profile_keeps_its_base_except_what_it_states(key: str) -> None:
    import tomllib
    from importlib import resources

    raw = tomllib.loads(resources.files("speedlimit.catalog").joinpath("engines.toml").read_text(encoding="utf-8"))
    base_key, version = VERSIONED[key]
    base, versioned = catalog_engine(base_key), catalog_engine(key)
    assert raw[key]["inherits"] == base_key and versioned.version != base.version
    stated = set(raw[key]) - {"name", "aliases", "version", "homepage", "devices", "inherits"}
    assert stated
    for field, sourced in versioned.sourced_values().items():
        if field in stated:  # fitted for that version, or a source about that version
            assert sourced.fitted in ("C", "D") or version in sourced.source, field
    for field, sourced in base.sourced_values().items():
        if field not in stated:
            assert versioned.sourced_values()[field] == sourced, field


def test_early_sglang_prices_decode_steps_above_its_kernel_floor() -> None:
    """SGLang 0.4's fitted per-kernel latency floor: a DeepSeek-V3 batch-1 step costs kernels x floor more than the
    late-2025 profile's, and the batch adds the same weight traffic to both."""
    early, late = catalog_engine("sglang-0.4"), catalog_engine("sglang")
    arch = resolve_model("deepseek-v3")
    # llama.cpp's count at the profile's fraction, plus one activation-quant launch per fp8 linear
    kernels = arch.decode_kernels * early.kernel_fraction.value + arch.decode_linears
    runs = [estimate("deepseek-v3", "h200", weights="fp8", tp=8, batch=1, prompt=128, output=256, engine=e)
            for e in (early, late)]
    one = [run.itl_s for run in runs]
    assert runs[0].kernels_per_step == pytest.approx(kernels)
    floors = kernels * early.kernel_overhead_s.value - runs[1].kernels_per_step * late.kernel_overhead_s.value
    assert one[0] - one[1] == pytest.approx(floors, rel=1e-6)
    assert 0.02 < one[0] < 0.05  # ~30 ms, as SGLang v0.4.1.post2 ran it (fold D), where the late profile prices ~6 ms


def test_early_engines_launch_an_activation_quant_kernel_per_fp8_linear() -> None:
    """vLLM 0.7 and SGLang 0.4 quantize each block-fp8 linear's activations in a kernel of their own: DeepSeek-R1 runs
    4 attention linears (MLA with a query LoRA, kv_b absorbed), 2 MLP or fused-MoE GEMMs and 2 shared-expert linears
    in its 58 MoE layers, 482 a step; the launches count only for fp8 weights and only on the profiles that state it."""
    r1, lite, llama = (resolve_model(m) for m in ("deepseek-r1", "deepseek-coder-v2-lite", "llama-3.1-8b"))
    assert r1.decode_linears == 61 * (4 + 2) + 58 * 2 == 482
    assert lite.decode_linears == 27 * (3 + 2) + 26 * 2  # no query LoRA: one q_proj
    assert llama.decode_linears == 32 * (2 + 2)  # fused qkv and o, gate_up and down
    for key in ("vllm-0.7", "vllm-0.7-rocm", "sglang-0.4", "sglang-0.4-rocm"):
        early = catalog_engine(key)
        base = r1.decode_kernels * early.kernel_fraction.value
        assert early.decode_kernels(r1.decode_kernels, r1.decode_linears, "fp8") == base + 482
        assert early.decode_kernels(r1.decode_kernels, r1.decode_linears, "bf16") == base
        fp8 = estimate("deepseek-r1", "h200", weights="fp8", tp=8, engine=key)
        assert fp8.kernels_per_step == base + 482
        assert estimate("deepseek-r1", "h200", weights="bf16", tp=8, engine=key).kernels_per_step == base
    late = catalog_engine("vllm")
    assert late.decode_kernels(r1.decode_kernels, r1.decode_linears, "fp8") == r1.decode_kernels * late.kernel_fraction.value
    # late SGLang (0.5.x) runs the same two launches on every block-fp8 backend; late vLLM's is not counted
    sglang = catalog_engine("sglang")
    assert sglang.decode_kernels(r1.decode_kernels, r1.decode_linears, "fp8") == \
        r1.decode_kernels * sglang.kernel_fraction.value + 482
    assert sglang.decode_kernels(llama.decode_kernels, llama.decode_linears, "bf16") == \
        llama.decode_kernels * sglang.kernel_fraction.value


def test_early_vllm_prices_a_kernel_floor_and_a_cost_per_running_sequence() -> None:
    """vLLM 0.7's fitted step costs (fold D) over the late-2025 V1 profile: kernels x floor more per step, and each
    running sequence costs its fitted figure instead of V1's host bookkeeping."""
    early, late = catalog_engine("vllm-0.7"), catalog_engine("vllm")
    arch = resolve_model("deepseek-r1")
    kernels = arch.decode_kernels * early.kernel_fraction.value + arch.decode_linears
    for batch in (1, 32):
        runs = [estimate("deepseek-r1", "h200", weights="fp8", tp=8, batch=batch, prompt=3200, output=800, engine=e)
                for e in (early, late)]
        itl = [run.itl_s for run in runs]
        assert runs[0].kernels_per_step == pytest.approx(kernels)
        extra = (kernels * early.kernel_overhead_s.value - runs[1].kernels_per_step * late.kernel_overhead_s.value
                 + batch * (early.sequence_overhead_s.value - late.sequence_overhead_s.value))
        assert itl[0] - itl[1] == pytest.approx(extra, rel=1e-6)
    assert early.chunked_prefill.value is False and early.prefix_caching.value is False  # forced off with MLA in V0


@pytest.mark.parametrize("key", ["vllm-0.7", "sglang-0.4"])
def test_early_engines_price_the_routed_experts_at_their_fused_moe_rate(key: str) -> None:
    """vLLM 0.7 and SGLang 0.4 ran DeepSeek's FP8 experts in the Triton fused-MoE kernel at about 3% of the fp8 peak
    (engines.toml fp8_moe_gemm_efficiency, vllm PR #13932): a step's expert FLOPs are priced at that rate and the rest
    of its matmuls on the fp8 GEMM curve, so a long prompt's prefill is several times the late profile's."""
    import numpy as np

    early = step_model("deepseek-r1", "h200", weights="fp8", tp=8, engine=key)
    fraction = catalog_engine(key).fp8_moe_gemm_efficiency.value
    assert early.machine.flops * early.machine.moe_factor == pytest.approx(fraction * resolve_hardware("h200").peak_flops("fp8"))
    arch = resolve_model("deepseek-r1")
    expert_per_token = early.cost.expert_matmul_flops_per_token
    assert expert_per_token == pytest.approx(2 * arch.experts_per_token * arch.expert_params)
    assert 0 < expert_per_token < early.cost.matmul_flops_per_token  # the routed experts are part of the matmuls
    step = core.prefill_batch(early.cost, 1, 4096)
    on_curve = core.priced_flops(early.cost, early.machine._replace(moe_factor=math.nan), step)
    # off the fused rate, each expert's GEMM is priced at the tokens routed to it (4096 · 8 over ~256 experts)
    per_expert = core.gemm_factor(early.machine, core.expert_gemm_tokens(early.cost, 4096))
    extra = 4096 * expert_per_token * (1 / early.machine.moe_factor - 1 / per_expert)
    assert core.priced_flops(early.cost, early.machine, step) - on_curve == pytest.approx(extra, rel=1e-9)
    # vectorized: a machine array that mixes the two rates prices each element as the scalar path does
    mixed = early.machine._replace(moe_factor=np.array([early.machine.moe_factor, math.nan]))
    assert core.priced_flops(early.cost, mixed, step) == pytest.approx(
        [core.priced_flops(early.cost, early.machine, step), on_curve], rel=1e-12)
    late = {"vllm-0.7": "vllm", "sglang-0.4": "sglang"}[key]
    ttft = [estimate("deepseek-r1", "h200", weights="fp8", tp=8, prompt=3200, output=8, engine=e).ttft_s for e in (key, late)]
    assert ttft[0] > 3 * ttft[1]
    # only fp8 weights (the kernel the source times), and only the profiles that state it
    assert math.isnan(step_model("deepseek-r1", "h200", weights="bf16", tp=8, engine=key).machine.moe_factor)
    assert math.isnan(step_model("deepseek-r1", "h200", weights="fp8", tp=8, engine=late).machine.moe_factor)
    # an explicit --flops-efficiency is one flat rate for every matmul
    assert math.isnan(step_model("deepseek-r1", "h200", weights="fp8", tp=8, engine=key, flops_efficiency=0.5).machine.moe_factor)


@pytest.mark.parametrize("key", ["vllm-0.7", "sglang-0.4"])
def test_early_engines_read_the_routed_experts_at_their_fused_moe_rate_from_100_tokens(key: str) -> None:
    """The same kernel streams the experts' weights at 0.243 of the spec bandwidth where the source's table measured
    it and fold D places it (engines.toml fp8_moe_bandwidth_efficiency, from 100 tokens in the MoE layers): those bytes
    are priced at bw_efficiency / 0.243 times their count, the bytes reported stay the bytes read, and below 100 tokens
    nothing changes."""
    profile = catalog_engine(key)
    early = step_model("deepseek-r1", "h200", weights="fp8", tp=8, engine=key)
    rate, tokens = profile.moe_bandwidth_efficiency_for("fp8")
    assert (rate, tokens) == (profile.fp8_moe_bandwidth_efficiency.value, profile.fp8_moe_bandwidth_tokens.value) == (0.243, 100)
    bw_efficiency = early.machine.bandwidth_Bps / resolve_hardware("h200").memory_bandwidth_Bps
    assert early.machine.moe_bytes_factor == pytest.approx(bw_efficiency / rate)
    plain = early.machine._replace(moe_bytes_factor=1.0)
    for batch, priced in ((99, False), (100, True), (128, True), (512, True)):
        step = core.decode_batch(early.cost, batch, 3000.0)
        experts = core.experts_read_bytes(early.cost, float(batch))
        extra = (early.machine.moe_bytes_factor - 1) * experts if priced else 0.0
        assert core.priced_bytes(early.cost, early.machine, step) == pytest.approx(core.step_bytes(early.cost, step) + extra, rel=1e-12)
        memory_s, _ = core.step_roofline(early.cost, early.machine, step)
        plain_s, _ = core.step_roofline(early.cost, plain, step)
        assert memory_s - plain_s == pytest.approx(extra / (8 * early.machine.bandwidth_Bps), rel=1e-9)
    # reported bytes are the bytes read, whatever the rate
    result = estimate("deepseek-r1", "h200", weights="fp8", tp=8, batch=256, prompt=3000, output=200, engine=key)
    machine = step_model("deepseek-r1", "h200", weights="fp8", tp=8, engine=key).machine._replace(moe_bytes_factor=1.0)
    assert result.itl_s > core.mean_decode_step_seconds(early.cost, machine, 256, 3000, 3200)
    # only fp8 weights, only the profiles that state it, not under an explicit --bw-efficiency
    late = {"vllm-0.7": "vllm", "sglang-0.4": "sglang"}[key]
    assert step_model("deepseek-r1", "h200", weights="bf16", tp=8, engine=key).machine.moe_bytes_factor == 1.0
    assert step_model("deepseek-r1", "h200", weights="fp8", tp=8, engine=late).machine.moe_bytes_factor == 1.0
    assert step_model("deepseek-r1", "h200", weights="fp8", tp=8, engine=key, bw_efficiency=0.5).machine.moe_bytes_factor == 1.0


def test_a_lockstep_step_prices_the_experts_reads_at_the_groups_tokens() -> None:
    """Expert-sharing replicas: the MoE layers see every replica's tokens, so 16 replicas of 8 tokens (128 in all)
    read the experts at the fused-MoE rate, as the estimate's symmetric step of the group does; 12 of them (96, below
    the rate's 100 tokens) do not."""
    step = step_model("deepseek-r1", "h200", weights="fp8", tp=1, dp=16, ep=16, engine="sglang-0.4")
    one = core.decode_batch(step.cost, 8, 3000.0)
    group = core.StepBatch(*(16 * v for v in one))
    assert core.lockstep_step_seconds(step.cost, step.machine, [one] * 16) == pytest.approx(
        core.step_seconds(step.cost, step.machine, group), rel=1e-12)
    plain = step.machine._replace(moe_bytes_factor=1.0)
    assert core.lockstep_step_seconds(step.cost, step.machine, [one] * 16) > core.lockstep_step_seconds(step.cost, plain, [one] * 16)
    assert step.machine.moe_bytes_tokens == 100
    assert core.lockstep_step_seconds(step.cost, step.machine, [one] * 13) > core.lockstep_step_seconds(step.cost, plain, [one] * 13)
    assert core.lockstep_step_seconds(step.cost, step.machine, [one] * 12) == core.lockstep_step_seconds(step.cost, plain, [one] * 12)


def test_fused_moe_bandwidth_fields_are_checked() -> None:
    base = dict(catalog_engine("sglang-0.4").model_dump())
    for field, bad in (("fp8_moe_bandwidth_efficiency", 0.0), ("fp8_moe_bandwidth_tokens", 0), ("fp8_moe_bandwidth_tokens", 1.5)):
        with pytest.raises(ValueError):
            EngineProfile.model_validate({**base, field: {"value": bad, "source": "https://example.org/x"}})


def test_fused_moe_efficiency_must_be_a_fraction() -> None:
    base = dict(catalog_engine("sglang-0.4").model_dump())
    base["fp8_moe_gemm_efficiency"] = {"value": 1.5, "source": "https://example.org/x"}
    with pytest.raises(ValueError, match="fraction"):
        EngineProfile.model_validate(base)


def test_mlx_prices_its_own_kernels_on_apple_silicon() -> None:
    """[mlx]: MLX's per-kernel cost and kernel count replace llama.cpp Metal's; bandwidth stays the Apple kind's."""
    from speedlimit.catalog import efficiency_defaults

    mlx = catalog_engine("mlx")
    assert resolve_engine("mlx-lm").key == resolve_engine("mlx_lm.server").key == "mlx"
    mine = estimate("llama-3.1-8b", "apple-m4-max", weights="int4", prompt=16, output=256, engine="mlx")
    metal = estimate("llama-3.1-8b", "apple-m4-max", weights="int4", prompt=16, output=256)
    kernels = metal.kernels_per_step
    assert mine.kernels_per_step == pytest.approx(kernels * mlx.kernel_fraction.value)
    apple = efficiency_defaults()["apple"]["kernel_overhead_s"]
    # the two steps read the same bytes at the same bandwidth: they differ by the kernel terms alone
    assert metal.itl_s - mine.itl_s == pytest.approx(
        kernels * (apple - mlx.kernel_fraction.value * mlx.kernel_overhead_s.value), rel=1e-9)
    assert mine.decode_tok_s > metal.decode_tok_s
    # MLX runs on Apple silicon (or a custom device), not on an NVIDIA GPU
    with pytest.raises(SpeedlimitError, match="--engine mlx runs on apple, custom devices"):
        estimate("llama-3.1-8b", "h100-sxm", engine="mlx")
