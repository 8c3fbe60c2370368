"""User-facing errors: the one exception type the CLI turns into a one-line message and exit code 2, and the one
place that turns foreign errors (pydantic validation, OS, JSON, TOML) into it.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any


class SpeedlimitError(Exception):
    """Bad input or an unusable environment, with a message that says what to do.

    Raised anywhere in the library; `speedlimit.cli` prints ``error: <message>`` and exits 2,
    never a traceback.
    """


def pydantic_message(error: Exception, location: Callable[[tuple[Any, ...]], str] | None = None) -> str:
    """The first problem of a pydantic `ValidationError` as ``field.path: message`` (any other error: its text).

    ``location`` names the field another way (the CLI says ``--batch``); a failed constraint quotes the input.
    """
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except (IndexError, TypeError):
            return str(error)
        loc = tuple(first.get("loc", ()))
        where = location(loc) if location else ".".join(str(part) for part in loc)
        message = str(first.get("msg", error)).removeprefix("Value error, ")
        given = first.get("input")
        if first.get("type") != "value_error" and isinstance(given, (int, float, str)) and not isinstance(given, bool):
            message += f", got {_short_repr(given)}"
        return f"{where}: {message}".removeprefix(": ")
    return str(error)


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def file_error(path: Path | str, error: BaseException, what: str) -> SpeedlimitError:
    """A one-line error for a file that could not be read or parsed as ``what`` (e.g. "a bench summary.json")."""
    if isinstance(error, FileNotFoundError):
        return SpeedlimitError(f"no such file: {path} (expected {what})")
    if isinstance(error, IsADirectoryError):
        return SpeedlimitError(f"{path} is a directory, not {what}")
    if isinstance(error, PermissionError):
        return SpeedlimitError(f"cannot read {path}: permission denied")
    if isinstance(error, json.JSONDecodeError):
        return SpeedlimitError(f"{path} is not valid JSON ({error.msg} at line {error.lineno}); expected {what}")
    if isinstance(error, (tomllib.TOMLDecodeError, UnicodeDecodeError)):
        return SpeedlimitError(f"{path} is not {what} ({error})")
    if isinstance(error, RecursionError):
        return SpeedlimitError(f"{path} is not {what} (nested too deeply)")
    if isinstance(error, OSError):
        return SpeedlimitError(f"cannot read {path} ({error.strerror or error})")
    if hasattr(error, "errors"):  # pydantic ValidationError
        return SpeedlimitError(f"{path} is not {what} ({pydantic_message(error)})")
    return SpeedlimitError(f"{path} is not {what} ({error})")


def write_error(path: Path | str, error: BaseException, what: str) -> SpeedlimitError:
    """A one-line error for ``what`` (e.g. "the sweep") that could not be written to ``path``."""
    if isinstance(error, IsADirectoryError):
        return SpeedlimitError(f"cannot write {what} to {path}: it is a directory; give a file name")
    if isinstance(error, FileNotFoundError):
        return SpeedlimitError(f"cannot write {what} to {path}: the directory {Path(path).parent} does not exist")
    if isinstance(error, PermissionError):
        return SpeedlimitError(f"cannot write {what} to {path}: permission denied")
    if isinstance(error, OSError):
        return SpeedlimitError(f"cannot write {what} to {path} ({error.strerror or error})")
    return SpeedlimitError(f"cannot write {what} to {path} ({error})")
