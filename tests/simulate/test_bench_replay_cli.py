"""`bench --compare-estimate` end to end against the fake server: every sweep point gets a replay block."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

from faulty_server import FaultyOpenAIServer  # noqa: E402


def bench_against_the_fake_server(flags: list[str], capsys) -> tuple[int, str]:
    """speedlimit's console entry point, `bench --url <the fake server> FLAGS`: (exit code, stdout)."""
    from speedlimit import cli

    with FaultyOpenAIServer() as server:
        old, sys.argv = sys.argv, ["speedlimit", "bench", "--url", server.url("ok"), *flags]
        try:
            cli.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        finally:
            sys.argv = old
    return code, capsys.readouterr().out


def test_bench_sweep_compare_estimate_replays_every_point(tmp_path, capsys):
    code, out = bench_against_the_fake_server(
        ["--sweep", "concurrency=1,4", "--requests", "8", "--output-tokens", "5", "--out", str(tmp_path), "--json",
         "--no-progress", "--compare-estimate", "--hardware", "h100-sxm", "--estimate-model", "smollm2-135m",
         "--replay-engine", "continuous,max_seqs=4"], capsys)
    assert code == 0
    summary = json.loads(out)
    for point in summary["points"]:
        block = point["estimate"]
        assert block["method"] == "simulate"
        assert block["comparison"]["ttft_s.p99"]["measured"] is not None
        assert block["comparison"]["output_tok_s"]["predicted"] > 0
        assert block["predicted"]["engine"]["max_seqs"] == 4
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["points"][1]["estimate"]["inputs"]["concurrency"] == 4


def test_bench_compare_estimate_replays_the_deployment_named(tmp_path, capsys):
    """--engine / --tp / --weights describe the server the replay simulates: they reach the replay's engine block."""
    code, out = bench_against_the_fake_server(
        ["--concurrency", "2", "--requests", "4", "--output-tokens", "5", "--out", str(tmp_path), "--json",
         "--no-progress", "--compare-estimate", "--hardware", "h100-sxm", "--estimate-model", "llama-3.1-70b",
         "--engine", "vllm", "--tp", "4", "--weights", "fp8"], capsys)
    assert code == 0
    block = json.loads(out)["estimate"]
    engine = block["predicted"]["engine"]
    assert (engine["engine"], engine["tp"], engine["weights"]) == ("vllm", 4, "fp8")
    assert block["inputs"]["tp"] == 4 and engine["max_seqs"] == 1024  # vLLM's scheduler, not the generic 256


def test_bench_compare_estimate_replays_the_layout_named(tmp_path, capsys):
    """--tp / --dp / --ep describe SGLang's data-parallel attention (8 ranks over one MoE): the replay runs it."""
    code, out = bench_against_the_fake_server(
        ["--concurrency", "2", "--requests", "4", "--output-tokens", "5", "--out", str(tmp_path), "--json",
         "--no-progress", "--compare-estimate", "--hardware", "h200", "--estimate-model", "deepseek-v3",
         "--engine", "sglang-0.4", "--tp", "1", "--dp", "8", "--ep", "8"], capsys)
    assert code == 0
    block = json.loads(out)["estimate"]
    assert block["inputs"]["dp"] == 8 and block["inputs"]["ep"] == 8 and "tp" not in block["inputs"]
    assert block["predicted"]["engine"]["engine"] == "sglang-0.4" and block["predicted"]["engine"]["dp"] == 8


def test_a_sweep_compared_prints_each_levels_measured_and_predicted_figures(tmp_path, capsys):
    code, out = bench_against_the_fake_server(
        ["--sweep", "concurrency=1,2", "--requests", "4", "--output-tokens", "5", "--out", str(tmp_path),
         "--no-progress", "--compare-estimate", "--hardware", "h100-sxm", "--estimate-model", "smollm2-135m"], capsys)
    assert code == 0
    compared = out[out.index("vs simulate: smollm2-135m on h100-sxm"):]
    assert "TPOT ms" in compared and "meas./" in compared and "(engine llama-cpp-cuda)" in compared
    summary = json.loads((tmp_path / "summary.json").read_text())
    for point in summary["points"]:  # each level's row: its level, then its measured throughput
        level = f"{point['sweep_value']:g}"
        assert any(line.split("│")[1].strip() == level for line in compared.splitlines() if line.count("│") > 2)


def test_compare_estimate_without_hardware_names_what_to_pass(tmp_path, monkeypatch, capsys):
    """Before any request: the error names the catalog, and the profiles calibrated on this machine where any are
    saved (else how to make one)."""
    from speedlimit import cli

    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path))

    def refusal() -> str:
        monkeypatch.setattr(sys, "argv", ["speedlimit", "bench", "--url", "http://127.0.0.1:9/v1", "--no-progress",
                                          "--compare-estimate"])
        try:
            cli.main()
        except SystemExit as exit_:
            assert exit_.code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err
        return err

    assert "`local` after `speedlimit verify` and `speedlimit calibrate`" in refusal()
    (tmp_path / "profiles").mkdir()
    for name in ("gpu-box", "local"):
        (tmp_path / "profiles" / f"{name}.toml").write_text("")
    assert "calibrated here (gpu-box, local)" in refusal()
