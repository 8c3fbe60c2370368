"""Measure llama.cpp's CPU matmul kernel rate per weight type on this machine: fold C of the accuracy set.

On a CPU, llama.cpp's decode at a few threads and its prefill at any thread count are bound by how fast its
quantized dot-product kernels run, not by memory bandwidth: a Zen 4 core runs an IQ3_S matvec about four times slower
than a Q4_0 one, while the memory streams both alike. No public per-type figure exists, so this script measures one
on the machine it runs on and writes `benchmarks/accuracy/cpu_kernels.csv`; `catalog/engines.toml [llama-cpp-cpu]`
carries the rates fitted from that file (fold C: the project's own runs, never the held-out published rows), and
`benchmarks/accuracy/score.py` checks the catalog against the file.

What it runs, all local, nothing downloaded but the llama-cpp-python sdist that `scripts/build_llama_server.sh`
already fetches (or, with `--llama-cpp-python VERSION`, that version's sdist from PyPI, to measure an older llama.cpp):
1. builds `llama-bench` and `llama-quantize` from that sdist's llama.cpp with the AVX-512 kernels a native build on
   a Zen 4 machine selects, or with `--portable` as llama-cpp-python is installed (GGML_NATIVE=OFF: AVX2), cached
   beside the llama-server build or under <cache>/llama-cpp/VERSION;
2. writes synthetic F16 models with random weights (kernel speed does not depend on the values): for prefill, two
   layers with Llama-3.1-8B's matrices (hidden 4096, FFN 14336, 32 / 8 heads; SmolLM2's 49,152-token vocabulary,
   tied embeddings); for decode, one small layer at two FFN widths with a 1,024-token vocabulary, small enough to stay
   in the L3 cache (see DECODE_SHAPES);
3. quantizes each `--pure` to each type (every matrix one type; the IQ2 / IQ3_XXS types get an all-ones importance
   matrix, which they require and which does not change their kernels);
4. runs `llama-bench`: tg512 on the two in-cache models at 1 and all threads, pp512 on the 8B matrices at all
   threads, and tg32 on the 8B matrices at 1 thread (from DRAM, for reference), keeping each one's fastest
   repetition (`tok_s`; the mean beside it); and times a chain of dependent
   integer adds (one per cycle on every x86 core since Sandy Bridge / Zen: Agner Fog's instruction tables) at 1 and
   at all busy cores for the clock.

Each row's rate is multiply-accumulates (weights x tokens) per cycle per thread: a tg's MACs per token are the
matrices' weights, a pp's count the LM head once per prompt (llama.cpp computes logits for the last token only).
`benchmarks/accuracy/score.py` (`kernel_rates_from`) turns the rows into the catalog's [decode, prefill] pairs.

    python benchmarks/cpu_kernel_rates.py            # about 45 minutes on 2 cores, most of it quantizing the IQ types
    python benchmarks/cpu_kernel_rates.py --types q4_0,q8_0 --out /tmp/k.csv
    # llama.cpp build 3441 (081fe43, 2024-07-23), the build of the 7950X rows: [llama-cpp-cpu-b3441]
    python benchmarks/cpu_kernel_rates.py --llama-cpp-python 0.2.83 --out benchmarks/accuracy/cpu_kernels_b3441.csv
    # the build `speedlimit verify` runs (llama-cpp-python with GGML_NATIVE=OFF): [llama-cpp-cpu-avx2]
    python benchmarks/cpu_kernel_rates.py --portable --out benchmarks/accuracy/cpu_kernels_portable.csv
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from speedlimit.verify.clock import CLOCK_C, compile_probe, run_probe

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = HERE / "accuracy" / "cpu_kernels.csv"

# llama-quantize file type (with --pure every matrix gets the file type's default tensor type, llama-quant.cpp's
# llama_model_quantize_impl) -> the ggml tensor type that is: IQ2_S files store IQ2_XS, IQ2_M files IQ2_S
TYPES = {
    "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1",
    "Q2_K": "q2_k", "Q3_K_S": "q3_k", "Q4_K_S": "q4_k", "Q5_K_S": "q5_k", "Q6_K": "q6_k",
    "IQ2_XXS": "iq2_xxs", "IQ2_XS": "iq2_xs", "IQ2_M": "iq2_s", "IQ3_XXS": "iq3_xxs", "IQ3_S": "iq3_s",
    "IQ4_XS": "iq4_xs", "IQ4_NL": "iq4_nl",
    # MXFP4_MOE keeps only expert tensors MXFP4, but with --pure every matrix gets its default type, MXFP4
    # (llama-quant.cpp llama_ftype_get_default_type): SOURCES.md, "Fold C amendment 7"
    "MXFP4_MOE": "mxfp4",
}
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ2_M", "IQ3_XXS"}



class Shape(NamedTuple):
    """A synthetic Llama model: what it is for, its size, and its vocabulary (the first ``vocab`` SmolLM2 tokens)."""

    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    layers: int
    vocab: int | None  # None: SmolLM2's whole vocabulary (49,152)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Prefill: Llama-3.1-8B's matrices (a 512-token GEMM reuses each weight 512 times, so memory is not the limit).
PREFILL_SHAPE = Shape("8b-matrices", 4096, 14336, 32, 8, 2, None)
# Decode: one small layer and a 1,024-token vocabulary, at two FFN widths. Both stay in the 32 MB L3 cache (12 M
# weights, 24 MB at F16, the wider), so the matvec runs at the kernel's own rate (from DRAM it would run at whatever
# this machine's memory gives one core: about 16 GB/s on the dev VM, against the 57 GB/s a desktop Zen 4 core
# streams). The rate is the difference of the two: per-token costs that do not scale with the weights (graph
# dispatch, attention, the head) are the same in both and cancel; the estimate prices those apart.
DECODE_SHAPES = (Shape("in-cache-narrow", 1024, 512, 8, 2, 1, 1024), Shape("in-cache-wide", 1024, 3072, 8, 2, 1, 1024))



def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def llama_cpp_source(version: str | None) -> tuple[Path, Path]:
    """(llama.cpp source folder, cache folder) of a llama-cpp-python sdist: by default the one the llama-server
    build fetched (the pinned version); else ``version``'s, downloaded from PyPI once and kept in the cache."""
    if version is None:
        server = subprocess.run(["bash", str(REPO / "scripts" / "build_llama_server.sh")], check=True,
                                capture_output=True, text=True).stdout.strip().splitlines()[-1]
        root = Path(server).parents[2]  # <cache>/llama-server/<version>
        return next(root.glob("llama_cpp_python-*/vendor/llama.cpp")), root
    cache = Path(os.environ.get("SPEEDLIMIT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "speedlimit")
    root = cache / "llama-cpp" / version
    source = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").exists():
        root.mkdir(parents=True, exist_ok=True)
        log(f"downloading the llama-cpp-python {version} sdist into {root}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(root)], check=True)
        subprocess.run(["tar", "-xzf", str(root / f"llama_cpp_python-{version}.tar.gz"), "-C", str(root)], check=True)
    return source, root


# Zen 4's AVX-512 kernels: what a native build on the dev VM (and on the Ryzen 9 7950X of the published rows) selects
ZEN4_FLAGS = ["-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"]


def build_tools(cache: Path | None, version: str | None = None, portable: bool = False) -> Path:
    """llama-bench and llama-quantize from a llama-cpp-python sdist's llama.cpp: with Zen 4's AVX-512 kernels, or
    (``portable``) built as README's install line builds llama-cpp-python, GGML_NATIVE=OFF and nothing else
    (ggml then enables SSE4.2, AVX, AVX2, BMI2, FMA and F16C, no AVX-512)."""
    source, root = llama_cpp_source(version)
    build = cache if cache else root / ("build-portable" if portable else "build-zen4")
    bench, quantize = build / "bin" / "llama-bench", build / "bin" / "llama-quantize"
    if bench.exists() and quantize.exists():
        return build / "bin"
    log(f"building llama-bench and llama-quantize into {build} (several minutes)")
    # LLAMA_BUILD_EXAMPLES=ON: llama.cpp of 2024 keeps both tools among its examples (later ones under tools/)
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", *([] if portable else ZEN4_FLAGS), "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_CURL=OFF"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "llama-quantize",
                    "-j", str(os.cpu_count() or 2)], check=True, capture_output=True)
    return build / "bin"


def smollm2_tokenizer() -> dict:
    """The bundled SmolLM2 GGUF's tokenizer arrays (llama-bench needs a vocabulary; it feeds random tokens)."""
    from gguf import GGUFReader

    import speedlimit.bundled as bundled

    reader = GGUFReader(str(bundled.default_gguf_path()))
    field = reader.fields
    return {"tokens": field["tokenizer.ggml.tokens"].contents(),
            "token_type": field["tokenizer.ggml.token_type"].contents(),
            "merges": field["tokenizer.ggml.merges"].contents()}


def matrices(shape: Shape) -> list[tuple[str, tuple[int, int]]]:
    """(name, (rows, columns)) of every layer matrix (the head is the tied embedding table)."""
    kv, h, f = shape.kv_heads * shape.head_dim, shape.hidden, shape.ffn
    out = []
    for layer in range(shape.layers):
        b = f"blk.{layer}."
        out += [(b + "attn_q.weight", (h, h)), (b + "attn_k.weight", (kv, h)), (b + "attn_v.weight", (kv, h)),
                (b + "attn_output.weight", (h, h)), (b + "ffn_gate.weight", (f, h)), (b + "ffn_up.weight", (f, h)),
                (b + "ffn_down.weight", (h, f))]
    return out


def write_model(path: Path, shape: Shape, tokenizer: dict) -> tuple[int, int]:
    """Write the synthetic F16 model; return (MACs per decoded token, LM-head MACs).

    A shortened vocabulary keeps SmolLM2's first tokens (its specials and single bytes, which is all llama.cpp
    tokenizes at load) and the merges among them: llama-bench feeds random token ids and never tokenizes text."""
    from gguf import GGUFWriter

    if shape.vocab is not None:
        kept = tokenizer["tokens"][:shape.vocab]
        known = set(kept)
        merges = [m for m in tokenizer["merges"] if "".join(m.split(" ")) in known and all(p in known for p in m.split(" "))]
        tokenizer = {"tokens": kept, "token_type": tokenizer["token_type"][:shape.vocab], "merges": merges}
    vocab = len(tokenizer["tokens"])
    writer = GGUFWriter(str(path), "llama")
    writer.add_name(f"speedlimit synthetic kernel-rate model ({shape.name})")
    writer.add_block_count(shape.layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokenizer["tokens"])
    writer.add_token_types(tokenizer["token_type"])
    writer.add_token_merges(tokenizer["merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    rng = np.random.default_rng(0)
    body = 0
    writer.add_tensor("token_embd.weight", (rng.standard_normal((vocab, shape.hidden), dtype=np.float32) * 0.02).astype(np.float16))
    for layer in range(shape.layers):
        ones = np.ones(shape.hidden, dtype=np.float32)
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", ones)
    for name, size in matrices(shape):
        writer.add_tensor(name, (rng.standard_normal(size, dtype=np.float32) * 0.02).astype(np.float16))
        body += size[0] * size[1]
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    head = vocab * shape.hidden
    return body + head, head


def write_imatrix(path: Path, shape: Shape) -> None:
    """An all-ones importance matrix in llama.cpp's legacy format (common/imatrix-loader.cpp reads it)."""
    with open(path, "wb") as f:
        # the tied embedding table too: --pure quantizes it to the same type, and the IQ2 quantizers need a matrix
        entries = [*matrices(shape), ("token_embd.weight", (0, shape.hidden))]
        f.write(struct.pack("<i", len(entries)))
        for name, (_, columns) in entries:
            encoded = name.encode()
            f.write(struct.pack("<i", len(encoded)) + encoded + struct.pack("<ii", 1, columns))
            f.write(np.ones(columns, dtype=np.float32).tobytes())


class SyntheticRun(NamedTuple):
    """What a fold-C script of synthetic models starts from (`synthetic_run`)."""

    args: argparse.Namespace
    cores: int
    tools: Path  # the built llama.cpp tools' folder
    work: Path
    tokenizer: dict
    clocks: dict[int, float]  # busy cores (1 and all) -> the clock
    cpu: str
    date: str


def synthetic_run(description: str, default_out: Path, repetitions: int, prefix: str,
                  argv: list[str] | None) -> SyntheticRun:
    """The command line every fold-C script of synthetic models takes (--out, --portable, --work, --repetitions), the
    built tools, a scratch folder, SmolLM2's tokenizer and the clock at 1 and at all busy cores, logged."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--portable", action="store_true", help="the GGML_NATIVE=OFF (AVX2) build, as llama-cpp-python is installed")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder for the models (default: a temporary one)")
    parser.add_argument("--repetitions", type=int, default=repetitions)
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    tools = build_tools(None, None, args.portable)
    work = args.work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = smollm2_tokenizer()
    clocks = {1: clock_hz(work, 1), cores: clock_hz(work, cores)}
    log(f"clock: {clocks[1] / 1e9:.3f} GHz at 1 busy core, {clocks[cores] / 1e9:.3f} GHz at {cores}")
    return SyntheticRun(args, cores, tools, work, tokenizer, clocks, cpu_name(), datetime.date.today().isoformat())


def clock_hz(work: Path, copies: int) -> float:
    """The core clock with ``copies`` cores busy: dependent adds retire one per cycle (`speedlimit.verify.clock`,
    the probe `speedlimit verify` times too; 3e9 adds, about a second)."""
    binary = work / "clock"
    # a reused --work folder may hold the binary of an older chain (the add-immediate one): rebuild when it differs
    if not binary.exists() or not (work / "clock.c").exists() or (work / "clock.c").read_text() != CLOCK_C:
        compile_probe(work)
    return run_probe(binary, copies, iterations=300_000_000)


def cpu_name() -> str:
    """The CPU's model name as Linux reports it (else what Python's platform module knows)."""
    fallback = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), fallback)
    except OSError:
        return fallback


def fastest_tok_s(result: dict) -> float:
    """A llama-bench result's fastest repetition: on a shared machine the others carry the neighbours' interference,
    and the kernel's own rate is what is wanted (the mean is kept beside it)."""
    return max(float(v) for v in result.get("samples_ts") or [result["avg_ts"]])


def build_label(result: dict) -> str:
    """The llama.cpp a llama-bench result names: ``<commit> build <number>``."""
    return f"{result.get('build_commit', '')} build {result.get('build_number', '')}"


def bench(binary: Path, model: Path, args: list[str]) -> list[dict]:
    out = subprocess.run([str(binary), "-m", str(model), "-o", "json", *args],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--types", default=",".join(t.lower() for t in TYPES), help="llama-quantize types, comma-separated")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder for the models (default: a temporary one)")
    parser.add_argument("--build", type=Path, default=None, help="build folder for the tools (default: cached)")
    parser.add_argument("--resume", action="store_true", help="keep the types --out already holds, run the rest")
    parser.add_argument("--llama-cpp-python", dest="version", default=None, metavar="VERSION",
                        help="measure the llama.cpp vendored in this llama-cpp-python sdist (default: the pinned one)")
    parser.add_argument("--portable", action="store_true",
                        help="build as llama-cpp-python is installed (GGML_NATIVE=OFF: AVX2, no AVX-512) instead of Zen 4's kernels")
    args = parser.parse_args(argv)
    wanted = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TYPES]
    if unknown:
        parser.error(f"unknown type(s) {', '.join(unknown)}; known: {', '.join(t.lower() for t in TYPES)}")
    cores = os.cpu_count() or 1
    tools = build_tools(args.build, args.version, args.portable)
    work = args.work or Path(tempfile.mkdtemp(prefix="speedlimit-kernels-"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = smollm2_tokenizer()
    macs: dict[str, tuple[int, int]] = {}
    for shape in (*DECODE_SHAPES, PREFILL_SHAPE):
        base = work / f"{shape.name}-f16.gguf"
        log(f"writing {base}")
        macs[shape.name] = write_model(base, shape, tokenizer)  # deterministic (seed 0): rewriting changes nothing
        write_imatrix(work / f"{shape.name}.imatrix", shape)
    clocks = {1: clock_hz(work, 1), cores: clock_hz(work, cores)}
    log(f"clock: {clocks[1] / 1e9:.3f} GHz at 1 busy core, {clocks[cores] / 1e9:.3f} GHz at {cores}")
    version = subprocess.run([str(tools / "llama-bench"), "--version"], capture_output=True, text=True)
    build = (version.stdout + version.stderr).strip().splitlines()[0] if (version.stdout + version.stderr).strip() else ""
    rows = []
    date = datetime.date.today().isoformat()
    cpu = cpu_name()
    # (shape, llama-bench arguments): the decode kernel in cache at 1 and all threads, at two widths; the prefill GEMM
    # at all threads; and, for reference, the same matvec streaming the 8B matrices from DRAM at one thread
    decode_args = ["-p", "0", "-n", "512", "-r", "10", "-t", f"1,{cores}"]
    runs = ((DECODE_SHAPES[0], decode_args), (DECODE_SHAPES[1], decode_args),
            (PREFILL_SHAPE, ["-p", "512", "-n", "0", "-r", "3", "-t", str(cores)]),
            (PREFILL_SHAPE, ["-p", "0", "-n", "32", "-r", "3", "-t", "1"]))
    if args.resume and args.out.exists():
        with open(args.out, newline="") as f:
            rows = [row for row in csv.DictReader(f) if row["quantize"] in wanted]
        done = {row["quantize"] for row in rows}
        log(f"resuming: {', '.join(sorted(done))} already in {args.out}")
        wanted = [quant for quant in wanted if quant not in done]
    for quant in wanted:
        for shape, bench_args in runs:
            model = work / f"{shape.name}-{quant.lower()}.gguf"
            if not model.exists():
                log(f"quantizing {shape.name} to {quant}")
                command = [str(tools / "llama-quantize"), "--pure"]
                if quant in NEEDS_IMATRIX:
                    command += ["--imatrix", str(work / f"{shape.name}.imatrix")]
                partial = model.with_suffix(".part")  # renamed when complete: an interrupted run leaves no model
                subprocess.run(command + [str(work / f"{shape.name}-f16.gguf"), str(partial), quant, str(cores)],
                               check=True, capture_output=True)
                partial.rename(model)
            per_token, head = macs[shape.name]
            for result in bench(tools / "llama-bench", model, bench_args):
                threads, prompt, output = int(result["n_threads"]), int(result["n_prompt"]), int(result["n_gen"])
                tok_s = fastest_tok_s(result)
                run_macs = (prompt * (per_token - head) + head) / prompt if prompt else per_token
                clock = clocks[1] if threads == 1 else clocks[cores]
                rows.append({
                    "type": TYPES[quant], "quantize": quant, "model": shape.name,
                    "test": f"pp{prompt}" if prompt else f"tg{output}", "threads": threads,
                    "tok_s": f"{tok_s:.3f}", "tok_s_mean": f"{float(result['avg_ts']):.3f}",
                    "tok_s_stdev": f"{float(result['stddev_ts']):.3f}", "repetitions": len(result.get("samples_ts") or [1]),
                    "macs_per_token": int(round(run_macs)), "clock_hz": f"{clock:.4g}",
                    "macs_per_cycle_per_thread": f"{tok_s * run_macs / (threads * clock):.4f}",
                    "model_bytes": int(result["model_size"]), "cpu": cpu, "cores": cores,
                    "llama_cpp": build_label(result),
                    "date": date,
                })
        log(f"  {quant}: " + ", ".join(f"{r['model']} {r['test']} t{r['threads']} {r['tok_s']} tok/s"
                                        for r in rows if r["quantize"] == quant))
        write_rows(args.out, rows)  # after every type: an interrupted run keeps what it measured
    log(f"wrote {len(rows)} rows to {args.out} ({build})")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
