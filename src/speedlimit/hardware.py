"""Hardware: a device's peak memory bandwidth, peak FLOPs per precision, capacity and links.

`Hardware` is the validated record that the catalog (``catalog/hardware.toml``), custom flags
(``--bandwidth/--flops/--memory``) and calibrated profiles all produce. `Efficiency` holds the
fractions of peak that real kernels achieve plus a fixed per-step overhead; defaults live in
``catalog/efficiency.toml`` with their basis.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator

from speedlimit.errors import SpeedlimitError, pydantic_message

# Peak-FLOPs fallbacks: a device without a native column computes at the next one it has.
_FLOPS_FALLBACK = {
    "fp8": ("fp8", "bf16", "fp16", "fp32"),
    "int8": ("int8", "bf16", "fp16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
}


class Hardware(BaseModel):
    """One accelerator (or CPU socket) as the estimator sees it."""

    model_config = ConfigDict(extra="allow", frozen=True)

    key: str
    name: str
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

    @field_validator("memory_bandwidth_Bps")
    @classmethod
    def _positive_bandwidth(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"memory bandwidth must be a positive number of bytes/s, got {value}")
        if value > 1e15:
            raise ValueError(f"memory bandwidth {value:.3g} B/s is absurd (> 1 PB/s); give bytes per second, e.g. 3.35e12")
        return value

    @field_validator("memory_bytes", "interconnect_Bps")
    @classmethod
    def _positive_optional(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ValueError(f"must be a positive number, got {value}")
        return value

    @field_validator("flops")
    @classmethod
    def _positive_flops(cls, value: dict[str, float]) -> dict[str, float]:
        for dtype, rate in value.items():
            if not math.isfinite(rate) or rate <= 0:
                raise ValueError(f"peak {dtype} FLOP/s must be positive, got {rate}")
            if rate > 1e18:
                raise ValueError(f"peak {dtype} FLOP/s {rate:.3g} is absurd (> 1 EFLOP/s per device)")
        return value

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
    except ValueError as error:
        raise SpeedlimitError(pydantic_message(error)) from None

