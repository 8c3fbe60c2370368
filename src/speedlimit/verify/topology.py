"""This machine's CPU layout: sockets, NUMA nodes per socket, physical cores per socket, threads per core.

`detect_layout` reads Linux sysfs (the only I/O here; its root is a parameter so tests pass fake trees) and
`layout_from_cpus` reduces what it read to the uniform layout the estimator models (`CpuLayout`, whose fields are
`speedlimit.hardware.Hardware`'s CPU layout fields). Files read, as the kernel documents them:

- ``devices/system/cpu/online``: the online CPUs, a cpulist ("0-3,8-11").
- ``devices/system/cpu/cpuN/topology/physical_package_id`` (the socket), ``thread_siblings_list`` (the CPUs that
  share cpuN's physical core) and ``core_id`` (used when the siblings list is missing): CPU topology,
  https://docs.kernel.org/admin-guide/cputopology.html
- ``devices/system/node/nodeN/cpulist``: the CPUs of NUMA node N, sysfs ABI
  https://www.kernel.org/doc/Documentation/ABI/stable/sysfs-devices-node ("/sys/devices/system/node/nodeX/cpulist:
  the CPUs associated to the node").

Only the CPUs this process may run on count (``allowed``: its affinity mask), since those are the cores its
threads can use. NUMA nodes without CPUs (memory-only: CXL, HBM in flat mode) hold no cores and are not counted.
Anything missing or unreadable, or a machine without sysfs (macOS, Windows), gives the fallback: one socket and one
NUMA node with every logical CPU a core, and a note saying the layout could not be read. Never an exception.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speedlimit.hardware import MAX_CORES, MAX_NODES_PER_SOCKET, MAX_SOCKETS, MAX_THREADS_PER_CORE

SYSFS_ROOT = Path("/sys")
_MAX_FILE_BYTES = 1 << 16  # a sysfs topology file is a line; a larger one is not one
_MAX_CPUS = 1 << 16  # CPUs in one cpulist (Linux's NR_CPUS tops out at 8192)
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class CpuLayout(BaseModel):
    """The layout one process's threads see; ``detected`` False: the fallback (one socket, one node), see ``notes``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    sockets: int = Field(1, ge=1, le=MAX_SOCKETS)
    numa_nodes_per_socket: int = Field(1, ge=1, le=MAX_NODES_PER_SOCKET)
    cores_per_socket: int = Field(ge=1, le=MAX_CORES)  # physical cores
    threads_per_core: int = Field(1, ge=1, le=MAX_THREADS_PER_CORE)  # SMT threads (logical CPUs) per core
    detected: bool = False
    source: str = ""  # where the layout was read ("Linux sysfs at /sys"), or why it was assumed
    notes: list[str] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _even(self) -> CpuLayout:
        if self.cores_per_socket % self.numa_nodes_per_socket:
            raise ValueError(f"{self.cores_per_socket} cores per socket do not split into "
                             f"{self.numa_nodes_per_socket} NUMA nodes")
        return self

    @property
    def numa_nodes(self) -> int:
        return self.sockets * self.numa_nodes_per_socket

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket

    def hardware_fields(self) -> dict[str, int]:
        """The `Hardware` fields this layout sets."""
        return {"sockets": self.sockets, "numa_nodes_per_socket": self.numa_nodes_per_socket,
                "cores_per_socket": self.cores_per_socket, "threads_per_core": self.threads_per_core}

    def describe(self) -> str:
        """``2 sockets × 2 NUMA nodes, 32 cores per socket, 2 threads per core`` (with ``(assumed)`` for the fallback)."""
        def count(n: int, word: str) -> str:
            return f"{n} {word}{'s' if n != 1 else ''}"

        nodes = (f" × {count(self.numa_nodes_per_socket, 'NUMA node')}" if self.sockets > 1
                 else f", {count(self.numa_nodes_per_socket, 'NUMA node')}")
        text = (f"{count(self.sockets, 'socket')}{nodes}, {count(self.cores_per_socket, 'core')} per socket, "
                f"{count(self.threads_per_core, 'thread')} per core")
        return text if self.detected else f"{text} (assumed)"


def fallback_layout(logical_cpus: int, why: str) -> CpuLayout:
    """One socket and one NUMA node, every logical CPU a core: what a measured machine counted as before detection."""
    return CpuLayout(cores_per_socket=max(1, min(int(logical_cpus), MAX_CORES)), detected=False, source="fallback",
                     notes=[f"the CPU layout could not be read ({why}): counted as one socket and one NUMA node"])


# --------------------------------------------------------------------------------------------
# the reduction (pure)


class CpuRecord(NamedTuple):
    """One logical CPU as sysfs describes it."""

    package: int
    core: Any  # a hashable key of its physical core: the frozenset of its thread siblings, or (package, core_id)
    node: int | None  # its NUMA node; None where sysfs says none


