"""The roofline core against brute force: exact mean over a growing context, critical batch, capacity."""

import math

import numpy as np
import pytest

from speedlimit.catalog import catalog_hardware, catalog_model, default_efficiency
from speedlimit.estimator import core
from speedlimit.estimator.api import cost_model, machine_for
from speedlimit.precision import parse_precision


def _setup(model="gemma-2-9b", hardware="h100-sxm", weights="bf16"):
    arch = catalog_model(model)
    device = catalog_hardware(hardware)
    cost, _ = cost_model(arch, parse_precision(weights), parse_precision("fp16"))
    return cost, machine_for(device, default_efficiency(device), "bf16", 1, ideal=False)


@pytest.mark.parametrize(("model", "batch", "start", "end"), [
    ("gemma-2-9b", 1, 100, 9000),  # crosses the 4096 sliding window
    ("gemma-2-9b", 512, 10, 6000),  # compute-bound part, then KV-bound
    ("llama-3.1-8b", 64, 0, 3000),
    ("deepseek-v3", 256, 1000, 1300),
])  # fmt: skip
def test_mean_step_is_exact_average_over_context(model, batch, start, end):
    cost, machine = _setup(model)
    contexts = np.linspace(start, end, 200_001)
    brute = float(np.mean(core.decode_step_seconds(cost, machine, batch, contexts)))
    assert float(core.mean_decode_step_seconds(cost, machine, batch, start, end)) == pytest.approx(brute, rel=1e-6)


def test_critical_batch_is_the_crossover():
    cost, machine = _setup("llama-3.1-8b")
    context = 64.0
    b_star = float(core.critical_batch(cost, machine, context))
    assert math.isfinite(b_star)

    def bound(b):
        memory_s, compute_s = core.roofline_seconds(core.decode_bytes(cost, b, context), core.decode_flops(cost, b, context), machine)
        return compute_s >= memory_s

    assert bound(b_star) and not bound(b_star - 1)


def test_critical_batch_infinite_when_kv_dominates():
    cost, machine = _setup("llama-3.1-8b")
    assert math.isinf(float(core.critical_batch(cost, machine, 100_000.0)))


def test_expected_experts_read():
    assert float(core.expected_experts_read(8, 2, 1)) == pytest.approx(2.0)
    assert float(core.expected_experts_read(8, 2, 1000)) == pytest.approx(8.0)
    assert float(core.expected_experts_read(0, 0, 50)) == 0.0
    # two tokens: 8 · (1 − (6/8)²)
    assert float(core.expected_experts_read(8, 2, 2)) == pytest.approx(8 * (1 - 0.75**2))


def test_max_batch_fills_memory():
    cost, machine = _setup("llama-3.1-8b")
    context = 4096
    n = float(core.max_batch_that_fits(cost, machine, context))
    used = cost.total_weight_bytes + core.kv_cache_bytes(cost, n, context)
    assert used <= core.usable_memory_bytes(machine) < used + core.kv_bytes_per_sequence(cost, context)


def test_tensor_parallel_splits_work_and_adds_communication():
    arch = catalog_model("llama-3.1-70b")
    device = catalog_hardware("h100-sxm")
    cost, _ = cost_model(arch, parse_precision("bf16"), parse_precision("fp16"))
    one = machine_for(device, default_efficiency(device), "bf16", 1, ideal=False)
    four = machine_for(device, default_efficiency(device), "bf16", 4, ideal=False)
    assert float(core.allreduce_seconds(cost, one, 8)) == 0.0
    comm = float(core.allreduce_seconds(cost, four, 8))
    assert comm > 2 * arch.n_layers * core.allreduce_latency_s(4)
    t1 = float(core.decode_step_seconds(cost, one, 8, 1000))
    t4 = float(core.decode_step_seconds(cost, four, 8, 1000))
    assert t4 < t1 / 2  # memory time quarters, communication is small next to it


def test_a_prefill_pays_the_lm_head_once_per_sequence_not_per_prompt_token():
    arch = catalog_model("llama-3.2-3b")  # tied 128k-vocab head: 0.39 B of its 3.2 B matmul parameters
    cost, _ = cost_model(arch, parse_precision("bf16"), parse_precision("bf16"))
    head = 2.0 * arch.head_params
    assert cost.head_flops_per_sequence == head
    prompt = 512
    assert core.step_matmul_flops(cost, core.prefill_batch(cost, 3, prompt)) == pytest.approx(
        3 * prompt * (cost.matmul_flops_per_token - head) + 3 * head)
    # a decode step still computes logits for every sequence: 2 FLOPs per matmul parameter per token
    assert core.step_matmul_flops(cost, core.decode_batch(cost, 5, 100)) == pytest.approx(5 * cost.matmul_flops_per_token)


