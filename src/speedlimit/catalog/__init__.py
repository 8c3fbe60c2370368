"""Catalogs: the thin layer that loads the bundled data files and resolves what users type.

Data lives beside this module: ``hardware.toml`` (devices, each with its vendor source),
``models.toml`` (Hugging Face config subsets with their source and published parameter counts) and
``efficiency.toml`` (achievable fractions of peak per kind of device, with their basis) and ``engines.toml``
(serving-engine profiles, every value with its source). This module
turns names, aliases, config.json paths, .gguf paths and bare sizes into `Architecture` and
`Hardware` objects, and unknown names into a one-line error with the closest match.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from speedlimit.architecture import (
    Architecture,
    architecture_from_hf_config,
    architecture_from_param_count,
    parse_param_count,
)
from speedlimit.engine_profile import EngineProfile
from speedlimit.errors import SpeedlimitError, file_error, pydantic_message
from speedlimit.hardware import Efficiency, Hardware
from speedlimit.suggest import did_you_mean


# The longest name or path a user may type (Linux's PATH_MAX); catalog names are far shorter.
MAX_NAME_CHARS = 4096


def _load_toml(filename: str) -> dict[str, Any]:
    return tomllib.loads(resources.files(__package__).joinpath(filename).read_text(encoding="utf-8"))


def _normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _alias_map(entries: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Normalized slug and every alias → the catalog key."""
    aliases: dict[str, str] = {}
    for key, entry in entries.items():
        aliases[_normalize(key)] = key
        for alias in entry.get("aliases", []):
            aliases[_normalize(alias)] = key
    return aliases


# --------------------------------------------------------------------------------------------
# models


@cache
def model_entries() -> dict[str, dict[str, Any]]:
    """Raw catalog rows keyed by slug (HF config subset under ``config``)."""
    return _load_toml("models.toml")


@cache
def _model_aliases() -> dict[str, str]:
    return _alias_map(model_entries())


@cache
def catalog_model(key: str) -> Architecture:
    entry = model_entries()[key]
    return architecture_from_hf_config(entry["config"], name=key, source=entry.get("source", ""))


def model_names() -> list[str]:
    return list(model_entries())


def resolve_model(text: str, *, files: bool = True) -> Architecture:
    """A catalog name/alias, a path to config.json or .gguf, or a bare size (``7B``, ``70e9``).

    With ``files=False`` (the web API) no path is looked at: catalog names and sizes only, and any other text is
    an unknown model whether or not a file of that name exists.
    """
    if not isinstance(text, str) or not text.strip():
        raise SpeedlimitError("--model is empty: pass a catalog name (see `speedlimit models`), a config.json, a .gguf, or a size like 7B")
    _check_name_length(text, "--model")
    key = _model_aliases().get(_normalize(text))
    if key:
        return catalog_model(key)
    if files:
        path = _user_path(text)
        if path.suffix.lower() == ".gguf" or _starts_with(path, b"GGUF"):
            from speedlimit.gguf_model import architecture_from_gguf  # I/O edge, imported on demand

            return architecture_from_gguf(path)
        if path.suffix.lower() == ".json" or _is_dir(path):
            return architecture_from_config_file(path)
    params = parse_param_count(text)
    if params is not None:
        return architecture_from_param_count(params)
    hint = "see `speedlimit models`, or pass a config.json, a .gguf file, or a size like 7B" if files else \
        "pick a catalog model or give a size like 7B"
    raise SpeedlimitError(f"unknown model {text!r}{did_you_mean(_normalize(text), _model_aliases())}; {hint}")


def _check_name_length(text: str, flag: str) -> None:
    if len(text) > MAX_NAME_CHARS:
        raise SpeedlimitError(f"{flag} is {len(text):,} characters long; give a catalog name, a path or a size")


def _user_path(text: str) -> Path:
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~user that does not exist
        return Path(text)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _starts_with(path: Path, magic: bytes) -> bool:
    """Whether ``path`` is a regular file that begins with ``magic`` (reads only those bytes; never a FIFO)."""
    try:
        if not path.is_file():
            return False
        with path.open("rb") as file:
            return file.read(len(magic)) == magic
    except (OSError, ValueError):  # not a file, unreadable, a name too long for the file system
        return False


# A config.json is a few kB; anything this large is not one (and would be read whole into memory).
MAX_CONFIG_BYTES = 16 * 2**20


