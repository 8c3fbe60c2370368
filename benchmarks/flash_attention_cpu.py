"""Flash attention on or off in llama.cpp's CPU backend: what `speedlimit verify` measures either way.

llama.cpp's own tools (llama-server, llama-bench, llama-cli) default to ``--flash-attn auto``, which turns it on
wherever the backend runs it, the CPU backend included; llama-cpp-python's ``Llama`` defaults to off. Since
2026-12-05 verify runs llama.cpp with it on, as the default engine runs. This script loads the bundled SmolLM2-135M
Q4_1 twice in one process (flash attention off, on), alternates them ``--rounds`` times, and prints per context the
median prefill time of the context and the median decode rate of ``--tokens`` tokens after it, and on ÷ off.

    python benchmarks/flash_attention_cpu.py                 # contexts 128,512,1024, 3 rounds, 32 tokens
    python benchmarks/flash_attention_cpu.py --threads 1 --contexts 128,2048
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="128,512,1024")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import llama_cpp

    from speedlimit.bundled import default_gguf_path

    contexts = [int(c) for c in args.contexts.split(",")]
    n_ctx = max(contexts) + args.tokens + 16
    models = {on: llama_cpp.Llama(model_path=str(default_gguf_path()), n_ctx=n_ctx, n_threads=args.threads,
                                  n_threads_batch=args.threads, flash_attn=on, verbose=False) for on in (False, True)}
    filler = models[False].tokenize(b"The quick brown fox jumps over the lazy dog. " * (n_ctx // 8), add_bos=True)
    prefill: dict[tuple[bool, int], list[float]] = {}
    decode: dict[tuple[bool, int], list[float]] = {}
    for _ in range(args.rounds):
        for on, llm in models.items():
            for context in contexts:
                llm.reset()
                start = time.perf_counter()
                llm.eval(filler[:context])
                prefill.setdefault((on, context), []).append(time.perf_counter() - start)
                start = time.perf_counter()
                for k in range(args.tokens):
                    llm.eval([filler[context + k]])
                decode.setdefault((on, context), []).append(args.tokens / (time.perf_counter() - start))
    print(f"SmolLM2-135M Q4_1, {args.threads} threads, median of {args.rounds} alternating rounds")
    print("context  prefill ms off / on (on÷off)   decode tok/s off / on (on÷off)")
    for context in contexts:
        p_off, p_on = (statistics.median(prefill[(on, context)]) * 1e3 for on in (False, True))
        d_off, d_on = (statistics.median(decode[(on, context)]) for on in (False, True))
        print(f"{context:>7}  {p_off:8.1f} / {p_on:8.1f} ({p_on / p_off:.2f})       "
              f"{d_off:7.1f} / {d_on:7.1f} ({d_on / d_off:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
