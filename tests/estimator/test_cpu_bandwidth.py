"""The bandwidth one process reaches on a CPU machine: threads, sockets, NUMA policy (core.cpu_bandwidth_limits,
api.bandwidth_reach), the --threads/--numa inputs, and what the estimate says about them."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from speedlimit.catalog import catalog_hardware
from speedlimit.cli import app
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core, estimate
from speedlimit.estimator.api import bandwidth_reach
from speedlimit.estimator.sweep import sweep_grid
from speedlimit.hardware import CpuTopology, Hardware
from speedlimit.scenario import MAX_THREADS, scenario_from

runner = CliRunner()
# a made-up 2-socket machine with every figure known: 64 cores a socket at 10 GB/s each, 200 GB/s a socket, 80 GB/s link
TWO_SOCKETS = CpuTopology(sockets=2, nodes_per_socket=1, cores_per_socket=64, threads_per_core=2, per_core_Bps=10e9,
                          link_Bps=80e9)
SUMMED_BPS = 400e9
DUAL = ("amd-epyc-9654-2p", "intel-xeon-8480-2p")
SINGLE = ("amd-epyc-9654", "intel-xeon-8480")


def reached(threads, numa="none", topology=TWO_SOCKETS, bandwidth=SUMMED_BPS) -> float:
    return float(core.cpu_bandwidth_limits(bandwidth, topology, threads, numa).reached_Bps)


@pytest.mark.parametrize("numa", ["none", "distribute", "isolate"])
def test_bandwidth_grows_with_threads_until_the_memory_saturates(numa: str) -> None:
    rates = [reached(t, numa) for t in range(1, 4 * TWO_SOCKETS.cores)]
    assert all(b >= a for a, b in zip(rates, rates[1:]))  # monotone
    assert rates[0] == 10e9  # one core's figure
    assert reached(4, numa) == 40e9  # below saturation: cores × per-core
    ceiling = {"none": 160e9, "distribute": SUMMED_BPS, "isolate": 200e9}[numa]  # none: 2 × the 80 GB/s link
    assert max(rates) == ceiling and reached(10_000, numa) == ceiling


def test_hyperthreads_add_no_bandwidth() -> None:
    cores = TWO_SOCKETS.cores
    slow = CpuTopology(2, 1, 64, 2, 1e9, math.nan)  # per-core so low that every core counts
    assert reached(cores, "distribute", slow) == reached(2 * cores, "distribute", slow) == 128e9
    assert reached(64, "isolate", slow) == reached(128, "isolate", slow) == 64e9  # isolate: one node's 64 cores


def test_two_sockets_without_numa_reach_less_than_distributed_and_never_more_than_summed() -> None:
    for threads in (1, 16, 64, 128, 256):
        none, spread = reached(threads, "none"), reached(threads, "distribute")
        assert none <= spread <= SUMMED_BPS
    assert reached(128, "none") < reached(128, "distribute")


def test_the_link_limit_applies_only_across_sockets_without_numa() -> None:
    limits = core.cpu_bandwidth_limits(SUMMED_BPS, TWO_SOCKETS, 128, "none")
    assert float(limits.link_Bps) == 160e9 and float(limits.memory_Bps) == 200e9
    assert math.isinf(float(core.cpu_bandwidth_limits(SUMMED_BPS, TWO_SOCKETS, 128, "distribute").link_Bps))
    one_socket = TWO_SOCKETS._replace(sockets=1)
    assert math.isinf(float(core.cpu_bandwidth_limits(200e9, one_socket, 64, "none").link_Bps))


def test_numa_nodes_split_a_socket() -> None:
    nps4 = TWO_SOCKETS._replace(nodes_per_socket=4, per_core_Bps=math.nan)
    assert reached(128, "none", nps4) == 50e9  # first touch: one of 8 nodes
    assert reached(128, "isolate", nps4) == 50e9
    assert reached(128, "distribute", nps4) == SUMMED_BPS
    assert reached(3, "distribute", nps4) == 150e9  # 3 threads round-robin over 3 of the 8 nodes


def test_vectorized_over_threads() -> None:
    threads = np.array([1, 8, 64, 512])
    grid = core.cpu_bandwidth_limits(SUMMED_BPS, TWO_SOCKETS, threads, "distribute").reached_Bps
    assert list(grid) == [reached(int(t), "distribute") for t in threads]


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match="mirror"):
        core.cpu_bandwidth_limits(SUMMED_BPS, TWO_SOCKETS, 8, "mirror")


# --------------------------------------------------------------------------------------------
# the catalog and the estimate


@pytest.mark.parametrize("key", SINGLE)
def test_single_socket_entries_price_as_before(key: str) -> None:
    device = catalog_hardware(key)
    flat = device.model_copy(update={f: None for f in ("sockets", "numa_nodes_per_socket", "cores_per_socket",
                                                       "threads_per_core", "memory_channels_per_socket")})
    assert flat.topology is None and device.topology is not None
    for model, weights in (("llama-3.1-8b", "q4_k_m"), ("qwen2.5-7b", "bf16")):
        # a flat FLOP/s efficiency on both: the layout-less device cannot price llama.cpp's per-core kernel rates
        new = estimate(model, device, weights=weights, flops_efficiency=0.5)
        old = estimate(model, flat, weights=weights, flops_efficiency=0.5)
        assert new.reached_bandwidth_Bps == device.memory_bandwidth_Bps
        assert (new.decode_tok_s, new.ttft_s) == (old.decode_tok_s, old.ttft_s)
        assert new.threads == device.cores_per_socket and new.numa == "none"


@pytest.mark.parametrize("key", DUAL)
def test_dual_socket_entries(key: str) -> None:
    device = catalog_hardware(key)
    half = device.memory_bandwidth_Bps / 2
    none = estimate("llama-3.1-8b", key, weights="q4_k_m")
    spread = estimate("llama-3.1-8b", key, weights="q4_k_m", numa="distribute")
    isolated = estimate("llama-3.1-8b", key, weights="q4_k_m", numa="isolate")
    assert none.threads == spread.threads == 2 * device.cores_per_socket  # llama.cpp's default: every physical core
    assert none.reached_bandwidth_Bps <= half < spread.reached_bandwidth_Bps == device.memory_bandwidth_Bps
    assert none.decode_tok_s < spread.decode_tok_s
    assert isolated.reached_bandwidth_Bps == half
    assert isolated.ttft_s > spread.ttft_s  # one socket's cores: half the FLOP/s for prefill
    assert "2 sockets, numa none" in none.bandwidth_basis and "summed peak" in none.bandwidth_basis
    # ideal mode is the seed formula: the summed peak whatever the layout
    ideal = estimate("llama-3.1-8b", key, weights="q4_k_m", ideal=True)
    assert ideal.reached_bandwidth_Bps is None and ideal.bandwidth_Bps == device.memory_bandwidth_Bps


def test_the_xeon_pair_is_bound_by_its_upi_links() -> None:
    result = estimate("llama-3.1-8b", "intel-xeon-8480-2p", weights="q4_k_m")
    assert result.reached_bandwidth_Bps == 2 * 128e9 < 307.2e9
    assert "socket link" in result.bandwidth_basis


def test_fewer_threads_fewer_flops_on_a_catalog_cpu_without_a_per_core_figure() -> None:
    full = estimate("llama-3.1-8b", "intel-xeon-8480", prompt=2048)
    eight = estimate("llama-3.1-8b", "intel-xeon-8480", prompt=2048, threads=8)
    assert eight.reached_bandwidth_Bps == full.reached_bandwidth_Bps  # no public per-core figure: not a bandwidth limit
    # 8 of 56 cores, each at a higher clock (3.8 GHz boost with one busy, 2.0 base with all): > 3x the prefill time
    assert eight.ttft_s > 3 * full.ttft_s and "no per-core bandwidth figure" in eight.bandwidth_basis


def test_a_catalog_cpus_published_per_core_figure_limits_one_thread() -> None:
    """The 7950X's per-core figure (Chips and Cheese, peak-equivalent 75.1 GB/s): one thread reaches less than the
    socket; two already reach the socket's 83.2 GB/s, so from two threads on only FLOP/s scale."""
    one = estimate("llama-3.1-8b", "amd-ryzen-9-7950x", weights="f16", threads=1, prompt=0, output=128)
    two = estimate("llama-3.1-8b", "amd-ryzen-9-7950x", weights="f16", threads=2, prompt=0, output=128)
    assert one.reached_bandwidth_Bps == pytest.approx(75.1e9) and two.reached_bandwidth_Bps == pytest.approx(83.2e9)
    assert one.decode_tok_s < two.decode_tok_s and "1 core" in one.bandwidth_basis
    assert estimate("llama-3.1-8b", "amd-epyc-9654", threads=4).reached_bandwidth_Bps == pytest.approx(4 * 45.4e9)


