"""Typed artifacts that cross legs, each with one reader and one writer.

- `RequestRecord`: one request, one line of ``requests.jsonl`` (bench measures it, simulate predicts it).
- `RunSummary`: one run's ``summary.json`` (bench and simulate write the same model).
- `SweepSummary`: a sweep's ``summary.json``: one `RunSummary` per load level, the knee and saturation.
- `VerifyResult` lives in `speedlimit.verify.run` on the same `Artifact` base; `Estimate` in the estimator.

Every file carries ``schema`` (``speedlimit.<kind>/<version>``). Files written before schemas existed (no
``schema`` key) still load; a file of another kind or a newer version is a one-line error that names it.
Writes are atomic (temporary file + rename), so a crash leaves the last complete file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from speedlimit.errors import SpeedlimitError, file_error, pydantic_message


def write_json_atomic(path: Path, data: Any) -> Path:
    """Write JSON to ``path`` through a temporary file and a rename (no half-written file survives a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, allow_nan=False, default=str) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def read_json(path: Path, what: str) -> Any:
    """Parsed JSON of ``path``, or a one-line `SpeedlimitError` saying why it is not ``what``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise file_error(path, error, what) from None


def finite_json(value: Any) -> Any:
    """NaN and ±inf become None, recursively: JSON has no NaN, and a missing value is what they mean here."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_json(v) for v in value]
    return value


class Artifact(BaseModel):
    """Base of a versioned JSON artifact: `save` writes it atomically, `load`/`parse` read and check it."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    schema_: str = Field(default="", alias="schema")

    @model_validator(mode="before")
    @classmethod
    def _check_schema(cls, data: Any) -> Any:
        if isinstance(data, dict):
            schema = data.get("schema")
            if schema in (None, ""):  # written before schemas existed: same fields
                return {**data, "schema": cls.schema_id()}
            kind, _, version = str(schema).partition("/")
            if kind != f"speedlimit.{cls.KIND}":
                raise ValueError(f"this is a {schema!r} file, not a speedlimit.{cls.KIND} file")
            if not version.isdigit() or int(version) > cls.VERSION:
                raise ValueError(f"schema {schema!r} is newer than this speedlimit reads ({cls.schema_id()}): "
                                 "upgrade speedlimit")
        return data

    @classmethod
    def schema_id(cls) -> str:
        return f"speedlimit.{cls.KIND}/{cls.VERSION}"

    def model_post_init(self, _context: Any) -> None:
        if not self.schema_:
            self.schema_ = self.schema_id()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (`save` writes exactly this; non-finite numbers become null)."""
        return finite_json(self.model_dump(mode="json", by_alias=True))

    def save(self, path: Path) -> Path:
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def parse(cls, data: Any, source: str = "input") -> Any:
        """Validate already-parsed JSON; a one-line error naming ``source`` when it is not this artifact."""
        if not isinstance(data, dict):
            raise SpeedlimitError(f"{source} is not a {cls.KIND} artifact (expected a JSON object)")
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise SpeedlimitError(f"{source} is not a valid speedlimit.{cls.KIND} file ({pydantic_message(error)})") from None

    @classmethod
    def load(cls, path: Path) -> Any:
        return cls.parse(read_json(path, f"a speedlimit.{cls.KIND} JSON file"), str(path))


# --------------------------------------------------------------------------------------------
# per request