def architecture_from_config_file(path: Path) -> Architecture:
    try:
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise SpeedlimitError(f"no such config file: {path}")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise SpeedlimitError(f"{path} is {path.stat().st_size:,} bytes: too large for a config.json")
        config = json.loads(path.read_text(encoding="utf-8"))
    except SpeedlimitError:
        raise
    except (OSError, ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise file_error(path, error, "a Hugging Face config.json") from None
    return architecture_from_hf_config(config, name=path.parent.name or path.stem, source=str(path))


# --------------------------------------------------------------------------------------------
# hardware


@cache
def hardware_entries() -> dict[str, dict[str, Any]]:
    return _load_toml("hardware.toml")


@cache
def _hardware_aliases() -> dict[str, str]:
    return _alias_map(hardware_entries())


def _entry(model: type[Any], kind: str, key: str, fields: dict[str, Any]) -> Any:
    """One catalog entry as its typed model; a broken data file is our bug, but the error says where."""
    try:
        return model(key=key, **fields)
    except ValidationError as error:
        raise SpeedlimitError(f"{kind} catalog entry {key!r} is invalid: {pydantic_message(error)}") from None


@cache
def catalog_hardware(key: str) -> Hardware:
    return _entry(Hardware, "hardware", key, hardware_entries()[key])


def hardware_names() -> list[str]:
    return list(hardware_entries())


def resolve_hardware(text: str) -> Hardware:
    _check_name_length(text, "--hardware")
    key = _hardware_aliases().get(_normalize(text))
    if key:
        return catalog_hardware(key)
    from speedlimit.catalog.profiles import load_profile_hardware  # profiles are user files: on demand

    profile = load_profile_hardware(text)
    if profile is not None:
        return profile
    if _normalize(text) == "local":
        raise SpeedlimitError(
            "no calibrated profile 'local' yet: run `speedlimit verify --out verify.json` then `speedlimit calibrate verify.json`"
        )
    raise SpeedlimitError(
        f"unknown hardware {text!r}{did_you_mean(_normalize(text), _hardware_aliases())}; "
        "see `speedlimit hardware`, or give --bandwidth BYTES_PER_S [--flops FLOP_PER_S] [--memory BYTES]"
    )


@cache
def gguf_file_type_bits() -> dict[str, float]:
    """Effective bits per weight of GGUF file-type mixes (q4_k_m, ...), from llama-quantize's table."""
    table = _load_toml("gguf_file_types.toml")
    return {name: size * 2**30 * 8 / table["reference_params"] for name, size in table["size_gib"].items()}


@cache
def gguf_per_group_file_types() -> dict[str, str]:
    """GGUF file types that keep tensor groups at different types (mxfp4_moe), as their per-group weights spelling."""
    return {name: row["weights"] for name, row in _load_toml("gguf_file_types.toml").get("per_group", {}).items()}


@cache
def block_format_bits() -> dict[str, float]:
    """Bits per weight of block-scaled formats (mxfp4, nvfp4): element bits + one shared scale per block."""
    table = _load_toml("block_formats.toml")
    return {name: row["element_bits"] + row["scale_bits"] / row["block"] for name, row in table.items()}


@cache
def efficiency_defaults() -> dict[str, dict[str, Any]]:
    return _load_toml("efficiency.toml")


def default_efficiency(hardware: Hardware, engine: EngineProfile | None = None) -> Efficiency:
    """The achievable-fraction defaults for a device: its own fields (a calibrated profile) over its kind's.

    A record that sets its own ``step_overhead_s`` (a calibrated profile measured the whole per-step
    cost) drops the kind's per-kernel term unless it sets ``kernel_overhead_s`` too. With ``engine`` (the profile
    as it runs on this device, `engine_for_device`), its per-step and per-kernel costs stand over those, as the
    estimator prices them, unless a calibrated profile measured the whole per-step cost.
    """
    table = efficiency_defaults()
    row = dict(table.get(hardware.kind) or table["gpu"])
    if hardware.step_overhead_s is not None:
        row["kernel_overhead_s"] = 0.0
    if hardware.calibrated_at:
        row["basis"] = f"calibrated {hardware.calibrated_at[:10]} from {', '.join(hardware.calibrated_from)}"
    for field in ("bw_efficiency", "flops_efficiency", "step_overhead_s", "kernel_overhead_s"):
        if getattr(hardware, field) is not None:
            row[field] = getattr(hardware, field)
    if engine is not None and not (hardware.calibrated_at and hardware.step_overhead_s is not None):
        if engine.step_overhead_s is not None:
            row["step_overhead_s"] = engine.step_overhead_s.value
        if engine.kernel_overhead_s is not None:
            row["kernel_overhead_s"] = engine.kernel_overhead_s.value
    fields = ("bw_efficiency", "flops_efficiency", "step_overhead_s", "kernel_overhead_s", "basis")
    return Efficiency(**{k: row[k] for k in fields if k in row})


# --------------------------------------------------------------------------------------------
# serving engines

#: The engine a scenario runs when it names none: what `speedlimit verify` runs.
DEFAULT_ENGINE = "llama-cpp"


@cache
def engine_entries() -> dict[str, dict[str, Any]]:
    """Raw engine profiles keyed by slug, each with its ``inherits`` parent's values filled in."""
    raw = _load_toml("engines.toml")
    merged: dict[str, dict[str, Any]] = {}

    def resolved(key: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
        # a versioned profile inherits a backend that inherits the engine: parents resolve first, a loop is an error
        if key in seen:
            raise SpeedlimitError(f"engines.toml: profile {key!r} inherits itself ({' -> '.join((*seen, key))})")
        if key not in merged:
            entry = raw[key]
            parent = entry.get("inherits")
            base = ({k: v for k, v in resolved(parent, (*seen, key)).items()
                     if k not in ("aliases", "name", "version", "devices", "inherits", "rocm_profile", "server_versions")}
                    if parent else {})
            merged[key] = {**base, **entry}
        return merged[key]

    for key in raw:
        resolved(key)
    return merged


@cache
def _engine_aliases() -> dict[str, str]:
    aliases = _alias_map(engine_entries())
    for key in engine_entries():  # "llama.cpp-cuda" spells "llama-cpp-cuda"
        aliases.setdefault(_normalize(key).replace("llama-cpp", "llama.cpp"), key)
    return aliases


@cache
def catalog_engine(key: str) -> EngineProfile:
    return _entry(EngineProfile, "engine", key, engine_entries()[key])


def engine_names() -> list[str]:
    return list(engine_entries())


def resolve_engine(text: str | EngineProfile | None, *, what: str = "--engine") -> EngineProfile:
    """An engine profile by name or alias (None: `DEFAULT_ENGINE`); unknown → one line (naming ``what`` the user
    gave) listing the known ones."""
    if isinstance(text, EngineProfile):
        return text
    if text is None:
        return catalog_engine(DEFAULT_ENGINE)
    key = _engine_aliases().get(_normalize(str(text)))
    if key:
        return catalog_engine(key)
    raise SpeedlimitError(f"unknown {what} {str(text)[:80]!r}{did_you_mean(_normalize(str(text)), _engine_aliases())}; "
                          f"known engines: {', '.join(engine_names())}")


def engine_for_server(engine: str, version: str | None) -> str:
    """The profile a server of ``engine`` (a profile key) runs as when it reports ``version``: the profile descending
    from ``engine`` whose ``server_versions`` holds a prefix of it, else ``engine``'s own."""
    if version:
        for key, entry in engine_entries().items():
            if _descends(key, engine) and any(version.startswith(p) for p in entry.get("server_versions", ())):
                return key
    return engine


def _descends(key: str, ancestor: str) -> bool:
    entries = engine_entries()
    seen = 0
    while key is not None and seen <= len(entries):
        if key == ancestor:
            return True
        key, seen = entries[key].get("inherits"), seen + 1
    return False


def engine_record(profile: EngineProfile) -> dict[str, Any]:
    """A profile as plain data with whether it is the default (``GET /api/engines``, ``speedlimit engines --json``)."""
    return profile.record() | {"default": profile.key == DEFAULT_ENGINE}


def engine_for_device(engine: EngineProfile, hardware: Hardware) -> EngineProfile:
    """The profile ``engine`` runs as on a device: its ROCm build on an AMD GPU where it names one (`rocm_profile`:
    llama.cpp's ROCm backend, vLLM 0.7's ROCm build); the default ``llama-cpp``'s backend elsewhere (cpu → CPU,
    apple → Metal, gpu → CUDA); else itself."""
    if hardware.kind == "gpu" and hardware.vendor == "amd" and engine.rocm_profile:
        return catalog_engine(engine.rocm_profile)
    if engine.key != DEFAULT_ENGINE:
        return engine
    backend = {"cpu": "llama-cpp-cpu", "apple": "llama-cpp-metal", "gpu": "llama-cpp-cuda"}.get(hardware.kind)
    return catalog_engine(backend) if backend else engine
