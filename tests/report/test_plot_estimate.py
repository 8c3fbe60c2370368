"""`plot_estimate` (behind `speedlimit estimate --plot`) and the curve/knee helpers it draws."""

from __future__ import annotations

import pytest

from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import estimate
from speedlimit.report import plot_estimate
from speedlimit.estimator.curves import batch_curve, curve_batches, find_batch_knee, roofline


def test_plot_estimate_writes_a_png(tmp_path):
    out = plot_estimate("llama-3.1-8b", "h100-sxm", tmp_path / "sub" / "plot.png", weights="4", batch=8)
    assert out == tmp_path / "sub" / "plot.png"
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000


def test_plot_estimate_passes_bad_input_through_as_speedlimit_error(tmp_path):
    with pytest.raises(SpeedlimitError, match="unknown model"):
        plot_estimate("nope-model", "h100-sxm", tmp_path / "plot.png")
    assert not (tmp_path / "plot.png").exists()


@pytest.mark.parametrize(
    ("model", "kwargs"),
    [
        ("llama-3.1-8b", {"weights": "4"}),
        ("llama-3.1-8b", {"weights": "16", "ideal": True}),
        ("llama-3.1-70b", {"weights": "q4_k_m", "tp": 2, "kv": "fp8", "prompt": 4000, "output": 1000}),
        ("mixtral-8x7b", {"weights": "fp8", "batch": 3}),
    ],
)
def test_curve_points_equal_estimate(model, kwargs):
    curve = batch_curve(model, "h100-sxm", **kwargs)
    assert curve["estimate"] == estimate(model, "h100-sxm", **kwargs).to_dict()
    for point in curve["points"]:
        expected = estimate(model, "h100-sxm", **{**kwargs, "batch": point["batch"]})
        assert point["itl_s"] == pytest.approx(expected.itl_s, rel=1e-9)
        assert point["throughput_tok_s"] == pytest.approx(expected.throughput_tok_s, rel=1e-9)
        assert point["memory_bytes"] == pytest.approx(expected.memory_bytes, rel=1e-12)
        assert point["fits"] == expected.fits
        assert point["regime"] == expected.regime


def test_curve_batches_cover_the_memory_limit_and_current_batch():
    batches = curve_batches(100, 343.0)
    assert batches[0] == 1 and 100 in batches and 343 in batches and batches[-1] > 343
    assert curve_batches(1, None)[-1] >= 512
    assert curve_batches(1, 0.0)[-1] >= 512  # nothing fits: still show the shape


def test_knee_is_where_throughput_stops_paying():
    batches = [1, 2, 4, 8, 16, 32, 64]
    linear_then_flat = [10, 20, 40, 80, 100, 105, 107]
    assert find_batch_knee(batches, linear_then_flat) == 8
    assert find_batch_knee(batches, [10 * b for b in batches]) is None  # never flattens
    moe_dip_then_recover = [10, 11, 20, 40, 80, 84, 85]  # early dip (more experts read) is not the knee
    assert find_batch_knee(batches, moe_dip_then_recover) == 16


def test_roofline_point_sits_under_the_roof():
    result = estimate("llama-3.1-8b", "h100-sxm", weights="4", batch=4).to_dict()
    roof = roofline(result)
    assert roof["point"]["intensity"] == pytest.approx(result["arithmetic_intensity"])
    attainable = min(result["flops"] * result["flops_efficiency"], result["arithmetic_intensity"] * result["bandwidth_Bps"] * result["bw_efficiency"])
    assert 0 < roof["point"]["flops"] <= attainable * (1 + 1e-9)
    assert roof["ridge_intensity"] == pytest.approx(result["flops"] / result["bandwidth_Bps"])
    assert roof["intensity"][0] < result["arithmetic_intensity"] < roof["intensity"][-1]


def test_roofline_of_a_two_socket_cpu_uses_the_bandwidth_one_process_reaches():
    result = estimate("llama-3.1-8b", "amd-epyc-9654-2p", weights="q4_k_m", batch=4).to_dict()
    roof = roofline(result)
    memory_roof = roof["effective_roof_flops"][0] / roof["intensity"][0]  # the low-intensity end is memory-bound
    assert memory_roof == pytest.approx(result["reached_bandwidth_Bps"] * result["bw_efficiency"])
    assert memory_roof < 0.6 * result["bandwidth_Bps"] * result["bw_efficiency"]  # not the summed peak
    assert 0 < roof["point"]["flops"] <= result["arithmetic_intensity"] * memory_roof * (1 + 1e-9)
