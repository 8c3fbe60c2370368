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
    from speedlimit.catalog import block_format_bits, gguf_file_type_bits

    return sorted(set(_PLAIN_BITS) | set(block_format_bits()) | set(gguf_type_bits()) | set(gguf_file_type_bits()))


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


# file types whose main tensor type is not their name less its size suffix (llama.cpp's llama_model_ftype defaults:
# IQ2_M and IQ3_M / IQ3_XS files store most matrices as IQ2_S / IQ3_S)
_MAIN_TENSOR_TYPE = {"iq2_m": "iq2_s", "iq3_m": "iq3_s", "iq3_xs": "iq3_s", "fp16": "f16", "f16": "f16", "bf16": "bf16"}


def _format_key(text: object) -> str:
    """A format name as the tables key it: trimmed, lower case, dashes as underscores (``Q4-K-M`` -> ``q4_k_m``)."""
    return str(text).strip().lower().replace("-", "_")


def main_tensor_type(name: str) -> str | None:
    """The GGUF tensor type of most matrices in a weight format or GGUF file type (``q4_k_m`` -> ``q4_k``); None for
    a format that is not a GGUF tensor type (fp8, int4, mxfp4 named by bits, ...)."""
    key = _format_key(name)
    if key in _MAIN_TENSOR_TYPE:
        return _MAIN_TENSOR_TYPE[key]
    if key in gguf_type_bits():
        return key
    mix = _GGUF_MIX_SUFFIX.match(key)
    if mix:
        base = mix.group("base") or mix.group("base2")
        for candidate in (base, base.rsplit("_", 1)[0] + "_k"):
            if candidate in gguf_type_bits():
                return candidate
    return None


@lru_cache(maxsize=512)
def parse_precision(text: str | float | int, *, what: str = "weights") -> Precision:
    """Resolve ``'bf16'``, ``'q4_k_m'``, ``'4'`` (bits) or ``4.5`` into a `Precision`.

    Raises `SpeedlimitError` with the closest known name for anything else.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _from_bits(float(text), what)
    key = _format_key(text)
    if key.endswith("bit"):
        key = key[:-3].rstrip("_ ")
    try:
        return _from_bits(float(key), what)
    except ValueError:
        pass
    if key in _PLAIN_BITS:
        return Precision(key, _PLAIN_BITS[key])
    from speedlimit.catalog import block_format_bits, gguf_file_type_bits  # data files, loaded once

    blocks = block_format_bits()
    if key in blocks:
        return Precision(key, blocks[key])
    gguf_bits = gguf_type_bits()
    if key in gguf_bits:
        return Precision(key, gguf_bits[key])
    mixes = gguf_file_type_bits()
    if key in mixes:
        return Precision(key, mixes[key])
    mix = _GGUF_MIX_SUFFIX.match(key)
    if mix:
        base = mix.group("base") or mix.group("base2")
        for candidate in (base, base.rsplit("_", 1)[0] + "_k", base + "_s", base + "_xs"):
            if candidate in gguf_bits:
                return Precision(candidate, gguf_bits[candidate])
    raise SpeedlimitError(f"unknown {what} format {text!r}{did_you_mean(key, known_formats())}; use bits (e.g. 4) or a name like bf16, fp8, int4, mxfp4, nvfp4, q4_0, q8_0")


# No format stores fewer bits per element than this (llama.cpp's 1.5625-bit iq1_s is the smallest); below it a
# number is a typo, and 0.001 bits would claim a 7B model reads 875 kB per token.
MIN_BITS = 1.0


def _from_bits(bits: float, what: str) -> Precision:
    if not math.isfinite(bits) or not MIN_BITS <= bits <= 64:
        raise SpeedlimitError(f"{what} bits must be a number from {MIN_BITS:g} to 64, got {bits:g}")
    name = {32.0: "fp32", 16.0: "bf16", 8.0: "int8", 4.0: "int4"}.get(bits, f"{bits:g}bit")
    return Precision(name, bits)


# --------------------------------------------------------------------------------------------
# mixed precision: one format per tensor group

#: The weight groups the cost model prices apart (`speedlimit.architecture.Architecture`): attention projections;
#: the rest of the weights every token reads (dense MLPs, shared experts, routers, norms); the routed experts; the
#: token-embedding table; the output projection (an untied LM head; a tied one is the embedding table).
WEIGHT_GROUPS = ("attention", "dense", "experts", "embeddings", "lm_head")
DEFAULT_GROUP = "default"
# A per-group spelling is a handful of group=format pairs; anything longer is not one.
MAX_WEIGHTS_CHARS = 256


@dataclass(frozen=True)
class WeightFormats:
    """One format per weight group (``experts=mxfp4,default=bf16``): ``formats`` in `WEIGHT_GROUPS` order.

    ``explicit``: the groups the spelling named (the others took ``default``, else bf16).
    """

    formats: tuple[Precision, ...]
    explicit: frozenset[str] = frozenset()

    def __getitem__(self, group: str) -> Precision:
        return self.formats[WEIGHT_GROUPS.index(group)]

    @property
    def uniform(self) -> Precision | None:
        """The one format every group shares, else None."""
        first = self.formats[0]
        return first if all(fmt == first for fmt in self.formats) else None

    @property
    def name(self) -> str:
        """Canonical spelling: the groups whose format differs from the most common one, then default= (one format: its name)."""
        if self.uniform is not None:
            return self.uniform.name
        names = [fmt.name for fmt in self.formats]
        common = max(names, key=names.count)
        parts = [f"{group}={fmt}" for group, fmt in zip(WEIGHT_GROUPS, names) if fmt != common]
        return ",".join([*parts, f"{DEFAULT_GROUP}={common}"])


# --weights spellings that ask for the format the checkpoint ships in (its config's quantization_config), which only
# the model knows: `estimator.api.shipped_format` resolves them, the same as leaving --weights out
SHIPPED_WEIGHTS = frozenset({"shipped", "as_shipped"})


def is_shipped(text: object) -> bool:
    """Whether a --weights value asks for the checkpoint's shipped format (``shipped``) rather than naming one."""
    return isinstance(text, str) and _format_key(text).replace(" ", "_") in SHIPPED_WEIGHTS


