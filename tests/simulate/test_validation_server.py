"""Real engines on this machine vs the simulator's prediction of the same workload (marked `server`).

For each engine, bench measures concurrency 1 and 4 against the real server serving the bundled SmolLM2-135M GGUF;
the engine profile (per-step overhead and prefill FLOP/s efficiency) is fitted on the concurrency-1 run alone,
on hardware measured here in a few seconds (read bandwidth and fp32 matmul FLOP/s); concurrency 4 is then a
held-out prediction: how the engine batches (llama-server: continuous batching over 8 slots) or queues
(llama-cpp-python's server: one request at a time) under load.

The band (BAND = 2.5): this is a shared 2-core VM. Two server threads, the benchmark client and other jobs compete
for two cores, and the same server measured twice ten minutes apart at concurrency 1 gave 1.9 and 1.1 output tok/s,
TPOT p50 406 and 514 ms, TTFT p50 4.8 and 3.6 s (benchmarks/README.md, 2026-12-02, load average 6-10). The fit point
and the held-out point each move by up to ~1.6× between repeats, so their ratio can move by ~2.5× with no model
error at all; in those runs the concurrency-4 held-out ratios were 0.71-1.25. A ratio outside [1/2.5, 2.5] is a model error
larger than this machine's noise.

The band is only meaningful when the machine is not oversubscribed: with a 1-minute load average above the core
count, other jobs' threads take the server's cores mid-run (measured: llama-server's TPOT jumped from 10 ms to 300 ms
between two points run a minute apart at load 3.7), and the test skips instead of reporting noise as a model error.
llama-cpp-python's server runs 1 compute thread here (`validate_simulate.DEFAULT_THREADS`): with 2 beside its Python
event loop and the bench client on 2 cores, its per-token time took one of two values from run to run (8-9 or
25-29 ms, 2026-12-05), so the fit at concurrency 1 and the held-out point could land in different ones (TPOT ratio
3.4) with no model error; with 1 thread three runs gave 0.93-1.04 on every checked metric.
The load average cannot see a burst that starts after the check: in a 2026-12-03 CI dry run, mid-suite, the
llama-cpp-python server's concurrency-4 TPOT p50 came out 41.9 ms against 14.2 predicted (ratio 3.0), and the same
test alone minutes later passed. So a validation outside the band is run once more, fit point and held-out point
together; a model error misses on both attempts, a burst of other work rarely lasts through both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

pytestmark = pytest.mark.server

BAND = 2.5  # measured ÷ predicted must lie within [1/BAND, BAND]
ATTEMPTS = 2  # a point outside the band is measured once more (see the module docstring)
CHECKED = ("TTFT p50", "TPOT p50", "output tok/s")


@pytest.fixture(scope="module")
def this_machine():
    from speedlimit.hardware import custom_hardware
    from speedlimit.verify.membench import measure_bandwidth, measure_matmul_flops

    bandwidth = max(r.best_Bps for r in measure_bandwidth(array_bytes=64 * 2**20, threads=2, repeats=3,
                                                          kernels=("read",)))
    matmul = measure_matmul_flops(n=1024, repeats=3)
    return custom_hardware(bandwidth, matmul.best_flops if matmul else None)


@pytest.mark.parametrize("engine", ["llama-server", "llama-cpp-python"])
def test_simulated_engine_agrees_with_the_real_one_under_load(engine, this_machine, tmp_path):
    import os

    import validate_simulate

    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        pytest.skip(f"load average {load:.1f} on {cores} cores: timings measure other jobs, not the engine")

    if engine == "llama-server" and not validate_simulate.LLAMA_SERVER.is_file():
        pytest.skip(f"llama.cpp's llama-server is not built at {validate_simulate.LLAMA_SERVER}")
    if engine == "llama-cpp-python":
        pytest.importorskip("llama_cpp.server")
    misses: list[tuple] = []
    for attempt in range(ATTEMPTS):
        # a server per point: the concurrency-4 point does not inherit the slots the first point left scattered
        # (llama-server's --parallel slots step one forward pass per run of consecutive busy slots)
        result = validate_simulate.validate(engine, this_machine, tmp_path / f"attempt_{attempt}", [1, 4], requests=6,
                                            prompt=128, output=24, fresh_server=True)
        held_out = [row for row in result["rows"] if row["prediction"] == "engine profile" and row["concurrency"] == 4]
        assert held_out and held_out[0]["failed"] <= 3  # llama-server drops reused connections: see the hardening issue
        misses = [(engine, name, held_out[0][name]) for name in CHECKED
                  if held_out[0][name]["ratio"] is None or not 1 / BAND <= held_out[0][name]["ratio"] <= BAND]
        if not misses:
            break
    assert not misses, misses  # outside the band on every attempt: a model error, not a burst of other work
