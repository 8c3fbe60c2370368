"""The seed text's formula and table must come out of `--ideal` exactly (one test per cell)."""

import json

import pytest
from typer.testing import CliRunner

from speedlimit.cli import app
from speedlimit.estimator import estimate

SEED_BANDWIDTH_BPS = 3.35e12
# tokens_per_sec.py in ../shared/seed: printed with one decimal.
SEED_TABLE = {
    ("7B", 16): "239.3", ("7B", 8): "478.6", ("7B", 4): "957.1",
    ("70B", 16): "23.9", ("70B", 8): "47.9", ("70B", 4): "95.7",
    ("175B", 16): "9.6", ("175B", 8): "19.1", ("175B", 4): "38.3",
}  # fmt: skip


@pytest.mark.parametrize(("size", "bits"), list(SEED_TABLE))
def test_seed_table_cell(size, bits):
    from speedlimit.hardware import custom_hardware

    result = estimate(size, custom_hardware(SEED_BANDWIDTH_BPS), weights=bits, ideal=True)
    assert f"{result.decode_tok_s:5.1f}".strip() == SEED_TABLE[(size, bits)]
    params = {"7B": 7e9, "70B": 70e9, "175B": 175e9}[size]
    assert result.decode_tok_s == pytest.approx(SEED_BANDWIDTH_BPS / (params * bits / 8), rel=1e-12)
    assert result.bytes_per_token == pytest.approx(params * bits / 8, rel=1e-12)


def test_seed_70b_1000_token_reply():
    result = estimate("70B", "h100-sxm", weights=16, ideal=True, output=1000)
    assert f"{result.reply_s:.1f}" == "41.8"


def test_cli_prints_seed_number():
    runner = CliRunner()
    out = runner.invoke(app, ["estimate", "--model", "7B", "--weights", "16", "--bandwidth", "3.35e12", "--ideal"])
    assert out.exit_code == 0, out.output
    assert "239.3 tok/s" in out.output
    as_json = runner.invoke(app, ["estimate", "--model", "7B", "--weights", "16", "--bandwidth", "3.35e12", "--ideal", "--json"])
    assert round(json.loads(as_json.output)["decode_tok_s"], 1) == 239.3


def test_ideal_batching_climbs_until_compute_bound():
    """Seed: batching reuses one weight read, so throughput rises ~B× until the FLOPs ceiling."""
    one = estimate("70B", "h100-sxm", weights=16, ideal=True, batch=1)
    eight = estimate("70B", "h100-sxm", weights=16, ideal=True, batch=8)
    huge = estimate("70B", "h100-sxm", weights=16, ideal=True, batch=4096)
    assert eight.throughput_tok_s == pytest.approx(8 * one.throughput_tok_s)
    assert huge.regime == "compute"
    assert huge.throughput_tok_s == pytest.approx(989.4e12 / (2 * 70e9), rel=1e-9)
