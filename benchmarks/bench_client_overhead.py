"""How much does `speedlimit bench`'s client itself cost? Measured against the FaultyOpenAIServer test fixture
(a fake server, not a model) running in its own process on 127.0.0.1.

1. Sustained throughput: N concurrent streams (default 1,000), each asking `--tokens` tokens of the `firehose` mode,
   which writes chunks as fast as its socket allows. Prints output tokens/s, the peak number of streams open at once
   and the client's CPU seconds.
2. Client-added ITL: `paced-<ms>` mode, where the server stamps every chunk with `time.perf_counter_ns()` at send
   time (CLOCK_MONOTONIC, shared by both processes). For every gap between two tokens we compare the gap the
   client measured with the gap the server sent: their difference is what the client adds to ITL.
3. Send-side lag and TTFT error under load: `paced-<ms>` streams at a fixed concurrency (default 64). The server
   stamps the moment it has read each request (the first chunk's `r<ns>`) and each chunk's send, so the true TTFT is
   known: the client's TTFT minus it is the client's error, split into send lag (server read the request - client's
   start stamp) and receive lag (client's first-chunk stamp - server's send).
4. The same firehose run through guidellm's client (`guidellm run`, from PyPI, installed in its own venv because it
   pulls torch), and the ratio of sustained tokens/s. If guidellm is not installed the script says so: no figure is
   invented for it.

Usage: python benchmarks/bench_client_overhead.py [--streams 1000] [--tokens 200] [--ttft 64x20] [--repeat 3]
       [--guidellm /path/to/guidellm]
SPEEDLIMIT_SRC=/other/checkout/src measures another checkout's client with this script (e.g. before a change).
Timing figures are printed, never asserted (benchmarks print, tests check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SPEEDLIMIT_SRC") or str(ROOT / "src"))

import aiohttp  # noqa: E402

import speedlimit.bench.runner as runner_module  # noqa: E402
from speedlimit.bench.client import Endpoint, run_async  # noqa: E402
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan  # noqa: E402
from speedlimit.bench.workload import LengthSpec  # noqa: E402

FAULTY_SERVER = ROOT / "tests" / "bench" / "faulty_server.py"


def start_fake_server() -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, str(FAULTY_SERVER), "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if not line.startswith("PORT "):
        process.kill()
        raise SystemExit(f"FaultyOpenAIServer did not start: {line!r}")
    return process, int(line.split()[1])


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_open_streams(records) -> int:
    events = sorted([(r.start_ns, 1) for r in records] + [(r.end_ns, -1) for r in records])
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


#: Client-internal send lag per request (ns): `session.post` called -> body handed to the socket. Measured with a
#: trace config of this script's own, added to the session bench makes (works for any checkout's client).
SEND_LAGS_NS: list[int] = []


def _instrumented_session(make_session=runner_module.make_session):
    async def on_start(_session, context, _params) -> None:
        context.post_ns = time.perf_counter_ns()

    async def on_sent(_session, context, _params) -> None:
        if getattr(context, "post_ns", None) is not None:
            SEND_LAGS_NS.append(time.perf_counter_ns() - context.post_ns)
            context.post_ns = None

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    trace.on_request_chunk_sent.append(on_sent)
    trace.freeze()
    session = make_session()
    session._trace_configs.append(trace)  # private, but stable across aiohttp 3.x; a benchmark may lean on it
    return session


runner_module.make_session = _instrumented_session


async def run_speedlimit(url: str, streams: int, requests: int, tokens: int):
    endpoint = Endpoint(url, model="fake-model", api="chat", timeout_s=600)
    workload = WorkloadPlan(LengthSpec("fixed", 16), tokens, None, 0)
    async with BenchRunner(endpoint, workload) as runner:
        cpu_before = cpu_s()
        result = await runner.run(LoadPlan(concurrency=streams, requests=requests))
        return result, cpu_s() - cpu_before


def server_stamps(record) -> tuple[int, np.ndarray]:
    """(ns the server had read the request, ns it sent each chunk) from a timestamped mode's output text."""
    items = record.output_text.split()
    received = int(items[0][1:]) if items and items[0].startswith("r") else 0
    return received, np.array([int(t) for t in items if not t.startswith("r")], dtype=np.int64)