def test_a_small_all_reduce_costs_what_the_cited_table_says_by_group_size():
    """SGLang PR #2904's H100 custom all-reduce at 512 bytes: 3.7 / 4.8 / 5.9 us at TP 2 / 4 / 8 (SOURCES.md)."""
    assert core.allreduce_latency_s(1) == 0.0
    assert [core.allreduce_latency_s(tp) for tp in (2, 4, 8)] == pytest.approx([3.7e-6, 4.8e-6, 5.9e-6])
    assert core.allreduce_latency_s(16) == pytest.approx(5.9e-6)  # above the table: its largest group's
    assert 3.7e-6 < core.allreduce_latency_s(3) < 4.8e-6
    vector = core.allreduce_latency_s(np.array([1.0, 2.0, 6.0, 8.0]))
    assert vector[0] == 0.0 and vector[1] == pytest.approx(3.7e-6) and vector[3] == pytest.approx(5.9e-6)
    assert vector[2] == pytest.approx(core.allreduce_latency_s(6))
    assert core.SEND_LATENCY_S == pytest.approx(3.7e-6)


def test_an_expert_multiplies_the_tokens_routed_to_it():
    """k · tokens token-expert products over the expected experts touched (uniform routing), at least 1."""
    cost, _ = _setup("qwen3-30b-a3b")  # 128 experts, top 8
    assert core.expert_gemm_tokens(cost, 1.0) == pytest.approx(1.0)  # one token: k experts, one row each
    touched = core.expected_experts_read(128, 8, 512.0)
    assert core.expert_gemm_tokens(cost, 512.0) == pytest.approx(512 * 8 / touched)
    assert 32.0 < core.expert_gemm_tokens(cost, 512.0) < 33.0  # nearly every expert busy: 4,096 rows over ~128
    tokens = np.array([1.0, 4.0, 512.0, 1e6])
    assert core.expert_gemm_tokens(cost, tokens) == pytest.approx([core.expert_gemm_tokens(cost, float(t)) for t in tokens])
    dense, _ = _setup("llama-3.1-8b")
    assert core.expert_gemm_tokens(dense, 512.0) == 512.0


def test_experts_ride_the_gemm_curve_at_their_own_rows():
    """Without a fused-MoE rate, a step's routed-expert FLOPs are priced at the GEMM rate of the rows each expert
    multiplies (llama.cpp's mul_mat_id runs one GEMM per expert over its rows), its other matmuls at the step's."""
    from speedlimit.estimator.api import step_model

    model = step_model("qwen3-30b-a3b", "amd-ryzen-9-7950x", weights="q4_k_m", engine="llama.cpp-b3441")
    cost, machine = model.cost, model.machine
    assert machine.gemm_factor_small != machine.gemm_factor_large  # the CPU kernel rates' curve
    assert math.isnan(machine.moe_factor)  # build 3441: no matvec expert path cited
    step = core.prefill_batch(cost, 1, 512)
    expert = 512 * cost.expert_matmul_flops_per_token
    rest = core.step_flops(cost, step) - expert
    attention = core.step_attention_flops(cost, step)
    expected = ((rest - attention) / core.gemm_factor(machine, 512.0) + attention / machine.attention_factor
                + expert / core.gemm_factor(machine, core.expert_gemm_tokens(cost, 512.0)))
    assert core.priced_flops(cost, machine, step) == pytest.approx(expected, rel=1e-12)
    # 32 rows an expert are priced slower than the step's 512; one decode token is one row either way
    assert core.priced_flops(cost, machine, step) > (rest - attention + expert) / core.gemm_factor(machine, 512.0)
    one = core.decode_batch(cost, 1.0, 100.0)
    assert core.priced_flops(cost, machine, one) == pytest.approx(
        (core.step_flops(cost, one) - core.step_attention_flops(cost, one)) / core.gemm_factor(machine, 1.0)
        + core.step_attention_flops(cost, one) / machine.attention_factor, rel=1e-12)