class RequestRecord(BaseModel):
    """What one request did (seconds). ``start_ns``/``end_ns`` are the run's monotonic clock in nanoseconds.

    Bench fills it from the stream; simulate fills the same fields plus the split of the request's time into
    queue, prefill and decode, which a client cannot see (None from bench).
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=False)

    index: int
    start_ns: int = 0
    end_ns: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = Field(default_factory=list)  # gaps between text-carrying stream events (per chunk)
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_chunks: int = 0
    token_count_source: str = "chunks"  # usage | tokenizer | max_tokens | chunks | simulated
    prompt_token_source: str = "unknown"  # usage | tokenizer | words | unknown | simulated
    http_status: int | None = None
    error_kind: str | None = None
    error_text: str | None = None
    finish_reason: str | None = None
    retries: int = 0  # resent once on a fresh connection after failing before any response byte
    # simulate only: where the request's time went
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    preemptions: int = 0
    # bench --workers/--ray: the worker (0-based) that sent it; start_ns/end_ns are already on the run's clock
    worker: int | None = None
    # bench: the X-Request-Id sent with it (a UUID4), and the server's own id for it when the response carried one
    # (its X-Request-Id header, else the OpenAI `id` of the stream chunks): joins a run with server logs and traces
    request_id: str | None = None
    server_request_id: str | None = None
    max_tokens: int | None = None  # bench: the max_tokens it asked for (what the output-length self-check compares)
    scheduled_ns: int | None = None  # bench open loop: when the schedule meant it to leave (start_ns is when it did)
    # kept in memory for recounting tokens; never written
    output_text: str = Field(default="", exclude=True)

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT)/(n - 1); None when undefined (fewer than 2 tokens or a failed request)."""
        if self.e2e_s is None or self.ttft_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json_dict(self) -> dict[str, Any]:
        """The requests.jsonl row: every field but the output text, plus TPOT and the output's length."""
        row = self.model_dump()
        row["tpot_s"] = self.tpot_s
        row["output_chars"] = len(self.output_text)
        return finite_json(row)

    def to_json_line(self) -> str:
        return json.dumps(self.to_json_dict(), allow_nan=False) + "\n"

    @classmethod
    def trusted(cls, values: dict[str, Any], fields_set: set[str] | None = None) -> "RequestRecord":
        """A record from already-valid values, without validation: what `model_construct` does, minus resolving
        every default per call (the simulator builds hundreds of thousands of records at the end of a run).
        ``fields_set`` (the names in ``values``) may be one set shared by many records."""
        defaults = cls.__dict__.get("_trusted_defaults")
        if defaults is None:
            defaults = {name: field.get_default(call_default_factory=True) for name, field in cls.model_fields.items()}
            cls._trusted_defaults = defaults
        record = cls.__new__(cls)
        data = {**defaults, **values}
        if "itl_s" not in values:
            data["itl_s"] = []
        object.__setattr__(record, "__dict__", data)
        object.__setattr__(record, "__pydantic_fields_set__", set(values) if fields_set is None else fields_set)
        object.__setattr__(record, "__pydantic_extra__", None)
        object.__setattr__(record, "__pydantic_private__", None)
        return record


def write_records(path: Path, records: list[RequestRecord]) -> None:
    """Replace ``path`` atomically with these records, in request order."""
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for record in sorted(records, key=lambda r: r.index):
            handle.write(record.to_json_line())
    os.replace(temporary, path)


def iter_records(path: Path, bad_lines: list[int] | None = None,
                 progress: Callable[[int], None] | None = None) -> Iterator[RequestRecord]:
    """The records of a requests.jsonl, streamed. Lines that are not a record (a truncated last line after a kill,
    a corrupted row) are skipped and their line numbers appended to ``bad_lines``. ``progress``, when given, is
    called with the byte length of every line read (for a progress bar over the file's size)."""
    try:
        handle = Path(path).open("rb")
    except OSError as error:
        raise file_error(path, error, "bench's requests.jsonl") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if progress is not None:
                progress(len(line))
            if not line.strip():
                continue
            try:
                yield RequestRecord.model_validate_json(line)
            except ValidationError:
                if bad_lines is not None:
                    bad_lines.append(number)


# --------------------------------------------------------------------------------------------
# summaries


class Distribution(BaseModel):
    """mean, p50/p90/p95/p99 (linear interpolation), min, max and count of one metric (seconds); None when empty."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    n: int = 0


class LoadInfo(BaseModel):
    """The load a run was under: closed loop (concurrency) or open loop (rate, burstiness), and its length."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    trace: str | None = None  # bench --trace: the replayed trace file (arrivals at its recorded times)
    time_scale: float | None = None  # bench --time-scale: recorded gaps multiplied by this


