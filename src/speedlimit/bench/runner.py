"""Load generation for `speedlimit bench`: closed loop (fixed concurrency), open loop (Poisson/gamma arrivals),
warm-up, sweeps, incremental results on disk. All I/O of a run lives here; the numbers come from `metrics`.

Closed loop: C workers, each sends its next request as soon as its previous one ends. Open loop: requests leave at
seeded gamma-distributed times with mean rate R whatever the server does (so queueing shows up as latency). A run
ends after N requests, or once S seconds have passed (no new request starts after S; in-flight ones finish).

Interruption (SIGINT/SIGTERM, see `BenchRunner.stop_on_signals`): no new request starts, requests in flight end as
`cancelled` with what they received, and the run's (and a sweep's) summary of what finished is written as usual,
marked `interrupted`. Rows of requests.jsonl are written by a background writer that yields to pending sends first,
so file writes never delay a request going out.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from pydantic import ValidationError, model_validator

from speedlimit.bench.client import Endpoint, check_server, make_session, raise_open_file_limit, send_request
from speedlimit.artifacts import (LoadInfo, RequestRecord, RunSummary, ServerMetrics, SweepInfo, SweepSummary,
                                 write_records)
from speedlimit.bench.metrics import find_knee, run_warnings, summarize
from speedlimit.bench.selfcheck import LoopLagMonitor, check_warnings, cpu_seconds, prefix_cache_warning, self_checks
from speedlimit.bench.server_metrics import DEFAULT_INTERVAL_S, TRTLLM_METRICS_PATH, MetricsScraper
from speedlimit.bench.tokenizer import LocalTokenizer, ServerTokenizer, load_local_tokenizer, probe_tokenizer
from speedlimit.bench.workload import (LengthSpec, RequestSpec, arrival_offsets_s, build_requests, checked_seed,
                                      load_dataset, level_seed, load_trace, trace_offsets_s)
from speedlimit.errors import SpeedlimitError, pydantic_message

#: Prompt pool size for --duration runs, where the request count is not known in advance (prompts then cycle).
DURATION_POOL_CLOSED = 512
#: Bounds on the load, so that an absurd number is an error before anything is created, not a MemoryError later.
MAX_REQUESTS = 1_000_000
MAX_CONCURRENCY = 100_000
#: Distinct prompts built at most, and the prompt tokens they may hold together; past either, prompts cycle.
MAX_PROMPT_POOL = 10_000
#: Seed offset of warm-up prompts (from the level's seed, `level_seed`): a different seed draws different synthetic
#: prompts, so the measured requests never meet a prompt the warm-up left in a prefix cache.
WARMUP_SALT = 10**6
PROMPT_TOKEN_BUDGET = 50_000_000
#: What every run writes into --out, measured (bench) or predicted (simulate).
RECORD_FILES = ("requests.jsonl", "summary.json")
#: Files a bench run may write into --out (the server's metrics when it exports them); an --out that holds any
#: of them holds a run.
RUN_FILES = (*RECORD_FILES, "server_metrics.jsonl")


def _finite(name: str, value: float | None) -> None:
    if value is not None and math.isnan(value):
        raise SpeedlimitError(f"{name} must be a number, not nan")


class LoadPlan(LoadInfo):
    """The load bench is asked for: `LoadInfo`'s fields, checked as command-line options are. Exactly one of
    concurrency/rate; at most one of requests/duration_s (neither: 100 requests)."""

    def __init__(self, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as error:  # a wrong type is a bad option, not a traceback
            flag = lambda loc: "--" + str(loc[0]).removesuffix("_s").replace("_", "-")  # noqa: E731
            raise SpeedlimitError(pydantic_message(error, flag)) from None

    @model_validator(mode="after")
    def _checked(self) -> "LoadPlan":
        self._check()
        return self

    def _check(self) -> None:
        for name, value in (("--rate", self.rate), ("--burstiness", self.burstiness), ("--duration", self.duration_s)):
            _finite(name, value)
        if (self.concurrency is None) == (self.rate is None):
            raise SpeedlimitError("give exactly one of --concurrency (closed loop) or --rate (open loop)")
        if self.concurrency is not None and not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise SpeedlimitError(f"--concurrency must be between 1 and {MAX_CONCURRENCY:,}")
        if self.rate is not None and self.rate <= 0:
            raise SpeedlimitError("--rate must be > 0 requests/s (use inf to send all at once)")
        if not 0 < self.burstiness < math.inf:
            raise SpeedlimitError("--burstiness must be a finite number > 0")
        if self.requests is not None and self.duration_s is not None:
            raise SpeedlimitError("give --requests or --duration, not both")
        if self.requests is None and self.duration_s is None:
            self.requests = 100
        if self.requests is not None and not 1 <= self.requests <= MAX_REQUESTS:
            raise SpeedlimitError(f"--requests must be between 1 and {MAX_REQUESTS:,}")
        if self.duration_s is not None and not 0 < self.duration_s < math.inf:
            raise SpeedlimitError("--duration must be a finite number of seconds > 0")
        if self.rate is not None and self.duration_s is not None and self.rate * self.duration_s > MAX_REQUESTS:
            raise SpeedlimitError(f"--rate × --duration asks for more than {MAX_REQUESTS:,} requests: shorten the "
                                  "run or lower the rate")
        if not 0 <= self.warmup <= MAX_REQUESTS:
            raise SpeedlimitError(f"--warmup must be between 0 and {MAX_REQUESTS:,}")

    @property
    def request_count(self) -> int:
        """Requests the run sends at most (a --duration run may stop earlier)."""
        if self.requests is not None:
            return self.requests
        if self.rate is not None and self.rate != float("inf"):
            return min(MAX_REQUESTS, max(16, int(self.rate * self.duration_s * 1.5) + 16))
        if self.rate is not None:
            return max(DURATION_POOL_CLOSED, 4 * (self.concurrency or 1))
        return MAX_REQUESTS  # closed loop for --duration: bounded by the clock

    def pool_size(self, mean_prompt_tokens: float) -> int:
        """Distinct prompts to build (requests past it reuse them in turn)."""
        budget = max(1, int(PROMPT_TOKEN_BUDGET // max(mean_prompt_tokens, 1)))
        wanted = self.requests if self.requests is not None else max(DURATION_POOL_CLOSED, 4 * (self.concurrency or 1))
        return max(1, min(wanted, MAX_PROMPT_POOL, budget))

    def load_info(self) -> LoadInfo:
        """The load as the run summary records it."""
        return LoadInfo(**self.model_dump(include=set(LoadInfo.model_fields)))


#: Largest prompt or output length in tokens (2**20: beyond every context window served today).
MAX_TOKENS = 2**20


@dataclass
class WorkloadPlan:
    prompt_tokens: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 128))
    output_tokens: int = 64
    dataset: Path | None = None
    seed: int = 0
    prefix_tokens: int = 0  # --prefix-tokens: one shared prefix on every prompt
    trace: Path | None = None  # --trace: replay a trace's arrivals and lengths
    time_scale: float = 1.0  # --time-scale: the trace's recorded gaps times this
    prefix_groups: int = 1  # --prefix-groups: that many distinct shared prefixes, prompt i with prefix i mod groups

    def __post_init__(self) -> None:
        if not 1 <= self.output_tokens <= MAX_TOKENS:
            raise SpeedlimitError(f"--output-tokens must be between 1 and {MAX_TOKENS:,}")
        if not 0 <= self.prefix_tokens <= MAX_TOKENS:
            raise SpeedlimitError(f"--prefix-tokens must be between 0 and {MAX_TOKENS:,}")
        self.seed = checked_seed(self.seed)
        if not 1 <= self.prefix_groups <= MAX_PROMPT_POOL:
            raise SpeedlimitError(f"--prefix-groups must be between 1 and {MAX_PROMPT_POOL:,}")
        if self.prefix_groups > 1 and not self.prefix_tokens:
            raise SpeedlimitError(f"--prefix-groups {self.prefix_groups} needs --prefix-tokens: the length of each "
                                  "group's prefix")
        if not 0 < self.time_scale < math.inf:
            raise SpeedlimitError("--time-scale must be a finite number > 0")
        if self.trace is not None and self.dataset is not None:
            raise SpeedlimitError("give --trace or --dataset, not both")
        spec = self.prompt_tokens
        largest = spec.b if spec.kind == "uniform" else spec.a + 4 * spec.b if spec.kind == "normal" else spec.a
        if largest > MAX_TOKENS:
            raise SpeedlimitError(f"--prompt-tokens asks for prompts of up to {largest:,.0f} tokens: the most is "
                                  f"{MAX_TOKENS:,}")


def _previous_run(out: Path) -> list[Path]:
    """What a bench run left in `out`: requests.jsonl, summary.json, report/, sweep levels' folders."""
    return [p for p in out.iterdir() if p.name in RUN_FILES or p.name == "report"
            or (p.is_dir() and p.name.startswith(("concurrency_", "rate_")) and (p / "summary.json").exists())]