def test_late_llama_cpp_cpu_experts_run_at_the_matvec_rate():
    """Late llama.cpp's CPU backend multiplies each routed row by its expert one at a time (repack.cpp
    forward_mul_mat_id: gemv per row), so a type with kernel rates prices its experts at the 1-token rate in every
    step; the dense matmuls keep the curve, and an engine without the flag keeps the experts on it."""
    from speedlimit.estimator.api import step_model

    late = step_model("qwen3-30b-a3b", "amd-ryzen-9-7950x", weights="q4_k_m", engine="llama.cpp")
    cost, machine = late.cost, late.machine
    assert late.engine.expert_matvec.value is True
    assert machine.moe_factor == machine.gemm_factor_small < machine.gemm_factor_large
    step = core.prefill_batch(cost, 1, 512)
    expert = 512 * cost.expert_matmul_flops_per_token
    rest = core.step_flops(cost, step) - expert
    attention = core.step_attention_flops(cost, step)
    # (its attention is a kernel of its own, timed apart: fold C amendment 9)
    assert core.attention_apart(machine)
    assert core.priced_flops(cost, machine, step) == pytest.approx(
        (rest - attention) / machine.gemm_factor_large + expert / machine.gemm_factor_small, rel=1e-12)
    assert core.attention_kernel_seconds(cost, machine, step) == pytest.approx(attention / machine.attention_prefill_flops)
    # the estimate says so (its caption names the experts' rate), and a dense model or build 3441 does not
    from speedlimit.cli.estimate import _caption
    from speedlimit.estimator import estimate

    said = estimate("qwen3-30b-a3b", "amd-ryzen-9-7950x", weights="q4_k_m", engine="llama.cpp")
    assert said.experts_as_matvecs and "the routed experts at its 1-token rate" in _caption(said)
    assert not estimate("llama-3.1-8b", "amd-ryzen-9-7950x", weights="q4_k_m", engine="llama.cpp").experts_as_matvecs
    assert not estimate("qwen3-30b-a3b", "amd-ryzen-9-7950x", weights="q4_k_m", engine="llama.cpp-b3441").experts_as_matvecs
    # a format without measured kernel rates, and a GPU backend, keep the experts where they were
    assert math.isnan(step_model("gpt-oss-20b", "amd-ryzen-9-7950x", weights="experts=fp8,default=q8_0",
                                 engine="llama.cpp").machine.moe_factor)
    assert math.isnan(step_model("qwen3-30b-a3b", "rtx-4090", weights="q4_k_m", engine="llama.cpp").machine.moe_factor)