class WorkerInfo(BaseModel):
    """One load-generating worker of a `bench --workers/--ray` run, and how its clock was mapped onto the run's."""

    worker: int
    host: str = ""
    pid: int = 0
    requests: int = 0
    concurrency: int | None = None  # closed loop: the slots it ran
    clock_offset_ms: float = 0.0  # its monotonic clock minus the parent's (subtracted from its timestamps)
    clock_uncertainty_ms: float = 0.0  # half the shortest ping's round trip: the offset is known to ± this
    clock_drift_ms: float | None = None  # the offset measured after the run minus before it
    start_lag_ms: float | None = None  # when it actually started minus the common start (run clock)
    cpu_s: float | None = None  # CPU seconds the worker process used during the run
    loop_lag_p99_s: float | None = None  # how late its event loop woke for a timer (p99; its timestamps lag as much)


class WorkersInfo(BaseModel):
    """How a `bench --workers N` (processes on this machine) or `--ray` (Ray actors) run was spread, and the clock
    skew measured between its workers (offsets are corrected; what remains is the uncertainty and the drift)."""

    mode: Literal["processes", "ray"]
    count: int
    address: str | None = None  # --ray ADDRESS (None: a local Ray instance)
    max_clock_offset_ms: float = 0.0
    max_clock_uncertainty_ms: float = 0.0
    max_clock_drift_ms: float | None = None
    start_spread_ms: float | None = None  # latest minus earliest actual worker start, on the run clock
    cpu_s: float | None = None  # all workers together
    workers: list[WorkerInfo] = Field(default_factory=list)


class ServerGauge(BaseModel):
    """A server gauge over a run's scrapes (before, during every --metrics-interval, after)."""

    metric: str
    mean: float | None = None
    max: float | None = None
    last: float | None = None


class ServerHistogram(BaseModel):
    """A server latency histogram over the run: the scrape after minus the one before. The mean is exact
    (_sum/_count); percentiles are interpolated within buckets as Prometheus' histogram_quantile does."""

    metric: str
    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class ServerMetrics(BaseModel):
    """What the server's own Prometheus /metrics said about a run (bench; None when it exports none). The series
    behind it are in the run directory's server_metrics.jsonl."""

    engine: str = "unknown"  # vllm | sglang | tgi | llamacpp | trtllm | unknown (from the metric names' prefix)
    version: str | None = None  # the engine's version as its server reports it (vLLM's /version, SGLang's server info)
    # how the server lays out and schedules the deployment, where it says so (SGLang's server info, TensorRT-LLM's
    # config and iteration gauges)
    tp: int | None = None  # the tensor-parallel GPUs of one replica (with data-parallel attention: every GPU)
    dp: int | None = None  # data-parallel replicas or attention ranks, where more than 1
    dp_attention: bool | None = None  # the dp ranks run attention data-parallel, the MoE across every GPU
    ep: int | None = None  # expert-parallel GPUs, where more than 1
    pp: int | None = None  # pipeline stages, where more than 1
    batched_tokens: int | None = None  # the tokens one scheduler step may prefill (SGLang's chunked-prefill size,
    # TensorRT-LLM's max_num_tokens)
    max_running: int | None = None  # the cap on running requests (SGLang's given one, TensorRT-LLM's batch size)
    url: str = ""
    scrapes: int = 0
    interval_s: float | None = None
    failures: int = 0
    running: ServerGauge | None = None  # requests running (in the batch)
    waiting: ServerGauge | None = None  # requests queued (llama.cpp: deferred)
    kv_cache_usage: ServerGauge | None = None  # fraction 0..1 of the KV cache in use
    prefix_cache_hit_rate: float | None = None  # vLLM: blocks hit/queried; SGLang, llama.cpp: cached prompt tokens
    kv_capacity_tokens: float | None = None  # the KV cache the server allocated (vLLM: blocks x block size; SGLang:
    # one scheduler's token pool; TensorRT-LLM: blocks x tokens per block)
    kv_block_size: int | None = None  # vLLM, TensorRT-LLM: tokens per KV block
    slots: int | None = None  # llama-server: the sequences it runs at once (its /props total_slots, --parallel)
    slot_context_tokens: int | None = None  # llama-server: the context one slot holds (/props n_ctx)
    # llama-server, as the run began (its /slots, after bench's warm-up): the slots that had served a request, least
    # recently used first, and how many were serving one (another client's: the replay cannot see that work)
    slot_history: list[int] | None = None
    slots_busy: int | None = None
    counters: dict[str, float] = Field(default_factory=dict)  # over the run: prompt_tokens, generation_tokens, ...
    histograms: dict[str, ServerHistogram] = Field(default_factory=dict)  # ttft_s, tpot_s, itl_s, e2e_s, queue_s...


