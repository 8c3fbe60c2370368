"""Real validation of `speedlimit simulate`: bench a real engine serving the bundled SmolLM2-135M GGUF at several
concurrencies on this machine, replay each run's workload through the simulator, print measured ÷ predicted.

Run (from the repository root, with the real engine installed):

    python benchmarks/validate_simulate.py --engine llama-server --hardware simval-verify --out /tmp/val-ls
    python benchmarks/validate_simulate.py --engine llama-cpp-python --hardware simval-verify --out /tmp/val-lcp

``--hardware`` is this machine: a profile from `speedlimit verify --quick --out v.json && speedlimit calibrate v.json
--name NAME`. Two predictions per point:

- **verify profile**: the simulator on the calibrated profile alone (nothing from the server);
- **engine profile**: the same, plus the engine's own per-step cost and prefill rate fitted on the concurrency-1
  run only (TPOT p50 → per-step overhead; TTFT p50 → FLOP/s efficiency), so concurrency 2, 4 and 8 are predictions
  of how the engine behaves under load, held out from the fit.

The engines: llama.cpp's C++ `llama-server` (`-t 2 --parallel 8 -c 8192 --metrics`: continuous batching, 8 slots,
8,192 KV cells, n_batch 2,048), simulated as ``continuous,max_seqs=8,max_batched_tokens=2048,kv_tokens=8192,
slot_streams=1`` (``--parallel 8`` gives each slot its own KV stream: `speedlimit simulate --slot-streams`); and
llama-cpp-python's server (one request at a time; prompts in n_batch = 512 calls), simulated as ``serial``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

LLAMA_SERVER = Path(os.environ.get("SPEEDLIMIT_LLAMA_SERVER",
                                   "/root/.cache/speedlimit/llama-server/0.3.36/build/bin/llama-server"))
ENGINE_SPECS = {"llama-server": "continuous,max_seqs=8,max_batched_tokens=2048,kv_tokens=8192,slot_streams=1",
                "llama-cpp-python": "serial"}
WARMUP_REQUESTS = 1  # bench's --warmup before each point


def engine_spec(engine: str, fresh_server: bool, summary: Any = None) -> str:
    """The replay's scheduler for ``engine``. llama-server's slots as the point began: the ones its /slots said
    earlier requests had used (bench records them: `EngineConfig.slot_history`), else, on a fresh server, the top
    slot the warm-up request took (so the server's LRU hands the run the never-used ones first:
    `EngineConfig.slots_used`)."""
    from speedlimit.simulator.api import slot_history_option

    history = getattr(getattr(summary, "server", None), "slot_history", None)
    if engine == "llama-server" and history:
        return f"{ENGINE_SPECS[engine]},{slot_history_option(history)}"
    if engine == "llama-server" and fresh_server:
        return f"{ENGINE_SPECS[engine]},slots_used={WARMUP_REQUESTS}"
    return ENGINE_SPECS[engine]


COMPARED = (("TTFT p50", "ttft_s", "p50"), ("TPOT p50", "tpot_s", "p50"), ("E2E p50", "e2e_s", "p50"),
            ("TTFT p90", "ttft_s", "p90"), ("output tok/s", "output_tok_s", None))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Compute threads per engine on the 2-core machines this runs on. llama-cpp-python's server streams each token from
# a Python event loop that needs a core of its own: with 2 compute threads beside it and the bench client, its
# per-token time on the dev VM took one of two values from run to run (8-9 ms or 25-29 ms; 2026-12-05, see
# benchmarks/README.md, "Serving simulator against real engines"), whatever the model, so a fit at one concurrency
# did not carry to another; with 1 it stays within 12-17 ms. llama-server streams from C++ threads and keeps 2.
DEFAULT_THREADS = {"llama-server": 2, "llama-cpp-python": 1}


def server_command(engine: str, gguf: Path, port: int, threads: int) -> list[str]:
    if engine == "llama-server":
        return [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                "--parallel", "8", "-c", "8192", "--metrics"]
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "2048", "--n_threads", str(threads), "--interrupt_requests", "False"]


class Server:
    """A real engine on 127.0.0.1, started and stopped by this process."""

    def __init__(self, engine: str, gguf: Path, threads: int, timeout_s: float = 180) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = tempfile.NamedTemporaryFile(prefix=f"{engine}_", suffix=".log", delete=False)
        self.process = subprocess.Popen(server_command(engine, gguf, self.port, threads), stdout=self.log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{engine} exited: {Path(self.log.name).read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{engine} did not answer within {timeout_s:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_bench(url: str, out: Path, concurrencies: list[int], requests: int, prompt: int, output: int,
              seed: int, engine: str, attempts: int = 3) -> None:
    """One bench run per concurrency (each retried: on a loaded machine llama-server sometimes drops a connection
    that bench's tokenizer probe is using, which ends that bench invocation). Each point gets its own seed, so no
    prompt repeats across points, and llama-server is asked not to reuse a slot's cached prompt (its default
    ``cache_prompt`` made some TTFTs 20 ms: a prefix-cache hit the simulator does not model)."""
    for concurrency in concurrencies:
        command = [sys.executable, "-m", "speedlimit.cli", "bench", "--url", url, "--concurrency", str(concurrency),
                   "--requests", str(requests), "--prompt-tokens", str(prompt), "--output-tokens", str(output),
                   "--seed", str(seed + concurrency), "--out", str(out / f"concurrency_{concurrency}"),
                   "--no-progress", "--warmup", str(WARMUP_REQUESTS)]
        if engine == "llama-server":
            command += ["--extra-body", '{"cache_prompt": false}']
        for attempt in range(attempts):
            done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ})
            if done.returncode == 0:
                break
            print(f"bench at concurrency {concurrency} failed (attempt {attempt + 1}): "
                  f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}", file=sys.stderr)
        else:
            raise RuntimeError(f"bench at concurrency {concurrency} failed {attempts} times")


def bench_points(engine: str, gguf: Path, threads: int, out: Path, concurrencies: list[int], requests: int, prompt: int,
                 output: int, seed: int, fresh_server: bool = False) -> None:
    """Bench every concurrency against one server, or (``fresh_server``) each against a server of its own."""
    for group in ([[c] for c in concurrencies] if fresh_server else [concurrencies]):
        with Server(engine, gguf, threads) as server:
            run_bench(server.url, out, group, requests, prompt, output, seed, engine)


def _bisect(predict, target: float, low: float = 1e-4, high: float = 1.0) -> float:
    """The value in [low, high] (log scale) where the decreasing function ``predict`` meets ``target``."""
    for _ in range(50):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if predict(mid) > target else (low, mid)
    return math.sqrt(low * high)


def fit_engine_profile(summary, model: Any, hardware: Any) -> dict[str, float]:
    """The engine as this machine runs it, from the concurrency-1 run only: the FLOP/s efficiency that makes the
    prefill last the measured TTFT p50, and the bandwidth efficiency that makes a decode step last the measured
    TPOT p50 (if even 100% is too slow, the rest is per-step overhead: the engine's and its HTTP/SSE stack's);
    alternated a few times, since each step's time has both terms."""
    from speedlimit.estimator import estimate

    prompt = round(summary.prompt_tokens / summary.completed)
    output = round(summary.output_tokens / summary.completed)
    tpot, ttft = summary.tpot_s.p50, summary.ttft_s.p50

    def run(bw: float, flops: float, overhead: float):
        return estimate(model, hardware, prompt=prompt, output=output, step_overhead_s=overhead, bw_efficiency=bw,
                        flops_efficiency=flops)

    bw, flops, overhead = 1.0, 1.0, 0.0
    for _ in range(4):
        flops = _bisect(lambda f: run(bw, f, overhead).ttft_s, ttft)
        fastest = run(1.0, flops, 0.0).itl_s
        if fastest >= tpot:
            bw, overhead = _bisect(lambda b: run(b, flops, 0.0).itl_s, tpot), 0.0
        else:
            bw, overhead = 1.0, min(tpot - fastest, 1.0)
    return {"bw_efficiency": bw, "step_overhead": overhead, "flops_efficiency": flops}


