"""llama.cpp's CPU matmul kernel rates (engines.toml [llama-cpp-cpu] kernel_rates, api.cpu_kernel_rate): the per-type
rate that binds decode at a few threads and prefill at any, the core clock it scales with (Hardware.core_clock_hz),
the tensor type a format runs (precision.main_tensor_type), and where the rate does not apply."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from speedlimit.bundled import default_gguf_path
from speedlimit.catalog import catalog_engine, catalog_hardware, hardware_entries
from speedlimit.engine_profile import KERNEL_PREFILL_TOKENS, Sourced
from speedlimit.estimator import estimate
from speedlimit.estimator.api import step_model
from speedlimit.hardware import Hardware
from speedlimit.precision import main_tensor_type

CPU = "amd-ryzen-9-7950x"
MARK = "MACs per cycle per thread"  # what the efficiency basis says when the kernel rates price the matmuls
PROFILE = catalog_engine("llama-cpp-cpu")


def test_the_clock_runs_from_boost_with_one_core_busy_to_the_measured_all_core_clock_with_a_socket_busy() -> None:
    device = catalog_hardware(CPU)  # AMD: base 4.5 GHz, boost up to 5.7, 16 cores; 5.0 measured all-core
    assert device.all_core_clock_hz == pytest.approx(5.0e9) and device.all_core_clock_source.startswith("http")
    assert device.core_clock_hz(1) == pytest.approx(5.7e9)
    assert device.core_clock_hz(16) == pytest.approx(5.0e9) == device.core_clock_hz(64)
    assert device.core_clock_hz(8.5) == pytest.approx((5.7e9 + 5.0e9) / 2)
    assert math.isnan(catalog_hardware("h100-sxm").core_clock_hz(1))


def test_without_a_measured_all_core_clock_a_busy_socket_runs_at_base() -> None:
    device = catalog_hardware("amd-epyc-9654")  # base 2.4 GHz, boost up to 3.7, 96 cores; no all-core figure cited
    assert device.all_core_clock_hz is None
    assert device.core_clock_hz(96) == pytest.approx(2.4e9)
    assert device.core_clock_hz(48.5) == pytest.approx((3.7e9 + 2.4e9) / 2)


@pytest.mark.parametrize("fields, needle", [
    ({"base_clock_hz": 3e9}, "go together"),
    ({"base_clock_hz": 3e9, "boost_clock_hz": 2e9}, "at least"),
    ({"base_clock_hz": 3e12, "boost_clock_hz": 4e12}, "less than or equal"),
    ({"all_core_clock_hz": 3e9, "all_core_clock_source": "https://example.org"}, "needs base_clock_hz"),
    ({"base_clock_hz": 3e9, "boost_clock_hz": 4e9, "all_core_clock_hz": 4.5e9, "all_core_clock_source": "x"},
     "between"),
    ({"base_clock_hz": 3e9, "boost_clock_hz": 4e9, "all_core_clock_hz": 3.5e9}, "all_core_clock_source"),
])
def test_bad_clocks_are_refused(fields: dict, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        Hardware(key="box", name="box", kind="cpu", memory_bandwidth_Bps=80e9, cores_per_socket=8, **fields)


def test_every_catalog_cpu_gives_its_vendors_clocks() -> None:
    cpus = [catalog_hardware(key) for key in hardware_entries() if catalog_hardware(key).kind == "cpu"]
    assert cpus
    for device in cpus:
        assert device.base_clock_hz and device.boost_clock_hz >= device.base_clock_hz, device.key


@pytest.mark.parametrize("name, tensor_type", [
    ("q4_k_m", "q4_k"), ("q4_k_s", "q4_k"), ("q2_k_s", "q2_k"), ("q3_k_l", "q3_k"), ("Q4_1", "q4_1"),
    ("iq2_m", "iq2_s"), ("iq3_m", "iq3_s"), ("iq3_xxs", "iq3_xxs"), ("fp16", "f16"), ("bf16", "bf16"),
    ("fp8", None), ("int4", None), ("4.5bit", None),
])
def test_a_format_runs_its_main_tensor_types_kernels(name: str, tensor_type: str | None) -> None:
    assert main_tensor_type(name) == tensor_type


def test_the_shipped_rates_are_fitted_on_fold_c_and_cover_the_published_cpu_types() -> None:
    assert PROFILE.kernel_rates is not None and PROFILE.kernel_rates.fitted == "C"
    for tensor_type in ("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
                        "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs", "iq4_nl"):
        decode, prefill = PROFILE.kernel_rate(tensor_type)
        assert 0 < decode < prefill, tensor_type  # a matvec reuses no weight; a 512-token GEMM reuses each 512 times
    assert PROFILE.kernel_rate("fp8") is None and PROFILE.kernel_rate(None) is None


@pytest.mark.parametrize("value", [{}, {"q4_0": [1.0]}, {"q4_0": [0, 2.0]}, {"q4_0": [True, 2.0]}, [1, 2]])
def test_malformed_kernel_rates_are_refused(value) -> None:
    with pytest.raises(ValidationError, match="kernel_rates|MACs per cycle"):
        PROFILE.model_validate(PROFILE.model_dump() | {"kernel_rates": {"value": value, "fitted": "C"}})


def _kernel_decode_s(tensor_type: str, threads: int) -> float:
    """One decode token's matmuls at the shipped decode rate: 2 FLOPs per MAC, `threads` cores at their clock."""
    step = step_model("llama-3.1-8b", CPU, weights=tensor_type, threads=threads)
    decode, _ = PROFILE.kernel_rate(tensor_type)
    flops = step.cost.matmul_flops_per_token
    return flops / (2.0 * decode * threads * catalog_hardware(CPU).core_clock_hz(threads))


