"""Measure what llama.cpp's CPU attention costs per cached token: fold C of the accuracy set.

A decode step attends over every cached token of its sequence; on a GPU that is a stream of the KV cache, but on a
CPU llama.cpp's flash-attention kernel (ggml-cpu/ops.cpp, `ggml_compute_forward_flash_attn_ext_f16_one_chunk`) does,
per query head and cached token, an f16 dot product of the head's width, an `expf` of the online softmax and an f16
multiply-add of the value row, and that arithmetic, not the KV bytes, is its time: SmolLM2-135M's decode slows from
7.9 to 18.7 ms a token between context 0 and 2,048 on the dev VM, where its KV cache adds 47 MB a token to read (1.7
ms at the VM's 27.8 GB/s). No public figure exists, so this script measures the rate on the machine it runs on, with
the same build, synthetic models and fastest-of-repetitions rule as `benchmarks/cpu_kernel_rates.py`:
1. two synthetic Llama models whose time at depth is attention (4 layers, 16 query / 4 KV heads, a 256-wide FFN, a
   1,024-token vocabulary, F16), with heads 64 and 128 wide (hidden 1,024 and 2,048): the two widths tell a cost per
   head and cached token from a cost per multiply-accumulate;
2. `llama-bench -fa 1 -p 0 -n 32 -d 1024,4096` (decode) and `-p 512 -n 0 -d 0,2048` (prefill at depth) on each, at 1
   and at all threads, and the clock with 1 and all cores busy.
The difference between the two depths is attention alone (the weights, the graph and the head cancel).
`benchmarks/accuracy/score.py` (`attention_rates_from`) turns the rows into the profile's `attention_rates`
(SOURCES.md, "Fold C amendment 9"): multiply-accumulates (query heads x cached tokens x (key + value width)) per cycle
per thread, for decode (one query token; llama.cpp splits the cached tokens over the threads from 512 on) and for a
512-token prefill (its tiled kernel).

    python benchmarks/cpu_attention_rate.py --portable --out benchmarks/accuracy/cpu_attention_portable.csv   # the build verify runs
    python benchmarks/cpu_attention_rate.py   # the AVX-512 build of [llama-cpp-cpu]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cpu_kernel_rates as kernels  # noqa: E402  (a sibling script, not a package)

# (name, hidden, ffn, heads, kv_heads, layers, vocab): attention-heavy, the weights small beside the cache's traffic
SHAPES = (kernels.Shape("attention-d64", 1024, 256, 16, 4, 4, 1024), kernels.Shape("attention-d128", 2048, 256, 16, 4, 4, 1024))
DECODE_DEPTHS = (1024, 4096)
PREFILL_DEPTHS = (0, 2048)
DECODE_TOKENS, PREFILL_TOKENS = 32, 512
DEFAULT_OUT = HERE / "accuracy" / "cpu_attention.csv"


def main(argv: list[str] | None = None) -> int:
    run = kernels.synthetic_run(__doc__.split("\n\n")[0], DEFAULT_OUT, 5, "speedlimit-attention-", argv)
    args, cores, tools, work, tokenizer, clocks, cpu, date = run
    thread_list = "1" if cores == 1 else f"1,{cores}"
    tests = (("decode", ["-p", "0", "-n", str(DECODE_TOKENS), "-d", ",".join(map(str, DECODE_DEPTHS))]),
             ("prefill", ["-p", str(PREFILL_TOKENS), "-n", "0", "-d", ",".join(map(str, PREFILL_DEPTHS))]))
    rows = []
    for shape in SHAPES:
        model = work / f"{shape.name}-f16.gguf"
        kernels.write_model(model, shape, tokenizer)
        for phase, test_args in tests:
            results = kernels.bench(tools / "llama-bench", model,
                                    [*test_args, "-fa", "1", "-r", str(args.repetitions), "-t", thread_list])
            for result in results:
                threads = int(result["n_threads"])
                tokens = int(result["n_gen"]) or int(result["n_prompt"])
                rows.append({
                    "model": shape.name, "phase": phase, "head_dim": shape.head_dim, "heads": shape.heads,
                    "kv_heads": shape.kv_heads, "layers": shape.layers, "depth": int(result.get("n_depth", 0)),
                    "tokens": tokens, "threads": threads, "tok_s": f"{kernels.fastest_tok_s(result):.3f}",
                    "tok_s_mean": f"{float(result['avg_ts']):.3f}", "tok_s_stdev": f"{float(result['stddev_ts']):.3f}",
                    "repetitions": len(result.get("samples_ts") or [1]),
                    "clock_hz": f"{clocks[1] if threads == 1 else clocks[cores]:.4g}",
                    "build": "portable (GGML_NATIVE=OFF)" if args.portable else "zen4 (AVX-512)", "cpu": cpu,
                    "cores": cores, "llama_cpp": kernels.build_label(result), "date": date,
                })
            kernels.log(f"  {shape.name} {phase}: " + ", ".join(
                f"t{r['threads']} d{r['depth']} {r['tok_s']} tok/s" for r in rows if r["model"] == shape.name and r["phase"] == phase))
    kernels.write_rows(args.out, rows)
    kernels.log(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
