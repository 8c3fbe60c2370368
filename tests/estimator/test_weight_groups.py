"""Mixed precision per tensor group (issue 13): --weights experts=mxfp4,attention=bf16,default=q4_k.

Per-group bytes add up to the single-format figure, gpt-oss-120b as shipped (MXFP4 experts, bf16 rest) fits one
H100 80GB and reads what its groups say, the FLOP rate follows each group's compute dtype, bad spellings are one
line naming the valid groups, and the spelling works the same on estimate, sweep, simulate and the web API.
"""

import csv
import io
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from speedlimit import simulate
from speedlimit.catalog import block_format_bits, resolve_hardware, resolve_model
from speedlimit.cli import app
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core, estimate
from speedlimit.estimator.api import compute_rate, cost_model, group_params, step_model
from speedlimit.precision import WEIGHT_GROUPS, WeightFormats, parse_precision, parse_weights

runner = CliRunner()
GROUPS_MESSAGE = "attention, dense, experts, embeddings, lm_head, default"


def test_block_formats_follow_their_specs():
    # OCP MX v1.0: FP4 elements + one 8-bit scale per 32; NVFP4: FP4 + one FP8 scale per 16
    # group-wise int4: 16-bit scale + 16-bit zero per group (gpt-fast/torchao, MLX affine); MLC q4f16_1: fp16 scale per 32
    assert block_format_bits() == {"mxfp4": 4.25, "nvfp4": 4.5, "int4_g32": 5.0, "int4_g64": 4.5, "int4_g128": 4.25,
                                   "q4f16_1": 4.5}
    assert parse_precision("mxfp4").bits == 4.25 and parse_precision("NVFP4").bits == 4.5
    assert parse_precision("int4-g32") == parse_precision("INT4_G32")  # spelled either way on the command line
    assert parse_precision("mxfp4").compute_dtype == "bf16"  # weight-only: dequantized to 16-bit, as int4/q4


def test_parse_groups_and_default():
    spelled = parse_weights("experts=mxfp4, attention=bf16 ,default=q4_k")
    assert isinstance(spelled, WeightFormats)
    assert spelled["experts"].name == "mxfp4" and spelled["attention"].name == "bf16"
    assert spelled["dense"].name == spelled["embeddings"].name == spelled["lm_head"].name == "q4_k"
    assert spelled.explicit == {"experts", "attention"}
    assert spelled.name == "attention=bf16,experts=mxfp4,default=q4_k"
    assert parse_weights("experts=mxfp4")["dense"].name == "bf16"  # no default: bf16, as a plain estimate
    assert parse_weights("Lm-Head=8,default=8").name == "int8"  # one format named per group is that format
    assert parse_weights("q4_k_m") == parse_precision("q4_k_m") and parse_weights(4) == parse_precision(4)


@pytest.mark.parametrize(
    ("spelling", "fragment"),
    [("expert=mxfp4", "unknown weights group 'expert'; did you mean 'experts'"),
     ("experts=mxfp5,default=bf16", "unknown weights (experts) format 'mxfp5'"),
     ("experts=mxfp4,experts=bf16", "given twice"),
     ("experts=", "has no format"),
     ("=bf16", "names no group"),
     ("experts=mxfp4,,default=bf16", "empty entry"),
     ("experts=mxfp4,bf16", "names no group"),
     ("experts=0", "bits must be"),
     ("experts=mxfp4," * 40, "characters long")],
)  # fmt: skip
def test_bad_spellings_are_one_line_naming_the_groups(spelling, fragment):
    with pytest.raises(SpeedlimitError) as caught:
        parse_weights(spelling)
    message = str(caught.value)
    assert fragment in message and "\n" not in message
    if "group" in fragment or "entry" in fragment:
        assert GROUPS_MESSAGE in message


@pytest.mark.parametrize("model", ["gpt-oss-120b", "llama-3.1-8b", "gemma-2-9b", "deepseek-v3", "mixtral-8x7b"])
@pytest.mark.parametrize("fmt", ["bf16", "q4_k", "mxfp4"])
def test_groups_sum_to_the_single_format(model, fmt):
    arch = resolve_model(model)
    assert sum(group_params(arch).values()) == pytest.approx(arch.total_params, rel=1e-12)
    kv = parse_precision("fp16")
    single, bits = cost_model(arch, parse_precision(fmt), kv)
    # the same format named per group: cost_model sums the groups (resolve would collapse it to the one format)
    split, split_bits = cost_model(arch, WeightFormats(tuple(parse_precision(fmt) for _ in WEIGHT_GROUPS)), kv)
    for field in core.CostModel._fields:
        assert getattr(split, field) == pytest.approx(getattr(single, field), rel=1e-12), field
    assert split_bits == pytest.approx(bits, rel=1e-12)


