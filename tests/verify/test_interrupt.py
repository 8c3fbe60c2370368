"""`speedlimit verify` on SIGINT/SIGTERM (issue 10): it stops between measurements, writes what it measured to --out
marked ``interrupted`` (not ``complete``), says where it is and exits 130; a second signal quits at once.

The child runs the real verify code (bandwidth, matmul, orchestration, writing, the CLI) with a fake engine: each
fake decode prints MEASURING and sleeps, so the test knows when a measurement is under way. The same with the real
engine is `test_engine_real.py::test_sigint_during_verify_keeps_a_partial_result`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

FAKE_ENGINE = """
import sys, time
import speedlimit.verify.engine as engine
import speedlimit.verify.run as run
from speedlimit.catalog import catalog_model

engine.import_llama_cpp = lambda: None
engine.engine_version = lambda: "fake"
engine.engine_system_info = lambda: "fake"
engine.preflight = lambda *args, **kwargs: {"tokens": 16, "prefill_s": 0.01, "decode_s": 0.1}
DECODE_S = float(sys.argv.pop())
FAIL_ABOVE = 2  # the fake engine cannot hold more sequences: the batched series stops there, the run goes on

class FakeRunner:
    def __init__(self, path, n_ctx, n_threads, n_batch=512):
        self.n_tokens = 0
    def prefill(self, count):
        self.n_tokens = count
        return 0.05
    def decode(self, count):
        print("MEASURING", file=sys.stderr, flush=True)
        time.sleep(DECODE_S)
        self.n_tokens += count
        return DECODE_S, [0] * count
    def reset(self):
        self.n_tokens = 0
    def extend_to(self, context):
        self.n_tokens = max(self.n_tokens, context)
        return 0.0
    def batched_decode(self, sequences, context, steps):
        if sequences > FAIL_ABOVE:
            from speedlimit.errors import SpeedlimitError
            raise SpeedlimitError(f"llama.cpp could not make a context for {sequences} sequences")
        return [0.01 * sequences] * steps
    def close(self):
        pass

engine.LlamaRunner = FakeRunner
arch = catalog_model("smollm2-135m")
run.load_model_info = lambda path: (arch, run.ModelInfo(path=str(path), name="fake", file_bytes=10**8,
                                                        context_length=8192, kv_bytes_per_token=1e4))
"""


def start(args: list[str], decode_s: float) -> subprocess.Popen:
    code = (f"import sys\nsys.argv = ['speedlimit', *{args!r}, '{decode_s}']\n{textwrap.dedent(FAKE_ENGINE)}\n"
            "from speedlimit.cli import main\nmain()\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))


def wait_for_measurement(process: subprocess.Popen, count: int) -> None:
    seen = 0
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        seen += "MEASURING" in line
        if seen == count:
            return
    process.kill()
    raise AssertionError(f"verify never reached measurement {count}: {''.join(lines)}{process.stderr.read()}")


ARGS = ["verify", "--quick", "--model", "fake.gguf", "--array-mib", "8", "--no-single-thread", "--threads", "2"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_verify_between_measurements_and_keeps_a_partial_result(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "verify.json"
    process = start([*ARGS, "--out", str(out)], decode_s=0.5)
    wait_for_measurement(process, 3)  # warm-up, run 1, and run 2 under way
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert lines[0].startswith("stopping after the measurement under way"), stderr
    assert lines[-1].startswith(f"interrupted by {sig.name} after ") and str(out) in lines[-1], stderr
    assert "partial result" in lines[-1] and "bandwidth" in lines[-1]
    result = json.loads(out.read_text())
    assert result["complete"] is False and result["interrupted"] == sig.name and result["finished_at"]
    assert result["measured_bandwidth_Bps"] > 0 and result["measured_flops"] > 0
    # runs 1 and 2 of 3 finished: kept, as a point of 2 runs; the headline (a complete run's) is absent
    assert [len(p["runs_s"]) for p in result["prefill"]] == [2]
    assert [p["kind"] for p in result["decode"]] == ["base"] and len(result["decode"][0]["runs_tok_s"]) == 2
    assert result["decode_tok_s_measured"] is None


def test_interrupted_verify_without_out_says_nothing_was_written() -> None:
    process = start([*ARGS, "--json"], decode_s=0.5)
    wait_for_measurement(process, 1)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1].endswith("nothing written (no --out)"), stderr
    partial = json.loads(stdout)  # --json: the partial result on stdout
    assert partial["interrupted"] == "SIGINT" and partial["complete"] is False


def test_a_second_signal_quits_at_once(tmp_path: Path) -> None:
    out = tmp_path / "verify.json"
    process = start([*ARGS, "--out", str(out)], decode_s=60)  # a measurement that would take a minute
    wait_for_measurement(process, 1)
    process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted", stderr
    assert json.loads(out.read_text())["complete"] is False  # written per stage, before the engine ran


def test_a_batched_decode_the_engine_cannot_run_stops_the_series_not_the_run(tmp_path: Path) -> None:
    # the fake engine holds at most 2 sequences: the series keeps 1 and 2, says why it stopped, and verify completes
    out = tmp_path / "verify.json"
    process = start([*ARGS, "--out", str(out)], decode_s=0.01)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    result = json.loads(out.read_text())
    assert result["complete"] is True
    assert [p["sequences"] for p in result["batched_decode"]] == [1, 2]
    assert "could not make a context for 4 sequences" in result["batched_decode_error"]
    assert "decode of several sequences stopped" in " ".join(stdout.split())