def check_out_dir(out: Path | None, force: bool = False) -> None:
    """--out, checked before anything is sent or created: never a file, never a directory that already holds a run
    unless `force` (then `prepare_out_dir` replaces that run)."""
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise SpeedlimitError(f"--out {out} is a file: give a directory for requests.jsonl and summary.json")
    if out.is_dir() and not force:
        previous = _previous_run(out)
        if previous:
            raise SpeedlimitError(f"--out {out} already holds a run ({', '.join(sorted(p.name for p in previous))}"
                                  "): give a fresh directory, or pass --force to replace that run")


def prepare_out_dir(out: Path | None, force: bool = False) -> None:
    """Create --out (after `check_out_dir`, once the server answered); with `force`, remove the run it held."""
    if out is None:
        return
    check_out_dir(out, force)
    try:
        if out.is_dir():
            for path in _previous_run(out):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".speedlimit-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise SpeedlimitError(f"cannot write to --out {out} ({error.strerror or error})") from None


class RecordSink:
    """requests.jsonl, appended as each request completes. Rows are queued and written by a background task that
    first yields to pending sends, then writes and flushes everything queued: a file write never delays a request
    going out, and a finished request is on disk within one event-loop turn (Ctrl-C loses nothing)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = None
        self._pending: list[RequestRecord] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")
            self._task = asyncio.create_task(self._drain())

    def write(self, record: RequestRecord) -> None:
        if self._file is not None:
            self._pending.append(record)
            self._wake.set()

    async def _drain(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let sends that are ready go out first
            self._flush()

    def _flush(self) -> None:
        if self._file is not None and self._pending:
            pending, self._pending = self._pending, []
            self._file.write("".join(record.to_json_line() for record in pending))
            self._file.flush()

    def rewrite(self, records: list[RequestRecord]) -> None:
        """Replace the file atomically with final rows (after token recounting)."""
        if self.path is None:
            return
        self.close()
        write_records(self.path, records)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._flush()
        if self._file is not None:
            self._file.close()
            self._file = None


class _Sender:
    """Sends requests for one run and remembers which are in flight, so that `stop` can cancel exactly those."""

    def __init__(self, session, endpoint: Endpoint, on_record: Callable[[RequestRecord], None]) -> None:
        self.session = session
        self.endpoint = endpoint
        self.on_record = on_record
        self.records: list[RequestRecord] = []
        self.in_flight: set[asyncio.Task] = set()
        self.stopping = False
        self.stopped = asyncio.Event()

    async def send(self, spec: RequestSpec, scheduled_ns: int | None = None) -> None:
        task = asyncio.create_task(send_request(self.session, self.endpoint, spec))
        self.in_flight.add(task)
        try:
            record = await task  # `stop` cancels `task`; send_request then returns it as `cancelled`
        except asyncio.CancelledError:
            if task.cancelled() and self.stopping:
                return  # cancelled before it started: nothing was sent
            raise
        finally:
            self.in_flight.discard(task)
        record.scheduled_ns = scheduled_ns
        self.records.append(record)
        self.on_record(record)

    def stop(self) -> None:
        self.stopping = True
        self.stopped.set()
        for task in list(self.in_flight):
            task.cancel()


def repeated_prompt_warning(records: list[RequestRecord], distinct: int) -> str | None:
    """Request n sends synthetic prompt n mod `distinct` (`_cycled`): past the pool, prompts repeat, and a server with
    prefix caching serves a repeat's whole prompt from its cache, so its TTFT is no prefill at all."""
    repeated = sum(1 for r in records if r.index >= distinct and r.error_kind != "cancelled")
    if not repeated:
        return None
    return (f"{repeated} of {len(records)} requests re-sent one of the run's {distinct} distinct synthetic prompts: a "
            f"server with prefix caching answers those from its cache, so their TTFT is not a full prefill; use "
            f"--requests (up to {MAX_PROMPT_POOL:,} distinct prompts) instead of --duration")


