"""This machine's core clock, measured: a chain of dependent register adds, timed at one and at N busy cores.

A register-to-register integer add has a latency of one cycle on every x86-64 core since Sandy Bridge and Zen
(Agner Fog's instruction tables) and on AArch64 cores alike, so a chain of them retires one add per cycle and its
rate is the clock the core actually runs at, turbo and all-core limits included; an OS's "cpu MHz" is often the
nominal or the hypervisor's TSC rate instead (2.6 GHz on the dev VM, whose cores run near 3.5 GHz). llama.cpp's CPU
kernel rates (catalog/engines.toml kernel_rates) are per cycle, so the estimate needs this clock to price them.

The chain is C with inline assembly, compiled once per call with the machine's C compiler (present wherever
llama-cpp-python was built from source, as README's install line builds it). Without a compiler, on another
architecture, or on any failure `measure_clock` returns a `ClockResult` with ``hz_one_core`` None and the reason;
it never raises. `benchmarks/cpu_kernel_rates.py` times its fold-C rows with the same probe.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Iterations x 10 adds: 1e8 x 10 = 1e9 cycles, about 0.3 s at 3.5 GHz.
DEFAULT_ITERATIONS = 100_000_000
_TIMEOUT_S = 60.0

CLOCK_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    const long n = argc > 1 ? atol(argv[1]) : 300000000L;
    long x = 0, one = 1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    /* register-register adds: Intel's Golden Cove folds add-immediate chains at rename (a first run on a Xeon
       read 9 GHz with "add $1"), a dependent register add still retires one per cycle */
    for (long i = 0; i < n; i++) {
#if defined(__x86_64__)
        __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                         "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"(one));
#elif defined(__aarch64__)
        __asm__ volatile("add %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\t"
                         "add %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1"
                         : "+r"(x) : "r"(one));
#else
#error "no dependent-add chain for this architecture"
#endif
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    printf("%.0f\n", (double)n * 10.0 / s);
    return x == 42;
}
"""

_ARCHITECTURES = {"x86_64", "amd64", "aarch64", "arm64"}


@dataclass(frozen=True)
class ClockResult:
    """The clock with one core busy and with ``busy_cores`` busy (each the slowest copy), or why there is none."""

    hz_one_core: float | None
    hz_all_busy: float | None
    busy_cores: int
    basis: str


def compile_probe(folder: Path) -> Path:
    """Compile the dependent-add chain into ``folder``; its path (raises OSError / CalledProcessError / RuntimeError)."""
    compiler = next((found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)
    if compiler is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    source, binary = folder / "clock.c", folder / "clock"
    source.write_text(CLOCK_C)
    subprocess.run([compiler, "-O1", "-o", str(binary), str(source)], check=True, capture_output=True, timeout=_TIMEOUT_S)
    return binary


def run_probe(binary: Path, copies: int, iterations: int = DEFAULT_ITERATIONS) -> float:
    """Adds per second of ``copies`` concurrent chains: the slowest copy (raises ValueError on bad output)."""
    runs = [subprocess.Popen([str(binary), str(iterations)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for _ in range(copies)]
    outputs = []
    try:
        for run in runs:
            outputs.append(run.communicate(timeout=_TIMEOUT_S)[0])
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    rates = [float(text) for text in outputs]
    if not rates or not all(1e8 <= rate <= 1e10 for rate in rates):
        raise ValueError(f"implausible clock readings {rates}")
    return min(rates)


def measure_clock(busy_cores: int, iterations: int = DEFAULT_ITERATIONS) -> ClockResult:
    """This machine's clock at 1 and at ``busy_cores`` busy cores; ``hz_one_core`` None (with the reason) where it
    cannot be measured."""
    machine = platform.machine().lower()
    if machine not in _ARCHITECTURES:
        return ClockResult(None, None, busy_cores, f"no dependent-add probe for a {machine or 'unknown'} CPU")
    try:
        with tempfile.TemporaryDirectory(prefix="speedlimit-clock-") as folder:
            binary = compile_probe(Path(folder))
            one = run_probe(binary, 1, iterations)
            busy = run_probe(binary, busy_cores, iterations) if busy_cores > 1 else one
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return ClockResult(None, None, busy_cores, f"clock not measured ({reason[:200]})")
    return ClockResult(one, busy, busy_cores,
                       f"dependent register adds, one per cycle, timed at 1 and {busy_cores} busy cores (slowest copy)")