def hardware_arg(text: str) -> Any:
    """A hardware name or profile, or "BANDWIDTH,FLOPS" (bytes/s, FLOP/s) for custom hardware."""
    if "," in text:
        from speedlimit.hardware import custom_hardware

        bandwidth, flops = (float(x) for x in text.split(","))
        return custom_hardware(bandwidth, flops)
    return text


def replay_point(records, summary, model, hardware: str, spec: str, profile: dict[str, float] | None):
    from speedlimit.simulator.api import engine_config, parse_engine_spec, replay_workload, resolve, run_workload

    options = parse_engine_spec(spec)
    profile = profile or {}
    step = resolve(model, hardware, step_overhead_s=profile.get("step_overhead"),
                   bw_efficiency=profile.get("bw_efficiency"), flops_efficiency=profile.get("flops_efficiency"))
    config = engine_config(options.pop("mode"), step=step, **options)
    return run_workload(step, config, replay_workload(records, summary.offered_load)).summary


def figure(summary, metric: str, stat: str | None) -> float | None:
    value = getattr(summary, metric)
    return getattr(value, stat) if stat else value


def validate(engine: str, hardware: str, out: Path, concurrencies: list[int], requests: int, prompt: int, output: int,
             seed: int = 1, bench: bool = True, basis: Any = None, threads: int | None = None,
             fresh_server: bool = False) -> dict[str, Any]:
    """Bench ``concurrencies`` against one server (``fresh_server``: a server of its own for each, so no point
    inherits the slots the points and warm-ups before it left busy or scattered, which the replay of one point cannot
    know), replay each point, and return measured ÷ predicted."""
    from speedlimit.artifacts import iter_records, load_summary
    from speedlimit.bundled import default_gguf_path
    from speedlimit.catalog import resolve_model

    gguf = default_gguf_path()
    threads = threads or DEFAULT_THREADS[engine]
    if bench:
        bench_points(engine, gguf, threads, out, concurrencies, requests, prompt, output, seed, fresh_server)
    model = resolve_model(str(gguf))
    points = {c: load_summary(out / f"concurrency_{c}" / "summary.json") for c in concurrencies}
    records = {c: list(iter_records(out / f"concurrency_{c}" / "requests.jsonl")) for c in points}
    first = min(points)
    basis = hardware if basis is None else basis
    profile = fit_engine_profile(points[first], model, basis)
    rows = []
    for concurrency, measured in sorted(points.items()):
        for label, base, profile_used in (("verify profile", hardware, None), ("engine profile", basis, profile)):
            spec = engine_spec(engine, fresh_server, measured)
            predicted = replay_point(records[concurrency], measured, model, base, spec, profile_used)
            row = {"concurrency": concurrency, "prediction": label, "failed": measured.failed, "spec": spec}
            for name, metric, stat in COMPARED:
                m, p = figure(measured, metric, stat), figure(predicted, metric, stat)
                row[name] = {"measured": m, "predicted": p, "ratio": m / p if m is not None and p else None}
            rows.append(row)
    return {"engine": engine, "hardware": hardware, "basis": basis, "spec": engine_spec(engine, fresh_server),
            "engine_profile": profile,
            "workload": {"prompt": prompt, "output": output, "requests": requests, "seed": seed},
            "threads": threads, "fresh_server": fresh_server, "rows": rows}