def test_single_format_spelled_per_group_is_that_format():
    plain = estimate("llama-3.1-8b", "h100-sxm", weights="q4_k").to_dict()
    spelled = estimate("llama-3.1-8b", "h100-sxm", weights="default=q4_k").to_dict()
    assert spelled == plain


def test_gpt_oss_120b_as_shipped_fits_one_h100():
    # model card (https://huggingface.co/openai/gpt-oss-120b, arXiv 2508.10925): MXFP4 MoE weights, the rest bf16,
    # "fits into a single 80GB GPU"
    arch = resolve_model("gpt-oss-120b")
    shipped = estimate(arch, "h100-sxm", weights="experts=mxfp4,default=bf16", prompt=512, output=256)
    assert shipped.fits and shipped.weights == "experts=mxfp4,default=bf16"
    params = group_params(arch)
    expected_weights = params["experts"] * 4.25 / 8 + (arch.total_params - params["experts"]) * 2
    assert shipped.weights_bytes == pytest.approx(expected_weights, rel=1e-12)
    assert 60e9 < shipped.weights_bytes < 66e9  # about 61 GB of MXFP4 experts + 4 GB of bf16
    # batch 1 reads the 4 routed experts per layer at 4.25 bits, the head and dense weights at 16
    step = step_model(arch, "h100-sxm", weights="experts=mxfp4,default=bf16")
    c = step.cost
    assert c.expert_bytes == pytest.approx(arch.expert_params * 4.25 / 8)
    assert c.dense_bytes == pytest.approx(arch.dense_params * 2) and c.head_bytes == pytest.approx(arch.lm_head_params * 2)
    mid = 512 + 256 / 2
    weights_read = arch.lm_head_params * 2 + arch.dense_params * 2 + 4 * arch.expert_params * 4.25 / 8
    expected = weights_read + c.embedding_row_bytes + core.kv_bytes_per_sequence(c, mid) + c.activation_bytes_per_token
    assert shipped.bytes_per_token == pytest.approx(expected, rel=1e-9)
    assert 4.9e9 < shipped.bytes_per_token < 5.1e9
    assert not estimate(arch, "h100-sxm", weights="bf16").fits
    all_bf16 = estimate(arch, "h100-sxm", weights="bf16", tp=4)
    assert all_bf16.weights_bytes == pytest.approx(arch.total_params * 2)


def test_flop_rate_follows_each_groups_compute_dtype():
    arch, device = resolve_model("mixtral-8x7b"), resolve_hardware("h100-sxm")
    fp8, bf16 = device.peak_flops("fp8"), device.peak_flops("bf16")
    dtype, peak = compute_rate(arch, device, parse_weights("experts=fp8,default=bf16"), None)
    expert = arch.experts_per_token * arch.expert_params
    rest = arch.matmul_params_per_token - expert
    assert dtype == "mixed" and peak == pytest.approx((expert + rest) / (expert / fp8 + rest / bf16))
    assert bf16 < peak < fp8
    assert compute_rate(arch, device, parse_weights("experts=fp8,default=bf16"), "bf16") == ("bf16", bf16)  # --compute wins
    assert compute_rate(arch, device, parse_weights("experts=mxfp4,default=bf16"), None) == ("bf16", bf16)
    mixed = estimate(arch, "h100-sxm", weights="experts=fp8,default=bf16", batch=64, prompt=4096, tp=2)
    assert mixed.flops == pytest.approx(peak)


def test_attention_group_needs_a_split_model():
    with pytest.raises(SpeedlimitError, match="dense= instead of attention="):
        estimate("7B", "h100-sxm", weights="attention=fp8,default=q4_k")
    bare = estimate("7B", "h100-sxm", weights="dense=fp8")  # a bare size is all dense weights
    assert bare.weight_bits == 8 and bare.weights_bytes == pytest.approx(7e9)


def test_tied_head_takes_the_embeddings_format():
    with pytest.raises(SpeedlimitError, match="ties its LM head"):
        estimate("gemma-2-9b", "h100-sxm", weights="lm_head=q8_0,default=bf16")
    tied = estimate("gemma-2-9b", "h100-sxm", weights="embeddings=q8_0,default=bf16")
    assert tied.weights_bytes < estimate("gemma-2-9b", "h100-sxm", weights="bf16").weights_bytes


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "speedlimit.cli", *args], capture_output=True, text=True, timeout=60)


