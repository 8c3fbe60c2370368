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


@pytest.mark.parametrize("argv,needle", [
    (("--rate", "-1"), "--rate"),
    (("--concurrency", "2", "--rate", "3"), "exactly one"),
    (("--concurrency", "0"), "--concurrency"),
    (("--requests", "0"), "--requests"),
    (("--prompt-tokens", "abc"), "token length"),
    (("--output-tokens", "0"), "token length"),
    (("--engine", "warp"), "--engine"),
    (("--engine", "serial", "--max-seqs", "4"), "serial"),
    (("--max-seqs", "64", "--max-batched-tokens", "32"), "--max-batched-tokens"),
    (("--kv-tokens", "256"), "can never be admitted"),
    (("--sweep", "concurrency=1,x"), "--sweep"),
    (("--sweep", "rate=1,2", "--rate", "2"), "--sweep"),
    (("--slo", "ttft=fast"), "duration"),
    (("--duration", "nan"), "--duration"),
    (("--burstiness", "0"), "--burstiness"),
    (("--rate", "inf", "--duration", "5"), "--requests"),
    (("--dataset", "/nonexistent.jsonl"), "does not exist"),
    (("--no-chunked-prefill", "--prompt-tokens", "9000"), "--max-batched-tokens"),
    (("--sequence-overhead", "5"), "--sequence-overhead"),
    (("--block-size", "0"), "--block-size"),
    (("--knee-fraction", "2"), "--knee-fraction"),
])
def test_bad_input_is_one_line_and_exit_2(cli, argv, needle):
    code, out, err = cli(*BASE, *argv)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert needle in err


def test_model_that_leaves_no_kv_memory_is_an_error(cli):
    code, out, err = cli("simulate", "-m", "llama-3.1-70b", "-H", "l4", "--requests", "2")
    assert code == 2 and err.count("\n") == 1 and ("no memory" in err or "does not fit" in err)


def test_no_hardware_is_an_error(cli):
    code, out, err = cli("simulate", "-m", "7B")
    assert code == 2 and "--hardware" in err
