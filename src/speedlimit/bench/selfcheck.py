"""bench checking itself, for every run: is the number the server's, or the client's?

- Arrivals (open loop): each request's send (on the socket) minus the time the schedule gave it. A client that cannot
  keep up sends late, and the offered load was lower than asked.
- Client load: CPU seconds of the event loop's thread (or of each --workers process) over wall seconds (an asyncio
  loop can use one core at most) and event-loop lag (how late a timer fires: every stream's timestamps are late by as
  much). Either near its limit, in a run of at least MIN_JUDGED_WALL_S -> a loud warning.
- Client TTFT minus the server's own TTFT histogram (when the server exports one): network, HTTP and client overhead.
- Requested vs received output length: was max_tokens honoured?

The functions here are pure (records and numbers in, typed checks out) except `LoopLagMonitor` and `cpu_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Sequence

import numpy as np

from speedlimit.artifacts import (ArrivalCheck, ClientCheck, Distribution, OutputLengthCheck, RequestRecord,
                                  SelfChecks, ServerMetrics, TTFTCheck, WorkersInfo)

#: An open-loop request that leaves more than this after its scheduled time counts as late.
LATE_THRESHOLD_S = 0.010
#: How often the loop-lag monitor asks to be woken up.
LOOP_LAG_INTERVAL_S = 0.020
#: CPU use (of one core) from which a process is taken to be saturated.
CPU_SATURATED = 0.90
#: Event-loop lag p99 from which the client's timestamps are taken to be distorted.
LOOP_LAG_BAD_S = 0.020
#: Late requests (share of the scheduled ones) from which the offered load is taken to be missed.
LATE_SHARE_BAD = 0.05
#: Runs shorter than this are not judged client-bound: their CPU is mostly setup (session, first connections).
MIN_JUDGED_WALL_S = 1.0


def cpu_seconds() -> float:
    """CPU seconds of the calling thread so far: called from the event loop's thread, what the loop used (one core
    is all it can use; a server run in another thread of the same process, as in tests, does not count)."""
    return time.thread_time()


class LoopLagMonitor:
    """A background task that sleeps `interval_s` again and again and records how much later than asked it woke."""

    def __init__(self, interval_s: float = LOOP_LAG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lags_s: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.lags_s.append(max(0.0, time.perf_counter() - asked - self.interval_s))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def arrival_check(records: Sequence[RequestRecord], late_threshold_s: float = LATE_THRESHOLD_S) -> ArrivalCheck | None:
    """Open loop only (records with a scheduled time); None for a closed-loop run."""
    lags = np.array([(r.start_ns - r.scheduled_ns) / 1e9 for r in records if r.scheduled_ns is not None and r.start_ns],
                    dtype=float)
    if lags.size == 0:
        return None
    return ArrivalCheck(requests=int(lags.size), lag_p50_s=_pct(lags, 50), lag_p99_s=_pct(lags, 99),
                        lag_max_s=float(lags.max()), late=int((lags > late_threshold_s).sum()),
                        late_threshold_s=late_threshold_s)


def client_check(wall_s: float, cpu_s: float, lags_s: Sequence[float],
                 workers: WorkersInfo | None = None) -> ClientCheck:
    """CPU use of the busiest sending process (this one, or each --workers worker) and this loop's timer lag."""
    fraction = cpu_s / wall_s if wall_s > 0 else 0.0
    processes = 1
    total_cpu = cpu_s
    if workers is not None:
        processes = workers.count
        for worker in workers.workers:
            if worker.cpu_s is not None and wall_s > 0:
                fraction = max(fraction, worker.cpu_s / wall_s)
                total_cpu += worker.cpu_s
    lags = np.asarray(lags_s, dtype=float)
    worker_lags = [w.loop_lag_p99_s for w in (workers.workers if workers is not None else [])
                   if w.loop_lag_p99_s is not None]
    check = ClientCheck(wall_s=wall_s, cpu_s=total_cpu, cpu_fraction=fraction, processes=processes,
                        loop_lag_p50_s=_pct(lags, 50), loop_lag_p99_s=_pct(lags, 99),
                        loop_lag_max_s=float(lags.max()) if lags.size else None, loop_lag_samples=int(lags.size),
                        worker_loop_lag_p99_s=max(worker_lags) if worker_lags else None)
    check.bottleneck = bool(wall_s >= MIN_JUDGED_WALL_S and (fraction >= CPU_SATURATED
                                                            or worst_loop_lag_s(check) >= LOOP_LAG_BAD_S))
    return check


def worst_loop_lag_s(check: ClientCheck) -> float:
    """The worst event-loop lag p99 of the run's sending loops (this one, and every worker's)."""
    return max(check.loop_lag_p99_s or 0.0, check.worker_loop_lag_p99_s or 0.0)