class ArrivalCheck(BaseModel):
    """Open loop: each request's actual send (its last byte on the socket) minus its scheduled time. It includes
    opening a connection when the pool had none free; a slightly negative lag is a timer that fired early (uvloop's
    timers have 1 ms granularity)."""

    requests: int = 0
    lag_p50_s: float | None = None
    lag_p99_s: float | None = None
    lag_max_s: float | None = None
    late: int = 0  # sent more than late_threshold_s after its scheduled time
    late_threshold_s: float = 0.01


class ClientCheck(BaseModel):
    """How busy the client was: CPU seconds of the event loop's thread (of each worker process with --workers) over
    the run's wall time (1.0 = one core, all an asyncio loop can use) and how late the event loop woke up for a
    timer (lag). Runs shorter than 1 s are not judged."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    cpu_fraction: float = 0.0  # of one core, for the busiest process (this one, or the busiest worker)
    processes: int = 1
    loop_lag_p50_s: float | None = None
    loop_lag_p99_s: float | None = None
    loop_lag_max_s: float | None = None
    loop_lag_samples: int = 0
    worker_loop_lag_p99_s: float | None = None  # --workers/--ray: the worst worker's own event-loop lag p99
    bottleneck: bool = False  # the client, not the server, may be what limits these numbers


class OutputLengthCheck(BaseModel):
    """Requested max_tokens vs received output tokens over completed requests with exact counts."""

    checked: int = 0
    token_count_source: str = "none"
    exact: int = 0
    fewer: int = 0
    more: int = 0
    mean_received_over_requested: float | None = None
    finish_reasons: dict[str, int] = Field(default_factory=dict)


class TTFTCheck(BaseModel):
    """Client-measured TTFT minus the server's own TTFT histogram (network, client and HTTP overhead)."""

    client_mean_s: float | None = None
    server_mean_s: float | None = None
    mean_diff_s: float | None = None
    client_p50_s: float | None = None
    server_p50_s: float | None = None  # interpolated within the server's buckets: coarse
    p50_diff_s: float | None = None
    server_metric: str = ""


class SelfChecks(BaseModel):
    """bench checking itself: arrivals on schedule, client headroom, TTFT vs the server's, output lengths."""

    arrivals: ArrivalCheck | None = None
    client: ClientCheck | None = None
    ttft_vs_server: TTFTCheck | None = None
    output_length: OutputLengthCheck | None = None


class Comparison(BaseModel):
    measured: float | None = None
    predicted: float | None = None
    ratio: float | None = None  # measured / predicted


class PredictionBlock(BaseModel):
    """What `bench --compare-estimate` adds to a run: the prediction for the same workload, metric by metric."""

    model: str
    hardware: str
    method: str = "estimate"  # estimate (static batch) | simulate (replay of the measured workload)
    inputs: dict[str, float] = Field(default_factory=dict)
    predicted: dict[str, Any] = Field(default_factory=dict)
    comparison: dict[str, Comparison] = Field(default_factory=dict)