def client_added_itl(records) -> dict[str, float]:
    """Per gap: client-measured gap minus server-sent gap (ms); and per token: receive minus send (ms)."""
    added, delay = [], []
    for record in records:
        if not record.ok:
            continue
        sent = server_stamps(record)[1]
        gaps = np.array(record.itl_s) * 1e9
        received = record.start_ns + record.ttft_s * 1e9 + np.concatenate([[0.0], np.cumsum(gaps)])
        if len(sent) != len(received):
            raise SystemExit(f"request {record.index}: {len(sent)} server stamps vs {len(received)} client stamps")
        delay.extend((received - sent) / 1e6)
        added.extend((gaps - np.diff(sent)) / 1e6)
    added_arr, delay_arr = np.array(added), np.array(delay)
    return {
        "gaps": int(added_arr.size),
        "added_itl_p50_ms": float(np.percentile(added_arr, 50)),
        "added_itl_p99_ms": float(np.percentile(added_arr, 99)),
        "abs_added_itl_p99_ms": float(np.percentile(np.abs(added_arr), 99)),
        "send_to_receive_p50_ms": float(np.percentile(delay_arr, 50)),
        "send_to_receive_p99_ms": float(np.percentile(delay_arr, 99)),
    }


def ttft_error(stamps) -> dict[str, float]:
    """Client TTFT against the server's known one, per request: error (%), server-read lag and receive lag (ms).
    `stamps`: (client start ns, client first-chunk ns, server read-the-request ns, server first-chunk-sent ns)."""
    error_pct, send_lag, receive_lag = [], [], []
    for start_ns, first_ns, received_ns, sent_ns in stamps:
        server_ttft_ns = sent_ns - received_ns
        error_pct.append(((first_ns - start_ns) - server_ttft_ns) / server_ttft_ns * 100)
        send_lag.append((received_ns - start_ns) / 1e6)
        receive_lag.append((first_ns - sent_ns) / 1e6)
    return {"requests": len(error_pct),
            "ttft_error_mean_pct": float(np.mean(error_pct)), "ttft_error_p99_pct": float(np.percentile(error_pct, 99)),
            "send_lag_p50_ms": float(np.percentile(send_lag, 50)), "send_lag_p99_ms": float(np.percentile(send_lag, 99)),
            "receive_lag_p50_ms": float(np.percentile(receive_lag, 50)),
            "receive_lag_p99_ms": float(np.percentile(receive_lag, 99))}


class _RawStream(asyncio.Protocol):
    """Floor of the environment: a bare asyncio protocol that stamps each socket read and does nothing else."""

    def __init__(self, done: asyncio.Future) -> None:
        self.done = done
        self.reads: list[tuple[int, bytes]] = []

    def data_received(self, data: bytes) -> None:
        self.reads.append((time.perf_counter_ns(), data))
        if data.endswith(b"0\r\n\r\n"):
            self.done.set_result(None)

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result(None)


def record_stamps(records) -> list[tuple[int, int, int, int]]:
    stamps = []
    for record in records:
        if record.ok:
            received, sent = server_stamps(record)
            stamps.append((record.start_ns, record.start_ns + int(record.ttft_s * 1e9), received, int(sent[0])))
    return stamps


async def raw_ttft_floor(port: int, path: str, concurrency: int, tokens: int) -> dict[str, float]:
    """TTFT error of a bare asyncio reader, `concurrency` requests at once (stamped right after transport.write)."""
    loop = asyncio.get_running_loop()
    body = json.dumps({"model": "fake-model", "prompt": "x", "max_tokens": tokens, "stream": True}).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def one() -> tuple[int, int, int, int]:
        done = loop.create_future()
        transport, protocol = await loop.create_connection(lambda: _RawStream(done), "127.0.0.1", port)
        transport.write(request)
        start_ns = time.perf_counter_ns()
        await done
        transport.close()
        for stamp, data in protocol.reads:
            for piece in data.split(b'"text":"r')[1:]:
                received, sent = piece.split(b'"', 1)[0].split()[:2]
                return start_ns, stamp, int(received), int(sent)
        raise SystemExit("bare reader: no first chunk with the server's stamps")

    return ttft_error(await asyncio.gather(*(one() for _ in range(concurrency))))


