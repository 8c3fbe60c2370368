"""Calibrated hardware profiles: small TOML files in the user's config dir (storage only; the fit is in
`speedlimit.verify.fit`).

A profile is a hardware record (peak bandwidth/FLOPs/memory) plus fitted ``bw_efficiency``,
``flops_efficiency`` and ``step_overhead_s``. `speedlimit calibrate` writes them; `--hardware NAME`
or `--profile NAME` reads them back through `load_profile_hardware`.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import platformdirs
from pydantic import ValidationError

from speedlimit.errors import SpeedlimitError, pydantic_message
from speedlimit.hardware import Hardware

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def profiles_dir() -> Path:
    """``$SPEEDLIMIT_CONFIG_DIR/profiles`` if set (tests use it), else the platform's user config dir."""
    root = os.environ.get("SPEEDLIMIT_CONFIG_DIR") or platformdirs.user_config_dir("speedlimit")
    return Path(root) / "profiles"


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


def save_profile(name: str, record: dict[str, Any]) -> Path:
    """Write a profile (flat keys, one dict level for ``flops``) and return its path."""
    path = profile_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# speedlimit calibrated hardware profile (written by `speedlimit calibrate`)"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in record.items() if value is not None]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def load_profile_hardware(name: str) -> Hardware | None:
    """The profile called ``name`` as `Hardware` (with its efficiency fields), or None if there is none."""
    if not _PROFILE_NAME.match(name):
        return None
    path = profiles_dir() / f"{name}.toml"
    if not path.is_file():
        return None
    try:
        record = tomllib.loads(path.read_text(encoding="utf-8"))
        record.setdefault("key", name)
        record.setdefault("name", f"{name} (calibrated)")
        return Hardware(**record)
    except (tomllib.TOMLDecodeError, ValidationError, TypeError) as error:
        message = pydantic_message(error) if isinstance(error, ValidationError) else str(error)
        raise SpeedlimitError(f"profile {path} is invalid ({message}); rerun `speedlimit calibrate` or delete it") from None