def test_a_moe_file_with_two_tensor_types_prices_each_at_its_own_kernels():
    """MXFP4_MOE keeps the experts MXFP4 and the rest Q8_0 (fold C amendment 7): the dense matmuls ride q8_0's curve,
    the routed experts mxfp4's 1-token rate, both against one peak; other mixes keep the kind's fraction."""
    from speedlimit.estimator import estimate
    from speedlimit.catalog import resolve_engine, resolve_model
    from speedlimit.estimator.api import kernel_types, step_model
    from speedlimit.precision import parse_weights

    model = step_model("gpt-oss-20b", "amd-ryzen-9-7950x", weights="mxfp4_moe", engine="llama.cpp")
    rate, machine, engine = model.kernel_rate, model.machine, model.engine
    (q8_decode, q8_prefill), (fp4_decode, _) = engine.kernel_rate("q8_0"), engine.kernel_rate("mxfp4")
    assert (rate.tensor_type, rate.expert_type) == ("q8_0", "mxfp4")
    q8_prefill *= rate.prefill_thread_efficiency
    fastest = max(q8_decode, q8_prefill, fp4_decode)
    assert rate.peak_flops == pytest.approx(2.0 * fastest * rate.clock_hz * model.device.topology.cores)
    assert (machine.gemm_factor_small, machine.gemm_factor_large, machine.moe_factor) == pytest.approx(
        (q8_decode / fastest, q8_prefill / fastest, fp4_decode / fastest))
    # priced: the dense matmuls on q8_0's curve, the experts at mxfp4's matvec rate
    cost = model.cost
    step = core.prefill_batch(cost, 1, 512)
    expert = 512 * cost.expert_matmul_flops_per_token
    attention = core.step_attention_flops(cost, step)
    dense = core.step_flops(cost, step) - expert - attention
    assert core.priced_flops(cost, machine, step) == pytest.approx(  # attention timed apart (fold C amendment 9)
        dense / machine.gemm_factor_large + expert / machine.moe_factor, rel=1e-12)
    said = estimate("gpt-oss-20b", "amd-ryzen-9-7950x", weights="mxfp4_moe", engine="llama.cpp", prompt=512)
    assert (said.cpu_kernels, said.cpu_expert_kernels, said.experts_as_matvecs) == ("q8_0", "mxfp4", True)
    from speedlimit.cli.estimate import _caption
    assert "the routed experts at the mxfp4 kernel's 1-token rate" in _caption(said)
    assert f"the routed experts' mxfp4 kernel {fp4_decode:.3g} (decode)" in said.efficiency_basis
    # one type throughout names no second kernel
    assert estimate("qwen3-30b-a3b", "amd-ryzen-9-7950x", weights="q4_k_m", engine="llama.cpp").cpu_expert_kernels is None
    arch, late = resolve_model("gpt-oss-20b"), resolve_engine("llama-cpp-cpu")
    assert kernel_types(arch, parse_weights("mxfp4_moe"), late) == ("q8_0", "mxfp4")
    # one type in every group of a MoE model, spelled per group, is that type, on any build
    for engine in (late, resolve_engine("llama.cpp-b3441")):
        assert kernel_types(arch, parse_weights("experts=q8_0,default=q8_0"), engine) == ("q8_0", "q8_0")
    # three types, a type without rates, or experts of another type where they are not matvecs: no kernel rates
    assert kernel_types(arch, parse_weights("experts=mxfp4,attention=q4_0,default=q8_0"), late) is None
    assert kernel_types(arch, parse_weights("experts=fp8,default=q8_0"), late) is None
    assert kernel_types(arch, parse_weights("mxfp4_moe"), resolve_engine("llama.cpp-b3441")) is None
    assert step_model("gpt-oss-20b", "amd-ryzen-9-7950x", weights="mxfp4_moe", engine="llama.cpp-b3441").kernel_rate is None
    # a dense model's per-group spelling with one type is that type
    dense = resolve_model("llama-3.1-8b")
    assert kernel_types(dense, parse_weights("attention=q8_0,default=q8_0"), late) == ("q8_0", "q8_0")
    # a .gguf file read without --weights: its own file type decides (MXFP4_MOE is its per-group spelling)
    import dataclasses

    from speedlimit.architecture import WeightBytes
    as_file = dataclasses.replace(arch, weight_bytes=WeightBytes(1e9, 1e9, 5e9, 1e8, file_type="mxfp4_moe"))
    assert kernel_types(as_file, None, late) == ("q8_0", "mxfp4")
    assert kernel_types(dataclasses.replace(dense, weight_bytes=WeightBytes(1e9, 1e9, 5e9, 0.0, file_type="q4_k_m")),
                        None, late) == ("q4_k", "q4_k")
    assert kernel_types(dense, None, late) == ("bf16", "bf16")  # a catalog model without --weights: bf16


@pytest.mark.parametrize(("memory_s", "compute_s", "overlap", "expected"), [
    (3.0, 1.0, 1.0, 3.0),  # the roofline: the larger
    (3.0, 1.0, 0.0, 4.0),  # added
    (1.0, 3.0, 0.5, 3.5),  # half of the smaller hidden
    (2.0, 2.0, 0.0, 4.0),
])  # fmt: skip
def test_stream_and_arithmetic_combine_as_far_as_they_overlap(memory_s, compute_s, overlap, expected):
    assert core.stream_compute_seconds(memory_s, compute_s, overlap) == pytest.approx(expected)
    # arrays broadcast to the same values (a sweep grid)
    grid = core.stream_compute_seconds(np.array([memory_s, memory_s]), np.array([compute_s, compute_s]), np.array(overlap))
    assert grid == pytest.approx([expected, expected])


def test_a_step_whose_stream_and_arithmetic_add_costs_both():
    cost, machine = _setup("llama-3.1-8b")
    step = core.decode_batch(cost, 32.0, 1000.0)
    memory_s, compute_s = core.step_roofline(cost, machine, step)
    roofline = float(core.step_seconds(cost, machine, step))
    summed = float(core.step_seconds(cost, machine._replace(stream_compute_overlap=0.0), step))
    assert summed - roofline == pytest.approx(min(memory_s, compute_s), rel=1e-9)