async def raw_floor(port: int, path: str, streams: int, tokens: int) -> dict[str, float]:
    """Same paced streams read by `_RawStream`: the send->receive and ITL jitter no client can avoid here."""
    loop = asyncio.get_running_loop()
    body = json.dumps({"model": "fake-model", "prompt": "x", "max_tokens": tokens, "stream": True}).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def one() -> list[tuple[int, int]]:
        done = loop.create_future()
        transport, protocol = await loop.create_connection(lambda: _RawStream(done), "127.0.0.1", port)
        transport.write(request)
        await done
        transport.close()
        pairs = []
        for stamp, data in protocol.reads:
            for piece in data.split(b'"text":"')[1:]:
                sent = piece.split(b'"', 1)[0].split()[-1:]  # the first chunk starts with r<ns>: the send is last
                if sent and sent[0].isdigit():
                    pairs.append((int(sent[0]), stamp))
        return pairs

    added, delay = [], []
    for pairs in await asyncio.gather(*(one() for _ in range(streams))):
        sent = np.array([p[0] for p in pairs], dtype=np.int64)
        received = np.array([p[1] for p in pairs], dtype=np.int64)
        delay.extend((received - sent) / 1e6)
        added.extend((np.diff(received) - np.diff(sent)) / 1e6)
    return {"added_itl_p99_ms": float(np.percentile(added, 99)),
            "abs_added_itl_p99_ms": float(np.percentile(np.abs(added), 99)),
            "send_to_receive_p50_ms": float(np.percentile(delay, 50)),
            "send_to_receive_p99_ms": float(np.percentile(delay, 99))}


