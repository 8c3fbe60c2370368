"""Measure what llama.cpp's CPU backend spends per graph node and per step beyond its matmuls: fold C of the accuracy set.

On a CPU every node of llama.cpp's decode graph (a norm, a rope, a KV-cache write, a matvec) is dispatched to the
threads and ends at a barrier, whatever its size. For a 135M model that is a tenth of the token's time; the estimate
charged none of it (efficiency.toml's provisional 0.2 ms per step stood for all of it). This script measures it on the
machine it runs on, with the same build, synthetic models and fastest-of-repetitions rule as
`benchmarks/cpu_kernel_rates.py`:
1. two synthetic Llama models of tiny width (hidden 64, FFN 128, 2 heads / 1 KV head, a 1,024-token vocabulary;
   F16, so every matrix stays in cache), one with 1 layer and one with 33;
2. `llama-bench -p 0 -n 256 -r 10` on each at 1 and at all threads, and the clock with 1 and all cores busy.
`benchmarks/accuracy/score.py` (`graph_overhead_from`) turns the rows into the profile's per-node and per-step costs
(SOURCES.md, "Fold C amendment 5"): the 32 extra layers' time, less their multiply-accumulates at the build's
in-cache f16 decode rate, over 32 x 22 nodes; and the 1-layer model's time less its nodes and its MACs.

    python benchmarks/cpu_graph_overhead.py                       # the AVX-512 build of [llama-cpp-cpu], ~2 minutes
    python benchmarks/cpu_graph_overhead.py --portable --out benchmarks/accuracy/cpu_graph_overhead_portable.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cpu_kernel_rates as kernels  # noqa: E402  (a sibling script, not a package)

# (name, hidden, ffn, heads, kv_heads, layers, vocab): as thin as llama.cpp's graph allows, so the nodes, not the
# multiply-accumulates, are the time
SHAPES = (kernels.Shape("tiny-1-layer", 64, 128, 2, 1, 1, 1024), kernels.Shape("tiny-33-layers", 64, 128, 2, 1, 33, 1024))
DEFAULT_OUT = HERE / "accuracy" / "cpu_graph_overhead.csv"


def main(argv: list[str] | None = None) -> int:
    run = kernels.synthetic_run(__doc__.split("\n\n")[0], DEFAULT_OUT, 10, "speedlimit-graph-", argv)
    args, cores, tools, work, tokenizer, clocks, cpu, date = run
    rows = []
    for shape in SHAPES:
        model = work / f"{shape.name}-f16.gguf"
        per_token, _ = kernels.write_model(model, shape, tokenizer)
        thread_list = "1" if cores == 1 else f"1,{cores}"
        for result in kernels.bench(tools / "llama-bench", model,
                                    ["-p", "0", "-n", "256", "-r", str(args.repetitions), "-t", thread_list]):
            threads = int(result["n_threads"])
            tok_s = kernels.fastest_tok_s(result)
            rows.append({
                "model": shape.name, "layers": shape.layers, "test": "tg256", "threads": threads,
                "tok_s": f"{tok_s:.3f}", "tok_s_mean": f"{float(result['avg_ts']):.3f}",
                "tok_s_stdev": f"{float(result['stddev_ts']):.3f}", "repetitions": len(result.get("samples_ts") or [1]),
                "macs_per_token": per_token, "clock_hz": f"{clocks[1] if threads == 1 else clocks[cores]:.4g}",
                "build": "portable (GGML_NATIVE=OFF)" if args.portable else "zen4 (AVX-512)", "cpu": cpu, "cores": cores,
                "llama_cpp": kernels.build_label(result), "date": date,
            })
        kernels.log(f"  {shape.name}: " + ", ".join(f"t{r['threads']} {r['tok_s']} tok/s" for r in rows if r["model"] == shape.name))
    kernels.write_rows(args.out, rows)
    kernels.log(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