class RunSummary(Artifact):
    """One run, measured by bench or predicted by simulate: latency distributions, throughput, goodput, errors."""

    KIND: ClassVar[str] = "run"

    source: Literal["bench", "simulate"] = "bench"
    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    retried: int = 0
    errors: dict[str, int] = Field(default_factory=dict)
    duration_s: float = 0.0
    ttft_s: Distribution = Field(default_factory=Distribution)
    itl_s: Distribution = Field(default_factory=Distribution)  # per chunk: gaps between text-carrying events
    itl_token_s: Distribution = Field(default_factory=Distribution)  # per token: chunk gap / tokens per chunk
    tpot_s: Distribution = Field(default_factory=Distribution)
    e2e_s: Distribution = Field(default_factory=Distribution)
    request_s: float = 0.0
    output_tok_s: float = 0.0
    input_tok_s: float = 0.0
    total_tok_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    mean_in_flight: float = 0.0
    slo: dict[str, float] = Field(default_factory=dict)
    goodput_requests: int = 0
    goodput_request_s: float = 0.0
    token_count_source: str = "none"
    token_count_sources: dict[str, int] = Field(default_factory=dict)
    prompt_token_source: str = "none"
    prompt_token_sources: dict[str, int] = Field(default_factory=dict)
    offered_load: LoadInfo | None = Field(default=None, alias="load")
    endpoint: dict[str, Any] | None = None  # bench: where and how it sent (url, api, model, workload)
    engine: dict[str, Any] | None = None  # simulate: the scenario and engine it simulated
    simulation: dict[str, Any] | None = None  # simulate: what a client cannot see (batch, queue, KV over time)
    estimate: PredictionBlock | None = None
    sweep_value: float | None = None  # the load level of this run within a sweep
    interrupted: str | None = None  # the signal (SIGINT, SIGTERM) that stopped the run early; None when it ran out
    warnings: list[str] = Field(default_factory=list)  # what a reader of these numbers must know (token counts...)
    notes: list[str] = Field(default_factory=list)  # what is worth knowing but does not touch the numbers
    workers: WorkersInfo | None = None  # bench --workers/--ray: the workers and the clock skew measured between them
    server: ServerMetrics | None = None  # bench: the server's own /metrics over the run (server_metrics.jsonl)
    self_checks: SelfChecks | None = None  # bench: arrival lag, client CPU and loop lag, TTFT vs server, lengths

    @property
    def decode_tok_s_per_user(self) -> float | None:
        """One user's decode speed: 1 / mean TPOT (per token, so multi-token chunks count right)."""
        mean = self.tpot_s.mean
        return 1.0 / mean if mean else None


class SweepInfo(BaseModel):
    parameter: Literal["concurrency", "rate"]
    values: list[float]
    saturation_output_tok_s: float | None = None
    saturation_load: float | None = None
    knee_load: float | None = None
    knee_output_tok_s: float | None = None
    knee_fraction: float = 0.9
    slo_max_load: float | None = None  # the highest load whose goodput meets the SLOs (None: none or no SLO)


class SweepSummary(Artifact):
    """A sweep: one `RunSummary` per load level, with the knee and the saturation throughput."""

    KIND: ClassVar[str] = "sweep"

    sweep: SweepInfo
    points: list[RunSummary]
    endpoint: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None
    interrupted: str | None = None  # the signal that stopped the sweep; `points` then holds the levels run so far

    @model_validator(mode="before")
    @classmethod
    def _legacy_points(cls, data: Any) -> Any:
        # files before schemas carried each point's load level under the parameter's own name
        if isinstance(data, dict) and isinstance(data.get("sweep"), dict) and isinstance(data.get("points"), list):
            parameter = data["sweep"].get("parameter")
            points = []
            for point in data["points"]:
                if isinstance(point, dict) and "sweep_value" not in point and parameter in point:
                    point = {**point, "sweep_value": point[parameter]}
                points.append(point)
            data = {**data, "points": points}
        return data


def load_summary_data(data: Any, source: str) -> RunSummary | SweepSummary:
    """Parsed summary JSON of either kind (bench or simulate, one run or a sweep) as its artifact."""
    if isinstance(data, dict) and ("sweep" in data or str(data.get("schema", "")).startswith("speedlimit.sweep/")):
        return SweepSummary.parse(data, source)
    return RunSummary.parse(data, source)


def load_summary(path: Path) -> RunSummary | SweepSummary:
    """A summary.json of either kind (bench or simulate, one run or a sweep)."""
    return load_summary_data(read_json(path, "a speedlimit summary.json"), str(path))
