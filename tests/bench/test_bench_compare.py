"""--compare-estimate: mapping a run onto estimate() inputs and the measured/predicted ratios."""

from __future__ import annotations

import pytest

from speedlimit.artifacts import LoadInfo, RunSummary
from speedlimit.bench.compare import compare, estimate_for, estimate_inputs
from speedlimit.errors import SpeedlimitError

SUMMARY = RunSummary.parse({
    "completed": 4, "prompt_tokens": 256, "output_tokens": 128, "mean_in_flight": 2.6,
    "load": {"concurrency": None, "rate": 2.0},
    "ttft_s": {"p50": 0.2, "mean": 0.25}, "itl_s": {"mean": 0.005, "p50": 0.0049}, "tpot_s": {"mean": 0.02},
    "itl_token_s": {"mean": 0.0125},
    "e2e_s": {"p50": 0.9}, "output_tok_s": 100.0,
})


def test_inputs_use_littles_law_for_open_loop_and_concurrency_for_closed():
    assert estimate_inputs(SUMMARY) == {"batch": 3, "prompt": 64, "output": 32}
    closed = SUMMARY.model_copy(update={"offered_load": LoadInfo(concurrency=8)})
    assert estimate_inputs(closed)["batch"] == 8


def test_ratios_are_measured_over_predicted():
    rows = compare(SUMMARY, {"ttft_s": 0.1, "itl_s": 0.01, "e2e_s": None, "throughput_tok_s": 400.0,
                             "decode_tok_s": 100.0})
    assert rows["ttft_s"].ratio == pytest.approx(2.0)
    assert rows["tpot_s"].ratio == pytest.approx(2.0)  # per token, not per chunk (itl_s mean is 0.005 here)
    assert rows["itl_token_s"].ratio == pytest.approx(1.25)
    assert "itl_s" not in rows  # the per-chunk ITL is never compared with a per-token prediction
    assert rows["e2e_s"].ratio is None and rows["e2e_s"].measured == 0.9
    assert rows["output_tok_s"].ratio == pytest.approx(0.25)
    assert rows["decode_tok_s_per_user"].measured == pytest.approx(50.0)
    assert rows["decode_tok_s_per_user"].ratio == pytest.approx(0.5)


def test_estimate_block_from_the_real_estimator_for_a_catalog_model():
    block = estimate_for(SUMMARY, hardware="h100-sxm", served_model="served-name", estimate_model="smollm2-135m")
    assert block.inputs == {"batch": 3, "prompt": 64, "output": 32}
    assert block.predicted["batch"] == 3 and block.predicted["itl_s"] > 0
    assert block.comparison["tpot_s"].ratio == pytest.approx(0.02 / block.predicted["itl_s"])


def test_unknown_served_model_asks_for_estimate_model():
    with pytest.raises(SpeedlimitError, match="--estimate-model"):
        estimate_for(SUMMARY, hardware="h100-sxm", served_model="my-finetune-v3", estimate_model=None)