def test_a_measured_per_core_figure_limits_few_threads() -> None:
    local = Hardware(key="box", name="box", kind="cpu", memory_bandwidth_Bps=80e9, flops={"fp32": 1e12},
                     cores_per_socket=16, per_core_bandwidth_Bps=12e9)
    assert bandwidth_reach(local, 2).bandwidth_Bps == 24e9
    assert bandwidth_reach(local).bandwidth_Bps == 80e9 and bandwidth_reach(local).threads == 16
    slow, fast = estimate("llama-3.1-8b", local, threads=2), estimate("llama-3.1-8b", local)
    assert slow.decode_tok_s < fast.decode_tok_s and "2 cores × 12 GB/s per core" in slow.bandwidth_basis


# --------------------------------------------------------------------------------------------
# inputs


@pytest.mark.parametrize("inputs, needle", [
    ({"threads": 0}, "--threads"), ({"threads": MAX_THREADS + 1}, "--threads"), ({"threads": True}, "--threads"),
    ({"threads": "many"}, "--threads"), ({"numa": "mirror"}, "--numa"), ({"numa": 3}, "--numa"),
    ({"threads": 8, "ideal": True}, "--ideal and --threads"), ({"numa": "isolate", "ideal": True}, "--ideal and --numa"),
])  # fmt: skip
def test_bad_threads_and_numa_name_the_flag(inputs: dict, needle: str) -> None:
    with pytest.raises(SpeedlimitError, match=needle):
        scenario_from(model="llama-3.1-8b", hardware="amd-epyc-9654", **inputs)