def _cycled(specs: list[RequestSpec], n: int) -> RequestSpec:
    spec = specs[n % len(specs)]
    if n < len(specs):
        return spec
    return RequestSpec(n, spec.prompt, spec.max_tokens, spec.prompt_tokens, spec.prompt_token_source, spec.messages,
                       spec.extra)


async def run_closed_loop(sender: _Sender, specs: list[RequestSpec], n_requests: int, concurrency: int,
                          deadline_ns: int | None, indices: Iterable[int] | None = None) -> list[RequestRecord]:
    """`concurrency` loops share one cursor over request indices (all of range(n_requests), or `indices`: one
    worker's share of a --workers run)."""
    cursor = iter(range(n_requests) if indices is None else indices)

    async def worker() -> None:
        for n in cursor:
            if sender.stopping or (deadline_ns is not None and time.perf_counter_ns() >= deadline_ns):
                return
            await sender.send(_cycled(specs, n))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, n_requests))))
    return sender.records


async def run_open_loop(sender: _Sender, specs: list[RequestSpec], offsets_s: list[float],
                        deadline_ns: int | None, start_ns: int | None = None,
                        indices: Sequence[int] | None = None) -> list[RequestRecord]:
    """Request `indices[k]` (default k) leaves at `start_ns` (default now) + `offsets_s[k]`."""
    start_ns = time.perf_counter_ns() if start_ns is None else start_ns
    tasks = []
    for n, offset_s in zip(range(len(offsets_s)) if indices is None else indices, offsets_s):
        send_ns = start_ns + int(offset_s * 1e9)
        if deadline_ns is not None and send_ns >= deadline_ns:
            break
        delay_s = (send_ns - time.perf_counter_ns()) / 1e9
        if delay_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sender.stopped.wait(), delay_s)
        if sender.stopping:
            break
        tasks.append(asyncio.create_task(sender.send(_cycled(specs, n), send_ns)))
    await asyncio.gather(*tasks)
    return sender.records


