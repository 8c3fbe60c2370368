"""`bench --workers N` (processes on this machine) and `bench --ray [ADDRESS]` (Ray actors): one run's load spread
over several event loops, for more load than one Python process can make.

The parent builds the prompts once and splits the load plan (`plan_jobs`): closed loop, the concurrency slots are
dealt out round-robin and request n goes to the worker owning slot n % C (so the run sends the same requests as one
process would); open loop, the arrival times come from ONE seeded schedule and request n goes to worker n % N.
Each worker runs the ordinary `run_closed_loop`/`run_open_loop` with its own aiohttp session, and streams its records
back in batches; the parent writes requests.jsonl as they arrive and computes the summary once.

Clock: before the run the parent pings each worker (`CLOCK_PINGS` times) and keeps the ping with the shortest round
trip: offset = worker clock - midpoint of the parent's send and receive, known to +- half that round trip. The run
starts at one common instant (a start barrier some ms ahead, translated into each worker's clock), every record's
timestamps are mapped back onto the parent's clock, and the offsets are measured again after the run (drift). All of
it is in summary.json's `workers` block. On one machine every process reads the same CLOCK_MONOTONIC, so the offsets
come out near 0 and the uncertainty is the ping's round trip.

Ctrl-C: the parent tells every worker to stop (workers ignore SIGINT themselves); each cancels its in-flight requests,
which come back recorded as `cancelled`, like a single-process run.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import resource
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from speedlimit.artifacts import RequestRecord, WorkerInfo, WorkersInfo
from speedlimit.bench.client import Endpoint, make_session, raise_open_file_limit, run_async
from speedlimit.bench.runner import _Sender, run_closed_loop, run_open_loop
from speedlimit.bench.selfcheck import LoopLagMonitor
from speedlimit.bench.workload import RequestSpec
from speedlimit.errors import SpeedlimitError

MAX_WORKERS = 256
#: Pings per worker for the clock offset; the one with the shortest round trip counts.
CLOCK_PINGS = 7
#: How far ahead of "now" the common start is set (plus the slowest ping's round trip).
START_MARGIN_NS = 200_000_000
#: Ray: how often the parent collects the records its actors have finished.
RAY_DRAIN_S = 0.05


@dataclass
class WorkerJob:
    """One worker's share of a run. `specs` is the run's prompt pool with the entries it never uses set to None."""

    worker: int
    endpoint: Endpoint
    specs: list[RequestSpec | None]
    n_requests: int
    duration_s: float | None = None
    concurrency: int | None = None  # closed loop: the run's total concurrency C
    slots: list[int] = field(default_factory=list)  # closed loop: this worker's slots (request n <-> slot n % C)
    arrivals: list[tuple[int, float]] = field(default_factory=list)  # open loop: (request index, offset s)

    def indices(self):
        if self.concurrency is None:
            return (n for n, _ in self.arrivals)
        mine = set(self.slots)
        return (n for n in range(self.n_requests) if n % self.concurrency in mine)


def plan_jobs(n_workers: int, endpoint: Endpoint, specs: list[RequestSpec], n_requests: int, *,
              concurrency: int | None = None, offsets_s: list[float] | None = None,
              duration_s: float | None = None) -> list[WorkerJob]:
    """Split one run over `n_workers`: concurrency slots (closed loop) or arrivals (open loop) dealt round-robin.
    Workers left with nothing to do (concurrency < workers) get no job."""
    jobs = []
    for w in range(n_workers):
        if concurrency is not None:
            slots = list(range(w, concurrency, n_workers))
            if not slots:
                continue
            job = WorkerJob(w, endpoint, [], n_requests, duration_s, concurrency=concurrency, slots=slots)
        else:
            arrivals = [(n, offsets_s[n]) for n in range(w, min(n_requests, len(offsets_s)), n_workers)]
            job = WorkerJob(w, endpoint, [], n_requests, duration_s, arrivals=arrivals)
        needed: set[int] = set()
        for n in job.indices():  # the pool entries it sends (all of them once it has cycled through the pool)
            needed.add(n % len(specs))
            if len(needed) == len(specs):
                break
        job.specs = [spec if i in needed else None for i, spec in enumerate(specs)]
        jobs.append(job)
    return jobs


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class LoadWorker:
    """The load loop of one worker (its own event loop and session); `emit` gets each record as it finishes."""

    def __init__(self) -> None:
        self.sender: _Sender | None = None
        self.stopping = False

    async def run(self, job: WorkerJob, start_at_ns: int, emit: Callable[[RequestRecord], None]) -> dict[str, Any]:
        raise_open_file_limit()
        session = make_session()
        sender = self.sender = _Sender(session, job.endpoint, emit)
        cpu_start = _cpu_s()
        started_ns = None
        monitor = LoopLagMonitor()  # this worker's own event loop: how late its timestamps may be
        monitor.start()
        try:
            wait_s = (start_at_ns - time.perf_counter_ns()) / 1e9
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sender.stopped.wait(), wait_s)
            started_ns = time.perf_counter_ns()
            deadline_ns = start_at_ns + int(job.duration_s * 1e9) if job.duration_s else None
            if not self.stopping:
                if job.concurrency is not None:
                    await run_closed_loop(sender, job.specs, job.n_requests, len(job.slots), deadline_ns,
                                          job.indices())
                else:
                    await run_open_loop(sender, job.specs, [o for _, o in job.arrivals], deadline_ns,
                                        start_ns=start_at_ns, indices=[n for n, _ in job.arrivals])
        finally:
            self.sender = None
            await monitor.stop()
            await session.close()
        lags = sorted(monitor.lags_s)
        return {"started_ns": started_ns, "cpu_s": _cpu_s() - cpu_start, "requests": len(sender.records),
                "host": socket.gethostname(), "pid": os.getpid(),
                "loop_lag_p99_s": lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None}

    def stop(self) -> None:
        self.stopping = True
        if self.sender is not None:
            self.sender.stop()


# --- processes --------------------------------------------------------------------------------------------------


def _reader_thread(conn, loop: asyncio.AbstractEventLoop, handle: Callable[[tuple], None], on_eof: tuple) -> None:
    """Receive on `conn` in a thread (blocking reads of whole messages; an event-loop reader would make the socket
    non-blocking, and a large batch would then fail half-read) and hand each message to `handle` on `loop`."""
    def receive() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = on_eof
            try:
                loop.call_soon_threadsafe(handle, message)
            except RuntimeError:  # the loop has closed
                return
            if message is on_eof:
                return

    threading.Thread(target=receive, daemon=True, name="speedlimit-bench-pipe").start()


def _process_main(conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent relays it
    run_async(_process_loop(conn))


async def _process_loop(conn) -> None:
    """A worker process: answers clock pings, runs jobs, streams records back in batches (one send per event-loop
    turn), stops when told to or when the parent goes away."""
    loop = asyncio.get_running_loop()
    worker = LoadWorker()
    inbox: asyncio.Queue = asyncio.Queue()
    batch: list[RequestRecord] = []
    wake = asyncio.Event()

    def handle(message: tuple) -> None:
        if message[0] == "clock":  # answered at once, not behind the inbox
            conn.send(("clock", time.perf_counter_ns()))
        elif message[0] == "stop":
            worker.stop()
        else:
            if message[0] == "exit":
                worker.stop()
            inbox.put_nowait(message)

    def emit(record: RequestRecord) -> None:
        batch.append(record)
        wake.set()

    async def flush_forever() -> None:
        while True:
            await wake.wait()
            wake.clear()
            await asyncio.sleep(0)  # sends that are ready go out first
            flush()

    def flush() -> None:
        if batch:
            conn.send(("records", batch[:]))
            batch.clear()

    _reader_thread(conn, loop, handle, ("exit",))
    flusher = asyncio.create_task(flush_forever())
    try:
        while True:
            message = await inbox.get()
            if message[0] == "exit":
                return
            _, job, start_at_ns = message
            try:
                report = await worker.run(job, start_at_ns, emit)
            except Exception as error:  # noqa: BLE001 - reported to the parent as one line
                flush()
                conn.send(("error", f"{type(error).__name__}: {error}"))
                continue
            flush()
            conn.send(("done", report))
    finally:
        flusher.cancel()


class ProcessPool:
    """N spawn-started worker processes, each talking to the parent over one pipe."""

    mode = "processes"
    address = None

    def __init__(self, n_workers: int) -> None:
        self.n = n_workers
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        self.replies: list[asyncio.Queue] = []
        self.on_records: Callable[[int, list[RequestRecord]], None] = lambda w, records: None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        context = multiprocessing.get_context("spawn")
        for w in range(self.n):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_process_main, args=(child_end,), daemon=True,
                                      name=f"speedlimit-bench-worker-{w}")
            process.start()
            child_end.close()
            self.processes.append(process)
            self.conns.append(parent_end)
            self.replies.append(asyncio.Queue())
            _reader_thread(parent_end, loop, lambda message, w=w: self._received(w, message), ("eof",))

    def _received(self, w: int, message: tuple) -> None:
        if message[0] == "eof":
            message = ("error", f"worker {w} exited (code {self.processes[w].exitcode})")
        if message[0] == "records":
            self.on_records(w, message[1])
        else:
            self.replies[w].put_nowait(message)

    async def _reply(self, w: int, kinds: tuple[str, ...]) -> Any:
        while True:
            message = await self.replies[w].get()
            if message[0] == "error":
                raise SpeedlimitError(f"bench worker {w} failed: {message[1]}")
            if message[0] in kinds:
                return message[1]

    async def clock_ns(self, w: int) -> int:
        self.conns[w].send(("clock",))
        return await self._reply(w, ("clock",))

    async def run(self, w: int, job: WorkerJob, start_at_ns: int) -> dict[str, Any]:
        self.conns[w].send(("run", job, start_at_ns))
        return await self._reply(w, ("done",))

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))

    async def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("exit",))
        for process in self.processes:
            await asyncio.to_thread(process.join, 5)
            if process.is_alive():
                process.kill()
        for conn in self.conns:
            conn.close()


# --- Ray --------------------------------------------------------------------------------------------------------


class RayLoadActor:
    """The Ray actor (an async actor: its methods share one event loop, so `stop`/`drain` run during `run`)."""

    def __init__(self) -> None:
        self.worker = LoadWorker()
        self.buffer: list[RequestRecord] = []

    async def clock(self) -> int:
        return time.perf_counter_ns()

    async def run(self, job: WorkerJob, start_at_ns: int) -> dict[str, Any]:
        return await self.worker.run(job, start_at_ns, lambda record: self.buffer.append(record))

    async def drain(self) -> list[RequestRecord]:
        records, self.buffer = self.buffer, []
        return records

    async def stop(self) -> None:
        self.worker.stop()


def import_ray():
    try:
        import ray
    except ImportError:
        raise SpeedlimitError("--ray needs Ray: pip install 'speedlimit[ray]'") from None
    return ray


class RayPool:
    """N `RayLoadActor`s on a Ray cluster (ADDRESS) or a local Ray instance (no address: started here, and shut
    down again by `close`)."""

    mode = "ray"

    def __init__(self, n_workers: int, address: str | None = None, **init_options: Any) -> None:
        self.n = n_workers
        self.address = address
        self.init_options = init_options
        self.actors: list[Any] = []
        self.started_ray = False
        self.on_records: Callable[[int, list[RequestRecord]], None] = lambda w, records: None

    async def start(self) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            options = {"include_dashboard": False, "log_to_driver": False, **self.init_options}
            try:
                await asyncio.to_thread(ray.init, address=self.address, **options)
            except Exception as error:  # noqa: BLE001 - ConnectionError, RuntimeError, ...: one line
                raise SpeedlimitError(f"cannot start or reach Ray{' at ' + self.address if self.address else ''}: "
                                      f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
            self.started_ray = True
        actor_class = ray.remote(num_cpus=0)(RayLoadActor)
        self.actors = [actor_class.remote() for _ in range(self.n)]

    async def clock_ns(self, w: int) -> int:
        return await self.actors[w].clock.remote()

    async def run(self, w: int, job: WorkerJob, start_at_ns: int) -> dict[str, Any]:
        actor = self.actors[w]
        done = actor.run.remote(job, start_at_ns)
        while True:
            finished, _ = await asyncio.to_thread(lambda: import_ray().wait([done], timeout=RAY_DRAIN_S))
            records = await actor.drain.remote()
            if records:
                self.on_records(w, records)
            if finished:
                return await done

    def stop(self) -> None:
        for actor in self.actors:
            actor.stop.remote()

    async def close(self) -> None:
        ray = import_ray()
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.actors = []
        if self.started_ray:
            await asyncio.to_thread(ray.shutdown)
            self.started_ray = False


# --- the parent's side ------------------------------------------------------------------------------------------


@dataclass
class ClockOffset:
    offset_ns: int
    uncertainty_ns: int


class ScaleOut:
    """What `BenchRunner` calls for a --workers/--ray run: start the pool, run one load plan on it, stop, close."""

    def __init__(self, pool: ProcessPool | RayPool) -> None:
        if not 1 <= pool.n <= MAX_WORKERS:
            raise SpeedlimitError(f"--workers must be between 1 and {MAX_WORKERS}")
        self.pool = pool
        self.stopping = False

    async def __aenter__(self) -> "ScaleOut":
        try:
            await self.pool.start()
        except BaseException:
            await self.pool.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.close()

    async def measure_clock(self, w: int) -> ClockOffset:
        best: tuple[int, int] | None = None  # (round trip, offset)
        for _ in range(CLOCK_PINGS):
            sent = time.perf_counter_ns()
            theirs = await self.pool.clock_ns(w)
            received = time.perf_counter_ns()
            trip = received - sent
            if best is None or trip < best[0]:
                best = (trip, theirs - (sent + received) // 2)
        assert best is not None
        return ClockOffset(best[1], best[0] // 2)

    def stop(self) -> None:
        self.stopping = True
        self.pool.stop()

    async def run(self, jobs: list[WorkerJob], on_record: Callable[[RequestRecord], None]
                  ) -> tuple[list[RequestRecord], WorkersInfo]:
        """Run the jobs from one common start; records (on the parent's clock, `worker` set) go to `on_record` as
        they arrive."""
        offsets = dict(zip((j.worker for j in jobs),
                           await asyncio.gather(*(self.measure_clock(j.worker) for j in jobs))))
        records: list[RequestRecord] = []

        def receive(w: int, batch: list[RequestRecord]) -> None:
            offset = offsets[w].offset_ns
            for record in batch:
                record.start_ns -= offset
                record.end_ns -= offset
                if record.scheduled_ns is not None:
                    record.scheduled_ns -= offset
                record.worker = w
                records.append(record)
                on_record(record)

        self.pool.on_records = receive
        margin = max((o.uncertainty_ns for o in offsets.values()), default=0) * 4
        start_at_ns = time.perf_counter_ns() + START_MARGIN_NS + margin
        if self.stopping:
            return records, self._info(jobs, offsets, {}, {}, start_at_ns)
        reports = await asyncio.gather(*(self.pool.run(j.worker, j, start_at_ns + offsets[j.worker].offset_ns)
                                         for j in jobs))
        after = dict(zip((j.worker for j in jobs), await asyncio.gather(*(self.measure_clock(j.worker)
                                                                          for j in jobs))))
        return records, self._info(jobs, offsets, after, dict(zip((j.worker for j in jobs), reports)), start_at_ns)

    def _info(self, jobs: list[WorkerJob], before: dict[int, ClockOffset], after: dict[int, ClockOffset],
              reports: dict[int, dict[str, Any]], start_at_ns: int) -> WorkersInfo:
        workers = []
        for job in jobs:
            offset, report = before[job.worker], reports.get(job.worker, {})
            drift = (after[job.worker].offset_ns - offset.offset_ns) / 1e6 if job.worker in after else None
            started = report.get("started_ns")
            workers.append(WorkerInfo(
                worker=job.worker, host=report.get("host", ""), pid=report.get("pid", 0),
                requests=report.get("requests", 0),
                concurrency=len(job.slots) if job.concurrency is not None else None,
                clock_offset_ms=offset.offset_ns / 1e6, clock_uncertainty_ms=offset.uncertainty_ns / 1e6,
                clock_drift_ms=drift,
                start_lag_ms=(started - offset.offset_ns - start_at_ns) / 1e6 if started is not None else None,
                cpu_s=report.get("cpu_s"), loop_lag_p99_s=report.get("loop_lag_p99_s")))
        lags = [w.start_lag_ms for w in workers if w.start_lag_ms is not None]
        drifts = [abs(w.clock_drift_ms) for w in workers if w.clock_drift_ms is not None]
        cpu = [w.cpu_s for w in workers if w.cpu_s is not None]
        return WorkersInfo(
            mode=self.pool.mode, count=self.pool.n, address=self.pool.address,
            max_clock_offset_ms=max((abs(w.clock_offset_ms) for w in workers), default=0.0),
            max_clock_uncertainty_ms=max((w.clock_uncertainty_ms for w in workers), default=0.0),
            max_clock_drift_ms=max(drifts) if drifts else None,
            start_spread_ms=max(lags) - min(lags) if lags else None,
            cpu_s=sum(cpu) if cpu else None, workers=workers)


def make_scale_out(workers: int | None, ray_address: str | None, use_ray: bool) -> ScaleOut | None:
    """The CLI's --workers/--ray as a `ScaleOut` (None: the ordinary single-process run)."""
    n = workers if workers is not None else (2 if use_ray else 1)
    if not 1 <= n <= MAX_WORKERS:
        raise SpeedlimitError(f"--workers must be between 1 and {MAX_WORKERS}")
    if use_ray:
        import_ray()
        return ScaleOut(RayPool(n, ray_address or None))
    if n == 1:
        return None
    return ScaleOut(ProcessPool(n))
