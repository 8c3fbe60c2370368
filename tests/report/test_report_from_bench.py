"""`speedlimit report` on what `speedlimit bench` really writes: a sweep and an erroring run against the bench
tests' fake OpenAI server (127.0.0.1, in a thread), both with --compare-estimate."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

from faulty_server import FaultyOpenAIServer  # noqa: E402


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speedlimit.cli", *args], capture_output=True, text=True, timeout=120)


def test_report_on_real_bench_sweep_and_failing_run(tmp_path):
    compare = ["--compare-estimate", "--hardware", "h100-sxm", "--estimate-model", "llama-3.1-8b", "--no-progress", "--output-tokens", "16"]
    with FaultyOpenAIServer() as server:
        sweep = run_cli("bench", "--url", server.url("ok"), "--sweep", "concurrency=1,2,4", "--requests", "8", "--out", str(tmp_path / "sweep"), *compare)
        assert sweep.returncode == 0, sweep.stderr
        run = run_cli("bench", "--url", server.url("mixed"), "--requests", "18", "--concurrency", "3", "--timeout", "1", "--out", str(tmp_path / "run"), *compare)
        assert run.returncode == 0, run.stderr

    done = run_cli("report", str(tmp_path / "sweep"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "sweep" / "report" / "report.html").read_text(encoding="utf-8")
    assert set(re.findall(r'<section id="([a-z]+)"', text)) == {"sweep", "distributions", "comparison", "timeline"}
    assert "Knee at concurrency = " in text
    for name in ("sweep.png", "distributions.png", "timeline.png"):
        assert (tmp_path / "sweep" / "report" / name).stat().st_size > 5_000

    done = run_cli("report", str(tmp_path / "run" / "requests.jsonl"), "--out", str(tmp_path / "run-report"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "run-report" / "report.html").read_text(encoding="utf-8")
    assert set(re.findall(r'<section id="([a-z]+)"', text)) == {"summary", "distributions", "comparison", "server",
                                                                "timeline", "errors"}
    assert "Self-checks" in text and "output length" in text  # bench's self-checks; the fake "mixed" has no /metrics
    assert "http_500" in text and "timeout" in text
    assert (tmp_path / "run-report" / "comparison.png").is_file()
