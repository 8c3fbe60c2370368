"""Measure how llama.cpp's CPU prefill scales with threads on this machine: fold C of the accuracy set.

`benchmarks/cpu_kernel_rates.py` measures each weight type's prefill GEMM on the dev VM's two cores, as
multiply-accumulates per cycle per thread, and the estimate multiplies that by every core of the user's CPU. Whether
sixteen threads reach eight times what two reach is not something two cores can show, and no public per-thread-count
llama-bench table of a catalog CPU was found. This script measures it where more cores are at hand: the same
synthetic Llama-3.1-8B-shaped model (two layers, `cpu_kernel_rates.PREFILL_SHAPE`), quantized `--pure` to each
type, `llama-bench -p 512 -n 0` at each thread count, and the clock with that many cores busy (the dependent-add
chain of `cpu_kernel_rates.clock_hz`), so a row's rate is MACs per cycle per thread at its own thread count.

It needs `llama-bench` and `llama-quantize` (`--tools`, e.g. built by `cpu_kernel_rates.build_tools`), `gguf` and
numpy, and SmolLM2's vocabulary: from the bundled model, or from `--tokenizer FILE` (a JSON file this script writes
with `--write-tokenizer FILE` where the bundled model is installed), for machines without the package.

    python benchmarks/cpu_thread_scaling.py --tools DIR --types q4_0,q8_0 --threads 2,4,8,16 --out scaling.csv
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cpu_kernel_rates as kernels  # noqa: E402  (a sibling script, not a package)


def tokenizer_from(path: Path | None) -> dict:
    if path is None:
        return kernels.smollm2_tokenizer()
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", type=Path, help="folder holding llama-bench and llama-quantize")
    parser.add_argument("--types", default="q4_0,q8_0", help="llama-quantize types, comma-separated")
    parser.add_argument("--threads", default=None, help="thread counts, comma-separated (default 1,2,4,... to all)")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--tokenizer", type=Path, default=None, help="SmolLM2 vocabulary as JSON (see --write-tokenizer)")
    parser.add_argument("--write-tokenizer", type=Path, default=None, help="write the bundled vocabulary as JSON and exit")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("cpu_thread_scaling.csv"))
    args = parser.parse_args(argv)
    if args.write_tokenizer:
        args.write_tokenizer.write_text(json.dumps({k: list(v) for k, v in kernels.smollm2_tokenizer().items()}))
        return 0
    if args.tools is None:
        parser.error("--tools is required")
    cores = os.cpu_count() or 1
    try:
        counts = [int(t) for t in args.threads.split(",")] if args.threads else sorted(
            {1, cores, *(2 ** k for k in range(1, cores.bit_length()) if 2 ** k < cores)})
    except ValueError:
        parser.error(f"--threads {args.threads!r}: give thread counts, comma-separated (e.g. 2,4,8,16)")
    if 2 not in counts or min(counts) < 1:
        parser.error("--threads must include 2 (the kernel rates' own count, which the scaling is relative to) and be >= 1")
    wanted = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in kernels.TYPES]
    if unknown:
        parser.error(f"unknown type(s) {', '.join(unknown)}; known: {', '.join(t.lower() for t in kernels.TYPES)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="speedlimit-threads-"))
    work.mkdir(parents=True, exist_ok=True)
    shape = kernels.PREFILL_SHAPE
    base = work / f"{shape.name}-f16.gguf"
    tokenizer = tokenizer_from(args.tokenizer)
    head = (shape.vocab or len(tokenizer["tokens"])) * shape.hidden
    per_token = sum(rows * columns for _, (rows, columns) in kernels.matrices(shape)) + head
    if not base.exists():  # deterministic (seed 0): a model already written is the same model
        kernels.log(f"writing {base}")
        assert kernels.write_model(base, shape, tokenizer) == (per_token, head)
    clocks = {n: kernels.clock_hz(work, n) for n in counts}
    kernels.log("clock: " + ", ".join(f"{clocks[n] / 1e9:.3f} GHz at {n}" for n in counts))
    cpu, date = kernels.cpu_name(), datetime.date.today().isoformat()
    run_macs = (512 * (per_token - head) + head) / 512
    rows: list[dict] = []
    for quant in wanted:
        model = base if quant == "F16" else work / f"{shape.name}-{quant.lower()}.gguf"
        if not model.exists():
            kernels.log(f"quantizing to {quant}")
            subprocess.run([str(args.tools / "llama-quantize"), "--pure", str(base), str(model), quant, str(cores)],
                           check=True, capture_output=True)
        results = kernels.bench(args.tools / "llama-bench", model,
                                ["-p", "512", "-n", "0", "-r", str(args.repetitions), "-t", ",".join(map(str, counts))])
        for result in results:
            threads = int(result["n_threads"])
            tok_s = kernels.fastest_tok_s(result)
            rows.append({
                "type": kernels.TYPES[quant], "quantize": quant, "model": shape.name, "test": "pp512",
                "threads": threads, "tok_s": f"{tok_s:.3f}", "tok_s_mean": f"{float(result['avg_ts']):.3f}",
                "repetitions": len(result.get("samples_ts") or [1]), "macs_per_token": int(round(run_macs)),
                "clock_hz": f"{clocks[threads]:.4g}",
                "macs_per_cycle_per_thread": f"{tok_s * run_macs / (threads * clocks[threads]):.4f}",
                "cpu": cpu, "cores": cores,
                "llama_cpp": kernels.build_label(result), "date": date,
            })
        kernels.log(f"  {quant}: " + ", ".join(f"t{r['threads']} {r['tok_s']} tok/s ({r['macs_per_cycle_per_thread']})"
                                               for r in rows if r["quantize"] == quant))
        kernels.write_rows(args.out, rows)  # after every type: an interrupted run keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
