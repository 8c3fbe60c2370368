"""User-facing errors: the one exception type the CLI turns into a one-line message and exit code 2, and the one
place that turns foreign errors (pydantic validation, OS, JSON, TOML) into it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path


class SpeedlimitError(Exception):
    """Bad input or an unusable environment, with a message that says what to do.

    Raised anywhere in the library; `speedlimit.cli` prints ``error: <message>`` and exits 2,
    never a traceback.
    """


def pydantic_message(error: Exception) -> str:
    """The first problem of a pydantic `ValidationError` as ``field.path: message`` (any other error: its text)."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except (IndexError, TypeError):
            return str(error)
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = str(first.get("msg", error)).removeprefix("Value error, ")
        return f"{where}: {message}".removeprefix(": ")
    return str(error)


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
    if isinstance(error, OSError):
        return SpeedlimitError(f"cannot read {path} ({error.strerror or error})")
    if hasattr(error, "errors"):  # pydantic ValidationError
        return SpeedlimitError(f"{path} is not {what} ({pydantic_message(error)})")
    return SpeedlimitError(f"{path} is not {what} ({error})")
