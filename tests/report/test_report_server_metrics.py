"""`speedlimit report` on a bench run whose server exported Prometheus metrics: the server section with its block,
the series plot from server_metrics.jsonl and the self-checks; and the series maths on a hand-made file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

from faulty_server import FaultyOpenAIServer  # noqa: E402

from speedlimit.report.plots import plot_server_metrics, server_series  # noqa: E402


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speedlimit.cli", *args], capture_output=True, text=True, timeout=120)


def test_report_shows_the_servers_view_of_a_bench_run(tmp_path):
    with FaultyOpenAIServer() as server:
        bench = run_cli("bench", "--url", server.url("metrics"), "--requests", "40", "--concurrency", "8",
                        "--output-tokens", "32", "--metrics-interval", "0.05", "--no-progress",
                        "--out", str(tmp_path / "run"))
    assert bench.returncode == 0, bench.stderr
    assert "server metrics" in bench.stdout and "arrival lag" not in bench.stdout  # closed loop: no schedule
    done = run_cli("report", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "run" / "report" / "report.html").read_text(encoding="utf-8")
    assert "server" in set(re.findall(r'<section id="([a-z]+)"', text))
    section = text[text.index('<section id="server">'):]
    section = section[:section.index("</section>")]
    assert "vllm at http://" in section and "generation_tokens 1,280" in section and "Self-checks" in section
    assert (tmp_path / "run" / "report" / "server_metrics.png").stat().st_size > 5_000


def rows(samples: list[dict], dt: float = 0.5) -> list[dict]:
    return [{"t_s": i * dt, "phase": "during", "samples": s} for i, s in enumerate(samples)]


def test_series_rates_are_counter_differences_over_time_and_survive_a_reset():
    series = server_series(rows([
        {"llamacpp:tokens_predicted_total": 100.0, "llamacpp:prompt_tokens_total": 10.0,
         "llamacpp:requests_processing": 0.0},
        {"llamacpp:tokens_predicted_total": 150.0, "llamacpp:prompt_tokens_total": 30.0,
         "llamacpp:requests_processing": 4.0},
        {"llamacpp:tokens_predicted_total": 20.0, "llamacpp:prompt_tokens_total": 35.0,
         "llamacpp:requests_processing": 2.0},
    ]))
    assert series["engine"] == "llamacpp"
    assert list(series["gauges"]["running"]) == [0.0, 4.0, 2.0]
    assert series["gauges"]["kv_cache_usage"] is None
    assert np.allclose(series["rates"]["generation_tokens"], [100.0, 40.0])  # 50/0.5 s, then a reset: 20/0.5 s
    assert np.allclose(series["rates"]["prompt_tokens"], [40.0, 10.0])


def test_nothing_to_plot_gives_no_figure(tmp_path):
    assert plot_server_metrics([], tmp_path / "a.png") is None
    assert plot_server_metrics(rows([{"vllm:unmapped_thing": 1.0}, {"vllm:unmapped_thing": 2.0}]),
                               tmp_path / "b.png") is None
    path = plot_server_metrics(rows([{"vllm:kv_cache_usage_perc": 0.1}, {"vllm:kv_cache_usage_perc": 0.3}]),
                               tmp_path / "c.png")
    assert path is not None and path.stat().st_size > 2_000


@pytest.mark.parametrize("line", ["{not json", json.dumps([1, 2]), json.dumps({"t_s": 1})])
def test_a_damaged_series_file_loses_only_its_bad_lines(tmp_path, line):
    from speedlimit.bench.server_metrics import load_series

    good = json.dumps({"t_s": 0.0, "phase": "before", "samples": {"vllm:num_requests_running": 1.0}})
    path = tmp_path / "server_metrics.jsonl"
    path.write_text(good + "\n" + line + "\n" + good + "\n")
    assert len(load_series(path)) == 2
