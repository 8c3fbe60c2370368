"""Hardware: a device's peak memory bandwidth, peak FLOPs per precision, capacity and links.

`Hardware` is the validated record that the catalog (``catalog/hardware.toml``), custom flags
(``--bandwidth/--flops/--memory``) and calibrated profiles all produce. A CPU record may also say how its
memory is laid out (`CpuTopology`: sockets, NUMA nodes, cores, per-core bandwidth, the socket link), which
`speedlimit.estimator.core.cpu_bandwidth_limits` turns into the bandwidth one inference process reaches.
`Efficiency` holds the fractions of peak that real kernels achieve plus a fixed per-step overhead; defaults live
in ``catalog/efficiency.toml`` with their basis.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from speedlimit.errors import SpeedlimitError, pydantic_message

# Peak-FLOPs fallbacks: a device without a native column computes at the next one it has.
_FLOPS_FALLBACK = {
    "fp8": ("fp8", "bf16", "fp16", "fp32"),
    "int8": ("int8", "bf16", "fp16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    # fp16 inputs with fp16 accumulation: GeForce cards list it at twice their fp16 (fp32-accumulate) rate; every
    # other device runs it at its fp16 rate
    "fp16_acc16": ("fp16_acc16", "fp16", "bf16", "fp32"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
}


# Plausible ranges of one device's figures: outside them the input is a unit mistake (or hostile), and results
# would be meaningless (1e-300 B/s gives NaN tokens per second).
BANDWIDTH_RANGE_BPS = (1e6, 1e15)  # 1 MB/s .. 1 PB/s
FLOPS_RANGE = (1e6, 1e18)  # 1 MFLOP/s .. 1 EFLOP/s
MEMORY_RANGE_BYTES = (1e6, 1e15)  # 1 MB .. 1 PB
MAX_CORES = 4096  # cores in one socket (today's largest have a few hundred)
MAX_SOCKETS = 64
MAX_NODES_PER_SOCKET = 64
MAX_THREADS_PER_CORE = 8
#: How llama.cpp places threads and weights over NUMA nodes (its --numa flag; "none" when not given).
NUMA_POLICIES = ("none", "distribute", "isolate")


class CpuTopology(NamedTuple):
    """How a CPU machine's memory and cores are laid out, as far as one process's bandwidth depends on it.

    ``per_core_Bps`` and ``link_Bps`` are NaN where unknown: that limit is then not applied.
    """

    sockets: int
    nodes_per_socket: int
    cores_per_socket: int
    threads_per_core: int
    per_core_Bps: float
    link_Bps: float

    @property
    def cores(self) -> int:
        """Physical cores of the whole machine (llama.cpp's default thread count)."""
        return self.sockets * self.cores_per_socket


def _check_range(value: float, low: float, high: float, what: str, example: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number, got {value:g}")
    if not low <= value <= high:
        raise ValueError(f"{what} {value:.3g} is absurd (outside {low:g}..{high:g}); give e.g. {example}")
    return float(value)


def check_bandwidth(value: float) -> float:
    """Peak memory bandwidth in bytes/s, within `BANDWIDTH_RANGE_BPS` (raises ValueError)."""
    return _check_range(value, *BANDWIDTH_RANGE_BPS, "memory bandwidth (bytes/s)", "3.35e12")


def check_flops(value: float) -> float:
    """Peak FLOP/s within `FLOPS_RANGE` (raises ValueError)."""
    return _check_range(value, *FLOPS_RANGE, "peak FLOP/s", "989e12")


def check_memory(value: float) -> float:
    """Device memory in bytes within `MEMORY_RANGE_BYTES` (raises ValueError)."""
    return _check_range(value, *MEMORY_RANGE_BYTES, "memory (bytes)", "80e9")


class Hardware(BaseModel):
    """One accelerator (or CPU socket) as the estimator sees it.

    A calibrated profile also carries its fitted efficiencies (bounded like `Efficiency`'s) and where they came
    from; catalog devices leave them None and take their kind's defaults.
    """

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    key: str = Field(max_length=200)
    name: str = Field(max_length=500)
    vendor: str = "custom"
    kind: str = "gpu"  # gpu | apple | cpu | custom
    aliases: list[str] = Field(default_factory=list)
    memory_bandwidth_Bps: float
    memory_bytes: float | None = None
    flops: dict[str, float] = Field(default_factory=dict)
    interconnect_Bps: float | None = None
    interconnect: str = ""
    source: str = ""
    notes: str = ""
    # calibrated profiles only
    bw_efficiency: float | None = Field(None, gt=0, le=1.0)
    flops_efficiency: float | None = Field(None, gt=0, le=1.0)
    step_overhead_s: float | None = Field(None, ge=0, le=1.0)
    kernel_overhead_s: float | None = Field(None, ge=0, le=0.01)
    sequence_overhead_s: float | None = Field(None, ge=0, le=0.1)  # per running sequence per step (calibrate from bench)
    # how far the step's stream and arithmetic overlap (1: the roofline's max; 0: they add), where calibrate found out
    stream_compute_overlap: float | None = Field(None, ge=0, le=1.0)
    # [decode, prefill] FLOP/s per busy core of llama.cpp's CPU attention kernel, where the verify run calibrate fitted
    # priced it apart at fold C's rates (its steps then pay the kernel as the fit did: `core.attention_kernel_seconds`)
    attention_flops_per_core: tuple[float, float] | None = None
    # CPUs: the engine profile whose llama.cpp CPU kernel rates price the build that ran (a verify run's,
    # `verify.run.kernel_profile_for`; a sweep's prior's) and the GGUF tensor type of the model it ran. A profile
    # calibrated on that run fitted one FLOP/s for that type; it prices another type at that FLOP/s times the two
    # types' measured kernel rates' ratio (`estimator.api.calibrated_kernel_transfer`)
    kernel_profile: str | None = Field(None, max_length=100)
    kernel_type: str | None = Field(None, max_length=40)
    # that model's matmul tensors by type: type -> parameters (`WeightBytes.matmul_types`; None: not recorded)
    kernel_mix: dict[str, float] | None = None
    calibrated_at: str | None = None
    calibrated_from: list[str] = Field(default_factory=list)
    # CPUs only (None elsewhere): the memory layout one process's threads see. memory_bandwidth_Bps is the whole
    # machine's (all sockets summed); each NUMA node holds an equal share of it and of the cores.
    sockets: int | None = Field(None, ge=1, le=MAX_SOCKETS)
    numa_nodes_per_socket: int | None = Field(None, ge=1, le=MAX_NODES_PER_SOCKET)
    cores_per_socket: int | None = Field(None, ge=1, le=MAX_CORES)
    threads_per_core: int | None = Field(None, ge=1, le=MAX_THREADS_PER_CORE)
    memory_channels_per_socket: int | None = Field(None, ge=1, le=64)
    per_core_bandwidth_Bps: float | None = None  # what one core alone streams from DRAM (achievable, measured)
    socket_link_Bps: float | None = None  # per direction, between two sockets (all links together)
    # the vendor's clocks: base (all cores busy, guaranteed) and maximum boost (one core busy)
    base_clock_hz: float | None = Field(None, ge=1e8, le=1e10)
    boost_clock_hz: float | None = Field(None, ge=1e8, le=1e10)
    # what the part runs at with every core loaded, where a measurement is published (a base clock is a floor)
    all_core_clock_hz: float | None = Field(None, ge=1e8, le=1e10)
    all_core_clock_source: str | None = None

    @property
    def topology(self) -> CpuTopology | None:
        """The CPU memory layout, or None for a device that has none (GPUs, Apple SoCs, custom hardware)."""
        if self.kind != "cpu" or self.cores_per_socket is None:
            return None
        return CpuTopology(sockets=self.sockets or 1, nodes_per_socket=self.numa_nodes_per_socket or 1,
                           cores_per_socket=self.cores_per_socket, threads_per_core=self.threads_per_core or 1,
                           per_core_Bps=self.per_core_bandwidth_Bps or math.nan,
                           link_Bps=self.socket_link_Bps or math.nan)

    @field_validator("per_core_bandwidth_Bps", "socket_link_Bps")
    @classmethod
    def _cpu_rates(cls, value: float | None, info: Any) -> float | None:
        what = "per-core bandwidth (bytes/s)" if info.field_name == "per_core_bandwidth_Bps" else "socket link bandwidth (bytes/s)"
        return None if value is None else _check_range(value, *BANDWIDTH_RANGE_BPS, what, "30e9")

    @model_validator(mode="after")
    def _layout(self) -> Hardware:
        layout = (self.sockets, self.numa_nodes_per_socket, self.threads_per_core, self.memory_channels_per_socket,
                  self.per_core_bandwidth_Bps, self.socket_link_Bps)
        if any(value is not None for value in layout) and self.cores_per_socket is None:
            raise ValueError("a CPU memory layout (sockets, NUMA nodes, per-core bandwidth) needs cores_per_socket")
        if self.cores_per_socket is not None and self.kind != "cpu":
            raise ValueError(f"cores_per_socket describes a CPU, not a {self.kind} device")
        if (self.base_clock_hz is None) != (self.boost_clock_hz is None):
            raise ValueError("base_clock_hz and boost_clock_hz go together")
        if self.base_clock_hz is not None and self.boost_clock_hz < self.base_clock_hz:
            raise ValueError("boost_clock_hz must be at least base_clock_hz")
        if self.all_core_clock_hz is not None:
            if self.base_clock_hz is None:
                raise ValueError("all_core_clock_hz needs base_clock_hz and boost_clock_hz")
            if not self.base_clock_hz <= self.all_core_clock_hz <= self.boost_clock_hz:
                raise ValueError("all_core_clock_hz must lie between base_clock_hz and boost_clock_hz")
            if not self.all_core_clock_source:
                raise ValueError("all_core_clock_hz needs all_core_clock_source (a measurement, cited)")
        nodes = self.numa_nodes_per_socket or 1
        if self.cores_per_socket is not None and self.cores_per_socket % nodes:
            raise ValueError(f"{self.cores_per_socket} cores per socket do not split into {nodes} NUMA nodes")
        return self

    @field_validator("attention_flops_per_core")
    @classmethod
    def _attention_rates(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None:
            for rate in value:
                check_flops(rate)
        return value

    @field_validator("memory_bandwidth_Bps")
    @classmethod
    def _bandwidth(cls, value: float) -> float:
        return check_bandwidth(value)

    @field_validator("memory_bytes")
    @classmethod
    def _memory(cls, value: float | None) -> float | None:
        return None if value is None else check_memory(value)

    @field_validator("interconnect_Bps")
    @classmethod
    def _link(cls, value: float | None) -> float | None:
        return None if value is None else _check_range(value, *BANDWIDTH_RANGE_BPS, "interconnect bandwidth (bytes/s)", "450e9")

    @field_validator("flops")
    @classmethod
    def _positive_flops(cls, value: dict[str, float]) -> dict[str, float]:
        for dtype, rate in value.items():
            check_flops(rate)
        return value

    def core_clock_hz(self, busy_cores: float) -> float:
        """The clock of each of ``busy_cores`` busy cores: the maximum boost with one busy, and with every core of a
        socket busy the measured all-core clock where the entry cites one, else the base clock (the vendor's floor),
        linear in between (the only two points published); NaN without clocks."""
        if self.base_clock_hz is None or self.boost_clock_hz is None:
            return math.nan
        all_busy_hz = self.all_core_clock_hz or self.base_clock_hz
        per_socket = self.cores_per_socket or 1
        busy = min(max(busy_cores, 1.0), per_socket)
        share = (busy - 1.0) / (per_socket - 1.0) if per_socket > 1 else 1.0
        return self.boost_clock_hz - (self.boost_clock_hz - all_busy_hz) * share

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for a compute dtype, falling back to the nearest column the device has.

        Returns NaN when the device has no FLOPs figure at all (custom hardware given only bandwidth).
        """
        for candidate in _FLOPS_FALLBACK.get(dtype, (dtype, "bf16", "fp16", "fp32")):
            if candidate in self.flops:
                return self.flops[candidate]
        return next(iter(self.flops.values()), math.nan)


class Efficiency(BaseModel):
    """Achievable fractions of peak and the fixed cost of one forward step."""

    model_config = ConfigDict(frozen=True)

    bw_efficiency: float = Field(gt=0, le=1.0)
    flops_efficiency: float = Field(gt=0, le=1.0)
    step_overhead_s: float = Field(ge=0, le=1.0)
    kernel_overhead_s: float = Field(default=0.0, ge=0, le=0.01)  # per kernel launched per step (launch + drain)
    basis: str = ""

    def overhead_s(self, kernels: float) -> float:
        """Fixed cost of one forward step that launches ``kernels`` kernels (`Architecture.decode_kernels`)."""
        return self.step_overhead_s + self.kernel_overhead_s * kernels


def custom_hardware(bandwidth_Bps: float, flops: float | None = None, memory_bytes: float | None = None) -> Hardware:
    """Hardware from ``--bandwidth/--flops/--memory`` flags (bytes/s, FLOP/s, bytes)."""
    try:
        return Hardware(
            key="custom",
            name=f"custom {bandwidth_Bps / 1e9:g} GB/s",
            kind="custom",
            memory_bandwidth_Bps=bandwidth_Bps,
            memory_bytes=memory_bytes,
            flops={"bf16": flops} if flops is not None else {},
        )
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        raise SpeedlimitError(pydantic_message(error)) from None

