"""Load generation for `speedlimit bench`: closed loop (fixed concurrency), open loop (Poisson/gamma arrivals),
warm-up, sweeps, incremental results on disk. All I/O of a run lives here; the numbers come from `metrics`.

Closed loop: C workers, each sends its next request as soon as its previous one ends. Open loop: requests leave at
seeded gamma-distributed times with mean rate R whatever the server does (so queueing shows up as latency). A run
ends after N requests, or once S seconds have passed (no new request starts after S; in-flight ones finish).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from speedlimit.bench.client import Endpoint, check_server, make_session, raise_open_file_limit, send_request
from speedlimit.artifacts import LoadInfo, RequestRecord, RunSummary, SweepInfo, SweepSummary, write_records
from speedlimit.bench.metrics import find_knee, summarize
from speedlimit.bench.tokenizer import ServerTokenizer, probe_tokenizer
from speedlimit.bench.workload import LengthSpec, RequestSpec, arrival_offsets_s, build_requests, load_dataset
from speedlimit.errors import SpeedlimitError

#: Prompt pool size for --duration runs, where the request count is not known in advance (prompts then cycle).
DURATION_POOL_CLOSED = 512


@dataclass
class LoadPlan:
    """How much load, and for how long. Exactly one of concurrency/rate; exactly one of requests/duration_s."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise SpeedlimitError("give exactly one of --concurrency (closed loop) or --rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise SpeedlimitError("--concurrency must be >= 1")
        if self.rate is not None and self.rate <= 0:
            raise SpeedlimitError("--rate must be > 0 requests/s (use inf to send all at once)")
        if self.burstiness <= 0:
            raise SpeedlimitError("--burstiness must be > 0")
        if self.requests is not None and self.duration_s is not None:
            raise SpeedlimitError("give --requests or --duration, not both")
        if self.requests is None and self.duration_s is None:
            self.requests = 100
        if self.requests is not None and self.requests < 1:
            raise SpeedlimitError("--requests must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise SpeedlimitError("--duration must be > 0 seconds")
        if self.warmup < 0:
            raise SpeedlimitError("--warmup must be >= 0")

    @property
    def pool_size(self) -> int:
        if self.requests is not None:
            return self.requests
        if self.rate is not None and self.rate != float("inf"):
            return max(16, int(self.rate * self.duration_s * 1.5) + 16)
        return max(DURATION_POOL_CLOSED, 4 * (self.concurrency or 1))

    def describe(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "rate": self.rate, "burstiness": self.burstiness,
                "requests": self.requests, "duration_s": self.duration_s, "warmup": self.warmup}


@dataclass
class WorkloadPlan:
    prompt_tokens: LengthSpec = field(default_factory=lambda: LengthSpec("fixed", 128))
    output_tokens: int = 64
    dataset: Path | None = None
    seed: int = 0


class RecordSink:
    """requests.jsonl, appended and flushed as each request completes (Ctrl-C or a crash loses nothing)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        if self._file is not None:
            self._file.write(record.to_json_line())
            self._file.flush()

    def rewrite(self, records: list[RequestRecord]) -> None:
        """Replace the file atomically with final rows (after token recounting)."""
        if self.path is None:
            return
        self.close()
        write_records(self.path, records)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


async def run_closed_loop(session, endpoint: Endpoint, specs: list[RequestSpec], concurrency: int,
                          deadline_ns: int | None, on_record: Callable[[RequestRecord], None]) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    cursor = iter(range(10**12))
    pool = len(specs)

    async def worker() -> None:
        for n in cursor:
            if deadline_ns is None and n >= pool:
                return
            if deadline_ns is not None and time.perf_counter_ns() >= deadline_ns:
                return
            spec = specs[n % pool]
            if n >= pool:
                spec = RequestSpec(n, spec.prompt, spec.max_tokens, spec.prompt_tokens, spec.prompt_token_source,
                                   spec.messages, spec.extra)
            record = await send_request(session, endpoint, spec)
            records.append(record)
            on_record(record)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def run_open_loop(session, endpoint: Endpoint, specs: list[RequestSpec], offsets_s: list[float],
                        deadline_ns: int | None, on_record: Callable[[RequestRecord], None]) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    start_ns = time.perf_counter_ns()

    async def one(spec: RequestSpec) -> None:
        record = await send_request(session, endpoint, spec)
        records.append(record)
        on_record(record)

    tasks = []
    for spec, offset_s in zip(specs, offsets_s):
        send_ns = start_ns + int(offset_s * 1e9)
        if deadline_ns is not None and send_ns >= deadline_ns:
            break
        delay_s = (send_ns - time.perf_counter_ns()) / 1e9
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        tasks.append(asyncio.create_task(one(spec)))
    await asyncio.gather(*tasks)
    return records


@dataclass
class RunResult:
    records: list[RequestRecord]
    summary: RunSummary


class BenchRunner:
    """Owns the session, tokenizer and prompts of one `speedlimit bench` invocation (one run or one sweep)."""

    def __init__(self, endpoint: Endpoint, workload: WorkloadPlan, *, slo: dict[str, float] | None = None,
                 preflight: bool = True, count_tokens: bool = True,
                 progress: Callable[[str, int | None], Any] | None = None) -> None:
        self.endpoint = endpoint
        self.workload = workload
        self.slo = slo or {}
        self.preflight = preflight
        self.count_tokens = count_tokens
        self.progress = progress  # progress(description, total) -> object with .advance(record) / .close()
        self.session = None
        self.tokenizer: ServerTokenizer | None = None
        self.served_models: list[str] = []
        self.dataset = load_dataset(workload.dataset) if workload.dataset else None

    async def __aenter__(self) -> "BenchRunner":
        raise_open_file_limit()
        self.session = make_session()
        try:
            if self.preflight:
                self.served_models = await check_server(self.session, self.endpoint)
                if self.endpoint.model is None:
                    if not self.served_models:
                        raise SpeedlimitError(f"{self.endpoint.base_url}/models lists no model: pass --model NAME")
                    self.endpoint.model = self.served_models[0]
                self.tokenizer = await probe_tokenizer(self.session, self.endpoint.root_url, self.endpoint.model,
                                                       self.endpoint.headers)
        except BaseException:  # __aexit__ does not run when __aenter__ fails: close the session here
            await self.session.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    async def specs(self, n: int, salt: int = 0) -> list[RequestSpec]:
        return await build_requests(n, prompt_spec=self.workload.prompt_tokens,
                                    output_tokens=self.workload.output_tokens, seed=self.workload.seed + salt,
                                    tokenizer=self.tokenizer, dataset=self.dataset)

    async def run(self, plan: LoadPlan, out_dir: Path | None = None, label: str = "bench") -> RunResult:
        """Warm up, run the plan, recount tokens, summarize; writes out_dir/requests.jsonl and summary.json."""
        assert self.session is not None, "use `async with BenchRunner(...)`"
        specs = await self.specs(plan.pool_size)
        if plan.warmup:
            warm = await self.specs(plan.warmup, salt=10**6)
            await run_closed_loop(self.session, self.endpoint, warm, plan.concurrency or 1, None, lambda r: None)
        sink = RecordSink(out_dir / "requests.jsonl" if out_dir else None)
        tracker = self.progress(label, plan.requests) if self.progress else None

        def on_record(record: RequestRecord) -> None:
            sink.write(record)
            if tracker is not None:
                tracker.advance(record)

        start_ns = time.perf_counter_ns()
        deadline_ns = start_ns + int(plan.duration_s * 1e9) if plan.duration_s else None
        try:
            if plan.concurrency is not None:
                records = await run_closed_loop(self.session, self.endpoint, specs, plan.concurrency, deadline_ns,
                                                on_record)
            else:
                offsets = arrival_offsets_s(len(specs), plan.rate, plan.burstiness, self.workload.seed)
                records = await run_open_loop(self.session, self.endpoint, specs, offsets, deadline_ns, on_record)
        finally:
            if tracker is not None:
                tracker.close()
        first_ns = min((r.start_ns for r in records), default=start_ns)
        last_ns = max((r.end_ns for r in records), default=start_ns)
        duration_s = (last_ns - first_ns) / 1e9
        recounted = await self.recount_output_tokens(records)
        if recounted:
            sink.rewrite(records)
        sink.close()
        summary = summarize(records, duration_s, self.slo, source="bench", offered_load=LoadInfo(**plan.describe()),
                            endpoint=self.describe_endpoint())
        if out_dir is not None:
            summary.save(out_dir / "summary.json")
        return RunResult(records, summary)

    async def recount_output_tokens(self, records: list[RequestRecord]) -> bool:
        """Without server usage, count outputs with the served model's tokenizer, after the timed window."""
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

    def describe_endpoint(self) -> dict[str, Any]:
        return {"url": self.endpoint.url, "api": self.endpoint.api, "model": self.endpoint.model,
                "include_usage": self.endpoint.include_usage, "force_output": self.endpoint.force_output,
                "tokenizer": self.tokenizer.kind if self.tokenizer else None,
                "workload": {"prompt_tokens": vars(self.workload.prompt_tokens),
                             "output_tokens": self.workload.output_tokens,
                             "dataset": str(self.workload.dataset) if self.workload.dataset else None,
                             "seed": self.workload.seed}}

    async def sweep(self, parameter: str, values: list[float], base: LoadPlan, out_dir: Path | None,
                    knee_fraction: float = 0.9) -> SweepSummary:
        """One run per load level; the summary lists every point plus the knee and saturation throughput."""
        points = []
        for value in values:
            plan = LoadPlan(concurrency=int(value) if parameter == "concurrency" else None,
                            rate=value if parameter == "rate" else None, burstiness=base.burstiness,
                            requests=base.requests, duration_s=base.duration_s, warmup=base.warmup)
            point_dir = out_dir / f"{parameter}_{value:g}" if out_dir else None
            result = await self.run(plan, point_dir, label=f"{parameter}={value:g}")
            points.append(result.summary.model_copy(update={"sweep_value": value}))
        knee = find_knee(values, [p.output_tok_s for p in points], knee_fraction)
        summary = SweepSummary(sweep=SweepInfo(parameter=parameter, values=values, **knee), points=points,
                               endpoint=self.describe_endpoint())
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
    if not values or any(v <= 0 for v in values):
        raise SpeedlimitError(f"bad --sweep {text!r}: give positive values")
    if parameter == "concurrency" and any(v != int(v) for v in values):
        raise SpeedlimitError("--sweep concurrency values must be whole numbers")
    return parameter, values
