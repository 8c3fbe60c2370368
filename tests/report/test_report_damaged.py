"""`speedlimit report` on what a killed or damaged run leaves: bad lines are skipped and counted, the rest reported."""

from __future__ import annotations

import json
import subprocess
import sys

from speedlimit.report import build_report
from speedlimit.report.results import load_results
from tests.report.test_report import cell, fake_requests, sections, write_jsonl


def test_truncated_last_line_is_skipped_and_counted(tmp_path):
    rows = fake_requests(40, failures=3)
    path = write_jsonl(tmp_path / "run" / "requests.jsonl", rows)
    with path.open("a", encoding="utf-8") as handle:  # what a kill mid-write leaves: half a row, no newline
        handle.write(json.dumps(fake_requests(41)[40])[:57])
    results = load_results(path)
    assert len(results.requests) == 40 and results.skipped == 1 and results.bad_lines == {path: [41]}
    text = build_report(path, tmp_path / "out").read_text(encoding="utf-8")
    assert {"summary", "distributions", "timeline", "errors"} <= sections(text)
    assert cell("requests", "40") in text and cell("completed", "37") in text
    assert 'id="skipped"' in text and "line 41" in text and "reported the other 40 requests" in text


def test_one_corrupted_line_in_the_middle_via_the_cli(tmp_path):
    rows = [json.dumps(row) for row in fake_requests(12)]
    rows[5] = rows[5][:20] + "\x00garbage" + rows[5][20:]
    rows[7] = '{"index": "seven"}'
    path = tmp_path / "run" / "requests.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "report", str(path.parent)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("warning: skipped 2 lines that are not a request record")
    assert "lines 6, 8" in done.stderr and "reported the other 10 requests" in done.stderr
    assert "report written to" in done.stdout
    text = (path.parent / "report" / "report.html").read_text(encoding="utf-8")
    assert cell("requests", "10") in text and "lines 6, 8" in text


def test_summary_json_is_kept_when_requests_jsonl_is_damaged(tmp_path):
    """The summary bench wrote stays the headline; the bad line only costs its point in the plots."""
    from speedlimit.artifacts import RunSummary

    path = write_jsonl(tmp_path / "requests.jsonl", fake_requests(20))
    with path.open("a", encoding="utf-8") as handle:
        handle.write("{\"index\": 20, \"start_ns\"")
    RunSummary(requests=21, completed=21, output_tok_s=123.4, duration_s=2.0).save(tmp_path / "summary.json")
    text = build_report(tmp_path, tmp_path / "out").read_text(encoding="utf-8")
    assert cell("requests", "21") in text and cell("output tok/s", "123") in text
    assert "line 21" in text


def test_directory_with_only_a_summary_is_reported(tmp_path):
    from speedlimit.artifacts import Distribution, RunSummary

    RunSummary(source="simulate", requests=100, completed=100, output_tok_s=2500.0, duration_s=10.0,
               ttft_s=Distribution(mean=0.2, p50=0.18, p90=0.3, p95=0.35, p99=0.5, n=100)).save(tmp_path / "summary.json")
    text = build_report(tmp_path / "summary.json", tmp_path / "out").read_text(encoding="utf-8")
    assert sections(text) == {"summary"}
    assert "summary only (no requests.jsonl)" in text and "simulate (predicted)" in text
    assert cell("output tok/s", "2,500") in text and "180.00 ms" in text
