"""Units: parsing quantities users type (``3.35e12``, ``3.35TB/s``, ``80GB``) and formatting results."""

from __future__ import annotations

import math
import re

from speedlimit.errors import SpeedlimitError

_QUANTITY = re.compile(
    r"^\s*(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*(?P<prefix>[kmgtpe]i?)?\s*(?P<unit>b/s|bps|b|flop/s|flops|tok/s)?\s*$",
    re.IGNORECASE,
)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18,
           "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50, "ei": 2.0**60}  # fmt: skip


def parse_quantity(text: str | float, what: str) -> float:
    """A positive, finite number with an optional SI/binary prefix: ``3.35e12``, ``3.35T``, ``80GB``, ``64GiB``."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _QUANTITY.match(str(text))
        if not match:
            raise SpeedlimitError(f"--{what} expects a number like 3.35e12 or 3.35T, got {text!r}")
        value = float(match.group("num")) * _PREFIX[(match.group("prefix") or "").lower()]
    if not math.isfinite(value) or value <= 0:
        raise SpeedlimitError(f"--{what} must be a positive finite number, got {text!r}")
    return value


def _scaled(value: float | None, units: tuple[tuple[str, float], ...], plain: str) -> str:
    """``value`` in the largest unit it reaches, two decimals; ``plain`` suffix below the smallest."""
    if value is None or not math.isfinite(value):
        return "—"
    for unit, scale in units:
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:,.0f}{plain}"


def format_bytes(value: float | None) -> str:
    return _scaled(value, (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)), " B")


def format_count(value: float | None) -> str:
    return _scaled(value, (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)), "")


def format_seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if value >= 1:
        return f"{value:,.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:,.2f} ms"
    return f"{value * 1e6:,.1f} µs"
