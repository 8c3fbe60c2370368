"""How fast is `speedlimit report` on big runs, and how much memory does it take?

Run: python benchmarks/bench_report.py [--rows 30000,300000]
Writes synthetic runs shaped like bench's output (one `RequestRecord` per line: 128-token prompts, 16-64 output
tokens, so 15-63 inter-token gaps per row; 1% failed) into a temporary directory, then runs the command a user runs,
`python -m speedlimit.cli report DIR --out OUT`, in a fresh process per case, and prints that process's wall seconds
and CPU seconds (interpreter start and imports included; on a shared machine CPU time is the steadier figure) and its
peak RSS (VmHWM of /proc/self/status: this process's own high-water mark, which ru_maxrss is not after a fork). Two cases per size: with bench's summary.json beside the
records (the normal case) and without it (a killed run: the summary is computed from the records).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from speedlimit.artifacts import RequestRecord, iter_records
from speedlimit.bench.metrics import summarize


def write_run(directory: Path, rows: int, seed: int = 0) -> int:
    """A synthetic bench run of ``rows`` requests at concurrency 64; returns the requests.jsonl size in bytes."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "requests.jsonl"
    lanes = np.zeros(64, dtype=np.int64)
    with path.open("w", encoding="utf-8") as handle:
        for index in range(rows):
            lane = index % 64
            output_tokens = int(rng.integers(16, 65))
            ttft = float(rng.gamma(4.0, 0.03))
            gaps = rng.normal(0.025, 0.004, output_tokens - 1).clip(0.005).round(6).tolist()
            e2e = ttft + sum(gaps)
            start = int(lanes[lane] + rng.integers(0, 2_000_000))
            failed = rng.random() < 0.01
            record = RequestRecord(
                index=index, start_ns=start, end_ns=start + int(e2e * 1e9), ttft_s=None if failed else round(ttft, 6),
                itl_s=[] if failed else gaps, e2e_s=round(e2e, 6), prompt_tokens=128, output_tokens=None if failed else output_tokens,
                output_chunks=output_tokens, token_count_source="usage", prompt_token_source="usage", http_status=500 if failed else 200,
                error_kind="http_500" if failed else None, error_text="internal error" if failed else None,
                finish_reason=None if failed else "length")  # fmt: skip
            handle.write(record.to_json_line())
            lanes[lane] = start + int(e2e * 1e9)
    return path.stat().st_size


def write_summary(directory: Path) -> None:
    records = list(iter_records(directory / "requests.jsonl"))
    duration = (max(r.end_ns for r in records) - min(r.start_ns for r in records)) / 1e9
    summarize(records, duration).save(directory / "summary.json")


def one(directory: str, out: str) -> None:
    """Child process: run the CLI in-process and print seconds since this process started and its peak RSS."""
    started = time.perf_counter()
    from speedlimit.cli import main

    sys.argv = ["speedlimit", "report", directory, "--out", out]
    try:
        main()
    except SystemExit as exit_:
        if exit_.code:
            raise
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    status = Path("/proc/self/status").read_text(encoding="ascii")
    peak_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    print(json.dumps({"seconds": seconds, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": peak_kb / 1024}), file=sys.stderr)


def measure(directory: Path, out: Path) -> dict[str, float]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--one", str(directory), str(out)], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"report failed: {done.stderr.strip()}")
    result = json.loads(done.stderr.strip().splitlines()[-1])
    return {"outer_wall_s": wall, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="30000,300000", help="comma-separated row counts")
    parser.add_argument("--one", nargs=2, metavar=("DIR", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(*args.one)
        return
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    print(f"{'rows':>8} {'file MB':>8} {'summary.json':>13} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12}")
    with tempfile.TemporaryDirectory() as temporary:
        for rows in (int(text) for text in args.rows.split(",")):
            run = Path(temporary) / f"run{rows}"
            size = write_run(run, rows)
            for with_summary in (True, False):
                if with_summary:
                    write_summary(run)
                else:
                    (run / "summary.json").unlink()
                result = measure(run, Path(temporary) / f"out{rows}{with_summary}")
                print(f"{rows:>8,} {size / 1e6:>8.0f} {'yes' if with_summary else 'no (killed)':>13} "
                      f"{result['seconds']:>8.2f} {result['cpu_s']:>8.2f} {result['peak_rss_mb']:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