def test_few_threads_are_bound_by_the_kernels_not_the_memory() -> None:
    # q5_1: a slow matvec kernel (no repacked or int8-GEMM path in this llama.cpp), so two threads are kernel-bound
    two = estimate("llama-3.1-8b", CPU, weights="q5_1", threads=2, prompt=0, output=128)
    itl_s = 1.0 / two.decode_tok_s
    # the kernel roof, plus the step's fixed cost; the memory roof is below it
    assert itl_s == pytest.approx(_kernel_decode_s("q5_1", 2), rel=0.05)
    assert two.bytes_per_token / (two.reached_bandwidth_Bps * two.bw_efficiency) < 0.8 * itl_s
    assert "q5_1 kernels" in two.efficiency_basis and "fold C" in two.efficiency_basis and two.cpu_kernels == "q5_1"


def test_a_slower_kernel_decodes_slower_at_few_threads_though_it_reads_fewer_bytes() -> None:
    q4 = estimate("llama-3.1-8b", CPU, weights="q4_0", threads=2, prompt=0, output=128)
    iq3 = estimate("llama-3.1-8b", CPU, weights="iq3_xxs", threads=2, prompt=0, output=128)
    assert iq3.bytes_per_token < q4.bytes_per_token and iq3.decode_tok_s < q4.decode_tok_s


def test_every_core_makes_the_memory_bind_again() -> None:
    full = estimate("llama-3.1-8b", CPU, weights="q4_0", prompt=0, output=128)
    without = estimate("llama-3.1-8b", CPU, weights="q4_0", prompt=0, output=128, flops_efficiency=0.5)
    assert full.decode_tok_s == pytest.approx(without.decode_tok_s, rel=0.01)  # bandwidth-bound either way


