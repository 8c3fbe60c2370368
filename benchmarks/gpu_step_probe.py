"""Probe one NVIDIA GPU's step-cost terms through PyTorch: fold C of the accuracy set (the project's own runs).

The engine profiles take their GPU terms from public figures measured on other GPUs (cuBLAS GEMM fractions on an A100
and an H100, a replayed CUDA graph's cost on an H100). Where a GPU is at hand, this script measures the same terms on
it, with the library kernels the PyTorch-based engines call:

- `copy`: a device-to-device copy of 4 GiB, bytes read plus written per second (the memory roof a kernel can reach);
- `gemm_bf16` / `gemm_fp8`: one Llama-3.1-8B layer's four matmuls (qkv 6144x4096, o 4096x4096, gate+up
  28672x4096, down 4096x14336) at M tokens, through `torch.nn.functional.linear` (cuBLAS) in bf16 and through
  `torch._scaled_mm` (cuBLASLt, per-tensor scales) in fp8 e4m3: FLOP/s, and the weight bytes per second;
- `eager_op` / `graph_op`: a chain of 2,000 dependent one-element adds, launched one by one from Python (what an
  engine without CUDA graphs pays per kernel) and replayed as one captured CUDA graph (what one with them pays).

Timings are CUDA-event means over repeated runs after warm-ups; the JSON records the GPU, driver and torch version.

    python benchmarks/gpu_step_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

LAYER = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def timed_s(torch, fn, repeats: int, warmups: int = 3) -> float:
    for _ in range(warmups):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def probe_copy(torch) -> dict:
    n = 4 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    seconds = timed_s(torch, lambda: dst.copy_(src), 10)
    return {"bytes": 2 * n, "seconds": seconds, "bytes_per_s": 2 * n / seconds}


def probe_gemm(torch, dtype: str) -> list[dict]:
    weights = {}
    for name, (n, k) in LAYER.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        weights[name] = w.to(torch.float8_e4m3fn) if dtype == "fp8" else w
    one = torch.ones((), device="cuda", dtype=torch.float32)
    rows = []
    for m in TOKENS:
        if dtype == "fp8" and m % 16:
            continue  # cuBLASLt's fp8 GEMM wants every dimension a multiple of 16
        xs = {name: (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1) for name, (_, k) in LAYER.items()}
        if dtype == "fp8":
            xs = {name: x.to(torch.float8_e4m3fn) for name, x in xs.items()}

            def layer():
                for name, w in weights.items():
                    torch._scaled_mm(xs[name], w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            def layer():
                for name, w in weights.items():
                    torch.nn.functional.linear(xs[name], w)
        repeats = max(5, min(200, int(2e4 / m)))
        seconds = timed_s(torch, layer, repeats)
        flops = sum(2 * m * n * k for n, k in LAYER.values())
        weight_bytes = sum(n * k for n, k in LAYER.values()) * (1 if dtype == "fp8" else 2)
        rows.append({"tokens": m, "seconds": seconds, "flop_per_s": flops / seconds,
                     "weight_bytes_per_s": weight_bytes / seconds})
    return rows


def probe_launch(torch) -> dict:
    x = torch.zeros(1, device="cuda")
    chain = 2000

    def eager():
        for _ in range(chain):
            x.add_(1.0)
    eager_s = timed_s(torch, eager, 5, warmups=2) / chain
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        eager()
    graph_s = timed_s(torch, graph.replay, 20) / chain
    return {"kernels": chain, "eager_op_s": eager_s, "graph_op_s": graph_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_step_probe.json"))
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_step_probe: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_step_probe: no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    result: dict = {"gpu": props.name, "sms": props.multi_processor_count, "memory_bytes": props.total_memory,
                    "torch": torch.__version__, "cuda": torch.version.cuda, "date": datetime.date.today().isoformat()}
    for name, probe in (("copy", probe_copy), ("launch", probe_launch), ("gemm_bf16", lambda t: probe_gemm(t, "bf16")),
                        ("gemm_fp8", lambda t: probe_gemm(t, "fp8"))):
        try:
            result[name] = probe(torch)
        except Exception as error:  # noqa: BLE001 -- one probe's failure must not lose the others' figures
            result[name] = {"error": f"{type(error).__name__}: {error}"}
        args.out.write_text(json.dumps(result, indent=1))
        print(name, json.dumps(result[name])[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
