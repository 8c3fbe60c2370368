"""Parallelism beyond tensor parallelism (issue 13): pipeline stages (--pp), data-parallel replicas (--dp) and
expert parallelism (--ep), priced by the one step-cost model; tp = pp = dp = ep = 1 is exactly the tensor-parallel step."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from speedlimit import SpeedlimitError
from speedlimit.catalog import catalog_hardware, catalog_model, default_efficiency
from speedlimit.cli import app
from speedlimit.estimator import core, estimate
from speedlimit.estimator.api import cost_model, machine_for, step_model
from speedlimit.estimator.sweep import sweep_grid
from speedlimit.precision import parse_precision
from speedlimit.scenario import scenario_from

runner = CliRunner()


def _setup(model="llama-3.1-70b", hardware="h100-sxm", weights="bf16", tp=1, **parallel):
    arch = catalog_model(model)
    device = catalog_hardware(hardware)
    cost, _ = cost_model(arch, parse_precision(weights), parse_precision("fp16"))
    return cost, machine_for(device, default_efficiency(device), "bf16", tp, ideal=False, **parallel)


def _tensor_parallel_step_s(cost, machine, step):
    """The step as priced before pipeline/data/expert parallelism existed: one replica, one pass, all-reduces."""
    return core.step_time(core.step_bytes(cost, step), core.priced_flops(cost, machine, step), machine,
                          core.allreduce_seconds(cost, machine, step.tokens), step.sequences)


# --------------------------------------------------------------------------------------------
# defaults: nothing changes


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-70b", 4), ("deepseek-v3", 8), ("gemma-2-9b", 1), ("mixtral-8x7b", 2)])
def test_default_parallelism_is_exactly_the_tensor_parallel_step(model, tp):
    cost, machine = _setup(model, tp=tp)
    for step in (core.decode_batch(cost, 64.0, 3000.0), core.prefill_batch(cost, 4.0, 2048.0),
                 core.StepBatch(decode_sequences=7.0, decode_context=7000.0, decode_context_local=7000.0,
                                prefill_sequences=1.0, prefill_tokens=512.0, prefill_context=512.0,
                                prefill_context_local=512.0, prefill_pairs=131328.0, prefill_pairs_local=131328.0)):
        assert core.step_seconds(cost, machine, step) == _tensor_parallel_step_s(cost, machine, step)
    assert core.prefill_seconds(cost, machine, 4.0, 2048.0) == core.step_seconds(cost, machine, core.prefill_batch(cost, 4.0, 2048.0))
    assert core.max_batch_that_fits(cost, machine, 4096.0) == max(0, math.floor(
        (core.usable_memory_bytes(machine) - cost.total_weight_bytes) / core.kv_bytes_per_sequence(cost, 4096.0)))


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-70b", 4), ("deepseek-v3", 8), ("gemma-2-9b", 1)])
def test_the_general_pipeline_path_reduces_to_the_fast_path_at_ones(model, tp):
    # step_seconds skips the pipeline bookkeeping when pp = dp = ep = 1; the general path must agree there
    cost, machine = _setup(model, tp=tp)
    for step in (core.decode_batch(cost, 64.0, 3000.0), core.prefill_batch(cost, 4.0, 2048.0), core.decode_batch(cost, 1.0, 10.0)):
        general = core.pipeline_cycle_seconds(cost, machine, *core.micro_step_seconds(cost, machine, step))
        assert core.step_seconds(cost, machine, step) == pytest.approx(general, rel=1e-12)


def test_explicit_ones_equal_the_defaults():
    plain = estimate("deepseek-v3", "h200", weights="fp8", tp=8, batch=32).to_dict()
    ones = estimate("deepseek-v3", "h200", weights="fp8", tp=8, batch=32, pp=1, dp=1, ep=1).to_dict()
    assert ones == plain
    assert plain["devices"] == 8 and plain["memory_per_device_bytes"] == pytest.approx(plain["memory_bytes"] / 8)


# --------------------------------------------------------------------------------------------
# pipeline parallelism


def test_pipeline_halves_the_weights_per_device():
    one = estimate("llama-3.1-70b", "h100-sxm", weights="fp8", batch=8)
    two = estimate("llama-3.1-70b", "h100-sxm", weights="fp8", batch=8, pp=2)
    assert two.devices == 2
    assert two.weights_per_device_bytes == pytest.approx(one.weights_per_device_bytes / 2)  # 80 layers: 40 per stage
    assert two.memory_per_device_bytes == pytest.approx(one.memory_per_device_bytes / 2)
    assert two.max_batch > 2 * one.max_batch  # the second device's memory goes to KV cache


def test_an_uneven_split_is_priced_at_its_largest_stage():
    three = estimate("llama-3.1-70b", "h100-sxm", weights="fp8", pp=3)
    assert three.weights_per_device_bytes == pytest.approx(three.weights_bytes * 27 / 80)  # 80 layers: 27 + 27 + 26
    cost, machine = _setup(pp=3)
    assert core.pipeline_imbalance(cost, machine) == pytest.approx(81 / 80)


def test_one_sequence_passes_every_stage_and_every_send():
    cost, one = _setup()
    _, four = _setup(pp=4)
    step = core.decode_batch(cost, 1.0, 2000.0)
    hidden_bytes = catalog_model("llama-3.1-70b").hidden_size * core.ACTIVATION_BYTES
    sends = 3 * (hidden_bytes / one.link_Bps + core.SEND_LATENCY_S)
    assert core.pipeline_send_seconds(cost, four, 1.0) == pytest.approx(sends)
    assert core.step_seconds(cost, four, step) == pytest.approx(core.step_seconds(cost, one, step) + sends)


def test_stages_overlap_micro_batches():
    cost, one = _setup()
    _, two = _setup(pp=2)
    send = core.pipeline_send_seconds(cost, two, 64.0)
    # 128 sequences in two micro-batches of 64: each cycle, both advance in the time one takes through the model
    assert core.decode_step_seconds(cost, two, 128.0, 1000.0) == pytest.approx(core.decode_step_seconds(cost, one, 64.0, 1000.0) + send)
    assert estimate("llama-3.1-70b", "h100-sxm", weights="fp8", batch=256, prompt=1024, pp=2).throughput_tok_s == pytest.approx(
        2 * estimate("llama-3.1-70b", "h100-sxm", weights="fp8", batch=128, prompt=1024).throughput_tok_s, rel=0.01)


def test_the_largest_stage_sets_the_cycle():
    cost, _ = _setup()
    cost = cost._replace(layers=3.0)  # two stages of 2 and 1 layers
    _, machine = _setup(pp=2)
    micro_s, send_s, count = core.micro_step_seconds(cost, machine, core.decode_batch(cost, 512.0, 100.0))
    assert count == 2
    assert core.decode_step_seconds(cost, machine, 512.0, 100.0) == pytest.approx(max(micro_s + send_s, 2 * (4 / 3) * micro_s / 2))
    assert core.decode_step_seconds(cost, machine, 512.0, 100.0) == pytest.approx(4 / 3 * micro_s)  # sends are µs


@pytest.mark.parametrize(("model", "parallel"), [
    ("gemma-2-9b", {"pp": 3, "dp": 2}),  # 42 layers in stages of 14: and a sliding window
    ("llama-3.1-70b", {"tp": 2, "pp": 3}),  # 80 layers: 27 + 27 + 26
    ("deepseek-v3", {"tp": 2, "dp": 4, "ep": 8}),
])  # fmt: skip
@pytest.mark.parametrize(("batch", "start", "end"), [(1, 100, 9000), (512, 10, 6000), (64, 0, 3000)])
def test_mean_step_over_the_reply_is_the_average(model, parallel, batch, start, end):
    resolved = step_model(model, "h200", weights="fp8", **parallel)
    contexts = np.linspace(start, end, 100_001)
    brute = float(np.mean(core.decode_step_seconds(resolved.cost, resolved.machine, float(batch), contexts)))
    mean = float(core.mean_decode_step_seconds(resolved.cost, resolved.machine, float(batch), start, end))
    assert mean == pytest.approx(brute, rel=1e-5)


def test_prefill_fills_the_pipeline():
    cost, _ = _setup()
    _, machine = _setup(pp=4)
    micro_s, send_s, count = core.micro_step_seconds(cost, machine, core.prefill_batch(cost, 8.0, 1024.0))
    assert count == 4
    assert core.prefill_seconds(cost, machine, 8.0, 1024.0) == pytest.approx(micro_s + send_s + 3 * micro_s / 4)


# --------------------------------------------------------------------------------------------
# expert parallelism


def test_alltoall_moves_each_tokens_hidden_vector_to_its_experts():
    arch = catalog_model("deepseek-v3")
    cost, machine = _setup("deepseek-v3", tp=8, ep=8)
    per_device = 256 / 8 * arch.experts_per_token * arch.hidden_size * core.ACTIVATION_BYTES * 7 / 8
    expected = 2 * arch.moe_layers * (per_device / machine.link_Bps + core.SEND_LATENCY_S)
    assert core.alltoall_seconds(cost, machine, 256.0) == pytest.approx(expected)
    assert arch.moe_layers == 58  # DeepSeek-V3: the first 3 of 61 layers are dense
    _, tp_only = _setup("deepseek-v3", tp=8)
    assert core.alltoall_seconds(cost, tp_only, 256.0) == 0.0
    # an MoE layer's second all-reduce becomes its all-to-alls
    ratio = core.allreduce_seconds(cost, machine, 256.0) / core.allreduce_seconds(cost, tp_only, 256.0)
    assert ratio == pytest.approx((2 * 61 - 58) / (2 * 61))


def test_expert_parallel_over_tp_reads_the_same_bytes():
    cost, tp_only = _setup("deepseek-v3", tp=8)
    _, ep = _setup("deepseek-v3", tp=8, ep=8)
    step = core.decode_batch(cost, 64.0, 2000.0)
    assert core.step_roofline(cost, ep, step) == core.step_roofline(cost, tp_only, step)


def test_expert_parallel_with_dp_reads_each_devices_share_of_the_whole_batch():
    arch = catalog_model("deepseek-v3")
    cost, machine = _setup("deepseek-v3", dp=8, ep=8)
    tokens = 256.0
    per_device_experts = core.expected_experts_read(arch.n_experts, arch.experts_per_token, tokens) / 8
    replica = core.decode_batch(cost, tokens / 8, 1000.0)
    expected = (cost.head_bytes + cost.dense_bytes + per_device_experts * cost.expert_bytes
                + tokens / 8 * (cost.embedding_row_bytes + cost.activation_bytes_per_token)
                + cost.kv_bytes_per_token_global * replica.decode_context)
    assert core.step_bytes(cost, replica, core.moe_group(machine)) == pytest.approx(expected)
    # each device holds the dense weights and 1/8 of the routed experts
    experts = arch.n_experts * cost.expert_bytes
    assert core.stage_weight_bytes(cost, machine) == pytest.approx(cost.total_weight_bytes - experts + experts / 8)


def test_dp_with_ep_fits_where_replicas_do_not():
    apart = estimate("deepseek-v3", "h200", weights="fp8", dp=8, batch=64)
    shared = estimate("deepseek-v3", "h200", weights="fp8", dp=8, ep=8, batch=64)
    assert apart.fits is False and shared.fits is True
    assert apart.devices == shared.devices == 8
    assert shared.ep_comm_s > 0 and shared.tp_comm_s == 0


# --------------------------------------------------------------------------------------------
# data parallelism


def test_replicas_add_throughput_at_the_latency_of_their_share():
    one = estimate("llama-3.1-8b", "h100-sxm", batch=16, prompt=1024)
    four = estimate("llama-3.1-8b", "h100-sxm", batch=64, prompt=1024, dp=4)
    assert four.devices == 4
    assert four.itl_s == pytest.approx(one.itl_s, rel=1e-12)
    assert four.ttft_s == pytest.approx(one.ttft_s, rel=1e-12)
    assert four.throughput_tok_s == pytest.approx(4 * one.throughput_tok_s, rel=1e-12)
    assert four.max_batch == 4 * one.max_batch
    assert four.memory_per_device_bytes == pytest.approx(one.memory_per_device_bytes)
    assert four.memory_capacity_bytes == pytest.approx(4 * one.memory_capacity_bytes)


def test_fewer_sequences_than_replicas_leave_replicas_idle():
    one = estimate("llama-3.1-8b", "h100-sxm", batch=2, prompt=1024)
    four = estimate("llama-3.1-8b", "h100-sxm", batch=2, prompt=1024, dp=4)
    single = estimate("llama-3.1-8b", "h100-sxm", batch=1, prompt=1024)
    assert four.itl_s == pytest.approx(single.itl_s, rel=1e-12)  # two replicas with one sequence each
    assert four.throughput_tok_s == pytest.approx(2 * single.throughput_tok_s, rel=1e-12)
    assert four.memory_per_device_bytes == pytest.approx(single.memory_per_device_bytes)
    assert one.itl_s > four.itl_s


def test_the_critical_batch_counts_every_replicas_micro_batches():
    one = estimate("llama-3.1-70b", "h200", weights="fp8", prompt=128, output=16)
    eight = estimate("llama-3.1-70b", "h200", weights="fp8", prompt=128, output=16, tp=2, pp=2, dp=2)
    two = estimate("llama-3.1-70b", "h200", weights="fp8", prompt=128, output=16, tp=2)
    assert eight.critical_batch == pytest.approx(4 * two.critical_batch, abs=4)
    assert one.critical_batch == two.critical_batch  # tensor parallelism splits bytes and FLOPs alike
    moe = estimate("deepseek-v3", "h200", weights="fp8", dp=8, ep=8, prompt=512, output=256)
    resolved = step_model("deepseek-v3", "h200", weights="fp8", dp=8, ep=8)

    def compute_bound(batch):
        memory_s, compute_s = core.step_roofline(resolved.cost, resolved.machine, core.decode_batch(resolved.cost, batch, 640.0))
        return compute_s >= memory_s

    assert compute_bound(moe.critical_batch) and not compute_bound(moe.critical_batch - 1)


def test_tensor_parallelism_replicates_kv_it_cannot_split():
    def kv(model, **parallel):
        return estimate(model, "h200", weights="fp8", **parallel).kv_bytes_per_token

    assert kv("llama-3.1-70b", tp=8) == kv("llama-3.1-70b")  # 8 KV heads, one per device
    assert kv("llama-3.1-70b", tp=16) == 2 * kv("llama-3.1-70b")  # each KV head on two devices
    assert kv("deepseek-v3", tp=8) == 8 * kv("deepseek-v3")  # MLA's latent on every device
    assert kv("deepseek-v3", dp=8, ep=8) == kv("deepseek-v3")  # data-parallel attention keeps one copy
    assert (estimate("deepseek-v3", "h200", weights="fp8", dp=8, ep=8, prompt=2048, output=512).max_batch
            > 4 * estimate("deepseek-v3", "h200", weights="fp8", tp=8, prompt=2048, output=512).max_batch)


def test_cost_per_token_counts_every_device():
    one = estimate("llama-3.1-8b", "h100-sxm", batch=16, usd_per_hour=2.0)
    four = estimate("llama-3.1-8b", "h100-sxm", batch=64, dp=4, usd_per_hour=2.0)
    assert four.usd_per_million_tokens == pytest.approx(one.usd_per_million_tokens)


# --------------------------------------------------------------------------------------------
# vectorized, validated, on the command line


def test_sweep_matches_single_estimates():
    result = sweep_grid(["deepseek-v3"], ["h200"], ["fp8"], [8, 64, 512], [1024, 8192], tp=2, pp=2, dp=4, ep=8)
    for row in result.rows():
        single = estimate("deepseek-v3", "h200", weights="fp8", batch=row["batch"], prompt=row["context"], tp=2, pp=2,
                          dp=4, ep=8)
        assert row["itl_s"] == pytest.approx(single.itl_s, rel=1e-9)
        assert row["ttft_s"] == pytest.approx(single.ttft_s, rel=1e-9)
        assert row["memory_bytes"] == pytest.approx(single.memory_bytes, rel=1e-9)
        assert row["fits"] == single.fits


def test_arrays_match_scalars():
    cost, machine = _setup("mixtral-8x7b", tp=2, pp=4, dp=2, ep=4)
    batches = np.array([1.0, 3.0, 16.0, 300.0])
    vector = core.decode_step_seconds(cost, machine._replace(pp=np.full(4, 4.0)), batches, 500.0)
    scalar = [core.decode_step_seconds(cost, machine, float(b), 500.0) for b in batches]
    assert np.allclose(vector, scalar, rtol=1e-12)


@pytest.mark.parametrize(("inputs", "needle"), [
    ({"model": "llama-3.1-70b", "ep": 2, "tp": 2}, "dense"),
    ({"model": "mixtral-8x7b", "ep": 4, "tp": 2}, "--ep 4 must be 1 or --tp × --dp = 2"),
    ({"model": "mixtral-8x7b", "ep": 16, "tp": 16}, "experts"),
    ({"model": "llama-3.1-8b", "pp": 33}, "32 layers"),
    ({"model": "llama-3.1-8b", "pp": 2, "ideal": True}, "--ideal and --pp"),
    ({"model": "llama-3.1-8b", "dp": 0}, "--dp"),
    ({"model": "llama-3.1-8b", "pp": True}, "--pp"),
    ({"model": "llama-3.1-8b", "tp": 4096, "pp": 4096}, "devices"),
])  # fmt: skip
def test_bad_parallelism_is_one_error_naming_the_flag(inputs, needle):
    with pytest.raises(SpeedlimitError, match=".*") as error:
        step_model(hardware="h100-sxm", **inputs)
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_scenario_counts_devices():
    assert scenario_from(model="7B", hardware="h100-sxm", tp=2, pp=3, dp=4).devices == 24


def test_cli_json_and_table_show_devices():
    argv = ["estimate", "-m", "deepseek-v3", "-H", "h200", "--weights", "fp8", "--tp", "2", "--dp", "4", "--ep", "8"]
    out = runner.invoke(app, [*argv, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert (data["tp"], data["pp"], data["dp"], data["ep"], data["devices"]) == (2, 1, 4, 8, 8)
    assert data == estimate("deepseek-v3", "h200", weights="fp8", tp=2, dp=4, ep=8).to_dict()
    table = runner.invoke(app, argv, terminal_width=200)
    assert table.exit_code == 0, table.output
    assert "tp 2 × pp 1 × dp 4, ep 8" in table.output and "memory / device" in table.output


@pytest.mark.parametrize(("argv", "needle"), [
    (["estimate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--ep", "2", "--tp", "2"], "dense"),
    (["estimate", "-m", "deepseek-v3", "-H", "h200", "--dp", "8"], "--ep with --dp"),
    (["simulate", "-m", "mixtral-8x7b", "-H", "h100-sxm", "--dp", "2", "--ep", "2", "--pp", "2", "--requests", "4"],
     "without pipeline stages"),
])  # fmt: skip
def test_cli_refusals_are_one_line_exit_2(argv, needle):
    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], done.stderr


def test_simulate_runs_a_pipeline():
    def run(*parallel):
        out = runner.invoke(app, ["simulate", "-m", "llama-3.1-70b", "-H", "l40s", "--weights", "fp8", "--tp", "2",
                                  *parallel, "--concurrency", "8", "--requests", "16", "--output-tokens", "32", "--json"])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)

    flat, piped = run(), run("--pp", "2")
    assert piped["completed"] == 16
    # the second stage's devices hold half the layers' weights and KV: more than twice the KV capacity
    assert piped["engine"]["kv_capacity_tokens"] > 2 * flat["engine"]["kv_capacity_tokens"]


def test_cli_plot_draws_a_parallel_deployment(tmp_path):
    out = runner.invoke(app, ["estimate", "-m", "llama-3.1-70b", "-H", "h100-sxm", "--tp", "2", "--pp", "2", "--batch", "8",
                              "--plot", str(tmp_path / "plot.png")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------
# replicas that share their experts and step together (the simulator's coupled --dp with --ep)

@pytest.mark.parametrize(("model", "weights"), [("mixtral-8x7b", "bf16"), ("deepseek-v3", "fp8")])
@pytest.mark.parametrize("engine_moe", [False, True])
@pytest.mark.parametrize("attention_apart", [False, True])
def test_a_symmetric_lockstep_step_is_the_group_step(model, weights, engine_moe, attention_apart):
    cost, machine = _setup(model, "h200", weights, dp=4, ep=4)
    if engine_moe:  # an engine whose fused-MoE kernel runs at its own rate
        machine = machine._replace(moe_factor=0.05, gemm_tokens_small=16.0, gemm_factor_small=0.5,
                                   gemm_tokens_large=2048.0, gemm_factor_large=0.9)
    if attention_apart:  # an attention kernel of its own (llama.cpp's CPU flash attention: fold C amendment 9)
        machine = machine._replace(attention_decode_flops=2e12, attention_prefill_flops=9e12)
    for one in (core.decode_batch(cost, 6, 3000.0), core.prefill_batch(cost, 1, 2048, cached=512),
                core.StepBatch(*(a + b for a, b in zip(core.decode_batch(cost, 3, 900.0), core.prefill_batch(cost, 2, 300))))):
        group = core.StepBatch(*(4 * v for v in one))
        assert core.lockstep_step_seconds(cost, machine, [one] * 4) == pytest.approx(core.step_seconds(cost, machine, group), rel=1e-12)


def test_a_lockstep_step_lasts_as_long_as_its_slowest_replica():
    cost, machine = _setup("deepseek-v3", "h200", "fp8", dp=8, ep=8)
    decode, prompt = core.decode_batch(cost, 4, 3000.0), core.prefill_batch(cost, 1, 4096)
    mixed = core.lockstep_step_seconds(cost, machine, [prompt] + [decode] * 7)
    assert mixed > core.lockstep_step_seconds(cost, machine, [decode] * 8)
    # the prompt's attention and dense layers run on its replica alone, its experts' FLOPs over all eight: faster
    # than eight prompts (eight times the experts' FLOPs), and the others' decodes only add experts to read
    eight = core.step_seconds(cost, machine, core.StepBatch(*(8 * v for v in prompt)))
    assert core.lockstep_step_seconds(cost, machine, [prompt]) <= mixed < eight
    # the experts are shared: one replica's decode step costs more when the others' tokens touch more experts
    assert core.lockstep_step_seconds(cost, machine, [decode] * 8) > core.lockstep_step_seconds(cost, machine, [decode])
    with pytest.raises(ValueError):
        core.lockstep_step_seconds(cost, machine, [])


def test_replicas_without_sequences_bring_no_tokens_to_the_experts():
    """One sequence on each of 3 of 8 expert-sharing replicas: the experts read and computed are those 3 tokens'
    (1/8 of them per device), as the lockstep price of the 3 working replicas has it."""
    cost, machine = _setup("deepseek-v3", "h200", "fp8", dp=8, ep=8)
    one = core.decode_batch(cost, 1, 2000.0)
    three = core.StepBatch(*(3 * v for v in one))
    assert core.step_seconds(cost, machine, three) == pytest.approx(core.lockstep_step_seconds(cost, machine, [one] * 3), rel=1e-12)
    memory_s, _ = core.step_roofline(cost, machine, three)
    experts = core.expected_experts_read(cost.n_experts, cost.experts_per_token, 3.0) * cost.expert_bytes / 8
    dense = core.step_bytes(cost, one) - core.expected_experts_read(cost.n_experts, cost.experts_per_token, 1.0) * cost.expert_bytes
    assert memory_s == pytest.approx((dense + experts) / machine.bandwidth_Bps, rel=1e-12)