def test_prefill_runs_at_the_prefill_kernels_rate_scaled_to_its_threads() -> None:
    result = estimate("llama-3.1-8b", CPU, weights="q8_0", prompt=KERNEL_PREFILL_TOKENS, output=1)
    step = step_model("llama-3.1-8b", CPU, weights="q8_0")
    _, prefill = PROFILE.kernel_rate("q8_0")
    scaling = PROFILE.prefill_thread_efficiency(16)
    assert 0 < scaling < 1  # measured: 16 threads reach less per thread than the 2 the rates were measured at
    rate = 2.0 * prefill * scaling * 16 * catalog_hardware(CPU).core_clock_hz(16)
    matmul_s = (step.cost.matmul_flops_per_token - step.cost.head_flops_per_sequence) * KERNEL_PREFILL_TOKENS / rate
    assert matmul_s < result.ttft_s < 1.15 * matmul_s  # plus attention and the head
    assert "prefill_thread_scaling" in result.efficiency_basis


def test_prefill_thread_scaling_is_fitted_on_fold_c_and_interpolates_in_log_threads() -> None:
    for name in ("llama-cpp-cpu", "llama-cpp-cpu-b3441"):
        curve = catalog_engine(name).prefill_thread_scaling
        assert curve is not None and curve.fitted == "C" and curve.value[0] == [2, 1.0]
    profile = PROFILE.model_validate(PROFILE.model_dump() | {
        "prefill_thread_scaling": {"value": [[2, 1.0], [8, 0.7]], "fitted": "C"}})
    assert profile.prefill_thread_efficiency(1) == profile.prefill_thread_efficiency(2) == 1.0
    assert profile.prefill_thread_efficiency(4) == pytest.approx(0.85)  # half-way in log2(threads)
    assert profile.prefill_thread_efficiency(8) == profile.prefill_thread_efficiency(96) == pytest.approx(0.7)
    without = PROFILE.model_validate(PROFILE.model_dump() | {"prefill_thread_scaling": None})
    assert without.prefill_thread_efficiency(64) == 1.0


@pytest.mark.parametrize("value", [[], [[2]], [[4, 1.0], [2, 0.9]], [[2, 1.0], [2, 0.9]], [[0, 1.0]], [[2, 0]],
                                   [[2, True]], {"2": 1.0}])
def test_malformed_thread_scaling_is_refused(value) -> None:
    with pytest.raises(ValidationError, match="thread|fraction"):
        PROFILE.model_validate(PROFILE.model_dump() | {"prefill_thread_scaling": {"value": value, "fitted": "C"}})


def test_prefill_at_two_threads_runs_at_the_measured_rate() -> None:
    two = estimate("llama-3.1-8b", CPU, weights="q8_0", prompt=KERNEL_PREFILL_TOKENS, output=1, threads=2)
    assert "prefill_thread_scaling" not in two.efficiency_basis  # the rates' own thread count: nothing to scale
    assert two.prefill_thread_efficiency == 1.0
    every = estimate("llama-3.1-8b", CPU, weights="q8_0", prompt=KERNEL_PREFILL_TOKENS, output=1)
    assert every.prefill_thread_efficiency == pytest.approx(PROFILE.prefill_thread_efficiency(16))
    gpu = estimate("llama-3.1-8b", "h100-sxm", prompt=KERNEL_PREFILL_TOKENS, output=1)
    assert gpu.prefill_thread_efficiency == 1.0 and gpu.cpu_kernels is None


def test_an_older_builds_profile_prices_its_own_measured_kernels() -> None:
    """`--engine llama-cpp-cpu-b3441` (llama.cpp of July 2024) runs its own fold-C rates: its IQ3_S prefill GEMM is
    measured several times slower than late-2025's, and the estimate says which profile priced it."""
    old = catalog_engine("llama-cpp-cpu-b3441")
    assert old.kernel_rates.fitted == "C" and old.kernel_rate("iq3_s") != PROFILE.kernel_rate("iq3_s")
    late = estimate("llama-3.1-8b", CPU, weights="iq3_s", prompt=KERNEL_PREFILL_TOKENS, output=1)
    early = estimate("llama-3.1-8b", CPU, weights="iq3_s", prompt=KERNEL_PREFILL_TOKENS, output=1, engine="llama-cpp-cpu-b3441")
    ratio = (PROFILE.kernel_rate("iq3_s")[1] * PROFILE.prefill_thread_efficiency(16)
             / (old.kernel_rate("iq3_s")[1] * old.prefill_thread_efficiency(16)))
    assert early.ttft_s / late.ttft_s == pytest.approx(ratio, rel=0.15)  # the matmuls dominate a CPU prefill
    assert early.engine == "llama-cpp-cpu-b3441" and early.cpu_kernels == "iq3_s"