def parse_cpulist(text: str) -> set[int]:
    """The CPUs of a kernel cpulist ("0-3,8,10-11"; empty: none); ValueError when it is not one."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"{part!r} is not a CPU number or range")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low or high - low + len(cpus) >= _MAX_CPUS:
            raise ValueError(f"{part!r} is not a plausible CPU range")
        cpus.update(range(low, high + 1))
    return cpus


def layout_from_cpus(cpus: dict[int, CpuRecord], source: str, notes: list[str] | None = None) -> CpuLayout:
    """The uniform layout closest to these CPUs: sockets × nodes per socket × cores per socket × threads per core.

    A machine that is not uniform (a node spanning packages, as a VM may show; cores spread unevenly; performance and
    efficiency cores with different thread counts) is rounded to one, and a note says how.
    """
    notes = list(notes or [])
    if not cpus:
        return fallback_layout(1, "no CPUs")
    packages = {record.package for record in cpus.values()}
    cores = {record.core for record in cpus.values()}
    known_nodes = all(record.node is not None for record in cpus.values())
    nodes = {record.node for record in cpus.values()} if known_nodes else set()
    sockets, per_socket = len(packages), 1
    if not known_nodes:
        notes.append("the NUMA node of some CPUs is unknown: one NUMA node per socket assumed")
    else:
        packages_of_node = {node: {r.package for r in cpus.values() if r.node == node} for node in nodes}
        if any(len(held) > 1 for held in packages_of_node.values()):
            notes.append(f"{len(packages)} CPU packages share {len(nodes)} NUMA node{'s' if len(nodes) > 1 else ''} "
                         "(a virtual machine?): each node counted as one socket")
            sockets = len(nodes)
        else:
            per_socket = max(1, round(len(nodes) / sockets))
            if per_socket * sockets != len(nodes):
                notes.append(f"{len(nodes)} NUMA nodes over {sockets} sockets: counted as {per_socket} per socket")
    if sockets > MAX_SOCKETS or per_socket > MAX_NODES_PER_SOCKET:
        return fallback_layout(len(cpus), f"{sockets} sockets × {per_socket} NUMA nodes is beyond what is modelled")
    exact = len(cores) / sockets
    per_socket_cores = max(per_socket, int(exact) // per_socket * per_socket)
    if per_socket_cores != exact:
        notes.append(f"{len(cores)} cores do not split evenly over {sockets} socket{'s' if sockets > 1 else ''} × "
                     f"{per_socket} NUMA node{'s' if per_socket > 1 else ''}: counted as {per_socket_cores} per socket")
    elif known_nodes and len(nodes) > 1:
        core_counts = sorted(len({r.core for r in cpus.values() if r.node == node}) for node in nodes)
        if core_counts[0] != core_counts[-1]:
            notes.append(f"the NUMA nodes hold {core_counts[0]} to {core_counts[-1]} cores: counted as an even split")
    threads = len(cpus) / len(cores)
    per_core = min(MAX_THREADS_PER_CORE, max(1, round(threads)))
    if per_core != threads:
        notes.append(f"{len(cpus)} logical CPUs on {len(cores)} cores (cores with different thread counts, e.g. "
                     f"performance and efficiency cores): counted as {per_core} per core")
    if per_socket_cores > MAX_CORES:
        return fallback_layout(len(cpus), f"{per_socket_cores} cores per socket is beyond what is modelled")
    return CpuLayout(sockets=sockets, numa_nodes_per_socket=per_socket, cores_per_socket=per_socket_cores,
                     threads_per_core=per_core, detected=True, source=source, notes=notes)


# --------------------------------------------------------------------------------------------
# reading sysfs (the I/O)


def _read(path: Path) -> str:
    with open(path, encoding="ascii") as file:
        return file.read(_MAX_FILE_BYTES)


def _node_of_cpu(root: Path) -> tuple[dict[int, int] | None, str | None]:
    """{cpu: node} from ``nodeN/cpulist``; (None, why) where the node directory is missing or unreadable."""
    base = root / "devices" / "system" / "node"
    try:
        entries = sorted(entry for entry in os.listdir(base) if re.fullmatch(r"node\d+", entry))
    except OSError:
        return None, None  # a kernel without NUMA support: no node directory at all
    where: dict[int, int] = {}
    for entry in entries[:_MAX_CPUS]:
        try:
            for cpu in parse_cpulist(_read(base / entry / "cpulist")):
                where.setdefault(cpu, int(entry[4:]))
        except (OSError, ValueError, UnicodeDecodeError) as error:
            return None, f"{base / entry / 'cpulist'}: {_reason(error)}"
    return where, None


def _reason(error: BaseException) -> str:
    if isinstance(error, FileNotFoundError):
        return "missing"
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return str(error) if isinstance(error, ValueError) and not isinstance(error, UnicodeDecodeError) else "not text"


def detect_layout(root: Path = SYSFS_ROOT, allowed: Collection[int] | None = None) -> CpuLayout:
    """This machine's layout from sysfs under ``root``, over the online CPUs in ``allowed`` (None: all online).

    Never raises: whatever cannot be read gives `fallback_layout` with a note naming the file.
    """
    base = root / "devices" / "system" / "cpu"
    logical = len(allowed) if allowed else (os.cpu_count() or 1)
    if not base.is_dir():
        return fallback_layout(logical, f"no {base}: not Linux")
    try:
        online = parse_cpulist(_read(base / "online"))
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return fallback_layout(logical, f"{base / 'online'}: {_reason(error)}")
    chosen = sorted(online & set(allowed)) if allowed else sorted(online)
    if not chosen:
        return fallback_layout(logical, f"none of the CPUs this process may use is online in {base / 'online'}")
    node_of, node_problem = _node_of_cpu(root)
    notes = [f"NUMA nodes not read ({node_problem})"] if node_problem else []
    cpus: dict[int, CpuRecord] = {}
    for cpu in chosen:
        folder = base / f"cpu{cpu}" / "topology"
        current = folder / "physical_package_id"
        try:
            package = int(_read(current).strip())
            current = folder / "thread_siblings_list"
            try:
                core: Any = frozenset(parse_cpulist(_read(current)))
            except FileNotFoundError:
                current = folder / "core_id"
                core = (package, int(_read(current).strip()))
        except (OSError, ValueError, UnicodeDecodeError) as error:
            return fallback_layout(len(chosen), f"{current}: {_reason(error)}")
        cpus[cpu] = CpuRecord(package, core, node_of.get(cpu) if node_of is not None else None)
    return layout_from_cpus(cpus, source=f"Linux sysfs at {root}", notes=notes)
