"""`speedlimit report` on synthetic bench output: files, sections, sweeps, comparisons, and bad input.

Hostile input, damaged files, scale and the measured-vs-predicted overlay have their own modules beside this one.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from speedlimit.cli import app
from speedlimit.errors import SpeedlimitError
from speedlimit.report import build_report
from speedlimit.report.results import load_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_requests(n: int, *, seed: int = 0, concurrency: int = 4, itl_s: float = 0.02, failures: int = 0) -> list[dict]:
    """Rows shaped like bench's RequestRecord.to_json_dict(): perf_counter_ns stamps, seconds, ITL lists."""
    rng = np.random.default_rng(seed)
    rows, lanes = [], [0] * concurrency
    for index in range(n):
        lane = index % concurrency
        start_ns = lanes[lane] + int(rng.integers(0, 5_000_000))
        output_tokens = int(rng.integers(20, 60))
        ttft = float(rng.gamma(4, 0.02))
        gaps = [float(g) for g in rng.normal(itl_s, itl_s / 10, output_tokens - 1).clip(itl_s / 5)]
        e2e = ttft + sum(gaps)
        failed = index < failures
        rows.append({
            "index": index, "start_ns": start_ns, "end_ns": start_ns + int(e2e * 1e9),
            "ttft_s": None if failed else ttft, "itl_s": [] if failed else gaps, "e2e_s": e2e,
            "prompt_tokens": 128, "output_tokens": None if failed else output_tokens, "output_chunks": output_tokens,
            "token_count_source": "usage", "http_status": 500 if failed else 200,
            "error_kind": "http_500" if failed else None, "error_text": "boom <b>" if failed else None,
            "finish_reason": None if failed else "length",
            "tpot_s": None if failed else (e2e - ttft) / (output_tokens - 1), "output_chars": 4 * output_tokens,
        })  # fmt: skip
        lanes[lane] = start_ns + int(e2e * 1e9)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def cell(label: str, value: str) -> str:
    """A summary table row as the page writes it."""
    return f'<td class="text">{label}</td><td>{value}</td>'


def sections(html_text: str) -> set[str]:
    return set(re.findall(r'<section id="([a-z]+)"', html_text))


def embedded_pngs(html_text: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html_text)]


def test_single_jsonl_report_has_distributions_timeline_and_errors(tmp_path):
    jsonl = write_jsonl(tmp_path / "run" / "requests.jsonl", fake_requests(40, failures=3))
    report = build_report(jsonl, tmp_path / "out")
    assert report == tmp_path / "out" / "report.html"
    text = report.read_text(encoding="utf-8")
    assert sections(text) == {"summary", "distributions", "timeline", "errors"}
    assert "http_500" in text and "boom &lt;b&gt;" in text  # escaped
    pngs = embedded_pngs(text)
    assert len(pngs) == 2 and all(p.startswith(PNG_MAGIC) for p in pngs)
    for name in ("distributions.png", "timeline.png"):
        assert (tmp_path / "out" / name).read_bytes().startswith(PNG_MAGIC)
    assert "http://" not in text and "https://" not in text  # self-contained
    # the summary is recomputed from the rows (no summary.json): 37 completed of 40
    assert cell("completed", "37") in text and cell("failed", "3") in text
    assert "Computed from requests.jsonl: there is no summary.json" in text


def test_run_directory_with_summary_and_comparison(tmp_path):
    run = tmp_path / "run"
    write_jsonl(run / "requests.jsonl", fake_requests(30))
    comparison = {
        "ttft_s": {"measured": 0.08, "predicted": 0.05, "ratio": 1.6},
        "itl_s": {"measured": 0.02, "predicted": 0.018, "ratio": 1.111},
        "output_tok_s": {"measured": 180.0, "predicted": 220.0, "ratio": 0.818},
    }
    summary = {"requests": 30, "completed": 30, "failed": 0, "duration_s": 4.2, "output_tok_s": 181.5,
               "ttft_s": {"mean": 0.08, "p50": 0.07, "p90": 0.12, "p99": 0.2}, "itl_s": {"mean": 0.02, "p50": 0.02, "p90": 0.022, "p99": 0.025},
               "estimate": {"model": "llama-3.1-8b", "hardware": "h100-sxm", "inputs": {"batch": 4, "prompt": 128, "output": 40},
                            "predicted": {}, "comparison": comparison}}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    report = build_report(run)  # default --out: <run>/report
    assert report == run / "report" / "report.html"
    text = report.read_text(encoding="utf-8")
    assert sections(text) == {"summary", "distributions", "comparison", "timeline"}
    assert cell("output tok/s", "182") in text  # 181.5 from summary.json, not recomputed
    assert "Computed from requests.jsonl" not in text
    assert "1.6" in text and "llama-3.1-8b on h100-sxm" in text
    assert (run / "report" / "comparison.png").read_bytes().startswith(PNG_MAGIC)
    assert len(embedded_pngs(text)) == 3


