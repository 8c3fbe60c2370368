"""How fast is the serving simulator, and how much memory does a long run take?

Run: python benchmarks/bench_simulate.py [--skip-memory]
Prints, for 10,000 requests (prompt 1,024, output 256, closed loop at concurrency 64, chunked prefill, vLLM-like
engine defaults) of llama-3.1-8b on h100-sxm: the wall time of `speedlimit.simulate()` end to end (workload,
simulation, records, bench's summary; best of 3 and median), split into its phases, with simulated requests/s and
engine steps/s. Then, in a fresh subprocess, the same workload with 100,000 requests: wall time and peak resident
memory (target < 1 GB).
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
import time

# scheduler="continuous": the generic vLLM-like scheduler, as time_phases runs it (plain simulate runs the default
# engine, llama-server's 4 slots, which needs 16x the steps for this load)
SCENARIO = dict(model="llama-3.1-8b", hardware="h100-sxm", concurrency=64, prompt_tokens=1024, output_tokens=256,
                chunked_prefill=True, scheduler="continuous")


def time_phases(requests: int) -> dict[str, float]:
    from speedlimit.bench.metrics import summarize
    from speedlimit.simulator.api import build_records, build_workload, engine_config, resolve
    from speedlimit.simulator.engine import run

    start = time.perf_counter()
    step = resolve(SCENARIO["model"], SCENARIO["hardware"])
    engine = engine_config("continuous", step=step)
    workload = build_workload(concurrency=64, requests=requests, prompt_tokens=1024, output_tokens=256)
    resolved = time.perf_counter()
    raw = run(step.cost, step.machine, engine, workload.prompts, workload.outputs, concurrency=64, requests=requests)
    simulated = time.perf_counter()
    records = build_records(raw)
    built = time.perf_counter()
    summarize(records, 1.0)
    summarized = time.perf_counter()
    return {"resolve + workload": resolved - start, "simulation": simulated - resolved,
            "records": built - simulated, "summary": summarized - built, "steps": len(raw.end_times)}


def end_to_end(requests: int) -> tuple[float, int, float]:
    from speedlimit import simulate

    start = time.perf_counter()
    result = simulate(**{**SCENARIO, "requests": requests})
    elapsed = time.perf_counter() - start
    return elapsed, result.summary.simulation["steps"], result.summary.output_tok_s


def memory_child(requests: int) -> None:
    elapsed, steps, _ = end_to_end(requests)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{elapsed:.3f} {steps} {peak_kib}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        memory_child(args.child)
        return
    import speedlimit

    print(f"speedlimit {speedlimit.__version__}, Python {platform.python_version()}, {platform.machine()}, "
          f"{platform.processor() or platform.platform()}")
    end_to_end(500)  # warm imports and catalog caches
    times = []
    for _ in range(3):
        elapsed, steps, tok_s = end_to_end(10_000)
        times.append(elapsed)
    best, median = min(times), statistics.median(times)
    print(f"10,000 requests (prompt 1,024, output 256, concurrency 64, chunked prefill), llama-3.1-8b on h100-sxm:")
    print(f"  simulate(): best {best:.3f} s, median {median:.3f} s of 3 (target <= 1 s)")
    print(f"  {10_000 / best:,.0f} simulated requests/s, {steps / best:,.0f} engine steps/s ({steps:,} steps; "
          f"predicted {tok_s:,.0f} output tok/s)")
    phases = time_phases(10_000)
    print("  phases: " + ", ".join(f"{k} {v:.3f} s" for k, v in phases.items() if k != "steps"))
    if not args.skip_memory:
        output = subprocess.run([sys.executable, __file__, "--child", "100000"], capture_output=True, text=True,
                                check=True).stdout.split()
        elapsed, steps, peak_kib = float(output[0]), int(output[1]), int(output[2])
        print(f"100,000 requests: {elapsed:.2f} s, {steps:,} steps, peak RSS {peak_kib / 1024:,.0f} MiB "
              f"(target < 1 GB, whole process incl. Python and numpy)")


if __name__ == "__main__":
    main()
