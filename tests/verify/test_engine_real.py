"""The real engine: llama-cpp-python generates from the bundled SmolLM2-135M, and verify's figures are physical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedlimit.bundled import default_gguf_path
from speedlimit.errors import SpeedlimitError
from speedlimit.verify import engine
from speedlimit.verify.membench import cpu_count

pytestmark = pytest.mark.engine


def test_generation_does_not_crash() -> None:
    """64 greedy tokens in a child process: a segfaulting llama-cpp-python build fails here with its signal."""
    try:
        report = engine.preflight(default_gguf_path(), n_threads=2, tokens=64)
    except SpeedlimitError as error:
        pytest.fail(f"llama-cpp-python could not generate 64 tokens: {error}")
    assert report["tokens"] == 64
    assert report["text"].strip(), "the model generated only whitespace"
    assert report["decode_s"] > 0


@pytest.fixture(scope="module")
def verify_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    from tests.verify.conftest import run_cli

    out = tmp_path_factory.mktemp("verify") / "verify.json"
    done = run_cli(["verify", "--prompt-tokens", "64", "--decode-tokens", "16", "--runs", "2", "--contexts", "64,512",
                    "--array-mib", "64", "--json", "--out", str(out)])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), json.loads(out.read_text())


def test_verify_structure(verify_run: tuple[dict, dict]) -> None:
    printed, saved = verify_run
    assert printed == saved and saved["complete"] is True
    for key in ("measured_bandwidth_Bps", "measured_flops", "decode_tok_s_measured", "decode_tok_s_predicted",
                "efficiency", "prefill_tok_s_measured", "ttft_s_measured", "ttft_s_predicted", "bytes_per_token", "regime"):
        assert isinstance(saved[key], (int, float, str)) and saved[key] is not None, key
    cores = cpu_count()
    engine_info = saved["engine"]
    assert engine_info["name"] == "llama-cpp-python" and engine_info["version"] == "0.3.36"
    assert engine_info["threads"] == saved["threads"] == cores
    assert engine_info["n_ctx"] >= 512 + 2 * 16
    assert saved["model"]["file_type"] == "q4_1" and saved["model"]["path"] == str(default_gguf_path().resolve())
    contexts = [p for p in saved["decode"] if p["kind"] == "context"]
    assert [p["context_start"] for p in contexts] == [64, 512]
    assert all(len(p["runs_tok_s"]) == 2 for p in saved["decode"])
    threads = {p["threads"] for p in saved["decode"] if p["kind"] == "base"}
    assert threads == ({cores, 1} if cores > 1 else {1})


def test_verify_is_physical(verify_run: tuple[dict, dict]) -> None:
    _, result = verify_run
    bandwidth, flops = result["measured_bandwidth_Bps"], result["measured_flops"]
    assert 1e8 < bandwidth < 1e12, "bandwidth outside 0.1 GB/s .. 1 TB/s"
    assert 1e8 < flops < 1e14, "fp32 matmul outside 0.1 GFLOP/s .. 100 TFLOP/s"
    assert 0 < result["efficiency"] <= 1.2
    measured, bytes_per_token = result["decode_tok_s_measured"], result["bytes_per_token"]
    # a decode step streams the weights: tokens/s cannot beat bandwidth ÷ bytes (20 % slack for noise and caches)
    assert measured <= 1.2 * bandwidth / bytes_per_token
    # ... and the reported efficiency is exactly that: measured = efficiency × roofline limit
    assert measured == pytest.approx(result["efficiency"] * result["decode_tok_s_limit"], rel=1e-9)
    memory_roof = bandwidth / bytes_per_token
    compute_roof = flops / result["flops_per_token"]
    assert result["decode_tok_s_limit"] == pytest.approx(min(memory_roof, compute_roof), rel=0.02)
    assert result["regime"] == ("memory" if memory_roof < compute_roof else "compute")
    assert 90e6 < bytes_per_token < 130e6  # SmolLM2-135M Q4_1: ~98 MB of weights + a small KV cache
    contexts = [p for p in result["decode"] if p["kind"] == "context"]
    assert contexts[1]["bytes_per_token"] > contexts[0]["bytes_per_token"]  # the KV-cache term shows
    for point in result["decode"]:
        assert 0 < point["efficiency"] <= 1.5, point
    assert result["prefill_tok_s_measured"] > 0 and result["ttft_s_measured"] > 0


def test_verify_prices_the_kernels_of_the_build_it_ran(verify_run: tuple[dict, dict]) -> None:
    """The engine's own system info picks the measured kernel rates (README's install line builds llama-cpp-python
    with GGML_NATIVE=OFF: AVX2), priced at the clock verify measured; where either is missing it says why."""
    from speedlimit.verify.run import kernel_profile_for

    _, result = verify_run
    clock, engine_info = result["machine"]["clock"], result["engine"]
    profile, _ = kernel_profile_for(engine_info["system_info"], result["machine"]["cpu_vendor"])
    if clock["hz_one_core"] is None:
        assert engine_info["kernel_profile"] is None and "clock not measured" in engine_info["kernel_profile_basis"]
        return
    assert 5e8 < clock["hz_all_busy"] and clock["hz_one_core"] < 7e9 and clock["busy_cores"] == result["threads"]
    assert engine_info["kernel_profile"] == profile and engine_info["kernel_profile_basis"]
    if profile is not None:
        assert "kernels" in result["default_efficiency"]["basis"] and "GHz" in result["default_efficiency"]["basis"]


def test_verify_times_several_sequences_decoding_together(verify_run: tuple[dict, dict], tmp_path: Path) -> None:
    """The batched series: 1, 2 and 4 sequences at the sweep's first context, each step's work as the estimator
    counts it, and calibrate fits the per-sequence cost from it."""
    from tests.verify.conftest import run_cli

    _, result = verify_run
    series = result["batched_decode"]
    assert [(p["sequences"], p["context"], p["threads"]) for p in series] == [(n, 64, result["threads"]) for n in (1, 2, 4)]
    bandwidth = result["measured_bandwidth_Bps"]
    for point in series:
        assert len(point["steps_s"]) == 16 and point["step_s"] > 0 and point["step_s_predicted"] > 0
        assert point["step_s"] >= point["step_bytes"] / (1.2 * bandwidth)  # no step beats the weights' stream
    assert series[0]["step_bytes"] < series[1]["step_bytes"] < series[2]["step_bytes"]  # each sequence's KV cache
    assert series[2]["step_s"] > series[0]["step_s"]  # four sequences' arithmetic is not free
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(result))
    done = run_cli(["calibrate", str(path), "--out", str(tmp_path / "box.toml"), "--json", "--force"])
    assert done.returncode == 0, done.stderr
    fit = json.loads(done.stdout)
    # the base decode, the two contexts, the three batched steps and the prefill, all in the fit (or left out by name)
    assert fit["points"] + len(fit["excluded"]) == 7
    # the joint fit ran on the series (a per-sequence cost, which may come out 0 where the steps' arithmetic, which
    # grows with the sequences too, explains their growth: the two are told apart by the prefill point alone)
    assert fit["sequence_overhead_s"] is not None and fit["sequence_overhead_s"] >= 0


@pytest.mark.parametrize("delay_s", [0.2, 1.0, 2.5])
def test_sigint_during_verify_keeps_a_partial_result(tmp_path: Path, delay_s: float) -> None:
    """A real Ctrl-C while llama.cpp runs: no "Exception ignored ... llama_log_callback", no minute of running on,
    the partial result on disk, exit 130 (issue 10)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "verify.json"
    process = subprocess.Popen([sys.executable, "-m", "speedlimit.cli", "verify", "--quick", "--no-progress", "--array-mib", "8",
                                "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:  # until the engine passed its pre-flight
        try:
            if json.loads(out.read_text()).get("engine"):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    time.sleep(delay_s)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    stopped_after = time.monotonic() - sent
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stopped_after < 30, f"verify ran on for {stopped_after:.0f} s after the signal"
    assert stderr.strip().splitlines()[-1].startswith("interrupted by SIGINT"), stderr
    result = json.loads(out.read_text())
    assert result["complete"] is False and result["interrupted"] == "SIGINT"
    assert result["measured_bandwidth_Bps"] > 0 and result["engine"]["name"] == "llama-cpp-python"
