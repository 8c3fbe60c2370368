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


def test_out_refuses_a_run_unless_force_with_benchs_check(cli, tmp_path, monkeypatch):
    """simulate --out uses bench's own check (one function): a directory holding a run is refused before any work,
    --force replaces it, and a file is never an --out."""
    import speedlimit.bench.runner as runner

    out = tmp_path / "run"
    code, _, err = cli(*BASE, "--concurrency", "2", "--requests", "6", "--out", str(out))
    assert code == 0, err
    before = (out / "requests.jsonl").read_bytes()
    calls = []
    original = runner.check_out_dir
    monkeypatch.setattr(runner, "check_out_dir", lambda *a, **k: (calls.append(a), original(*a, **k))[1])
    code, out_text, err = cli(*BASE, "--concurrency", "2", "--requests", "9", "--out", str(out))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "already holds a run" in err and "--force" in err
    assert calls and (out / "requests.jsonl").read_bytes() == before  # untouched
    code, _, err = cli(*BASE, "--concurrency", "2", "--requests", "9", "--out", str(out), "--force")
    assert code == 0, err
    assert len(list(iter_records(out / "requests.jsonl"))) == 9
    # a sweep over a single run's directory: refused, then replaced (the old run's files gone)
    code, _, err = cli(*BASE, "--sweep", "concurrency=1,2", "--requests", "4", "--out", str(out))
    assert code == 2 and "already holds a run" in err
    code, _, err = cli(*BASE, "--sweep", "concurrency=1,2", "--requests", "4", "--out", str(out), "--force")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["concurrency_1", "concurrency_2", "summary.json"]
    # and a single run over the sweep: its level folders are removed too
    code, _, err = cli(*BASE, "--requests", "3", "--out", str(out), "--force")
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["requests.jsonl", "summary.json"]
    (tmp_path / "file").write_text("x")
    code, _, err = cli(*BASE, "--requests", "3", "--out", str(tmp_path / "file"))
    assert code == 2 and "is a file" in err


def test_out_writes_exactly_benchs_files(cli, tmp_path):
    """The files every bench run writes (`RECORD_FILES`; a simulated engine exports no /metrics) and a sweep's level
    folders, `{parameter}_{value:g}`."""
    from speedlimit.bench.runner import RECORD_FILES

    code, _, err = cli(*BASE, "--rate", "4", "--requests", "5", "--out", str(tmp_path / "one"))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == sorted(RECORD_FILES)
    code, _, err = cli(*BASE, "--sweep", "rate=0.5,2", "--requests", "5", "--out", str(tmp_path / "two"))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["rate_0.5", "rate_2", "summary.json"]
    for level in ("rate_0.5", "rate_2"):
        assert sorted(p.name for p in (tmp_path / "two" / level).iterdir()) == sorted(RECORD_FILES)


ISSUE_FLAGS = [  # issue 12, "The command": estimate's model/hardware/precision/KV/TP options, bench's load, the engine
    "--model", "--hardware", "--weights", "--kv", "--compute", "--tp", "--ideal", "--bw-efficiency",
    "--flops-efficiency", "--step-overhead", "--concurrency", "--rate", "--burstiness", "--requests", "--duration",
    "--prompt-tokens", "--output-tokens", "--dataset", "--seed", "--sweep", "--slo", "--json", "--out", "--force",
    "--engine", "--max-seqs", "--max-batched-tokens", "--chunked-prefill", "--no-chunked-prefill",
]


def test_help_lists_every_flag_the_issue_names(cli, monkeypatch):
    import re

    monkeypatch.setenv("COLUMNS", "250")  # rich truncates long option names to fit a narrow terminal
    code, out, err = cli("simulate", "--help")
    assert code == 0, err
    shown = set(re.findall(r"--[a-z][a-z-]*", out))
    assert not [flag for flag in ISSUE_FLAGS if flag not in shown]