@dataclass
class RunResult:
    records: list[RequestRecord]
    summary: RunSummary


def pick_model(endpoint: Endpoint, served: list[str]) -> str | None:
    """--model checked against what the server lists (default: its first model); a one-line error naming them."""
    listed = ", ".join(served[:20]) + (f" (and {len(served) - 20} more)" if len(served) > 20 else "")
    if endpoint.model is None:
        if not served:
            raise SpeedlimitError(f"{endpoint.base_url}/models lists no model: pass --model NAME")
        return served[0]
    if served and endpoint.model not in served and f"{endpoint.model}:latest" not in served:
        raise SpeedlimitError(f"the server does not serve --model {endpoint.model!r}; {endpoint.base_url}/models "
                              f"lists: {listed} (or pass --skip-preflight to send anyway)")
    return endpoint.model


class BenchRunner:
    """Owns the session, tokenizer and prompts of one `speedlimit bench` invocation (one run or one sweep)."""

    def __init__(self, endpoint: Endpoint, workload: WorkloadPlan, *, slo: dict[str, float] | None = None,
                 preflight: bool = True, count_tokens: bool = True, tokenizer_path: Path | None = None,
                 progress: Callable[[str, int | None], Any] | None = None, scale: Any = None,
                 server_metrics: bool = True, metrics_interval_s: float = DEFAULT_INTERVAL_S,
                 metrics_url: str | None = None) -> None:
        if not 0 < metrics_interval_s < math.inf:
            raise SpeedlimitError("--metrics-interval must be a finite number of seconds > 0")
        if metrics_url is not None and not metrics_url.startswith(("http://", "https://")):
            raise SpeedlimitError(f"--metrics-url must start with http:// or https:// (got {metrics_url!r})")
        self.server_metrics = server_metrics  # scrape the server's Prometheus /metrics around every run
        self.metrics_interval_s = metrics_interval_s
        self.metrics_url = metrics_url
        self.endpoint = endpoint
        self.scale = scale  # bench.workers.ScaleOut: --workers/--ray (None: this process sends everything)
        self.workload = workload
        self.slo = slo or {}
        self.preflight = preflight
        self.count_tokens = count_tokens
        self.progress = progress  # progress(description, total) -> object with .advance(record) / .close()
        self.session = None
        self.tokenizer: ServerTokenizer | LocalTokenizer | None = (
            load_local_tokenizer(tokenizer_path) if tokenizer_path is not None else None)
        self.served_models: list[str] = []
        self.dataset = load_dataset(workload.dataset) if workload.dataset else None
        self.trace = load_trace(workload.trace) if workload.trace else None
        if self.trace is not None and sum(r.prompt_tokens for r in self.trace) > PROMPT_TOKEN_BUDGET:
            raise SpeedlimitError(f"--trace {workload.trace} asks for more than {PROMPT_TOKEN_BUDGET:,} prompt tokens "
                                  "in all: replay part of it (--requests N)")
        self.interrupted: str | None = None  # the signal that stopped this invocation
        self._sender: Any = None  # what `stop` stops: the run's _Sender, or the ScaleOut of a --workers run
        self._running = 0  # > 0 inside run()/sweep(): a signal then stops the run instead of cancelling
        self.results: list[RunResult] = []  # every run of this invocation, in order (what --compare-estimate replays)

    async def __aenter__(self) -> "BenchRunner":
        raise_open_file_limit()
        self.session = make_session()
        try:
            if self.preflight:
                self.served_models = await check_server(self.session, self.endpoint)
                self.endpoint.model = pick_model(self.endpoint, self.served_models)
                if self.tokenizer is None:
                    self.tokenizer = await probe_tokenizer(self.session, self.endpoint.root_url, self.endpoint.model,
                                                           self.endpoint.headers)
            if self.scale is not None:
                await self.scale.__aenter__()
        except BaseException:  # __aexit__ does not run when __aenter__ fails: close the session here
            await self.session.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.scale is not None:
                await self.scale.__aexit__(*exc)
        finally:
            if self.session is not None:
                await self.session.close()

    # --- interruption -------------------------------------------------------------------------------------------

    def stop(self, reason: str = "stop") -> None:
        """Stop early: no new request; requests in flight end as `cancelled`; summaries are still written."""
        if self.interrupted is None:
            self.interrupted = reason
        if self._sender is not None:
            self._sender.stop()

    @contextlib.contextmanager
    def stop_on_signals(self, task: asyncio.Task | None = None):
        """While inside: the first SIGINT/SIGTERM calls `stop` (or cancels `task` when no run has started yet, e.g.
        during the pre-flight); a second one cancels `task`, abandoning the summaries (requests.jsonl is kept)."""
        loop = asyncio.get_running_loop()
        task = task or asyncio.current_task()
        installed = []

        def on_signal(name: str) -> None:
            if self.interrupted is not None or not self._running:
                self.interrupted = self.interrupted or name
                if task is not None:
                    task.cancel()
                return
            self.stop(name)

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal, sig.name)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
                pass
        try:
            yield self
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    # --- runs ---------------------------------------------------------------------------------------------------

    async def specs(self, n: int, level: int = 0, salt: int = 0) -> list[RequestSpec]:
        """`n` requests of sweep level `level` (0: a single run), drawn from `level_seed` + `salt`."""
        return await build_requests(n, prompt_spec=self.workload.prompt_tokens,
                                    output_tokens=self.workload.output_tokens,
                                    seed=level_seed(self.workload.seed, level) + salt,
                                    tokenizer=self.tokenizer, dataset=self.dataset,
                                    prefix_tokens=self.workload.prefix_tokens, trace=self.trace,
                                    prefix_groups=self.workload.prefix_groups)

    async def run(self, plan: LoadPlan, out_dir: Path | None = None, label: str = "bench", level: int = 0) -> RunResult:
        """Warm up, run the plan, recount tokens, summarize; writes out_dir/requests.jsonl and summary.json.

        ``level``: the sweep level this run is (its prompts are drawn from `level_seed`, see `sweep`)."""
        assert self.session is not None, "use `async with BenchRunner(...)`"
        self._running += 1
        try:
            return await self._run(plan, out_dir, label, level)
        finally:
            self._running -= 1

    async def _run(self, plan: LoadPlan, out_dir: Path | None, label: str, level: int = 0) -> RunResult:
        n_requests = plan.request_count
        if self.trace is not None:  # every request its own recorded lengths: no pool, no cycling
            n_requests = len(self.trace) if plan.requests is None else min(plan.requests, len(self.trace))
            specs = await self.specs(n_requests)
        else:
            specs = await self.specs(plan.pool_size(self.workload.prompt_tokens.mean), level=level)
        if plan.warmup and self.interrupted is None:
            warm = await self.specs(min(plan.warmup, MAX_PROMPT_POOL), level=level, salt=WARMUP_SALT)
            sender = self._sender = _Sender(self.session, self.endpoint, lambda r: None)
            # a failed warm-up request warms nothing: stop the warm-up there (against a hung server it would cost
            # --warmup x --timeout before the run) and let the measured run meet and record the failure
            sender.on_record = lambda record: None if record.ok else sender.stop()
            try:
                await run_closed_loop(sender, warm, plan.warmup, plan.concurrency or 1, None)
            finally:
                self._sender = None
        sink = RecordSink(out_dir / "requests.jsonl" if out_dir else None)
        tracker = self.progress(label, plan.requests) if self.progress else None

        def on_record(record: RequestRecord) -> None:
            sink.write(record)
            if tracker is not None:
                tracker.advance(record)

        if self.trace is not None:
            offsets = trace_offsets_s(self.trace[:n_requests], self.workload.time_scale)
        elif plan.concurrency is None:
            offsets = arrival_offsets_s(n_requests, plan.rate, plan.burstiness, self.workload.seed)
        else:
            offsets = None
        workers_info = None
        scraper = None
        if self.server_metrics and self.interrupted is None:
            auth = {k: v for k, v in self.endpoint.headers.items() if k == "Authorization"}
            fallback = None if self.metrics_url else self.endpoint.root_url + TRTLLM_METRICS_PATH
            scraper = MetricsScraper(self.session, self.metrics_url or self.endpoint.root_url + "/metrics",
                                     self.metrics_interval_s, out_dir / "server_metrics.jsonl" if out_dir else None,
                                     headers=auth, fallback_url=fallback)
            await scraper.start()
        monitor = LoopLagMonitor()
        monitor.start()
        cpu_start = cpu_seconds()
        start_ns = time.perf_counter_ns()
        try:
            if self.scale is not None:
                records, workers_info = await self._run_on_workers(plan, specs, n_requests, offsets, on_record)
            else:
                sender = self._sender = _Sender(self.session, self.endpoint, on_record)
                if self.interrupted is not None:
                    sender.stop()
                deadline_ns = start_ns + int(plan.duration_s * 1e9) if plan.duration_s else None
                if offsets is None:
                    records = await run_closed_loop(sender, specs, n_requests, plan.concurrency, deadline_ns)
                else:
                    records = await run_open_loop(sender, specs, offsets, deadline_ns)
        except BaseException:
            monitor.cancel()
            if scraper is not None:
                scraper.abort()
            raise
        finally:
            self._sender = None
            if tracker is not None:
                tracker.close()
            sink.close()
        wall_s = (time.perf_counter_ns() - start_ns) / 1e9
        cpu_s = cpu_seconds() - cpu_start
        await monitor.stop()
        if scraper is not None:
            await scraper.finish()
        first_ns = min((r.start_ns for r in records), default=start_ns)
        last_ns = max((r.end_ns for r in records), default=start_ns)
        duration_s = (last_ns - first_ns) / 1e9
        # a server's tokenizer may hang like the server did: after an interruption only a local one recounts
        if self.interrupted is None or isinstance(self.tokenizer, LocalTokenizer):
            if await self.recount_output_tokens(records):
                sink.rewrite(records)
        load = plan.load_info()
        if self.trace is not None:
            load = load.model_copy(update={"concurrency": None, "rate": None, "trace": str(self.workload.trace),
                                           "time_scale": self.workload.time_scale, "requests": n_requests})
        summary = summarize(records, duration_s, self.slo, source="bench", offered_load=load,
                            endpoint=self.describe_endpoint(level), interrupted=self.interrupted,
                            warnings=run_warnings(records, self.workload.output_tokens, self.endpoint.force_output),
                            workers=workers_info)
        summary.server = scraper.summary() if scraper is not None else None
        summary.warnings += self.prompt_reuse_warnings(records, len(specs), summary.server, level)
        # CPU over the window the load ran (first send to last end): with --workers, the wall clock above also holds
        # the clock pings and the start barrier
        busy_s = duration_s if duration_s > 0 else wall_s
        summary.self_checks = self_checks(records, wall_s=busy_s, cpu_s=cpu_s, lags_s=monitor.lags_s,
                                          client_ttft=summary.ttft_s, server=summary.server, workers=workers_info)
        if scraper is not None and scraper.warning:
            summary.warnings.append(scraper.warning)
        if scraper is not None and scraper.note:
            summary.notes.append(scraper.note)
        summary.warnings.extend(check_warnings(summary.self_checks, self.endpoint.force_output))
        if out_dir is not None:
            summary.save(out_dir / "summary.json")
        self.results.append(RunResult(records, summary))
        return self.results[-1]

    async def _run_on_workers(self, plan: LoadPlan, specs: list[RequestSpec], n_requests: int,
                              offsets: list[float] | None, on_record: Callable[[RequestRecord], None]):
        """The plan split over --workers/--ray (see bench.workers); records come back on this process's clock."""
        from speedlimit.bench.workers import plan_jobs

        jobs = plan_jobs(self.scale.pool.n, self.endpoint, specs, n_requests, concurrency=plan.concurrency,
                         offsets_s=offsets, duration_s=plan.duration_s)
        self._sender = self.scale
        if self.interrupted is not None:
            self.scale.stop()
        return await self.scale.run(jobs, on_record)

    async def recount_output_tokens(self, records: list[RequestRecord]) -> bool:
        """Without server usage, count outputs with the model's tokenizer (local or the server's), after the timed
        window."""
        if self.tokenizer is None or not self.count_tokens:
            return False
        todo = [r for r in records if r.ok and r.token_count_source == "chunks"]
        gate = asyncio.Semaphore(8)

        async def recount(record: RequestRecord) -> None:
            async with gate:
                record.output_tokens = await self.tokenizer.count_generated(record.output_text)
                record.token_count_source = "tokenizer"

        await asyncio.gather(*(recount(r) for r in todo))
        return bool(todo)

    def prompt_reuse_warnings(self, records: list[RequestRecord], distinct: int, server: ServerMetrics | None,
                              level: int) -> list[str]:
        """Where this run's TTFTs may be prefix-cache hits rather than prefills: synthetic prompts re-sent past the
        pool, a server that says it answered most prompt tokens from its cache, a later sweep level of a dataset."""
        if self.dataset is None:
            # a trace's prompts are seeded text too; only --prefix-tokens shares a prefix on purpose
            warnings = [repeated_prompt_warning(records, distinct),
                        prefix_cache_warning(server, shared_prefix=bool(self.workload.prefix_tokens))]
            return [warning for warning in warnings if warning]
        # a dataset's rows are the user's own prompts (and a conversation's turns share prefixes on purpose)
        if not level:
            return []
        return [f"sweep level {level + 1} re-sent the --dataset prompts the levels before it sent (in another order): "
                f"a server with prefix caching may answer them from its cache, so this level's TTFT can be lower than "
                f"a first sending's; give each level its own dataset, or restart the server between levels, to "
                f"measure full prefills"]

    def describe_endpoint(self, level: int = 0) -> dict[str, Any]:
        """The endpoint and the workload sent (``prompt_seed``: the seed the run's prompts were drawn from, see
        `level_seed`; a reader can tell whether two levels of a sweep sent the same prompts)."""
        tokenizer = None
        if isinstance(self.tokenizer, LocalTokenizer):
            tokenizer = f"{self.tokenizer.kind}:{self.tokenizer.source}"
        elif self.tokenizer is not None:
            tokenizer = self.tokenizer.kind
        return {"url": self.endpoint.url, "api": self.endpoint.api, "model": self.endpoint.model,
                "include_usage": self.endpoint.include_usage, "force_output": self.endpoint.force_output,
                "tokenizer": tokenizer,
                "workload": {"prompt_tokens": vars(self.workload.prompt_tokens),
                             "output_tokens": self.workload.output_tokens,
                             "dataset": str(self.workload.dataset) if self.workload.dataset else None,
                             "seed": self.workload.seed, "prompt_seed": level_seed(self.workload.seed, level),
                             "prefix_tokens": self.workload.prefix_tokens,
                             "prefix_groups": self.workload.prefix_groups,
                             "trace": str(self.workload.trace) if self.workload.trace else None,
                             "time_scale": self.workload.time_scale}}

    async def sweep(self, parameter: str, values: list[float], base: LoadPlan, out_dir: Path | None,
                    knee_fraction: float = 0.9) -> SweepSummary:
        """One run per load level; the summary lists every point plus the knee and saturation throughput. When
        interrupted, the summary holds the levels run so far (the last one partial, marked `interrupted`).

        Each level sends prompts of its own (`level_seed`): with the same prompts, a server's prefix cache would
        serve every level after the first from cache, and their TTFTs would measure a one-token prefill."""
        self._running += 1
        try:
            return await self._sweep(parameter, values, base, out_dir, knee_fraction)
        finally:
            self._running -= 1

    async def _sweep(self, parameter: str, values: list[float], base: LoadPlan, out_dir: Path | None,
                     knee_fraction: float) -> SweepSummary:
        points = []
        for level, value in enumerate(values):
            if self.interrupted is not None:
                break
            plan = LoadPlan(concurrency=int(value) if parameter == "concurrency" else None,
                            rate=value if parameter == "rate" else None, burstiness=base.burstiness,
                            requests=base.requests, duration_s=base.duration_s, warmup=base.warmup)
            point_dir = out_dir / f"{parameter}_{value:g}" if out_dir else None
            result = await self.run(plan, point_dir, label=f"{parameter}={value:g}", level=level)
            points.append(result.summary.model_copy(update={"sweep_value": value}))
        finished = [p for p in points if p.interrupted is None] or points
        knee = (find_knee([p.sweep_value for p in finished], [p.output_tok_s for p in finished], knee_fraction)
                if finished else {})
        summary = SweepSummary(sweep=SweepInfo(parameter=parameter, values=values, **knee), points=points,
                               endpoint=self.describe_endpoint(), interrupted=self.interrupted)
        if out_dir is not None:
            summary.save(out_dir / "summary.json")
        return summary


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """'concurrency=1,2,4' or 'rate=0.5,1,2' -> (parameter, sorted values)."""
    parameter, sep, values_text = text.partition("=")
    parameter = parameter.strip().lower()
    if not sep or parameter not in ("concurrency", "rate"):
        raise SpeedlimitError(f"bad --sweep {text!r}: use concurrency=1,2,4 or rate=0.5,1,2")
    try:
        values = sorted({float(v) for v in values_text.split(",") if v.strip()})
    except ValueError:
        raise SpeedlimitError(f"bad --sweep values in {text!r}: use numbers separated by commas") from None
    if not values or any(not v > 0 for v in values):
        raise SpeedlimitError(f"bad --sweep {text!r}: give positive values")
    if parameter == "concurrency" and any(not math.isfinite(v) or v != int(v) for v in values):
        raise SpeedlimitError("--sweep concurrency values must be whole numbers")
    for value in values:  # each level is a LoadPlan: the same bounds as --concurrency/--rate
        LoadPlan(concurrency=int(value) if parameter == "concurrency" else None,
                 rate=value if parameter == "rate" else None)
    return parameter, values
