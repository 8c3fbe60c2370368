"""Does `bench --workers N` add load? Output tok/s against the fake server's `firehose` mode (tests/bench/
faulty_server.py, in its own process on 127.0.0.1) with 1, 2 and 4 worker processes, the CPU seconds used (parent
and workers), and what the client adds at each: ITL (p50/p99 of measured gap minus the server's paced 20 ms gap) and
TTFT (p50/p99 minus the server's paced 20 ms before the first chunk, so what is left is client plus loopback). The
firehose run's own self-check is printed too: the busiest sending process's CPU (share of one core), the worst
sending event loop's timer lag p99 (the parent's, or a worker's), and whether bench flagged itself as the bottleneck.

Usage: python benchmarks/bench_workers.py [--workers 1,2,4] [--streams 64] [--tokens 200] [--requests 600]
                                          [--repeat 1]
Figures are printed, never asserted. On a 2-core machine the cores, shared with the server, are the ceiling.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_client_overhead import start_fake_server  # noqa: E402
from speedlimit.bench.client import Endpoint, run_async  # noqa: E402
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan  # noqa: E402
from speedlimit.bench.selfcheck import worst_loop_lag_s  # noqa: E402
from speedlimit.bench.workers import make_scale_out  # noqa: E402
from speedlimit.bench.workload import LengthSpec  # noqa: E402


def cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(url: str, workers: int, plan: LoadPlan, tokens: int):
    async def main():
        workload = WorkloadPlan(LengthSpec("fixed", 16), tokens)
        async with BenchRunner(Endpoint(url), workload, count_tokens=False,
                               scale=make_scale_out(workers, None, False)) as runner:
            return (await runner.run(plan)).summary

    return run_async(main())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    server, port = start_fake_server()
    try:
        base = None
        print(f"{'workers':>7} {'out tok/s':>11} {'ratio':>6} {'CPU s':>6} {'wall s':>6} "
              f"{'+ITL p50/p99 ms':>16} {'+TTFT p50/p99 ms':>17} {'busiest CPU':>11} {'loop lag p99':>12} flagged")
        for _ in range(args.repeat):
            for n in [int(x) for x in args.workers.split(",")]:
                server_cpu = lambda: sum(float(x) for x in  # noqa: E731
                                         Path(f"/proc/{server.pid}/stat").read_text().split()[13:15]) / 100
                cpu0, wall0, scpu0 = cpu_s(), time.perf_counter(), server_cpu()
                fire = run(f"http://127.0.0.1:{port}/firehose/v1", n,
                           LoadPlan(concurrency=args.streams, requests=args.requests), args.tokens)
                cpu, wall, scpu = cpu_s() - cpu0, time.perf_counter() - wall0, server_cpu() - scpu0
                paced = run(f"http://127.0.0.1:{port}/paced-20/v1", n, LoadPlan(concurrency=16, requests=48), 20)
                base = base or fire.output_tok_s
                itl = (paced.itl_s.p50 * 1e3 - 20, paced.itl_s.p99 * 1e3 - 20)
                ttft = (paced.ttft_s.p50 * 1e3 - 20, paced.ttft_s.p99 * 1e3 - 20)
                client = fire.self_checks.client
                print(f"{n:>7} {fire.output_tok_s:>11,.0f} {fire.output_tok_s / base:>6.2f} {cpu:>6.1f} {wall:>6.1f} "
                      f"{itl[0]:>7.2f}/{itl[1]:<8.2f} {ttft[0]:>8.2f}/{ttft[1]:<8.2f} "
                      f"{client.cpu_fraction:>10.0%} {worst_loop_lag_s(client) * 1e3:>9.2f} ms "
                      f"{'yes' if client.bottleneck else 'no':>7}"
                      f"  (server CPU {scpu:.1f} s, timed window {fire.duration_s:.2f} s)")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