def test_burstiness_draws_benchs_gamma_arrivals(cli, tmp_path):
    import statistics

    from speedlimit.bench.workload import arrival_offsets_s

    code, out, err = cli(*BASE, "--rate", "4", "--burstiness", "0.25", "--requests", "40", "--seed", "5",
                         "--out", str(tmp_path / "run"))
    assert code == 0, err
    starts = [r.start_ns for r in iter_records(tmp_path / "run" / "requests.jsonl")]
    offsets = arrival_offsets_s(40, 4.0, 0.25, 5)
    assert sorted(starts) == [int(o * 1e9 + 0.5) for o in offsets]

    def variation(times):  # coefficient of variation of the gaps: 1 for Poisson, 1/sqrt(shape) for gamma
        gaps = [b - a for a, b in zip(times, times[1:])]
        return statistics.pstdev(gaps) / statistics.mean(gaps)

    assert variation(offsets) > 1.2 * variation(arrival_offsets_s(40, 4.0, 1.0, 5))  # burstier than Poisson


def test_a_tiny_rate_with_a_duration_sends_what_falls_inside_it(cli):
    code, out, err = cli(*BASE, "--rate", "1e-300", "--duration", "5", "--json")
    assert code == 0, err
    assert json.loads(out)["requests"] == 1  # the first send is at 0 s; the next would be ~1e300 s later


def test_trace_replays_each_request_at_its_recorded_time_with_its_lengths(cli, tmp_path):
    """bench's --trace format (incl. Mooncake's spelling), sent at recorded times × --time-scale."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival_s": 0.0, "prompt_tokens": 512, "output_tokens": 64}\n'
                     '{"timestamp": 4000, "input_length": 256, "output_length": 32}\n'
                     '{"arrival_s": 2.0, "prompt_tokens": 1024, "output_tokens": 16}\n')
    code, _, err = cli("simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--trace", str(trace), "--time-scale",
                       "0.5", "--out", str(tmp_path / "run"))
    assert code == 0, err
    summary = RunSummary.load(tmp_path / "run" / "summary.json")
    assert summary.offered_load.trace == str(trace) and summary.offered_load.time_scale == 0.5
    records = sorted(iter_records(tmp_path / "run" / "requests.jsonl"), key=lambda r: r.start_ns)
    assert [(r.prompt_tokens, r.output_tokens) for r in records] == [(512, 64), (1024, 16), (256, 32)]
    starts = [(r.start_ns - records[0].start_ns) / 1e9 for r in records]
    assert starts == pytest.approx([0.0, 1.0, 2.0])  # sorted by arrival, then halved
    code, out, err = cli("simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--trace", str(trace), "--requests",
                         "1", "--json")
    assert code == 0 and json.loads(out)["requests"] == 1, err  # the trace's first request only


@pytest.mark.parametrize("extra,needle", [
    (("--rate", "2"), "--trace sets the arrivals"),
    (("--sweep", "rate=1,2"), "--trace sets the arrivals"),
    (("--time-scale", "0"), "--time-scale"),
])
def test_trace_conflicts_are_one_line(cli, tmp_path, extra, needle):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 4}\n')
    code, _, err = cli("simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--trace", str(trace), *extra)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_prefix_flags_reach_the_engine_and_the_hit_rate_is_printed(cli):
    argv = (*BASE, "--engine", "vllm", "--concurrency", "4", "--requests", "12", "--prefix-tokens", "1024",
            "--prefix-groups", "2")
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["engine"]["prefix_caching"] is True
    assert summary["engine"]["workload"]["prefix_tokens"] == 1024 and summary["prompt_tokens"] == 12 * (512 + 1024)
    assert summary["simulation"]["prefix_cache_hit_rate"] == pytest.approx(10 * 1024 / (12 * 1536))
    code, out, err = cli(*argv)
    assert code == 0 and "prefix-cache hits" in out and "55.6%" in out
    code, out, err = cli(*argv, "--no-prefix-caching", "--json")
    assert code == 0 and json.loads(out)["simulation"]["prefix_cache_hit_rate"] is None