def test_cli_estimate_json_and_bad_spelling():
    out = runner.invoke(app, ["estimate", "-m", "gpt-oss-120b", "-H", "h100-sxm", "--weights", "experts=mxfp4,default=bf16", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data == estimate("gpt-oss-120b", "h100-sxm", weights="experts=mxfp4,default=bf16").to_dict()
    bad = run_cli("estimate", "-m", "gpt-oss-120b", "-H", "h100-sxm", "--weights", "experts=mxfp4,shared=bf16")
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and GROUPS_MESSAGE in lines[0], bad.stderr


def test_sweep_takes_the_spelling_as_one_value():
    out = runner.invoke(app, ["sweep", "-m", "gpt-oss-120b", "-H", "h100-sxm", "--weights", "experts=mxfp4,default=bf16",
                              "--batch", "1,8"])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.output)))
    assert [r["weights"] for r in rows] == ["experts=mxfp4,default=bf16"] * 2
    single = estimate("gpt-oss-120b", "h100-sxm", weights="experts=mxfp4,default=bf16", batch=8, prompt=512)
    assert float(rows[1]["decode_tok_s"]) == pytest.approx(single.decode_tok_s, rel=1e-9)


def test_simulate_and_web_take_the_spelling():
    run = simulate("gpt-oss-120b", "h100-sxm", weights="experts=mxfp4,default=bf16", concurrency=2, requests=4,
                   prompt_tokens=128, output_tokens=16)
    assert len(run.records) == 4 and all(r.output_tokens == 16 for r in run.records)
    shipped = step_model("gpt-oss-120b", "h100-sxm", weights="experts=mxfp4,default=bf16")
    assert run.summary.simulation["kv"]["capacity_tokens"] <= shipped.kv_budget_bytes() / shipped.cost.kv_bytes_per_token_global
    from fastapi.testclient import TestClient

    from speedlimit.web.app import create_app

    client = TestClient(create_app())
    body = {"model": "gpt-oss-120b", "hardware": "h100-sxm", "weights": "experts=mxfp4,default=bf16"}
    assert client.post("/api/estimate", json=body).json() == estimate(**body).to_dict()
    bad = client.post("/api/estimate", json={**body, "weights": "experts=mxfp4,experts=bf16"})
    assert bad.status_code == 422 and "given twice" in bad.text


def test_cli_simulate_takes_the_spelling():
    ok = runner.invoke(app, ["simulate", "-m", "gpt-oss-120b", "-H", "h100-sxm", "--weights", "experts=mxfp4,default=bf16",
                             "--concurrency", "2", "--requests", "4", "--output-tokens", "8"])
    assert ok.exit_code == 0, ok.output
    bad = run_cli("simulate", "-m", "gpt-oss-120b", "-H", "h100-sxm", "--weights", "experts=mxfp4,experts=bf16",
                  "--concurrency", "2", "--requests", "4")
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and "given twice" in lines[0], bad.stderr


