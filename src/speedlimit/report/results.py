"""Loading bench results for `speedlimit report`: requests.jsonl rows, summary.json, sweep directories.

Accepts what `speedlimit bench` writes (see `speedlimit.bench.runner`):

- a ``requests.jsonl`` file (one `RequestRecord.to_json_dict()` per line), with an optional
  ``summary.json`` beside it;
- a run directory holding ``requests.jsonl`` (+ ``summary.json``);
- a sweep directory whose ``summary.json`` has ``sweep`` and ``points`` (one run summary per load
  level, each run in a ``<parameter>_<value>/`` subdirectory with its own ``requests.jsonl``).

Bad input (missing path, malformed JSON, rows that are not objects) -> `SpeedlimitError` with one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedlimit.errors import SpeedlimitError


@dataclass
class Results:
    """Everything a report can draw from one bench output."""

    source: Path
    requests: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    sweep: dict[str, Any] | None = None  # the sweep summary: {"sweep": {...}, "points": [...]}

    @property
    def completed(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if not r.get("error_kind") and not r.get("error")]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r.get("error_kind") or r.get("error")]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_requests_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a requests.jsonl; a line that is not a JSON object is an error naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpeedlimitError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpeedlimitError(f"cannot read {path} ({error}); pass bench's requests.jsonl") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise SpeedlimitError(f"{path}:{number} is not valid JSON ({error.msg}); pass bench's requests.jsonl (one JSON object per line)") from None
        if not isinstance(row, dict):
            raise SpeedlimitError(f"{path}:{number} is not a JSON object; pass bench's requests.jsonl (one JSON object per line)")
        itl = row.get("itl_s")
        if itl is not None and not (isinstance(itl, list) and all(_number(x) is not None for x in itl)):
            raise SpeedlimitError(f"{path}:{number}: itl_s must be a list of seconds")
        for key in ("ttft_s", "e2e_s", "output_tokens"):
            if row.get(key) is not None and _number(row.get(key)) is None:
                raise SpeedlimitError(f"{path}:{number}: {key} must be a number, got {row.get(key)!r}")
        rows.append(row)
    if not rows:
        raise SpeedlimitError(f"{path} has no requests; run `speedlimit bench ... --out DIR` first")
    return rows


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise SpeedlimitError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpeedlimitError(f"cannot read {path} ({error})") from None
    if not isinstance(value, dict):
        raise SpeedlimitError(f"{path} is not a JSON object")
    return value


def load_results(path: Path) -> Results:
    """Read a requests.jsonl, a run directory, or a sweep directory."""
    path = Path(path).expanduser()
    if not path.exists():
        raise SpeedlimitError(f"no such file or directory: {path}")
    if path.is_file():
        summary_path = path.parent / "summary.json"
        summary = read_json(summary_path) if summary_path.is_file() else None
        results = Results(source=path, requests=read_requests_jsonl(path))
        if summary is not None and "sweep" in summary:
            results.sweep = summary
        else:
            results.summary = summary
        return results
    summary_path = path / "summary.json"
    summary = read_json(summary_path) if summary_path.is_file() else None
    if summary is not None and isinstance(summary.get("sweep"), dict):
        if not isinstance(summary.get("points"), list) or not summary["points"]:
            raise SpeedlimitError(f"{summary_path} is a sweep summary without points")
        results = Results(source=path, sweep=summary)
        parameter = summary["sweep"].get("parameter", "")
        for point in summary["points"]:  # the requests of the sweep's runs, tagged with their load
            value = point.get("sweep_value", point.get(parameter))
            run = path / f"{parameter}_{value:g}" / "requests.jsonl" if isinstance(value, (int, float)) else None
            if run is not None and run.is_file():
                for row in read_requests_jsonl(run):
                    row["_load"] = value
                    results.requests.append(row)
        return results
    requests_path = path / "requests.jsonl"
    if not requests_path.is_file():
        raise SpeedlimitError(f"{path} holds neither requests.jsonl nor a sweep summary.json; pass bench's --out directory")
    return Results(source=path, requests=read_requests_jsonl(requests_path), summary=summary)