def find_guidellm(explicit: str | None) -> str | None:
    for candidate in (explicit, shutil.which("guidellm"), "/tmp/guidellm-venv/bin/guidellm"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_guidellm(guidellm: str, port: int, streams: int, requests: int, tokens: int) -> dict:
    """guidellm's client on the same firehose (chat completions, same streams, requests and max tokens)."""
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("".join(f"prompt number {i} for the firehose\n" for i in range(requests)))
        report = Path(tmp) / "guidellm.json"
        command = [guidellm, "run",
                   "--backend", f"kind=openai_http,target=http://127.0.0.1:{port}/firehose,model=fake-model,"
                                f"max_tokens={tokens},validate_backend=false",
                   "--profile", f"kind=concurrent,streams={streams}",
                   "--constraint", f"kind=max_requests,count={requests}",
                   "--data", f"kind=text_file,path={prompts}",
                   "--output", f"kind=json,path={report}", "--disable-progress"]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        wall_s = time.perf_counter() - started
        if done.returncode != 0 or not report.exists():
            return {"error": f"guidellm exited {done.returncode}: {(done.stderr or done.stdout)[-800:]}"}
        benchmark = json.loads(report.read_text())["benchmarks"][0]
        metrics = benchmark["metrics"]
        output_tokens = metrics["output_token_count"]["successful"]["total_sum"]
        return {
            "completed": metrics["request_totals"]["successful"],
            "errored": metrics["request_totals"]["errored"],
            "output_tokens": output_tokens,
            "duration_s": benchmark["duration"],
            "output_tok_s": output_tokens / benchmark["duration"],
            "peak_concurrency": metrics["request_concurrency"]["successful"]["max"],
            "process_wall_s": wall_s,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000, help="concurrent streams (closed loop)")
    parser.add_argument("--requests", type=int, default=None, help="requests per run (default 3 x streams)")
    parser.add_argument("--tokens", type=int, default=200, help="output tokens per request")
    parser.add_argument("--paced", default="100x5,1000x50", help="ITL runs as STREAMSxMS pairs, comma separated")
    parser.add_argument("--paced-tokens", type=int, default=100, help="tokens per request in the ITL runs")
    parser.add_argument("--ttft", default="64x20", help="TTFT/send-lag runs as CONCURRENCYxMS pairs ('' to skip)")
    parser.add_argument("--ttft-tokens", type=int, default=32, help="tokens per request in the TTFT runs")
    parser.add_argument("--repeat", type=int, default=1, help="repeat the firehose (and guidellm) runs: spread")
    parser.add_argument("--guidellm", default=None, help="path of the guidellm executable")
    parser.add_argument("--skip-guidellm", action="store_true")
    parser.add_argument("--no-uvloop", action="store_true", help="plain asyncio loop even if uvloop is installed")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    requests = args.requests or 3 * args.streams

    server, port = start_fake_server()
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                 "load_average_1m_at_start": os.getloadavg()[0]}}
    print(f"{os.cpu_count()} CPUs, 1-minute load average at start {os.getloadavg()[0]:.2f} (other processes share them)")
    try:
        base = f"http://127.0.0.1:{port}"
        results["throughput_runs"] = []
        for _ in range(args.repeat):
            result, client_cpu_s = run_async(run_speedlimit(f"{base}/firehose/v1", args.streams, requests, args.tokens),
                                             not args.no_uvloop)
            summary = result.summary
            run = {"streams": args.streams, "requests": requests, "tokens_per_request": args.tokens,
                   "completed": summary.completed, "errors": summary.errors, "output_tokens": summary.output_tokens,
                   "duration_s": summary.duration_s, "output_tok_s": summary.output_tok_s,
                   "peak_open_streams": peak_open_streams(result.records), "client_cpu_s": client_cpu_s,
                   "load_average_1m": os.getloadavg()[0]}
            results["throughput_runs"].append(run)
            print(f"speedlimit client, firehose: {summary.output_tok_s:,.0f} output tok/s sustained over "
                  f"{summary.duration_s:.2f} s; {summary.completed}/{requests} requests ok, errors "
                  f"{summary.errors or 'none'}; peak {run['peak_open_streams']} streams open at once; "
                  f"client CPU {client_cpu_s:.1f} s; load average {run['load_average_1m']:.2f}")
        rates = [run["output_tok_s"] for run in results["throughput_runs"]]
        results["throughput"] = {"output_tok_s_median": float(np.median(rates)), "output_tok_s_min": min(rates),
                                 "output_tok_s_max": max(rates)}
        if args.repeat > 1:
            print(f"  over {args.repeat} runs: median {np.median(rates):,.0f}, min {min(rates):,.0f}, "
                  f"max {max(rates):,.0f} output tok/s")

        results["ttft"] = []
        for pair in filter(None, args.ttft.split(",")):
            concurrency, pace_ms = (int(x) for x in pair.split("x"))
            SEND_LAGS_NS.clear()
            result, _ = run_async(run_speedlimit(f"{base}/paced-{pace_ms}/v1", concurrency, 4 * concurrency,
                                                 args.ttft_tokens), not args.no_uvloop)
            stats = ttft_error(record_stamps(result.records))
            lags_ms = np.array(SEND_LAGS_NS) / 1e6
            stats.update(concurrency=concurrency, pace_ms=pace_ms, errors=result.summary.errors,
                         client_send_lag_p50_ms=float(np.percentile(lags_ms, 50)),
                         client_send_lag_p99_ms=float(np.percentile(lags_ms, 99)),
                         load_average_1m=os.getloadavg()[0])
            floor = run_async(raw_ttft_floor(port, f"/paced-{pace_ms}/v1/completions", concurrency, args.ttft_tokens),
                              not args.no_uvloop)
            stats["bare_socket_floor"] = floor
            results["ttft"].append(stats)
            print(f"TTFT at concurrency {concurrency}, server TTFT = ITL = {pace_ms} ms ({stats['requests']} requests, "
                  f"load average {stats['load_average_1m']:.2f}): client TTFT error mean "
                  f"{stats['ttft_error_mean_pct']:+.2f}%, p99 {stats['ttft_error_p99_pct']:+.2f}%")
            print(f"  client-internal send lag (session.post called -> request on the socket) p50 "
                  f"{stats['client_send_lag_p50_ms']:.3f} ms, p99 {stats['client_send_lag_p99_ms']:.3f} ms; "
                  f"request on the socket -> server has read it p50 {stats['send_lag_p50_ms']:+.3f} ms, p99 "
                  f"{stats['send_lag_p99_ms']:+.3f} ms; server first chunk -> client p50 "
                  f"{stats['receive_lag_p50_ms']:.3f} ms, p99 {stats['receive_lag_p99_ms']:.3f} ms")
            print(f"  bare-socket floor, {concurrency} requests at once: TTFT error mean "
                  f"{floor['ttft_error_mean_pct']:+.2f}%, p99 {floor['ttft_error_p99_pct']:+.2f}%; socket -> server "
                  f"read p50 {floor['send_lag_p50_ms']:+.3f} ms; server -> client p50 {floor['receive_lag_p50_ms']:.3f} ms")

        results["itl"] = []
        for pair in filter(None, args.paced.split(",")):
            streams, pace_ms = (int(x) for x in pair.split("x"))
            result, _ = run_async(run_speedlimit(f"{base}/paced-{pace_ms}/v1", streams, streams,
                                                   args.paced_tokens), not args.no_uvloop)
            stats = client_added_itl(result.records)
            stats.update(streams=streams, pace_ms=pace_ms, offered_tok_s=streams * 1000 / pace_ms,
                         measured_output_tok_s=result.summary.output_tok_s, errors=result.summary.errors)
            floor = run_async(raw_floor(port, f"/paced-{pace_ms}/v1/completions", streams, args.paced_tokens),
                              not args.no_uvloop)
            stats["bare_socket_floor"] = floor
            stats["added_over_floor_p99_ms"] = stats["added_itl_p99_ms"] - floor["added_itl_p99_ms"]
            results["itl"].append(stats)
            print(f"client-added ITL, {streams} streams paced {pace_ms} ms ({result.summary.output_tok_s:,.0f} "
                  f"tok/s): p50 {stats['added_itl_p50_ms']:+.3f} ms, p99 {stats['added_itl_p99_ms']:+.3f} ms, "
                  f"|p99| {stats['abs_added_itl_p99_ms']:.3f} ms over {stats['gaps']:,} gaps; server send -> client "
                  f"receive p50 {stats['send_to_receive_p50_ms']:.3f} ms, p99 {stats['send_to_receive_p99_ms']:.3f} ms")
            print(f"  bare-socket floor, same load: ITL gap p99 {floor['added_itl_p99_ms']:+.3f} ms, send -> receive "
                  f"p99 {floor['send_to_receive_p99_ms']:.3f} ms; speedlimit above the floor at p99: "
                  f"{stats['added_over_floor_p99_ms']:+.3f} ms")

        guidellm = None if args.skip_guidellm else find_guidellm(args.guidellm)
        if guidellm is None:
            results["guidellm"] = {"error": "guidellm not run: not installed (pip install guidellm in a venv and pass "
                                            "--guidellm PATH)" if not args.skip_guidellm else "skipped"}
            print(results["guidellm"]["error"])
        else:
            references = []
            for _ in range(args.repeat):
                reference = run_guidellm(guidellm, port, args.streams, requests, args.tokens)
                if "error" in reference:
                    print(reference["error"])
                    break
                reference["load_average_1m"] = os.getloadavg()[0]
                references.append(reference)
                print(f"guidellm client, same firehose: {reference['output_tok_s']:,.0f} output tok/s over "
                      f"{reference['duration_s']:.2f} s ({reference['completed']} ok, {reference['errored']} errored, "
                      f"peak concurrency {reference['peak_concurrency']:.0f}); load average "
                      f"{reference['load_average_1m']:.2f}")
            results["guidellm"] = references
            if references:
                theirs = [r["output_tok_s"] for r in references]
                results["ratio_speedlimit_over_guidellm_tok_s"] = {"median": float(np.median(rates) / np.median(theirs)),
                                                                   "min": min(rates) / max(theirs),
                                                                   "max": max(rates) / min(theirs)}
                ratio = results["ratio_speedlimit_over_guidellm_tok_s"]
                print(f"ratio of sustained tokens/s, speedlimit / guidellm: median {ratio['median']:.2f} "
                      f"(worst pairing {ratio['min']:.2f}, best {ratio['max']:.2f}) over {len(rates)} and "
                      f"{len(theirs)} runs")
    finally:
        server.terminate()
        server.wait(10)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