def test_an_explicit_or_calibrated_flops_efficiency_turns_the_kernel_rates_off() -> None:
    explicit = estimate("llama-3.1-8b", CPU, weights="q4_0", threads=2, flops_efficiency=0.5)
    assert MARK not in explicit.efficiency_basis
    calibrated = catalog_hardware(CPU).model_copy(update={"calibrated_at": "2026-12-03", "flops_efficiency": 0.3})
    assert MARK not in estimate("llama-3.1-8b", calibrated, weights="q4_0", threads=2).efficiency_basis


@pytest.mark.parametrize("inputs", [
    {"hardware": "h100-sxm"},  # not a CPU
    {"ideal": True},  # the seed formula
    {"compute": "int8"},  # an explicit compute dtype prices its peak
    {"weights": "fp8"},  # no GGUF tensor type
    {"engine": "llama-cpp-python"},  # its wheel is built without AVX-512 (GGML_NATIVE=OFF): not these kernels
])
def test_where_the_kernel_rates_do_not_apply(inputs: dict) -> None:
    inputs = {"hardware": CPU, "weights": "q4_0"} | inputs
    result = estimate("llama-3.1-8b", **inputs)
    assert MARK not in result.efficiency_basis and result.cpu_kernels is None


def test_a_gguf_file_runs_its_file_types_kernels() -> None:
    result = estimate(str(default_gguf_path()), CPU, threads=1, prompt=0, output=64)
    assert "q4_1 kernels" in result.efficiency_basis


def test_a_custom_cpu_without_clocks_keeps_the_kinds_fraction() -> None:
    box = Hardware(key="box", name="box", kind="cpu", memory_bandwidth_Bps=80e9, flops={"fp32": 1e12}, cores_per_socket=16)
    assert MARK not in estimate("llama-3.1-8b", box, weights="q4_0").efficiency_basis
    clocked = box.model_copy(update={"base_clock_hz": 3e9, "boost_clock_hz": 4e9})
    assert "q4_0 kernels" in estimate("llama-3.1-8b", clocked, weights="q4_0").efficiency_basis


def test_the_rates_sourced_value_round_trips_through_the_record() -> None:
    record = PROFILE.record()["values"]["kernel_rates"]
    assert record["fitted"] == "C" and record["value"]["q4_0"] == list(PROFILE.kernel_rate("q4_0"))
    assert isinstance(PROFILE.kernel_rates, Sourced)


def test_the_cli_says_the_matmuls_ran_at_the_measured_kernel_rates() -> None:
    from typer.testing import CliRunner

    from speedlimit.cli import app

    out = CliRunner().invoke(app, ["estimate", "-m", "llama-3.1-8b", "-H", CPU, "--weights", "iq3_s", "--threads", "2"])
    caption = " ".join(out.output.split())  # the table wraps its caption at the console's width
    assert out.exit_code == 0 and "matmuls at llama.cpp's measured iq3_s CPU kernel rates" in caption
    assert "thread scaling" not in caption  # 2 threads: the rates' own count
    every = " ".join(CliRunner().invoke(app, ["estimate", "-m", "llama-3.1-8b", "-H", CPU, "--weights", "iq3_s"]).output.split())
    scaling = PROFILE.prefill_thread_efficiency(16)
    assert f"kernel rates (prefill {scaling:.2f}× per thread: its measured thread scaling)" in every
    gpu = " ".join(CliRunner().invoke(app, ["estimate", "-m", "llama-3.1-8b", "-H", "h100-sxm"]).output.split())
    assert "of peak FLOP/s" in gpu and "kernel rates" not in gpu