@pytest.mark.parametrize("batch", [1, 64, 512])
def test_mean_step_is_exact_when_stream_and_arithmetic_add(batch):
    cost, machine = _setup("gemma-2-9b")
    machine = machine._replace(stream_compute_overlap=0.0)
    contexts = np.linspace(100, 9000, 200_001)
    brute = float(np.mean(core.decode_step_seconds(cost, machine, batch, contexts)))
    assert float(core.mean_decode_step_seconds(cost, machine, batch, 100, 9000)) == pytest.approx(brute, rel=1e-6)


def test_an_attention_kernel_of_its_own_leaves_the_roofline_and_adds_its_time():
    """llama.cpp's CPU flash attention timed apart (fold C amendment 9): the step's attention FLOPs and KV bytes leave
    the roofline, and its decode and prefill FLOPs at their own rates are added; NaN keeps the roofline as it was."""
    cost, machine = _setup("gemma-2-9b")  # sliding-window layers too
    rates = machine._replace(attention_decode_flops=2e12, attention_prefill_flops=5e12)
    step = core.decode_batch(cost, 4.0, 6000.0)._replace(prefill_sequences=1.0, prefill_tokens=512.0,
                                                         prefill_context=2560.0, prefill_context_local=2560.0,
                                                         prefill_pairs=512 * 2048 + 512 * 513 / 2,
                                                         prefill_pairs_local=512 * 2048 + 512 * 513 / 2)
    decode = cost.attn_flops_per_ctx_global * step.decode_context + cost.attn_flops_per_ctx_local * step.decode_context_local
    prefill = cost.attn_flops_per_ctx_global * step.prefill_pairs + cost.attn_flops_per_ctx_local * step.prefill_pairs_local
    assert not core.attention_apart(machine) and core.attention_apart(rates)
    assert core.attention_kernel_seconds(cost, machine, step) == 0.0
    assert core.attention_kernel_seconds(cost, rates, step) == pytest.approx(decode / 2e12 + prefill / 5e12)
    bytes_read = core.step_bytes(cost, step) - core.step_kv_bytes(cost, step)
    flops = core.priced_flops(cost, machine, step) - core.step_attention_flops(cost, step) / machine.attention_factor
    expected = core.step_time(bytes_read, flops, machine, 0.0, step.sequences, step.tokens) + decode / 2e12 + prefill / 5e12
    assert float(core.step_seconds(cost, rates, step)) == pytest.approx(expected, rel=1e-12)
    # a sweep grid: one machine with the kernel, one without, each as its scalar
    grid = machine._replace(attention_decode_flops=np.array([2e12, math.nan]), attention_prefill_flops=np.array([5e12, math.nan]))
    assert core.step_seconds(cost, grid, step) == pytest.approx(
        [float(core.step_seconds(cost, rates, step)), float(core.step_seconds(cost, machine, step))], rel=1e-12)
    # the mean over a growing context stays exact (the kernel's time is linear in the context)
    contexts = np.linspace(100, 9000, 200_001)
    brute = float(np.mean(core.decode_step_seconds(cost, rates, 8, contexts)))
    assert float(core.mean_decode_step_seconds(cost, rates, 8, 100, 9000)) == pytest.approx(brute, rel=1e-6)


def test_a_cpu_with_a_measured_attention_kernel_prices_the_cache_it_attends():
    """On a catalog CPU priced with the late build's kernel rates, a longer context costs its attention at the
    kernel's measured rate (more than its KV bytes would), the estimate says so, and a GPU or build 3441 does not."""
    from speedlimit.cli.estimate import _caption
    from speedlimit.estimator import estimate

    short, long = (estimate("llama-3.1-8b", "amd-epyc-9654", weights="q4_k_m", prompt=p, output=2) for p in (128, 4096))
    assert 0 < short.attention_kernel_s < long.attention_kernel_s
    assert long.itl_s - short.itl_s == pytest.approx(long.attention_kernel_s - short.attention_kernel_s, rel=0.05)
    assert "attention at its measured kernel rate" in _caption(long) and "attention: " in long.efficiency_basis
    assert estimate("llama-3.1-8b", "h100-sxm", prompt=4096).attention_kernel_s == 0.0
    old = estimate("llama-3.1-8b", "amd-ryzen-9-7950x", weights="q4_0", prompt=4096, engine="llama-cpp-cpu-b3441")
    assert old.attention_kernel_s == 0.0 and "attention at" not in _caption(old)
