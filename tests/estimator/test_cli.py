"""The estimate/sweep/models/hardware commands, and bad input: one line, exit code 2, no traceback."""

import csv
import io
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from speedlimit.cli import app
from speedlimit.estimator import estimate

runner = CliRunner()
JSON_KEYS = {
    "decode_tok_s", "itl_s", "ttft_s", "e2e_s", "throughput_tok_s", "bytes_per_token", "flops_per_token",
    "weights_bytes", "kv_bytes_per_token", "memory_bytes", "fits", "max_batch", "critical_batch", "regime",
}  # fmt: skip


def run_cli(*args):
    """The real console entry point in a subprocess: exit codes and stderr as a user sees them."""
    return subprocess.run([sys.executable, "-m", "speedlimit.cli", *args], capture_output=True, text=True, timeout=60)


def test_json_has_documented_keys_and_matches_library():
    out = runner.invoke(app, ["estimate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--batch", "8", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert JSON_KEYS <= set(data)
    assert data == estimate("llama-3.1-8b", "h100-sxm", batch=8).to_dict()


def test_table_output_for_people():
    out = runner.invoke(app, ["estimate", "-m", "mixtral-8x7b", "-H", "a100-sxm-80gb", "--tp", "2", "--usd-per-hour", "2"])
    assert out.exit_code == 0, out.output
    for text in ("decode speed", "time to first token", "aggregate throughput", "all-reduce", "/ M tokens"):
        assert text in out.output


def test_the_table_says_what_an_fp8_model_keeps_in_16_bits():
    out = runner.invoke(app, ["estimate", "-m", "qwen3-8b", "-H", "h100-sxm", "--weights", "fp8"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "bits (fp8); embedding table and LM head 16-bit" in out.output
    bf16 = runner.invoke(app, ["estimate", "-m", "qwen3-8b", "-H", "h100-sxm", "--weights", "bf16"])
    assert "LM head 16-bit" not in bf16.output


def test_config_json_input(tmp_path):
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    from_file = estimate(str(path), "h100-sxm")
    assert from_file.total_params == estimate("llama-3.1-8b", "h100-sxm").total_params


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "llama-3.1-8bb", "-H", "h100-sxm"], "did you mean 'llama-3.1-8b'"),
        (["-m", "llama-3.1-8b", "-H", "h100-sxn"], "did you mean"),
        (["-m", "7B", "--bandwidth", "-5"], "positive"),
        (["-m", "7B", "--bandwidth", "nan"], "number"),
        (["-m", "7B", "--bandwidth", "1e30"], "absurd"),
        (["-m", "7B", "-H", "h100-sxm", "--batch", "0"], "--batch"),
        (["-m", "7B", "-H", "h100-sxm", "--prompt", "-1"], "--prompt"),
        (["-m", "7B", "-H", "h100-sxm", "--tp", "0"], "--tp"),
        (["-m", "7B", "-H", "h100-sxm", "--weights", "q9_9"], "unknown weights format"),
        (["-m", "7B", "-H", "h100-sxm", "--weights", "0"], "bits"),
        (["-m", "7B", "-H", "h100-sxm", "--bw-efficiency", "1.5"], "fraction"),
        (["-m", "1e20", "-H", "h100-sxm"], "absurd"),
        (["-m", "llama-3.1-405b", "-H", "h100-sxm"], "try --tp"),
        (["-m", "7B"], "--hardware"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message):
    result = run_cli("estimate", *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"model_type": "llama"}', '{"hidden_size": -1}'])
def test_malformed_config_json(tmp_path, content):
    path = tmp_path / "config.json"
    path.write_text(content)
    result = run_cli("estimate", "-m", str(path), "-H", "h100-sxm")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compute_dtype_picks_the_flops_column():
    bf16 = estimate("llama-3.1-70b", "h100-sxm", tp=4, batch=64, prompt=4096)
    fp8 = estimate("llama-3.1-70b", "h100-sxm", tp=4, batch=64, prompt=4096, compute="fp8")
    assert fp8.flops == pytest.approx(2 * bf16.flops, rel=1e-3) and fp8.ttft_s < bf16.ttft_s
    assert run_cli("estimate", "-m", "7B", "-H", "h100-sxm", "--compute", "fp7").returncode == 2


def test_allow_no_fit_reports_anyway():
    out = runner.invoke(app, ["estimate", "-m", "llama-3.1-405b", "-H", "h100-sxm", "--allow-no-fit", "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["fits"] is False


def test_sweep_csv_matches_single_estimates():
    out = runner.invoke(app, ["sweep", "-m", "llama-3.1-8b", "-m", "mixtral-8x7b", "-H", "h100-sxm", "-H", "rtx-4090",
                              "--weights", "16,4", "--batch", "1:8", "--context", "128,4096"])  # fmt: skip
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.output)))
    assert len(rows) == 2 * 2 * 2 * 4 * 2
    for row in rows[::7]:
        single = estimate(row["model"], row["hardware"], weights=row["weights"], batch=int(row["batch"]), prompt=int(row["context"]))
        assert float(row["decode_tok_s"]) == pytest.approx(single.decode_tok_s, rel=1e-9)
        assert float(row["ttft_s"]) == pytest.approx(single.ttft_s, rel=1e-9)
        assert row["regime"] == single.regime


def test_sweep_without_weights_prices_each_model_as_estimate_does():
    """No --weights: a .gguf at its own type and a checkpoint at its shipped format, the formats estimate prices
    without --weights (a q4_1 file swept as bf16 read 2.7x its bytes)."""
    from speedlimit.bundled import default_gguf_path

    gguf = str(default_gguf_path())
    out = runner.invoke(app, ["sweep", "-m", gguf, "-m", "gpt-oss-20b", "-H", "h100-sxm", "--batch", "1,16",
                              "--context", "512", "--format", "json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert {row["weights"] for row in rows} == {"q4_1", "experts=mxfp4,default=bf16"}
    for row in rows:
        model = gguf if row["weights"] == "q4_1" else "gpt-oss-20b"
        single = estimate(model, "h100-sxm", batch=row["batch"], prompt=512)
        assert row["weights"] == single.weights
        assert row["decode_tok_s"] == pytest.approx(single.decode_tok_s, rel=1e-9)


def test_sweep_kv_and_tp_match_single_estimates():
    out = runner.invoke(app, ["sweep", "-m", "llama-3.1-70b", "-H", "h100-sxm", "--weights", "fp8", "--kv", "fp8", "--tp", "4",
                              "--batch", "1,32", "--context", "8192", "--format", "json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    for row in json.loads(out.output):
        single = estimate("llama-3.1-70b", "h100-sxm", weights="fp8", kv="fp8", tp=4, batch=row["batch"], prompt=8192)
        assert row["decode_tok_s"] == pytest.approx(single.decode_tok_s, rel=1e-9)


def test_sweep_json_and_bad_axis(tmp_path):
    out = tmp_path / "grid.json"
    ok = runner.invoke(app, ["sweep", "-m", "7B", "-H", "l4", "--batch", "1,2", "--format", "json", "--out", str(out), "--ideal"])
    assert ok.exit_code == 0, ok.output
    assert len(json.loads(out.read_text())) == 2
    bad = run_cli("sweep", "-m", "7B", "-H", "l4", "--batch", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_catalog_listings():
    models = json.loads(runner.invoke(app, ["models", "--json"]).output)
    hardware = json.loads(runner.invoke(app, ["hardware", "--json"]).output)
    assert {"deepseek-v3", "gpt-oss-120b"} <= {m["name"] for m in models}
    assert {"h200", "apple-m4-max"} <= {h["name"] for h in hardware}
    assert "llama-3.1-8b" in runner.invoke(app, ["models"]).output


def test_engines_lists_the_profiles_and_shows_one_with_every_source():
    listed = json.loads(runner.invoke(app, ["engines", "--json"]).output)
    assert [e["name"] for e in listed][:1] == ["llama-cpp"] and sum(e["default"] for e in listed) == 1
    assert {"vllm", "sglang", "tensorrt-llm", "llama-cpp-python"} <= {e["name"] for e in listed}
    assert all(v["source"] or v["fitted"] for e in listed for v in e["values"].values())
    # the same records as the web API's GET /api/engines
    from fastapi.testclient import TestClient

    from speedlimit.web.app import create_app

    assert TestClient(create_app()).get("/api/engines").json() == listed
    table = runner.invoke(app, ["engines"]).output
    assert "tensorrt-llm" in table and "weights: fp8)" in table and "llama-cpp (default)" in table
    # one engine by an alias: every value and where it comes from, the fitted one named by its fold
    one = json.loads(runner.invoke(app, ["engines", "llama.cpp-cuda", "--json"]).output)
    assert one["name"] == "llama-cpp-cuda" and one["values"]["gemm_efficiency"]["fitted"] == "A"
    assert one["values"]["max_seqs"] == listed[[e["name"] for e in listed].index("llama-cpp-cuda")]["values"]["max_seqs"]
    vllm = runner.invoke(app, ["engines", "vllm"]).output
    assert "max_batched_tokens" in vllm and "vllm/engine/arg_utils.py" in vllm.replace("\n", "")
    assert "fitted on fold A" in runner.invoke(app, ["engines", "llama-cpp-cuda"]).output
    # an engine whose ROCm build is its own profile says so, in the list and in its own table
    wide = runner.invoke(app, ["engines"], env={"COLUMNS": "200"}).output
    assert "(AMD: vllm-0.7-rocm)" in wide
    # the device rules of the scheduler defaults: memory tiers, vLLM's A100 exemption, SGLang's DP-attention split
    sglang = next(e for e in listed if e["name"] == "sglang")["values"]
    assert sglang["max_batched_tokens"]["by_memory_gib"] == [[35, 4096], [60, 8192], [160, 16384]]
    assert sglang["dp_attention_chunk_divisor"]["value"] == "dp"
    from speedlimit.cli.estimate import _scheduler_text  # the list's scheduler column

    assert "256 seqs (1,024 from 70 GiB; not on a100)" in _scheduler_text(next(e for e in listed if e["name"] == "vllm")["values"])
    assert ("2,048 tok/step (4,096 from 35 GiB; 8,192 from 60 GiB; 16,384 from 160 GiB), ÷ dp per DP-attention rank"
            in _scheduler_text(sglang))
    assert "on AMD GPUs it runs vllm-0.7-rocm" in " ".join(runner.invoke(app, ["engines", "vllm-0.7"], env={"COLUMNS": "200"}).output.split())
    bad = run_cli("engines", "warp")
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown engine 'warp'") and "vllm" in bad.stderr
