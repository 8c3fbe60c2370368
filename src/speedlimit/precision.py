"""Number formats: how many bits one weight or one KV-cache element occupies in memory.

GGUF tensor types take their bits per weight from the `gguf` package's block sizes
(``GGML_QUANT_SIZES``: bytes per block ÷ weights per block), so q4_0 is 4.5, q8_0 is 8.5 and q4_k
is 4.5 exactly as llama.cpp stores them. GGUF *file* types such as ``q4_k_m`` mix several tensor
types: they take the effective bits llama-quantize reports (``catalog/gguf_file_types.toml``), other
mixes resolve to their main tensor type, and a real ``.gguf`` file gives exact bytes instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache, lru_cache

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from speedlimit.errors import SpeedlimitError
from speedlimit.suggest import did_you_mean

# Plain formats (bits per element). nf4 is bitsandbytes NF4 with its default block of 64 weights and one
# fp32 absmax per block: 4 + 32/64 = 4.5 bits (double quantization lowers that to about 4.127).
_PLAIN_BITS: dict[str, float] = {
    "fp32": 32.0,
    "f32": 32.0,
    "tf32": 32.0,  # stored as 32-bit
    "fp16": 16.0,
    "f16": 16.0,
    "bf16": 16.0,
    "fp8": 8.0,
    "e4m3": 8.0,
    "e5m2": 8.0,
    "int8": 8.0,
    "i8": 8.0,
    "int4": 4.0,
    "fp4": 4.0,
    "nf4": 4.5,
}

# Which peak-FLOPs column a weight format computes in. Integer and low-bit weights are dequantized and
# multiplied in 16-bit by the common engines (llama.cpp, weight-only AWQ/GPTQ kernels), so they use bf16.
_COMPUTE_DTYPE: dict[str, str] = {
    "fp32": "fp32",
    "f32": "fp32",
    "tf32": "tf32",
    "fp8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
}

# GGUF file types (mixtures) -> the tensor type most of their weights use.
_GGUF_MIX_SUFFIX = re.compile(r"^(?P<base>(?:i?q\d)_(?:k|xxs|xs|s|m|nl))_(?:s|m|l|xl)$|^(?P<base2>iq\d)_(?:xs|xxs|s|m)$")


@cache
def gguf_type_bits() -> dict[str, float]:
    """Bits per weight of every GGML tensor type the installed `gguf` package knows, keyed in lowercase."""
    return {qtype.name.lower(): 8.0 * type_size / block_size for qtype, (block_size, type_size) in GGML_QUANT_SIZES.items()}


def known_formats() -> list[str]:
    """Every weight/KV format name this module accepts."""
    from speedlimit.catalog import gguf_file_type_bits

    return sorted(set(_PLAIN_BITS) | set(gguf_type_bits()) | set(gguf_file_type_bits()))


@dataclass(frozen=True)
class Precision:
    """A resolved number format: its canonical name and bits per element in memory."""

    name: str
    bits: float

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8.0

    @property
    def compute_dtype(self) -> str:
        """The peak-FLOPs column this format's matmuls run at (low-bit weights are dequantized to 16-bit)."""
        return _COMPUTE_DTYPE.get(self.name, "bf16")


@lru_cache(maxsize=512)
def parse_precision(text: str | float | int, *, what: str = "weights") -> Precision:
    """Resolve ``'bf16'``, ``'q4_k_m'``, ``'4'`` (bits) or ``4.5`` into a `Precision`.

    Raises `SpeedlimitError` with the closest known name for anything else.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _from_bits(float(text), what)
    key = str(text).strip().lower().replace("-", "_")
    if key.endswith("bit"):
        key = key[:-3].rstrip("_ ")
    try:
        return _from_bits(float(key), what)
    except ValueError:
        pass
    if key in _PLAIN_BITS:
        return Precision(key, _PLAIN_BITS[key])
    gguf_bits = gguf_type_bits()
    if key in gguf_bits:
        return Precision(key, gguf_bits[key])
    from speedlimit.catalog import gguf_file_type_bits  # data file, loaded once

    mixes = gguf_file_type_bits()
    if key in mixes:
        return Precision(key, mixes[key])
    mix = _GGUF_MIX_SUFFIX.match(key)
    if mix:
        base = mix.group("base") or mix.group("base2")
        for candidate in (base, base.rsplit("_", 1)[0] + "_k", base + "_s", base + "_xs"):
            if candidate in gguf_bits:
                return Precision(candidate, gguf_bits[candidate])
    raise SpeedlimitError(f"unknown {what} format {text!r}{did_you_mean(key, known_formats())}; use bits (e.g. 4) or a name like bf16, fp8, int4, q4_0, q8_0")


# No format stores fewer bits per element than this (llama.cpp's 1.5625-bit iq1_s is the smallest); below it a
# number is a typo, and 0.001 bits would claim a 7B model reads 875 kB per token.
MIN_BITS = 1.0


def _from_bits(bits: float, what: str) -> Precision:
    if not math.isfinite(bits) or not MIN_BITS <= bits <= 64:
        raise SpeedlimitError(f"{what} bits must be a number from {MIN_BITS:g} to 64, got {bits:g}")
    name = {32.0: "fp32", 16.0: "bf16", 8.0: "int8", 4.0: "int4"}.get(bits, f"{bits:g}bit")
    return Precision(name, bits)
