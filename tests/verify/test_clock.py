"""The measured core clock (`speedlimit.verify.clock`) and how verify picks the kernel rates of the build it runs."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from speedlimit.catalog import catalog_engine
from speedlimit.estimator.api import estimate
from speedlimit.verify import clock
from speedlimit.verify.run import kernel_profile_for, measured_hardware

WHEEL = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | "
         "OPENMP = 1 | REPACK = 1 | ")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_dependent_add_chain_reads_a_plausible_clock() -> None:
    result = clock.measure_clock(2, iterations=20_000_000)
    assert result.hz_one_core is not None and result.hz_all_busy is not None, result.basis
    assert 5e8 < result.hz_all_busy and result.hz_one_core < 7e9  # any CPU of the last twenty years
    assert result.busy_cores == 2 and "dependent register adds" in result.basis


def test_no_compiler_gives_no_clock_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock.shutil, "which", lambda name: None)
    result = clock.measure_clock(4)
    assert result.hz_one_core is None and result.hz_all_busy is None
    assert "no C compiler" in result.basis


def test_an_unknown_architecture_gives_no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock.platform, "machine", lambda: "riscv64")
    assert "riscv64" in clock.measure_clock(1).basis and clock.measure_clock(1).hz_one_core is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("printed", ["", "banana\n", "1e15\n", "0\n"])
def test_implausible_probe_output_is_refused(tmp_path, printed: str) -> None:
    fake = tmp_path / "clock"
    fake.write_text(f"#!/bin/sh\nprintf '{printed}'\n")
    fake.chmod(0o755)
    with pytest.raises(ValueError):
        clock.run_probe(fake, 2)


def test_a_failing_compiler_gives_no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise subprocess.CalledProcessError(1, args[0], stderr=b"cc: error")
    monkeypatch.setattr(clock.subprocess, "run", broken)
    monkeypatch.setattr(clock.shutil, "which", lambda name: "/usr/bin/cc")
    result = clock.measure_clock(2)
    assert result.hz_one_core is None and result.basis.startswith("clock not measured")


@pytest.mark.parametrize(("info", "vendor", "profile"), [
    (WHEEL, "", "llama-cpp-cpu-avx2"),
    (WHEEL, "AuthenticAMD", "llama-cpp-cpu-avx2"),
    # the portable build on an Intel core: its own measured rates (fold C amendment 8)
    (WHEEL, "GenuineIntel", "llama-cpp-cpu-intel"),
    ("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 |", "", "llama-cpp-cpu"),
    ("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 |", "GenuineIntel", "llama-cpp-cpu"),
    ("CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 |\nMetal : EMBED_LIBRARY = 1 |", "", None),
    ("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 0 |", "GenuineIntel", None),
    ("", "", None),
    ("fake", "GenuineIntel", None),
])
def test_the_kernel_rates_follow_the_build_llama_cpp_reports(info: str, vendor: str, profile: str | None) -> None:
    chosen, why = kernel_profile_for(info, vendor)
    assert chosen == profile and why
    if chosen is not None:
        assert catalog_engine(chosen).kernel_rates is not None
    assert ("Intel" in why) == (chosen == "llama-cpp-cpu-intel")


def test_a_clocked_measured_machine_prices_the_builds_kernels_and_its_limit_does_not() -> None:
    """With a clock and a core count the estimate prices llama.cpp's matmuls at the profile's per-cycle rates; the
    same machine without a clock is priced on bandwidth and BLAS FLOP/s, as before."""
    clocked = measured_hardware(30e9, 200e9, 16e9, "2 threads", threads=2, clock_hz=(3.6e9, 3.5e9))
    plain = measured_hardware(30e9, 200e9, 16e9, "2 threads")
    assert clocked.topology is not None and clocked.topology.cores == 2 and plain.topology is None
    assert clocked.core_clock_hz(2) == pytest.approx(3.5e9) and clocked.core_clock_hz(1) == pytest.approx(3.6e9)
    priced = estimate("llama-3.1-8b", clocked, weights="q4_1", prompt=512, output=1, engine="llama-cpp-cpu-avx2")
    assert priced.cpu_kernels == "q4_1" and "3.50 GHz with 2 cores busy" in priced.efficiency_basis
    avx512 = estimate("llama-3.1-8b", clocked, weights="q4_1", prompt=512, output=1, engine="llama-cpp-cpu")
    portable_rate = catalog_engine("llama-cpp-cpu-avx2").kernel_rate("q4_1")[1]
    avx512_rate = catalog_engine("llama-cpp-cpu").kernel_rate("q4_1")[1]
    assert portable_rate != avx512_rate  # the prefill GEMM is priced at each build's own measured rate
    assert avx512.ttft_s / priced.ttft_s == pytest.approx(portable_rate / avx512_rate, rel=0.1)
    unpriced = estimate("llama-3.1-8b", plain, weights="q4_1", prompt=512, output=1, engine="llama-cpp-cpu-avx2")
    assert unpriced.cpu_kernels is None
    one = measured_hardware(20e9, 100e9, 16e9, "1 thread", threads=1, clock_hz=(3.6e9, 3.6e9))
    assert one.core_clock_hz(1) == pytest.approx(3.6e9)
