"""Reading a run or a sweep for `speedlimit report`, through the typed artifacts of `speedlimit.artifacts`.

Accepts what `speedlimit bench` writes, and what `speedlimit simulate` writes in the same files:

- a ``requests.jsonl`` file, with an optional ``summary.json`` beside it;
- a run directory holding ``requests.jsonl`` and/or ``summary.json`` (or that ``summary.json`` itself);
- a sweep directory whose ``summary.json`` is a `SweepSummary`, each load level's run in
  ``<parameter>_<value>/requests.jsonl``.

Records are streamed (`iter_records`) into numpy columns (`RequestColumns`); no object per request is kept, so
memory grows by a few dozen bytes per request. A run without ``summary.json`` (a killed bench) gets its
`RunSummary` from `speedlimit.bench.metrics.summarize`. Lines that are not records (the truncated last line a
kill leaves, a corrupted row) are skipped and counted in `Results.bad_lines`; the rest is reported.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speedlimit.artifacts import RequestRecord, RunSummary, SweepSummary, iter_records, load_summary
from speedlimit.errors import SpeedlimitError

#: ``on_progress(bytes_read, bytes_total)`` while requests.jsonl files are read.
Progress = Callable[[int, int], None]

#: Inter-token gaps kept for the histogram when the summary already has the exact ITL distribution.
ITL_SAMPLE_CAP = 1_000_000
_PROGRESS_STEP_BYTES = 1 << 20


@dataclass(frozen=True)
class RequestColumns:
    """The per-request numbers a report draws, one array element per request, in file order (seconds).

    ``start_s`` counts from the earliest send in these results; unknown values are NaN. ``itl_s`` pools the
    inter-token gaps of completed requests: all of them, or an evenly thinned sample of at most
    `ITL_SAMPLE_CAP` when ``itl_sampled`` (the summary then has the exact distribution).
    """

    start_s: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    ok: np.ndarray
    load: np.ndarray  # the sweep's load level of each request (NaN in a single run)
    itl_s: np.ndarray
    itl_sampled: bool
    errors: dict[str, tuple[int, str]]  # error kind -> (count, the first error text seen)

    def __len__(self) -> int:
        return int(self.ok.size)

    @property
    def failed(self) -> int:
        return int((~self.ok).sum())


@dataclass
class Results:
    """One run (``summary``) or one sweep (``sweep``), with the records read beside it (``requests``, None when
    there is no requests.jsonl)."""

    source: Path
    summary: RunSummary | None = None
    sweep: SweepSummary | None = None
    requests: RequestColumns | None = None
    recomputed: bool = False  # summary computed from the records: there was no summary.json
    bad_lines: dict[Path, list[int]] = field(default_factory=dict)  # file -> line numbers skipped

    @property
    def skipped(self) -> int:
        return sum(len(lines) for lines in self.bad_lines.values())

    @property
    def runs(self) -> list[RunSummary]:
        return list(self.sweep.points) if self.sweep is not None else [self.summary] if self.summary else []


class _SummaryRow:
    """The fields `summarize` reads from a record, without the record's inter-token gaps (those stay in the
    pooled column): a few dozen bytes instead of a pydantic object per request."""

    __slots__ = ("ok", "error_kind", "ttft_s", "e2e_s", "tpot_s", "output_tokens", "prompt_tokens",
                 "token_count_source", "prompt_token_source", "retries", "itl_s", "output_chunks")

    def __init__(self, record: RequestRecord) -> None:
        self.ok = record.ok
        self.error_kind = sys.intern(record.error_kind) if record.error_kind else None
        self.ttft_s, self.e2e_s, self.tpot_s = record.ttft_s, record.e2e_s, record.tpot_s
        self.output_tokens, self.prompt_tokens = record.output_tokens, record.prompt_tokens
        self.token_count_source = sys.intern(record.token_count_source)
        self.prompt_token_source = sys.intern(record.prompt_token_source)
        self.retries = record.retries
        self.output_chunks = record.output_chunks
        self.itl_s: tuple[float, ...] = ()


class _GapSample:
    """Inter-token gaps: all of them, or (with a cap) an evenly thinned sample: past the cap every other kept gap
    is dropped and only every ``stride``-th new one kept, so memory stays under twice the cap."""

    def __init__(self, cap: int | None) -> None:
        self.cap, self.stride, self.seen = cap, 1, 0
        self.values = array("d")

    def extend(self, gaps: list[float]) -> None:
        if self.stride == 1:
            self.values.extend(gaps)
        else:
            offset = (-self.seen) % self.stride
            self.values.extend(gaps[offset:: self.stride])
        self.seen += len(gaps)
        if self.cap is not None and len(self.values) > 2 * self.cap:
            self.values = self.values[::2]
            self.stride *= 2


class _Collector:
    """Streams records into columns (and summary rows when a summary must be computed)."""

    def __init__(self, keep_rows: bool, itl_cap: int | None) -> None:
        self.start_ns, self.end_ns = array("q"), array("q")
        self.ttft_s, self.e2e_s, self.load = array("d"), array("d"), array("d")
        self.ok = bytearray()
        self.gaps = _GapSample(itl_cap)
        self.errors: dict[str, tuple[int, str]] = {}
        self.rows: list[_SummaryRow] | None = [] if keep_rows else None

    def add(self, record: RequestRecord, load: float) -> None:
        nan = float("nan")
        start = record.start_ns
        end = record.end_ns if record.end_ns > start else start + int((record.e2e_s or 0.0) * 1e9)
        self.start_ns.append(start)
        self.end_ns.append(end)
        self.ttft_s.append(record.ttft_s if record.ttft_s is not None else nan)
        self.e2e_s.append(record.e2e_s if record.e2e_s is not None else (end - start) / 1e9)
        self.load.append(load)
        self.ok.append(record.ok)
        if record.ok:
            if record.itl_s:
                self.gaps.extend(record.itl_s)
        else:
            kind = record.error_kind or "error"
            count, example = self.errors.get(kind, (0, record.error_text or ""))
            self.errors[kind] = (count + 1, example)
        if self.rows is not None:
            self.rows.append(_SummaryRow(record))

    def columns(self) -> RequestColumns:
        start = np.frombuffer(self.start_ns, dtype=np.int64) if self.start_ns else np.zeros(0, dtype=np.int64)
        origin = int(start.min()) if start.size else 0
        return RequestColumns(
            start_s=(start - origin) / 1e9,
            ttft_s=np.frombuffer(self.ttft_s, dtype=float) if self.ttft_s else np.zeros(0),
            e2e_s=np.frombuffer(self.e2e_s, dtype=float) if self.e2e_s else np.zeros(0),
            ok=np.frombuffer(bytes(self.ok), dtype=np.uint8).astype(bool),
            load=np.frombuffer(self.load, dtype=float) if self.load else np.zeros(0),
            itl_s=np.frombuffer(self.gaps.values, dtype=float) if self.gaps.values else np.zeros(0),
            itl_sampled=self.gaps.stride > 1,
            errors=dict(sorted(self.errors.items())),
        )

    def duration_s(self) -> float:
        """First send to last end, as bench measures a run."""
        if not self.start_ns:
            return 0.0
        return max(0.0, (max(self.end_ns) - min(self.start_ns)) / 1e9)


class _Reader:
    """Reads requests.jsonl files into one collector, counting bytes for ``on_progress`` and bad lines per file."""

    def __init__(self, files: list[Path], on_progress: Progress | None) -> None:
        self.total = sum(path.stat().st_size for path in files)
        self.done = self.reported = 0
        self.on_progress = on_progress
        self.bad_lines: dict[Path, list[int]] = {}

    def _advance(self, size: int) -> None:
        self.done += size
        if self.done - self.reported >= _PROGRESS_STEP_BYTES:
            self.reported = self.done
            self.on_progress(self.done, self.total)  # type: ignore[misc]

    def read(self, path: Path, collector: _Collector, load: float = float("nan")) -> int:
        bad: list[int] = []
        count = 0
        for record in iter_records(path, bad, self._advance if self.on_progress else None):
            collector.add(record, load)
            count += 1
        if bad:
            self.bad_lines[path] = bad
        return count

    def finish(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.total, self.total)


def _run_dir_name(parameter: str, value: float) -> str:
    return f"{parameter}_{value:g}"  # as bench and simulate name a sweep's runs


def load_results(path: Path, on_progress: Progress | None = None) -> Results:
    """Read a requests.jsonl, a run directory (or its summary.json), or a sweep directory."""
    path = Path(path).expanduser()
    if not path.exists():
        raise SpeedlimitError(f"no such file or directory: {path}; pass the --out directory of bench or simulate")
    if path.is_file() and path.name == "summary.json":
        path = path.parent
    directory = path if path.is_dir() else path.parent
    summary_path = directory / "summary.json"
    summary = load_summary(summary_path) if summary_path.is_file() else None

    if isinstance(summary, SweepSummary):
        if not summary.points:
            raise SpeedlimitError(f"{summary_path} is a sweep summary without points")
        runs = [(point.sweep_value, directory / _run_dir_name(summary.sweep.parameter, point.sweep_value) / "requests.jsonl")
                for point in summary.points if point.sweep_value is not None]
        runs = [(value, file) for value, file in runs if file.is_file()]
        reader = _Reader([file for _, file in runs], on_progress)
        collector = _Collector(keep_rows=False, itl_cap=ITL_SAMPLE_CAP)
        for value, file in runs:
            reader.read(file, collector, float(value))
        reader.finish()
        return Results(source=path, sweep=summary, requests=collector.columns() if runs else None, bad_lines=reader.bad_lines)

    requests_path = path if path.is_file() else directory / "requests.jsonl"
    if not requests_path.is_file():
        if summary is not None:
            return Results(source=path, summary=summary)
        raise SpeedlimitError(f"{path} holds neither requests.jsonl nor summary.json; pass the --out directory of bench or simulate")
    reader = _Reader([requests_path], on_progress)
    collector = _Collector(keep_rows=summary is None, itl_cap=ITL_SAMPLE_CAP if summary is not None else None)
    count = reader.read(requests_path, collector)
    reader.finish()
    skipped = len(reader.bad_lines.get(requests_path, []))
    if count == 0 and summary is None:
        if skipped:
            raise SpeedlimitError(f"no line of {requests_path} is a request record ({skipped} bad lines); pass the requests.jsonl of bench or simulate")
        raise SpeedlimitError(f"{requests_path} has no requests; run `speedlimit bench ... --out DIR` first")
    columns = collector.columns()
    recomputed = summary is None
    if summary is None:
        from speedlimit.bench.metrics import distribution, summarize

        # the rows carry no gaps (the pooled column holds them all), so the ITL distribution comes from the column
        summary = summarize(collector.rows, collector.duration_s())  # type: ignore[arg-type]
        summary = summary.model_copy(update={"itl_s": distribution(memoryview(columns.itl_s))})  # floats, no list
    return Results(source=path, summary=summary, requests=columns, recomputed=recomputed, bad_lines=reader.bad_lines)
