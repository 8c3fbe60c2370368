"""calibrate stores the CPU layout verify detected, and `estimate --hardware PROFILE --threads --numa` prices it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedlimit.catalog.profiles import load_profile_hardware
from speedlimit.estimator.api import estimate
from speedlimit.verify.fit import load_calibration_inputs
from speedlimit.verify.topology import CpuLayout, detect_layout
from tests.test_fuzz import invoke
from tests.verify.test_calibrate import BANDWIDTH, synthetic_points, verify_result
from tests.verify.test_topology import one_socket, two_sockets_smt

SINGLE_BPS = 0.3 * BANDWIDTH  # what one thread streams


def verify_file(path: Path, layout: CpuLayout | None, threads: int = 2, single_Bps: float = SINGLE_BPS) -> Path:
    """A verify result at ``threads`` threads (a 1-thread bandwidth too), with ``layout`` (None: a file from before
    detection)."""
    result = verify_result(synthetic_points(0.45, 0.35, 0.003))
    result["threads"] = threads
    for row in result["decode"] + result["prefill"]:
        row["threads"] = threads if row["threads"] == 2 else row["threads"]
    result["bandwidth"] = {"single_thread_Bps": single_Bps}
    result["machine"]["cores"] = threads
    if layout is not None:
        result["machine"]["layout"] = layout.model_dump()
    path.write_text(json.dumps(result))
    return path


def calibrate(path: Path, name: str) -> dict:
    done = invoke("calibrate", str(path), "--name", name, "--json")
    assert done.code == 0, done.err
    return json.loads(done.out)


PRICED = ("decode_tok_s", "ttft_s", "itl_s", "reached_bandwidth_Bps", "bandwidth_Bps", "flops", "threads", "numa",
          "bw_efficiency", "flops_efficiency", "step_overhead_s")


def test_a_one_socket_layout_prices_exactly_as_before_detection(tmp_path: Path) -> None:
    """This dev VM's layout (1 socket, 1 node, 2 cores): the detected layout is what a measured machine was assumed to
    be, so the profile and every estimate on it are unchanged."""
    layout = detect_layout(one_socket(tmp_path / "sys"))
    assert (layout.sockets, layout.numa_nodes_per_socket, layout.cores_per_socket, layout.threads_per_core) == (1, 1, 2, 1)
    before = calibrate(verify_file(tmp_path / "old.json", None), "before")
    after = calibrate(verify_file(tmp_path / "new.json", layout), "after")
    for key in ("bw_efficiency", "flops_efficiency", "step_overhead_s", "bandwidth_Bps", "layout", "error_after"):
        assert after[key] == before[key], key
    old, new = load_profile_hardware("before"), load_profile_hardware("after")
    assert new.topology == old.topology and new.memory_bandwidth_Bps == old.memory_bandwidth_Bps == BANDWIDTH
    for threads in (None, 1, 2, 8):
        for numa in (None, "none", "distribute", "isolate"):
            was = estimate("smollm2-135m", "before", threads=threads, numa=numa).to_dict()
            now = estimate("smollm2-135m", "after", threads=threads, numa=numa).to_dict()
            assert {k: now[k] for k in PRICED} == {k: was[k] for k in PRICED}, (threads, numa)


def test_two_sockets_are_stored_and_priced(tmp_path: Path) -> None:
    """2 sockets × 4 cores × 2 threads, verify at 16 threads: the profile keeps the layout, the measured all-thread
    figure is one node's, and --numa distribute reaches both nodes (the second one extrapolated, and said so)."""
    layout = detect_layout(two_sockets_smt(tmp_path / "sys"))
    path = verify_file(tmp_path / "verify.json", layout, threads=16)
    _, measured, _, notes = load_calibration_inputs([path])
    assert (measured.sockets, measured.numa_nodes_per_socket, measured.cores_per_socket, measured.threads_per_core) == (2, 1, 4, 2)
    assert measured.memory_bandwidth_Bps == 2 * BANDWIDTH and measured.per_core_bandwidth_Bps == SINGLE_BPS
    assert measured.socket_link_Bps is None  # not measured: no link bound is claimed
    assert any("one NUMA node" in note and "not measured" in note and "--numa distribute" in note for note in notes)

    fit = calibrate(path, "twosocket")
    assert fit["bw_efficiency"] == pytest.approx(0.45, rel=1e-6)  # fitted on the measured node's figure
    assert fit["layout"]["sockets"] == 2 and fit["layout"]["cores_per_socket"] == 4
    assert any("not measured" in note for note in fit["notes"])
    text = invoke("calibrate", str(path), "--name", "twosocket-text")
    assert text.code == 0, text.err
    assert "CPU layout: 2 sockets × 1 NUMA node, 4 cores per socket, 2 threads per core, 6.00 GB/s per core" in text.out
    profile = load_profile_hardware("twosocket")
    assert (profile.sockets, profile.numa_nodes_per_socket, profile.cores_per_socket, profile.threads_per_core) == (2, 1, 4, 2)
    assert "one NUMA node" in profile.notes and "not measured" in profile.notes

    default = estimate("smollm2-135m", "twosocket")  # llama.cpp's default: 8 threads (physical cores), no --numa
    assert (default.threads, default.reached_bandwidth_Bps) == (8, BANDWIDTH)  # the measured node, as measured
    spread = estimate("smollm2-135m", "twosocket", threads=8, numa="distribute")
    assert spread.reached_bandwidth_Bps == pytest.approx(2 * BANDWIDTH)  # both nodes: 8 × 0.3 BW per core ≥ 2 BW
    assert spread.decode_tok_s > default.decode_tok_s
    isolated = estimate("smollm2-135m", "twosocket", threads=8, numa="isolate")
    assert isolated.reached_bandwidth_Bps == pytest.approx(min(4 * SINGLE_BPS, BANDWIDTH))  # one node's 4 cores
    three = estimate("smollm2-135m", "twosocket", threads=3, numa="distribute")
    assert three.reached_bandwidth_Bps == pytest.approx(3 * SINGLE_BPS)  # bound by the threads' own rate