def print_result(result: dict[str, Any]) -> None:
    profile = result["engine_profile"]
    fresh = "; a fresh server per concurrency" if result.get("fresh_server") else ""
    print(f"{result['engine']} ({result['spec']}; server compute threads: {result['threads']}{fresh}) on "
          f"{getattr(result['hardware'], 'name', result['hardware'])}; workload {result['workload']}")
    print(f"engine profile fitted at concurrency 1: bandwidth efficiency {profile['bw_efficiency']:.3f}, step overhead "
          f"{profile['step_overhead'] * 1e3:.2f} ms, FLOP/s efficiency {profile['flops_efficiency']:.3f}")
    histories = {row["concurrency"]: row["spec"].partition("slot_history=")[2] for row in result["rows"]
                 if "slot_history=" in row.get("spec", "")}
    if histories:  # llama-server's /slots as each point began: the slots used before it, least recently used first
        print("slots used before each point (llama-server's /slots, least recently used first): "
              + "; ".join(f"C{c}: {h.replace('/', ', ')}" for c, h in sorted(histories.items())))
    names = [name for name, _, _ in COMPARED]
    print("| C | prediction | " + " | ".join(f"{n} meas / pred (÷)" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for row in result["rows"]:
        cells = []
        for name in names:
            cell = row[name]
            scale, unit = (1e3, "ms") if name != "output tok/s" else (1.0, "")
            if cell["measured"] is None or cell["predicted"] is None:
                cells.append("-")
            else:
                cells.append(f"{cell['measured'] * scale:,.1f} / {cell['predicted'] * scale:,.1f} "
                             f"({cell['ratio']:.2f})")
        print(f"| {row['concurrency']} | {row['prediction']} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(ENGINE_SPECS), required=True)
    parser.add_argument("--hardware", required=True, help="calibrated profile of this machine, or BANDWIDTH,FLOPS")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--basis", help="hardware the engine profile's efficiencies refer to (default: --hardware)")
    parser.add_argument("--no-bench", action="store_true", help="re-analyse an existing --out directory")
    parser.add_argument("--threads", type=int, help="the server's compute threads (default: llama-server 2, "
                                                     "llama-cpp-python 1; see DEFAULT_THREADS)")
    parser.add_argument("--fresh-server", action="store_true",
                        help="start a new server for each concurrency (no slot history from the points before); with "
                             "--no-bench: the runs did")
    args = parser.parse_args()
    result = validate(args.engine, hardware_arg(args.hardware), args.out, [int(c) for c in args.concurrency.split(",")],
                      args.requests, args.prompt, args.output, bench=not args.no_bench,
                      basis=hardware_arg(args.basis) if args.basis else None, threads=args.threads,
                      fresh_server=args.fresh_server)
    (args.out / "validation.json").write_text(json.dumps(result, indent=2, default=str))
    print_result(result)


if __name__ == "__main__":
    main()