def test_a_gguf_file_type_that_keeps_groups_apart_is_its_per_group_spelling():
    """llama.cpp's MXFP4_MOE file type (llama-bench's 'MXFP4 MoE'): experts MXFP4, every other tensor Q8_0."""
    spelled = parse_weights("experts=mxfp4,default=q8_0")
    for name in ("mxfp4_moe", "MXFP4-MoE", " mxfp4_moe "):
        assert parse_weights(name) == spelled
    mine = estimate("gpt-oss-20b", "rtx-4090", weights="mxfp4_moe")
    assert mine.to_dict() == estimate("gpt-oss-20b", "rtx-4090", weights="experts=mxfp4,default=q8_0").to_dict()
    # Q8_0 (8.5 bits) outside the experts: more bytes per token than pricing every tensor at MXFP4 (4.25 bits)
    assert mine.bytes_per_token > estimate("gpt-oss-20b", "rtx-4090", weights="mxfp4").bytes_per_token
    ok = runner.invoke(app, ["estimate", "-m", "gpt-oss-20b", "-H", "rtx-4090", "--weights", "mxfp4_moe", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["weights"] == "experts=mxfp4,default=q8_0"
    with pytest.raises(SpeedlimitError, match="unknown weights format"):
        parse_weights("mxfp4_moo")


def test_without_weights_a_checkpoint_is_priced_as_it_ships():
    """The config's quantization_config names the shipped format: fp8 (DeepSeek), MXFP4 experts (gpt-oss); else bf16."""
    from speedlimit.architecture import architecture_from_hf_config
    from speedlimit.catalog import model_entries

    r1 = estimate("deepseek-r1", "h200", tp=8)
    assert r1.weights == "fp8" and r1.to_dict() == estimate("deepseek-r1", "h200", tp=8, weights="fp8").to_dict()
    oss = estimate("gpt-oss-20b", "h100-sxm")
    assert oss.weights == "experts=mxfp4,default=bf16"
    assert oss.to_dict() == estimate("gpt-oss-20b", "h100-sxm", weights="experts=mxfp4,default=bf16").to_dict()
    assert estimate("gpt-oss-20b", "h100-sxm", weights="bf16").weights_bytes > 3 * oss.weights_bytes
    assert estimate("llama-3.1-8b", "h100-sxm").weights == "bf16"  # no quantization_config: bf16 as before
    # a user's config.json is read the same way; a method the estimator does not model stays bf16
    config = dict(model_entries()["deepseek-v3"]["config"])
    assert architecture_from_hf_config(config).shipped_weights == "fp8"
    for quant in ({"quant_method": "awq", "bits": 4}, "fp8", None):
        assert architecture_from_hf_config({**config, "quantization_config": quant}).shipped_weights == ""
    assert architecture_from_hf_config({k: v for k, v in config.items() if k != "quantization_config"}).shipped_weights == ""


def test_shipped_names_the_checkpoints_own_format():
    """``--weights shipped`` (CLI, API, sweep, the web menu) is the same as leaving --weights out, per model."""
    from fastapi.testclient import TestClient

    from speedlimit.estimator.sweep import sweep_grid
    from speedlimit.web.app import create_app

    for spelling in ("shipped", "as-shipped", " Shipped "):
        assert estimate("deepseek-r1", "h200", tp=8, weights=spelling).to_dict() == estimate("deepseek-r1", "h200", tp=8).to_dict()
    assert estimate("llama-3.1-8b", "h100-sxm", weights="shipped").weights == "bf16"
    client = TestClient(create_app())
    body = {"model": "gpt-oss-20b", "hardware": "h100-sxm"}
    assert client.post("/api/estimate", json={**body, "weights": "shipped"}).json() == client.post("/api/estimate", json=body).json()
    grid = sweep_grid(["deepseek-r1", "llama-3.1-8b"], ["h200"], ["shipped", "4"], [1], [512])
    assert list(grid.columns["weights"]) == ["fp8", "int4", "bf16", "int4"]
    ok = runner.invoke(app, ["sweep", "-m", "gpt-oss-20b", "-H", "h100-sxm", "--weights", "shipped,16"])
    assert ok.exit_code == 0 and "experts=mxfp4" in ok.output, ok.output


def test_an_fp8_model_keeps_its_embedding_table_and_lm_head_in_16_bits():
    """The engines' fp8 methods quantize linear layers and experts only (SGLang's and vLLM's
    Fp8Config.get_quant_method): an fp8 model reads its untied LM head at 2 bytes a weight and holds its embedding
    table at 2 bytes; a spelling that names those groups keeps what it names; other formats are unchanged."""
    arch = resolve_model("qwen3-8b")
    assert arch.lm_head_params > 0  # untied
    fp8 = estimate(arch, "h100-sxm", weights="fp8")
    body = arch.total_params - arch.embedding_params - arch.lm_head_params
    assert fp8.weights == "fp8"
    assert fp8.weights_bytes == pytest.approx(body * 1 + (arch.embedding_params + arch.lm_head_params) * 2, rel=1e-12)
    cost, bits = cost_model(arch, parse_precision("fp8"), parse_precision("bf16"))
    assert cost.head_bytes == arch.lm_head_params * 2 and cost.embedding_row_bytes == pytest.approx(arch.hidden_size * 2)
    assert bits == pytest.approx(8 * fp8.weights_bytes / arch.total_params, rel=1e-12) and 9 < bits < 9.5
    named = estimate(arch, "h100-sxm", weights="lm_head=fp8,embeddings=fp8,default=fp8")
    assert named.weights_bytes == pytest.approx(arch.total_params, rel=1e-12)  # every group fp8, as spelled
    assert named.itl_s < fp8.itl_s  # a smaller head to read
    int8 = estimate(arch, "h100-sxm", weights="int8")
    assert int8.weights_bytes == pytest.approx(arch.total_params, rel=1e-12)  # not an fp8 method: all at 1 byte
    # a tied head is the embedding table: read once per token at 2 bytes
    tied = resolve_model("llama-3.2-1b")
    assert tied.lm_head_params == 0
    tied_cost, _ = cost_model(tied, parse_precision("e4m3"), parse_precision("bf16"))
    assert tied_cost.head_bytes == tied.embedding_params * 2