def test_a_fallback_layout_counts_as_before(tmp_path: Path) -> None:
    """verify could not read the layout: the profile is the one-socket, one-node machine of old, with a note."""
    layout = detect_layout(tmp_path / "no-sysfs", allowed={0, 1, 2, 3})
    assert not layout.detected
    _, measured, _, notes = load_calibration_inputs([verify_file(tmp_path / "verify.json", layout, threads=2)])
    assert (measured.sockets, measured.numa_nodes_per_socket, measured.cores_per_socket, measured.threads_per_core) == (1, 1, 2, 1)
    assert measured.memory_bandwidth_Bps == BANDWIDTH
    assert any("could not read the CPU layout" in note for note in notes)


def test_smt_threads_that_stream_more_than_their_cores_raise_the_per_core_figure(tmp_path: Path) -> None:
    """8 cores × 0.1 BW alone < the BW that 16 SMT threads reached: per-core bandwidth becomes BW / 8 (with a note), so
    the default estimate reaches what verify measured, not less."""
    layout = detect_layout(two_sockets_smt(tmp_path / "sys"))
    path = verify_file(tmp_path / "verify.json", layout, threads=16, single_Bps=0.1 * BANDWIDTH)
    _, measured, _, notes = load_calibration_inputs([path])
    assert measured.per_core_bandwidth_Bps == pytest.approx(BANDWIDTH / 8)
    assert any("SMT threads add bandwidth" in note for note in notes)
    assert calibrate(path, "smt")["bw_efficiency"] == pytest.approx(0.45, rel=1e-6)
    assert estimate("smollm2-135m", "smt").reached_bandwidth_Bps == pytest.approx(BANDWIDTH)
