"""The device-probe scripts (benchmarks/cpu_thread_scaling.py, benchmarks/gpu_step_probe.py): their arithmetic and
their refusals, without llama.cpp's tools or a GPU (the runs themselves are recorded in benchmarks/accuracy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=120)


def test_the_thread_sweep_needs_its_tools() -> None:
    done = _run("cpu_thread_scaling.py")
    assert done.returncode == 2 and "--tools is required" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args, needle", [(["--threads", "two"], "thread counts, comma-separated"),
                                          (["--threads", "4,8"], "must include 2"),
                                          (["--types", "q9_9"], "unknown type")])
def test_the_thread_sweep_refuses_bad_arguments_in_one_line(args: list[str], needle: str) -> None:
    done = _run("cpu_thread_scaling.py", "--tools", "/nonexistent", *args)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr


def test_the_thread_sweep_counts_its_macs_as_the_kernel_rates_do() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import cpu_kernel_rates as kernels
    finally:
        sys.path.remove(str(BENCHMARKS))
    shape = kernels.PREFILL_SHAPE
    body = sum(rows * columns for _, (rows, columns) in kernels.matrices(shape))
    assert body == 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096)  # two Llama-3.1-8B layers
    # the files' macs_per_token: the layers per token plus the head once per 512-token prompt
    head = 49152 * 4096
    assert round((512 * body + head) / 512) == 436600832


def test_the_gpu_probe_refuses_without_torch_or_cuda_in_one_line() -> None:
    done = _run("gpu_step_probe.py", "--out", "/dev/null")
    try:
        import torch  # noqa: F401
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("a CUDA device is here: the probe would run")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "gpu_step_probe:" in done.stderr


def test_the_simulator_validation_can_bench_each_concurrency_on_a_fresh_server(monkeypatch, tmp_path) -> None:
    """`validate_simulate.py --fresh-server`: one server per concurrency, so no point inherits the slots the points
    before it left scattered (a replay of one point starts with fresh slots); without it one server serves them all."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import validate_simulate
    finally:
        sys.path.remove(str(BENCHMARKS))
    servers: list[list[int]] = []

    class FakeServer:
        url = "http://127.0.0.1:1/v1"

        def __init__(self, *args) -> None:
            servers.append([])

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    monkeypatch.setattr(validate_simulate, "Server", FakeServer)
    monkeypatch.setattr(validate_simulate, "run_bench", lambda url, out, group, *rest: servers[-1].extend(group))
    validate_simulate.bench_points("llama-server", tmp_path / "m.gguf", 2, tmp_path, [1, 2, 4], 8, 128, 32, 1,
                                   fresh_server=True)
    assert servers == [[1], [2], [4]]
    servers.clear()
    validate_simulate.bench_points("llama-server", tmp_path / "m.gguf", 2, tmp_path, [1, 2, 4], 8, 128, 32, 1)
    assert servers == [[1, 2, 4]]


def test_the_conversation_dataset_is_bench_s_dataset_and_the_same_for_a_seed(tmp_path: Path) -> None:
    """benchmarks/make_conversations.py writes what `bench --dataset` reads: one request per user turn, each turn's
    messages holding the turns before it; the same seed, the same file."""
    from speedlimit.bench.workload import load_dataset

    done = _run("make_conversations.py", "--count", "3", "--turns", "2", "--words", "10")
    assert done.returncode == 0 and _run("make_conversations.py", "--count", "3", "--turns", "2",
                                         "--words", "10").stdout == done.stdout
    path = tmp_path / "conv.jsonl"
    path.write_text(done.stdout)
    rows = load_dataset(path)
    assert [(row["_conversation"], len(row["messages"])) for row in rows] == [(1, 1), (1, 3), (2, 1), (2, 3),
                                                                              (3, 1), (3, 3)]
    assert rows[1]["messages"][0] == rows[0]["messages"][0] and rows[0]["output_tokens"] == 32
