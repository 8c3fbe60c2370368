"""This machine's speed limits, measured with numpy: STREAM-style memory bandwidth and fp32 matmul FLOP/s.

Bandwidth kernels run over float64 arrays far larger than the last-level cache, split into one contiguous
slice per thread (numpy releases the GIL inside copies and ufuncs, so N threads drive N cores), best of
several runs. Bytes are counted the way STREAM counts them:

- ``copy``  ``b[:] = a``            2 arrays (read a, write b)
- ``triad`` ``a[:] = b + s * c``    3 arrays (read b, read c, write a); ``s * c`` goes through a small
  cache-resident scratch buffer per thread, so no full-size temporary is streamed
- ``read``  ``max(a)``              1 array (read only, like a decode step streaming weights; numpy's max
  is SIMD-vectorized, where sum's pairwise loop is compute-bound on one core)

Write-allocate traffic (a store to a line not in cache first reads it) is NOT counted, as in STREAM: where
the CPU does it, the true triad traffic is up to 4/3 of the counted bytes. numpy's large copies go through
memcpy, which uses non-temporal stores for large sizes on x86 glibc, so copy usually has none.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from speedlimit.errors import SpeedlimitError

MIB = 1024 * 1024
# Elements per triad chunk: 32 Ki float64 = 256 KiB scratch, resident in any L2.
_TRIAD_CHUNK = 32 * 1024
KERNEL_ARRAYS_COUNTED = {"copy": 2, "triad": 3, "read": 1}


def cpu_count() -> int:
    """Cores this process may run on (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def allowed_cpus() -> set[int] | None:
    """The logical CPUs this process may run on (its affinity mask); None where the OS does not say."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def machine_memory_bytes() -> float | None:
    """Physical RAM in bytes (None where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes() -> float | None:
    """MemAvailable from /proc/meminfo (Linux), else physical RAM."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return machine_memory_bytes()


def _cpuinfo_field(name: str) -> str:
    """The first /proc/cpuinfo line's value for ``name`` (case-insensitive), '' where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model_name() -> str:
    import platform

    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_vendor_id() -> str:
    """The x86 vendor string (GenuineIntel, AuthenticAMD, ...), '' where /proc/cpuinfo gives none."""
    return _cpuinfo_field("vendor_id")[:64]


@dataclass
class KernelResult:
    """One bandwidth kernel at one thread count."""

    kernel: str
    threads: int
    array_bytes: int
    counted_bytes_per_run: int
    best_Bps: float
    runs_Bps: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MatmulResult:
    n: int
    dtype: str
    best_flops: float
    runs_flops: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _slices(length: int, parts: int) -> list[slice]:
    bounds = np.linspace(0, length, parts + 1).astype(int)
    return [slice(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def measure_bandwidth(
    array_bytes: int = 256 * MIB,
    threads: int | None = None,
    repeats: int = 5,
    kernels: tuple[str, ...] = ("copy", "triad", "read"),
    on_step: Callable[[str], None] | None = None,
) -> list[KernelResult]:
    """Best-of-``repeats`` bandwidth for each kernel with ``threads`` threads (default: all cores)."""
    threads = threads or cpu_count()
    unknown = set(kernels) - set(KERNEL_ARRAYS_COUNTED)
    if unknown:
        raise SpeedlimitError(f"unknown bandwidth kernel(s) {sorted(unknown)}; use copy, triad, read")
    available = available_memory_bytes()
    if available is not None and 3 * array_bytes > 0.8 * available:
        raise SpeedlimitError(
            f"bandwidth arrays need {3 * array_bytes / 2**30:.1f} GiB but only {available / 2**30:.1f} GiB is free; "
            "use a smaller --array-mib"
        )
    n = array_bytes // 8
    a = np.full(n, 1.0)  # np.full touches every page, so page faults are not timed
    b = np.full(n, 2.0)
    c = np.full(n, 0.5)
    parts = _slices(n, threads)
    scratch = [np.empty(_TRIAD_CHUNK) for _ in parts]
    scalar = 3.0

    def copy(index: int) -> None:
        part = parts[index]
        np.copyto(b[part], a[part])

    def triad(index: int) -> None:
        part, tmp = parts[index], scratch[index]
        for lo in range(part.start, part.stop, _TRIAD_CHUNK):
            hi = min(lo + _TRIAD_CHUNK, part.stop)
            t = tmp[: hi - lo]
            np.multiply(c[lo:hi], scalar, out=t)
            np.add(b[lo:hi], t, out=a[lo:hi])

    def read(index: int) -> None:
        part = parts[index]
        a[part].max()

    bodies = {"copy": copy, "triad": triad, "read": read}
    results = []
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        list(pool.map(lambda i: None, range(len(parts))))  # start the workers before timing
        for kernel in kernels:
            if on_step:
                on_step(f"bandwidth: {kernel}, {threads} thread{'s' if threads > 1 else ''}")
            body = bodies[kernel]
            counted = KERNEL_ARRAYS_COUNTED[kernel] * n * 8
            body_all = (lambda: [body(i) for i in range(len(parts))]) if len(parts) == 1 else (
                lambda: list(pool.map(body, range(len(parts)))))
            body_all()  # warm-up
            rates = []
            for _ in range(repeats):
                start = time.perf_counter()
                body_all()
                rates.append(counted / (time.perf_counter() - start))
            results.append(KernelResult(kernel, threads, int(n * 8), int(counted), max(rates), rates))
    del a, b, c
    return results


def _openblas_thread_functions() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """(get, set) of the OpenBLAS thread count numpy loaded, found by symbol; None for other BLAS builds."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    prefixes = ("scipy_openblas_", "openblas_")
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in prefixes:
            for suffix in ("64_", ""):
                get, put = f"{prefix}get_num_threads{suffix}", f"{prefix}set_num_threads{suffix}"
                if hasattr(lib, get) and hasattr(lib, put):
                    getter, setter = getattr(lib, get), getattr(lib, put)
                    getter.restype = ctypes.c_int
                    setter.argtypes = [ctypes.c_int]
                    return (lambda: int(getter())), (lambda count: setter(count))
    return None


def measure_matmul_flops(n: int = 2048, repeats: int = 3, threads: int | None = None,
                         on_step: Callable[[str], None] | None = None) -> MatmulResult | None:
    """Best-of-``repeats`` fp32 ``n×n @ n×n`` FLOP/s through numpy's BLAS.

    ``threads=None`` leaves BLAS at its default (all cores); a number pins OpenBLAS to it for the
    measurement and restores it after. Returns None when a thread count is asked for and numpy's BLAS
    is not an OpenBLAS whose thread count can be set.
    """
    control = None
    if threads is not None:
        control = _openblas_thread_functions()
        if control is None:
            return None
    if on_step:
        on_step(f"matmul: fp32 {n}×{n}" + (f", {threads} thread{'s' if threads > 1 else ''}" if threads else ""))
    previous = control[0]() if control else None
    if control:
        control[1](threads)
    try:
        return _time_matmul(n, repeats)
    finally:
        if control and previous:
            control[1](previous)


def _time_matmul(n: int, repeats: int) -> MatmulResult:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    np.matmul(x, y, out=out)  # warm-up: BLAS thread pool start, page faults
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.matmul(x, y, out=out)
        rates.append(2.0 * n**3 / (time.perf_counter() - start))
    return MatmulResult(n=n, dtype="fp32", best_flops=max(rates), runs_flops=rates)