def output_length_check(records: Sequence[RequestRecord]) -> OutputLengthCheck | None:
    """Completed requests whose output was counted exactly (usage or tokenizer) against the max_tokens they sent."""
    rows = [r for r in records if r.ok and r.max_tokens and r.output_tokens is not None
            and r.token_count_source in ("usage", "tokenizer")]
    finish: dict[str, int] = {}
    for record in records:
        if record.ok:
            finish[record.finish_reason or "none"] = finish.get(record.finish_reason or "none", 0) + 1
    if not rows:
        return None
    sources = {r.token_count_source for r in rows}
    return OutputLengthCheck(
        checked=len(rows), token_count_source=sources.pop() if len(sources) == 1 else "mixed",
        exact=sum(1 for r in rows if r.output_tokens == r.max_tokens),
        fewer=sum(1 for r in rows if r.output_tokens < r.max_tokens),
        more=sum(1 for r in rows if r.output_tokens > r.max_tokens),
        mean_received_over_requested=float(np.mean([r.output_tokens / r.max_tokens for r in rows])),
        finish_reasons=dict(sorted(finish.items())))


def ttft_check(client_ttft: Distribution, server: ServerMetrics | None) -> TTFTCheck | None:
    """Client TTFT minus the server's TTFT histogram; None when the server exports none."""
    histogram = server.histograms.get("ttft_s") if server is not None else None
    if histogram is None or client_ttft.mean is None:
        return None
    diff = (lambda a, b: a - b if a is not None and b is not None else None)
    return TTFTCheck(client_mean_s=client_ttft.mean, server_mean_s=histogram.mean,
                     mean_diff_s=diff(client_ttft.mean, histogram.mean), client_p50_s=client_ttft.p50,
                     server_p50_s=histogram.p50, p50_diff_s=diff(client_ttft.p50, histogram.p50),
                     server_metric=histogram.metric)


def self_checks(records: Sequence[RequestRecord], *, wall_s: float, cpu_s: float, lags_s: Sequence[float],
                client_ttft: Distribution, server: ServerMetrics | None,
                workers: WorkersInfo | None = None) -> SelfChecks:
    return SelfChecks(arrivals=arrival_check(records), client=client_check(wall_s, cpu_s, lags_s, workers),
                      ttft_vs_server=ttft_check(client_ttft, server), output_length=output_length_check(records))


#: A server that answers at least this share of the prompt tokens from its prefix cache, on a run whose prompts share
#: no prefix, measured cache hits, not prefills (a chat template's fixed tokens stay well below it at bench's lengths).
CACHED_PROMPT_SHARE_BAD = 0.5


def prefix_cache_warning(server: ServerMetrics | None, *, shared_prefix: bool) -> str | None:
    """The server's own count of prompt tokens served from its prefix cache, when the workload meant none to be."""
    hit = server.prefix_cache_hit_rate if server is not None else None
    if shared_prefix or hit is None or hit < CACHED_PROMPT_SHARE_BAD:
        return None
    return (f"the server answered {hit:.0%} of the prompt tokens from its prefix cache, though this run's prompts "
            f"share no prefix: its TTFTs are mostly cache hits, not prefills (prompts it had seen before: the same "
            f"--seed run again against this server? use another --seed, or restart the server)")


def check_warnings(checks: SelfChecks, forced_output: bool) -> list[str]:
    """The self-checks a reader of the numbers must not miss, one line each."""
    warnings = []
    client = checks.client
    if client is not None and client.bottleneck:
        why = []
        if client.cpu_fraction >= CPU_SATURATED:
            who = "this process" if client.processes == 1 else "the busiest of the sending processes"
            why.append(f"{who} used {client.cpu_fraction:.0%} of a core")
        if worst_loop_lag_s(client) >= LOOP_LAG_BAD_S:
            whose = "its event loop" if client.processes == 1 else "the slowest sending event loop"
            why.append(f"{whose} woke up {worst_loop_lag_s(client) * 1e3:.1f} ms late (p99) for a timer, so "
                       "timestamps may lag as much (a loop busy, or a process starved of CPU)")
        warnings.append("THE CLIENT MAY BE THE BOTTLENECK, not the server: " + " and ".join(why) + "; latencies "
                        "include client delay and throughput may be the client's ceiling (use --workers N, or a "
                        "less loaded machine)")
    arrivals = checks.arrivals
    if arrivals is not None and arrivals.late > LATE_SHARE_BAD * arrivals.requests:
        warnings.append(f"open-loop arrivals fell behind the schedule: {arrivals.late} of {arrivals.requests} "
                        f"requests left more than {arrivals.late_threshold_s * 1e3:g} ms late (lag p99 "
                        f"{(arrivals.lag_p99_s or 0) * 1e3:.1f} ms): the offered load was lower than asked")
    lengths = checks.output_length
    if lengths is not None and lengths.more:
        warnings.append(f"max_tokens not honoured: {lengths.more} of {lengths.checked} requests received MORE "
                        f"output tokens than they asked for ({lengths.token_count_source} counts)")
    if lengths is not None and forced_output and lengths.fewer:
        warnings.append(f"max_tokens not honoured: {lengths.fewer} of {lengths.checked} requests received fewer "
                        f"output tokens than the forced length (mean received/requested "
                        f"{lengths.mean_received_over_requested:.2f}; the server ignores min_tokens/ignore_eos? "
                        "use --no-force-output if that is expected)")
    return warnings