def test_sweep_directory_report_marks_the_knee(tmp_path):
    sweep_dir = tmp_path / "sweep"
    points = []
    for concurrency, tok_s in ((1, 50.0), (2, 95.0), (4, 170.0), (8, 190.0), (16, 195.0)):
        rows = fake_requests(12, seed=concurrency, concurrency=concurrency, itl_s=0.01 * concurrency ** 0.5)
        write_jsonl(sweep_dir / f"concurrency_{concurrency:g}" / "requests.jsonl", rows)
        points.append({"concurrency": float(concurrency), "requests": 12, "completed": 12, "failed": 0, "output_tok_s": tok_s,
                       "ttft_s": {"p50": 0.05 * concurrency, "p99": 0.09 * concurrency},
                       "itl_s": {"p50": 0.01 * concurrency ** 0.5, "p99": 0.02 * concurrency ** 0.5},
                       "e2e_s": {"p50": 1.0, "p99": 2.0}})  # fmt: skip
    summary = {"sweep": {"parameter": "concurrency", "values": [1.0, 2.0, 4.0, 8.0, 16.0], "saturation_output_tok_s": 195.0,
                         "saturation_load": 16.0, "knee_load": 8.0, "knee_output_tok_s": 190.0, "knee_fraction": 0.9}, "points": points}  # fmt: skip
    (sweep_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    results = load_results(sweep_dir)
    assert len(results.requests) == 60 and set(results.requests.load.tolist()) == {1.0, 2.0, 4.0, 8.0, 16.0}
    out = CliRunner().invoke(app, ["report", str(sweep_dir), "--out", str(tmp_path / "out")])
    assert out.exit_code == 0, out.output
    assert "report written to" in out.output
    text = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert sections(text) == {"sweep", "distributions", "timeline"}
    assert "Knee at concurrency = 8" in text
    assert (tmp_path / "out" / "sweep.png").read_bytes().startswith(PNG_MAGIC)


def test_bench_record_rows_round_trip(tmp_path):
    """Rows written by bench's own RequestRecord are read as they are."""
    from speedlimit.artifacts import RequestRecord

    records = [RequestRecord(index=i, start_ns=i * 10**8, end_ns=i * 10**8 + 5 * 10**8, ttft_s=0.1, itl_s=[0.02] * 20, e2e_s=0.5,
                             output_tokens=21, prompt_tokens=64) for i in range(5)]  # fmt: skip
    jsonl = write_jsonl(tmp_path / "requests.jsonl", [r.to_json_dict() for r in records])
    text = build_report(jsonl, tmp_path / "out").read_text(encoding="utf-8")
    assert {"summary", "distributions", "timeline"} <= sections(text)
    assert cell("completed", "5") in text


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"ttft_s": 0.1}\n{not json\n', "no line of"),  # no index: not a record either
        ("[1, 2]\n", "no line of"),
        ('{"index": 0, "ttft_s": "fast"}\n', "no line of"),
        ('{"index": 0, "itl_s": [0.1, "x"]}\n', "(1 bad lines)"),
        ("\n\n", "has no requests"),
    ],
)
def test_a_file_without_any_record_is_one_line_error(tmp_path, content, fragment):
    path = tmp_path / "requests.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SpeedlimitError, match=re.escape(fragment)) as error:
        build_report(path, tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out" / "report.html").exists()


def test_missing_path_and_empty_directory_are_errors(tmp_path):
    with pytest.raises(SpeedlimitError, match="no such file or directory"):
        build_report(tmp_path / "nope.jsonl")
    with pytest.raises(SpeedlimitError, match="neither requests.jsonl nor summary.json"):
        build_report(tmp_path)


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "report", str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error: no such file or directory") and done.stderr.count("\n") == 1
