"""Calibrated hardware profiles: small TOML files in the user's config dir (storage only; the fit is in
`speedlimit.verify.fit`).

A profile is a hardware record (peak bandwidth/FLOPs/memory) plus fitted ``bw_efficiency``,
``flops_efficiency`` and ``step_overhead_s``. `speedlimit calibrate` writes them; `--hardware NAME`
or `--profile NAME` reads them back through `load_profile_hardware`.
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import platformdirs
from pydantic import ValidationError

from speedlimit.errors import SpeedlimitError, file_error, pydantic_message
from speedlimit.hardware import Hardware

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def profiles_dir() -> Path:
    """``$SPEEDLIMIT_CONFIG_DIR/profiles`` if set (tests use it), else the platform's user config dir."""
    root = os.environ.get("SPEEDLIMIT_CONFIG_DIR") or platformdirs.user_config_dir("speedlimit")
    return Path(root) / "profiles"


def saved_profile_names() -> list[str]:
    """The calibrated profiles saved on this machine (what `calibrate` wrote), by name; [] where none or unreadable."""
    try:
        return sorted(path.stem for path in profiles_dir().glob("*.toml") if _PROFILE_NAME.match(path.stem))
    except OSError:
        return []


def profile_path(name: str) -> Path:
    if not _PROFILE_NAME.match(name):
        raise SpeedlimitError(f"profile name {name!r} must be letters, digits, '.', '_' or '-' (at most 64)")
    return profiles_dir() / f"{name}.toml"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def save_profile(name: str, record: dict[str, Any], path: Path | None = None) -> Path:
    """Write a profile (flat keys, one dict level for ``flops``) to ``path`` (default: `profile_path`); return it.

    Written to a temporary file and renamed, so an existing profile is replaced whole or not at all. OS errors
    (a read-only config dir) propagate for the caller to report next to the fit it must not lose.
    """
    path = profile_path(name) if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# speedlimit calibrated hardware profile (written by `speedlimit calibrate`)"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in record.items() if value is not None]
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def load_profile_hardware(name: str) -> Hardware | None:
    """The profile called ``name`` as `Hardware` (with its efficiency fields), or None if there is none.

    Profiles are user files: anything unreadable, not TOML, or out of bounds (``bw_efficiency = 5.0``) is a
    one-line error that says how to fix it.
    """
    if not isinstance(name, str) or not _PROFILE_NAME.match(name):
        return None
    path = profiles_dir() / f"{name}.toml"
    if not path.is_file():
        return None
    return load_profile_file(path, name)


# A profile is a dozen lines; a larger file is not one.
MAX_PROFILE_BYTES = 1 << 20


def load_profile_file(path: Path, name: str) -> Hardware:
    """A profile TOML at ``path`` as `Hardware` (``name`` is its key unless it sets one)."""
    fix = "rerun `speedlimit calibrate` or delete it"
    try:
        if path.stat().st_size > MAX_PROFILE_BYTES:
            raise SpeedlimitError(f"profile {path} is {path.stat().st_size:,} bytes: not a profile; {fix}")
        record = tomllib.loads(path.read_text(encoding="utf-8"))
    except SpeedlimitError:
        raise
    except (OSError, ValueError) as error:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise SpeedlimitError(f"{file_error(path, error, 'a speedlimit profile (TOML)')}; {fix}") from None
    record.setdefault("key", name)
    record.setdefault("name", f"{name} (calibrated)")
    try:
        return Hardware.model_validate(record)
    except ValidationError as error:
        raise SpeedlimitError(f"profile {path} is invalid ({pydantic_message(error)}); {fix}") from None