def test_numa_is_read_case_blind() -> None:
    assert scenario_from(model="7B", hardware="amd-epyc-9654", numa=" Distribute ").numa == "distribute"


@pytest.mark.parametrize("hardware", [{"hardware": "h100-sxm"}, {"hardware": "apple-m2-ultra"}, {"bandwidth": 100e9}])
@pytest.mark.parametrize("cpu", [{"threads": 8}, {"numa": "none"}])
def test_threads_and_numa_on_a_device_without_a_cpu_layout_are_an_error(hardware: dict, cpu: dict) -> None:
    flag = "--threads" if "threads" in cpu else "--numa"
    with pytest.raises(SpeedlimitError, match=f"{flag} describes the threads of a CPU run"):
        estimate("llama-3.1-8b", **hardware, **cpu)


def test_cli_json_says_which_bandwidth_and_why() -> None:
    out = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-H", "2x-epyc-9654", "--numa", "distribute",
                              "--threads", "96", "--weights", "q4_k_m", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data == estimate("llama-3.1-8b", "amd-epyc-9654-2p", numa="distribute", threads=96, weights="q4_k_m").to_dict()
    assert (data["threads"], data["numa"], data["reached_bandwidth_Bps"]) == (96, "distribute", 921.6e9)
    assert data["bandwidth_basis"].startswith("2 sockets, numa distribute: 96 threads reach 921.6 GB/s")
    table = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-H", "2x-epyc-9654", "--weights", "q4_k_m"])
    assert table.exit_code == 0 and "memory bandwidth reached" in table.output and "460.8 GB/s" in table.output


def test_cli_refuses_threads_on_a_gpu_in_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "speedlimit.cli", "estimate", "-m", "llama-3.1-8b", "-H", "h100-sxm",
                          "--threads", "8"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "gpu device" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_sweep_applies_numa_to_its_cpus_only() -> None:
    result = sweep_grid(["llama-3.1-8b"], ["h100-sxm", "amd-epyc-9654-2p"], ["q4_k_m"], [1], [512], numa="distribute")
    plain = sweep_grid(["llama-3.1-8b"], ["h100-sxm", "amd-epyc-9654-2p"], ["q4_k_m"], [1], [512])
    gpu, cpu = result.columns["decode_tok_s"]
    assert gpu == plain.columns["decode_tok_s"][0] and cpu > plain.columns["decode_tok_s"][1]
    with pytest.raises(SpeedlimitError, match="no hardware of this sweep is a CPU"):
        sweep_grid(["llama-3.1-8b"], ["h100-sxm"], ["q4_k_m"], [1], [512], threads=8)


def test_simulate_runs_at_the_reached_bandwidth() -> None:
    from speedlimit.simulator.api import resolve

    none = resolve("llama-3.1-8b", "amd-epyc-9654-2p", weights="q4_k_m")
    spread = resolve("llama-3.1-8b", "amd-epyc-9654-2p", weights="q4_k_m", numa="distribute")
    assert float(spread.machine.bandwidth_Bps) == pytest.approx(2 * float(none.machine.bandwidth_Bps))


@pytest.mark.parametrize("fields, needle", [
    ({"kind": "gpu", "cores_per_socket": 8}, "describes a CPU"),
    ({"sockets": 2}, "needs cores_per_socket"),
    ({"cores_per_socket": 6, "numa_nodes_per_socket": 4}, "do not split into 4 NUMA nodes"),
    ({"cores_per_socket": 8, "per_core_bandwidth_Bps": 1e30}, "per-core bandwidth"),
    ({"cores_per_socket": 8, "socket_link_Bps": -1.0}, "socket link bandwidth"),
    ({"cores_per_socket": 0}, "cores_per_socket"),
])  # fmt: skip
def test_a_bad_cpu_layout_is_refused(fields: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Hardware(**{"key": "x", "name": "x", "kind": "cpu", "memory_bandwidth_Bps": 100e9, **fields})
