"""`speedlimit simulate` on the command line: output, bench's files, sweeps, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import sys

import pytest

from speedlimit.artifacts import RunSummary, SweepSummary, iter_records, load_summary


@pytest.fixture
def cli(capsys):
    from speedlimit import cli as entry

    def run(*argv: str) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = ["speedlimit", *argv]
        try:
            entry.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        finally:
            sys.argv = old
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


BASE = ("simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--prompt-tokens", "512", "--output-tokens", "64")


def test_json_is_benchs_run_summary(cli):
    code, out, err = cli(*BASE, "--concurrency", "8", "--requests", "40", "--json", "--slo", "ttft=200ms,tpot=20ms")
    assert code == 0, err
    summary = RunSummary.parse(json.loads(out))
    assert summary.source == "simulate" and summary.completed == 40 and summary.offered_load.concurrency == 8
    assert summary.slo == {"ttft": 0.2, "tpot": 0.02}
    assert summary.engine["mode"] == "continuous" and summary.simulation["steps"] > 0
    assert len(summary.simulation["timeline"]["t_s"]) <= 200


def test_out_writes_benchs_files_and_report_reads_them(cli, tmp_path):
    code, out, err = cli(*BASE, "--rate", "5", "--requests", "30", "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert "speedlimit simulate" in out and "inside the engine" in out
    summary = load_summary(tmp_path / "run" / "summary.json")
    records = list(iter_records(tmp_path / "run" / "requests.jsonl"))
    assert isinstance(summary, RunSummary) and len(records) == 30
    assert records[0].token_count_source == "simulated" and records[0].queue_s is not None
    code, out, err = cli("report", str(tmp_path / "run"))
    assert code == 0, err
    assert (tmp_path / "run" / "report" / "report.html").is_file()


def test_sweep_reports_knee_saturation_and_slo_max(cli, tmp_path):
    code, out, err = cli(*BASE, "--sweep", "concurrency=1,4,16,64", "--requests", "64", "--slo", "ttft=150ms",
                         "--out", str(tmp_path / "sweep"), "--json")
    assert code == 0, err
    sweep = SweepSummary.parse(json.loads(out))
    assert [p.sweep_value for p in sweep.points] == [1, 4, 16, 64]
    assert sweep.sweep.saturation_output_tok_s == max(p.output_tok_s for p in sweep.points)
    assert sweep.sweep.knee_load in (1, 4, 16, 64)
    assert sweep.sweep.slo_max_load is not None
    assert (tmp_path / "sweep" / "concurrency_16" / "requests.jsonl").is_file()
    assert isinstance(load_summary(tmp_path / "sweep" / "summary.json"), SweepSummary)


def test_rate_above_saturation_runs_and_says_the_queue_grows(cli):
    code, out, err = cli(*BASE, "--rate", "2000", "--requests", "400", "--max-seqs", "16")
    assert code == 0, err
    assert "grows without bound" in " ".join(out.split()) and "saturation rate" in " ".join(out.split())
    code, out, err = cli(*BASE, "--rate", "2000", "--requests", "400", "--max-seqs", "16", "--json")
    sim = json.loads(out)["simulation"]
    assert sim["saturated"] is True and 0 < sim["saturation_request_s"] < 2000


def test_duration_and_dataset(cli, tmp_path):
    code, out, err = cli(*BASE, "--concurrency", "4", "--duration", "3", "--json")
    assert code == 0, err
    summary = json.loads(out)
    starts = summary["requests"]
    assert starts > 4 and summary["load"]["duration_s"] == 3
    code, out, err = cli(*BASE, "--rate", "10", "--duration", "2", "--json")
    assert code == 0, err
    assert 5 <= json.loads(out)["requests"] <= 60
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "one two three four five", "output_tokens": 7}\n'
                    '{"messages": [{"role": "user", "content": "a b c"}], "prompt_tokens": 300}\n')
    code, out, err = cli("simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--dataset", str(data), "--requests", "4",
                         "--output-tokens", "9", "--json", "--out", str(tmp_path / "ds"))
    assert code == 0, err
    rows = [r for r in iter_records(tmp_path / "ds" / "requests.jsonl")]
    assert sorted({(r.prompt_tokens, r.output_tokens) for r in rows}) == [(5, 7), (300, 9)]