def is_per_group(text: object) -> bool:
    """Whether a --weights value is a per-group spelling (``group=format,...``) rather than one format."""
    return isinstance(text, str) and "=" in text


def parse_weights(text: str | float | int) -> Precision | WeightFormats:
    """One format (``'bf16'``, ``4``) as `parse_precision`, or a per-group spelling as `WeightFormats`.

    ``'experts=mxfp4,attention=bf16,default=q4_k'``: groups from `WEIGHT_GROUPS` plus ``default`` (the groups
    not named; bf16 without it). Raises `SpeedlimitError` naming the valid groups for a wrong spelling.
    """
    if not is_per_group(text):
        from speedlimit.catalog import gguf_per_group_file_types  # data file, loaded once

        # a GGUF file type that keeps tensor groups at different types (mxfp4_moe) is its per-group spelling
        spelled = gguf_per_group_file_types().get(_format_key(text))
        return _parse_groups(spelled) if spelled else parse_precision(text, what="weights")
    return _parse_groups(str(text))


_VALID_GROUPS = ", ".join((*WEIGHT_GROUPS, DEFAULT_GROUP))


@lru_cache(maxsize=256)
def _parse_groups(text: str) -> WeightFormats:
    if len(text) > MAX_WEIGHTS_CHARS:
        raise SpeedlimitError(f"weights spelling is {len(text):,} characters long; give group=format pairs like experts=mxfp4,default=bf16")
    given: dict[str, Precision] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise SpeedlimitError(f"weights {text!r} has an empty entry: give group=format pairs separated by commas "
                                  f"(groups: {_VALID_GROUPS})")
        if "=" not in part:
            raise SpeedlimitError(f"weights entry {part!r} names no group: write group=format, e.g. default={part} "
                                  f"(groups: {_VALID_GROUPS})")
        group, _, fmt = (piece.strip() for piece in part.partition("="))
        group = group.lower().replace("-", "_")
        if not group:
            raise SpeedlimitError(f"weights entry {part!r} names no group: write group=format (groups: {_VALID_GROUPS})")
        if group not in (*WEIGHT_GROUPS, DEFAULT_GROUP):
            raise SpeedlimitError(f"unknown weights group {group!r}{did_you_mean(group, [*WEIGHT_GROUPS, DEFAULT_GROUP])}; "
                                  f"groups: {_VALID_GROUPS}")
        if group in given:
            raise SpeedlimitError(f"weights group {group!r} is given twice in {text!r}: give each group once")
        if not fmt:
            raise SpeedlimitError(f"weights group {group!r} has no format: write e.g. {group}=bf16")
        given[group] = parse_precision(fmt, what=f"weights ({group})")
    default = given.get(DEFAULT_GROUP) or parse_precision("bf16")
    return WeightFormats(tuple(given.get(group, default) for group in WEIGHT_GROUPS),
                         frozenset(g for g in given if g != DEFAULT_GROUP))
