"""verify's CPU layout detection (speedlimit.verify.topology) on fake sysfs trees, and its place in the verify result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedlimit.verify.run import VerifyResult
from speedlimit.verify.topology import CpuLayout, detect_layout, parse_cpulist


def fake_sysfs(root: Path, cpus: dict[int, tuple[int, int, str]], nodes: dict[int, str] | None,
               online: str | None = None) -> Path:
    """A sysfs tree under ``root``: ``cpus`` {cpu: (physical_package_id, core_id, thread_siblings_list)},
    ``nodes`` {node: cpulist} (None: no node directory, a kernel without NUMA)."""
    cpu_dir = root / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text((online if online is not None else f"0-{max(cpus)}") + "\n")
    for cpu, (package, core, siblings) in cpus.items():
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
        (topology / "thread_siblings_list").write_text(f"{siblings}\n")
    if nodes is not None:
        for node, cpulist in nodes.items():
            folder = root / "devices" / "system" / "node" / f"node{node}"
            folder.mkdir(parents=True)
            (folder / "cpulist").write_text(f"{cpulist}\n")
    return root


def one_socket(root: Path, cores: int = 2) -> Path:
    """A 1-socket, 1-node machine without SMT (this dev VM: 2 cores)."""
    return fake_sysfs(root, {cpu: (0, cpu, str(cpu)) for cpu in range(cores)}, {0: f"0-{cores - 1}"})


def two_sockets_smt(root: Path) -> Path:
    """2 sockets × 4 cores × 2 threads, one NUMA node per socket, numbered as Linux does on x86: the first thread of
    every core first (cpu0-3 socket 0, cpu4-7 socket 1), then their siblings (cpu8-11, cpu12-15)."""
    cpus = {}
    for cpu in range(16):
        first = cpu % 8
        package = first // 4
        cpus[cpu] = (package, first % 4, f"{first},{first + 8}")
    return fake_sysfs(root, cpus, {0: "0-3,8-11", 1: "4-7,12-15"})


def layout_tuple(layout: CpuLayout) -> tuple[int, int, int, int, bool]:
    return (layout.sockets, layout.numa_nodes_per_socket, layout.cores_per_socket, layout.threads_per_core,
            layout.detected)


# --------------------------------------------------------------------------------------------
# detection


def test_one_socket_one_node(tmp_path: Path) -> None:
    layout = detect_layout(one_socket(tmp_path))
    assert layout_tuple(layout) == (1, 1, 2, 1, True)
    assert layout.notes == [] and layout.source == f"Linux sysfs at {tmp_path}"
    assert layout.describe() == "1 socket, 1 NUMA node, 2 cores per socket, 1 thread per core"


def test_two_sockets_two_nodes_with_smt(tmp_path: Path) -> None:
    layout = detect_layout(two_sockets_smt(tmp_path))
    assert layout_tuple(layout) == (2, 1, 4, 2, True)
    assert layout.notes == [] and (layout.numa_nodes, layout.cores) == (2, 8)
    assert layout.describe() == "2 sockets × 1 NUMA node, 4 cores per socket, 2 threads per core"


def test_one_socket_nps4(tmp_path: Path) -> None:
    """EPYC with NPS4: one package, four NUMA nodes of 4 cores each."""
    root = fake_sysfs(tmp_path, {cpu: (0, cpu, str(cpu)) for cpu in range(16)},
                      {node: f"{4 * node}-{4 * node + 3}" for node in range(4)})
    assert layout_tuple(detect_layout(root)) == (1, 4, 16, 1, True)


def test_only_the_cpus_this_process_may_use_count(tmp_path: Path) -> None:
    """Pinned to socket 0 (taskset, a cpuset): one socket, one node, its 4 cores and their siblings."""
    layout = detect_layout(two_sockets_smt(tmp_path), allowed={0, 1, 2, 3, 8, 9, 10, 11})
    assert layout_tuple(layout) == (1, 1, 4, 2, True)


def test_offline_cpus_do_not_count(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {cpu: (0, cpu, str(cpu)) for cpu in range(4)}, {0: "0-3"}, online="0-1")
    assert layout_tuple(detect_layout(root)) == (1, 1, 2, 1, True)


def test_core_id_when_the_siblings_list_is_missing(tmp_path: Path) -> None:
    root = two_sockets_smt(tmp_path)
    for siblings in root.glob("devices/system/cpu/cpu*/topology/thread_siblings_list"):
        siblings.unlink()
    assert layout_tuple(detect_layout(root)) == (2, 1, 4, 2, True)


def test_packages_sharing_one_node_count_as_one_socket(tmp_path: Path) -> None:
    """A VM that shows each vCPU as its own package, all in one NUMA node: one pool of memory, one socket."""
    root = fake_sysfs(tmp_path, {cpu: (cpu, 0, str(cpu)) for cpu in range(4)}, {0: "0-3"})
    layout = detect_layout(root)
    assert layout_tuple(layout) == (1, 1, 4, 1, True)
    assert any("4 CPU packages share 1 NUMA node" in note for note in layout.notes)


def test_no_numa_directory_assumes_one_node_per_socket(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {cpu: (cpu // 2, cpu % 2, str(cpu)) for cpu in range(4)}, None)
    layout = detect_layout(root)
    assert layout_tuple(layout) == (2, 1, 2, 1, True)
    assert any("one NUMA node per socket assumed" in note for note in layout.notes)


def test_garbled_node_list_keeps_the_sockets_and_says_so(tmp_path: Path) -> None:
    root = two_sockets_smt(tmp_path)
    (root / "devices/system/node/node1/cpulist").write_text("4-x\n")
    layout = detect_layout(root)
    assert layout_tuple(layout) == (2, 1, 4, 2, True)
    assert any("node1/cpulist" in note for note in layout.notes)


def test_cores_with_different_thread_counts_are_rounded_with_a_note(tmp_path: Path) -> None:
    """2 performance cores with SMT and 2 efficiency cores without: 6 logical CPUs on 4 cores."""
    cpus = {0: (0, 0, "0-1"), 1: (0, 0, "0-1"), 2: (0, 1, "2-3"), 3: (0, 1, "2-3"), 4: (0, 2, "4"), 5: (0, 3, "5")}
    layout = detect_layout(fake_sysfs(tmp_path, cpus, {0: "0-5"}))
    assert layout_tuple(layout) == (1, 1, 4, 2, True)
    assert any("6 logical CPUs on 4 cores" in note for note in layout.notes)


def test_uneven_cores_per_node_are_rounded_to_a_multiple(tmp_path: Path) -> None:
    """5 cores over 2 nodes of one socket: counted as 4 per socket (2 per node), with a note."""
    root = fake_sysfs(tmp_path, {cpu: (0, cpu, str(cpu)) for cpu in range(5)}, {0: "0-2", 1: "3-4"})
    layout = detect_layout(root)
    assert layout_tuple(layout) == (1, 2, 4, 1, True)
    assert any("do not split evenly" in note for note in layout.notes)


def test_nodes_with_different_core_counts_are_split_evenly_with_a_note(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {cpu: (0, cpu, str(cpu)) for cpu in range(8)}, {0: "0-5", 1: "6-7"})
    layout = detect_layout(root)
    assert layout_tuple(layout) == (1, 2, 8, 1, True)
    assert layout.notes == ["the NUMA nodes hold 2 to 6 cores: counted as an even split"]


BROKEN = {
    "no cpu directory (not Linux)": ("devices/system/cpu", "rmtree"),
    "online missing": ("devices/system/cpu/online", "unlink"),
    "online garbled": ("devices/system/cpu/online", "0-1-2"),
    "package id missing": ("devices/system/cpu/cpu1/topology/physical_package_id", "unlink"),
    "package id garbled": ("devices/system/cpu/cpu1/topology/physical_package_id", "socket zero"),
    "package id not text": ("devices/system/cpu/cpu0/topology/physical_package_id", b"\xff\xfe"),
    "siblings garbled": ("devices/system/cpu/cpu0/topology/thread_siblings_list", "0-"),
    "siblings and core id missing": ("devices/system/cpu/cpu0/topology/*", "unlink siblings core"),
    "a range of a billion CPUs": ("devices/system/cpu/online", "0-999999999"),
    "nothing online": ("devices/system/cpu/online", ""),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_missing_or_garbled_files_fall_back_with_a_note(tmp_path: Path, case: str) -> None:
    import shutil

    root = one_socket(tmp_path)
    relative, change = BROKEN[case]
    target = root / relative
    if change == "rmtree":
        shutil.rmtree(target)
    elif change == "unlink":
        target.unlink()
    elif change == "unlink siblings core":
        for name in ("thread_siblings_list", "core_id"):
            (target.parent / name).unlink()
    elif isinstance(change, bytes):
        target.write_bytes(change)
    else:
        target.write_text(change + "\n")
    layout = detect_layout(root, allowed={0, 1})
    assert layout_tuple(layout) == (1, 1, 2, 1, False)  # the fallback: one socket and node, every CPU a core
    assert layout.source == "fallback"
    assert len(layout.notes) == 1 and layout.notes[0].startswith("the CPU layout could not be read (")
    assert layout.notes[0].endswith("counted as one socket and one NUMA node")
    assert layout.describe().endswith("(assumed)")


def test_this_machine_never_raises() -> None:
    layout = detect_layout()
    assert isinstance(layout, CpuLayout) and layout.cores >= 1


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("\n") == set()
    for bad in ("3-1", "a", "1,,x", "-1", "0-1-2", "0-70000"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


# --------------------------------------------------------------------------------------------
# the verify result artifact


def verify_dict(**machine: object) -> dict:
    return {"schema": "speedlimit.verify/1", "complete": False, "machine": {"cpu": "Test CPU", "cores": 16, **machine}}


def test_the_layout_round_trips_through_the_verify_result(tmp_path: Path) -> None:
    layout = detect_layout(two_sockets_smt(tmp_path / "sys"))
    path = VerifyResult.parse(verify_dict(layout=layout.model_dump())).save(tmp_path / "verify.json")
    saved = json.loads(path.read_text())["machine"]["layout"]
    assert (saved["sockets"], saved["numa_nodes_per_socket"], saved["cores_per_socket"], saved["threads_per_core"]) == (2, 1, 4, 2)
    assert VerifyResult.load(path).machine.layout == layout


def test_a_verify_result_without_a_layout_still_loads(tmp_path: Path) -> None:
    """Files written before detection have no ``layout`` (or no ``machine`` at all)."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps(verify_dict()))
    assert VerifyResult.load(path).machine.layout is None
    path.write_text(json.dumps({"schema": "speedlimit.verify/1"}))
    assert VerifyResult.load(path).machine.layout is None


def test_a_fallback_layout_round_trips_with_its_note(tmp_path: Path) -> None:
    layout = detect_layout(tmp_path / "nowhere", allowed={0, 1, 2})
    result = VerifyResult.parse(json.loads(json.dumps(VerifyResult.parse(verify_dict(layout=layout.model_dump())).to_dict())))
    assert result.machine.layout == layout and not layout.detected and layout.cores_per_socket == 3
