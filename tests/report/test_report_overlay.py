"""`speedlimit report MEASURED --predicted PREDICTED`: a predicted run (source "simulate", the files bench writes)
overlaid on a measured one: percentiles side by side with ratios; sweeps on the same axes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from speedlimit.artifacts import Comparison, Distribution, PredictionBlock, RequestRecord, RunSummary, SweepInfo, SweepSummary
from speedlimit.bench.metrics import summarize
from speedlimit.errors import SpeedlimitError
from speedlimit.report import build_report
from speedlimit.report.plots import compared_points
from tests.report.test_report import PNG_MAGIC, embedded_pngs, fake_requests, sections, write_jsonl


def dist(p50: float) -> Distribution:
    return Distribution(mean=p50 * 1.1, p50=p50, p90=p50 * 1.5, p95=p50 * 1.7, p99=p50 * 2, min=p50 / 2, max=p50 * 3, n=10)


def measured_run(path):
    rows = fake_requests(30)
    write_jsonl(path / "requests.jsonl", rows)
    records = [RequestRecord.model_validate(row) for row in rows]
    summarize(records, 5.0).save(path / "summary.json")
    return path


def test_run_overlay_shows_percentiles_side_by_side_with_ratios(tmp_path):
    measured = measured_run(tmp_path / "measured")
    predicted = RunSummary(source="simulate", requests=30, completed=30, duration_s=4.0, output_tok_s=400.0, request_s=7.5,
                           ttft_s=dist(0.05), itl_s=dist(0.01), tpot_s=dist(0.01), e2e_s=dist(0.5))
    predicted.save(tmp_path / "predicted" / "summary.json")
    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "report", str(measured), "--predicted", str(tmp_path / "predicted"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert sections(text) == {"summary", "overlay", "distributions", "timeline"}
    overlay = text[text.index('<section id="overlay">'):]
    overlay = overlay[: overlay.index("</section>")]
    measured_summary = RunSummary.load(measured / "summary.json")
    # TTFT p50: measured, predicted 50.00 ms, and their ratio
    ratio = f"{measured_summary.ttft_s.p50 / 0.05:.3g}×"
    assert re.search(rf'<td class="text">TTFT p50</td><td>[0-9.]+ ms</td><td>50.00 ms</td><td>{re.escape(ratio)}</td>', overlay)
    for metric in ("TTFT p99", "TPOT p50", "TPOT p99", "E2E p90", "output tok/s"):
        assert f'<td class="text">{metric}</td>' in overlay
    assert "(simulate)" in overlay and "(bench)" in overlay
    assert (tmp_path / "out" / "overlay.png").read_bytes().startswith(PNG_MAGIC)
    assert len(embedded_pngs(overlay)) == 1


def sweep(source: str, tok_s: list[float], ttft: list[float]) -> SweepSummary:
    loads = [1.0, 2.0, 4.0, 8.0]
    points = [RunSummary(source=source, requests=10, completed=10, output_tok_s=t, ttft_s=dist(f), tpot_s=dist(0.01 * load ** 0.5),
                         sweep_value=load) for load, t, f in zip(loads, tok_s, ttft)]
    return SweepSummary(sweep=SweepInfo(parameter="concurrency", values=loads, knee_load=4.0, knee_output_tok_s=tok_s[2],
                                        saturation_output_tok_s=max(tok_s)), points=points)


def test_sweep_overlay_matches_load_levels_and_draws_both_curves(tmp_path):
    measured = sweep("bench", [50, 95, 170, 190], [0.05, 0.06, 0.09, 0.2])
    predicted = sweep("simulate", [55, 100, 200, 210], [0.04, 0.05, 0.08, 0.1])
    predicted.points = predicted.points[1:]  # the prediction skipped load 1
    measured.save(tmp_path / "measured" / "summary.json")
    for point in measured.points:  # measured runs with records, predicted without
        write_jsonl(tmp_path / "measured" / f"concurrency_{point.sweep_value:g}" / "requests.jsonl", fake_requests(5))
    predicted.save(tmp_path / "predicted" / "summary.json")
    text = build_report(tmp_path / "measured", tmp_path / "out", tmp_path / "predicted").read_text(encoding="utf-8")
    assert sections(text) == {"sweep", "overlay", "distributions", "timeline"}
    overlay = text[text.index('<section id="overlay">'):]
    rows = re.findall(r'<tr><td>([0-9.]+)</td><td class="text">output tok/s</td><td>([0-9.,]+)</td><td>([0-9.,]+)</td><td>([0-9.]+)×</td>', overlay)
    assert rows == [("2", "95", "100", "0.95"), ("4", "170", "200", "0.85"), ("8", "190", "210", "0.905")]
    assert '<td>8</td><td class="text">TTFT</td><td>200.00 ms</td><td>100.00 ms</td><td>2×</td>' in overlay
    assert (tmp_path / "out" / "sweep.png").read_bytes().startswith(PNG_MAGIC)


def test_sweep_plot_changes_when_a_prediction_is_overlaid(tmp_path):
    """The predicted curves are drawn on the sweep plot (not just listed)."""
    measured = sweep("bench", [50, 95, 170, 190], [0.05, 0.06, 0.09, 0.2])
    measured.save(tmp_path / "m" / "summary.json")
    sweep("simulate", [55, 100, 200, 210], [0.04, 0.05, 0.08, 0.1]).save(tmp_path / "p" / "summary.json")
    alone = build_report(tmp_path / "m", tmp_path / "alone")
    both = build_report(tmp_path / "m", tmp_path / "both", tmp_path / "p")
    assert sections(alone.read_text(encoding="utf-8")) == {"sweep"}
    assert (alone.parent / "sweep.png").read_bytes() != (both.parent / "sweep.png").read_bytes()


@pytest.mark.parametrize("kind", ["run-on-sweep", "other-parameter"])
def test_overlay_of_different_kinds_is_a_one_line_error(tmp_path, kind):
    sweep("bench", [1, 2, 3, 4], [0.1] * 4).save(tmp_path / "m" / "summary.json")
    if kind == "run-on-sweep":
        RunSummary(source="simulate", requests=1).save(tmp_path / "p" / "summary.json")
        fragment = "cannot overlay a single run"
    else:
        other = sweep("simulate", [1, 2, 3, 4], [0.1] * 4)
        other.sweep.parameter = "rate"
        other.save(tmp_path / "p" / "summary.json")
        fragment = "cannot overlay a rate sweep"
    with pytest.raises(SpeedlimitError, match=fragment) as error:
        build_report(tmp_path / "m", tmp_path / "out", tmp_path / "p")
    assert "\n" not in str(error.value)


def _simulate(*argv: str) -> None:
    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "simulate", "-m", "smollm2-135m", "-H", "rtx-4090",
                           "--prompt-tokens", "128", "--output-tokens", "32", *argv], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_simulate_out_overlays_on_a_measured_run(tmp_path):
    """Real `simulate --out` output (not a hand-made summary) as the --predicted side of a report."""
    measured = measured_run(tmp_path / "measured")
    _simulate("--concurrency", "1", "--requests", "30", "--out", str(tmp_path / "predicted"))
    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "report", str(measured), "--predicted",
                           str(tmp_path / "predicted"), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    overlay = text[text.index('<section id="overlay">'):]
    overlay = overlay[: overlay.index("</section>")]
    predicted = RunSummary.load(tmp_path / "predicted" / "summary.json")
    assert predicted.source == "simulate"
    shown = f"{predicted.ttft_s.p50 * 1e3:.2f} ms"
    assert re.search(rf'<td class="text">TTFT p50</td><td>[0-9.,]+ ms</td><td>{re.escape(shown)}</td><td>[0-9.]+×</td>', overlay)
    assert "(simulate)" in overlay and (tmp_path / "out" / "overlay.png").read_bytes().startswith(PNG_MAGIC)
    # and the predicted run on its own draws like a bench run
    assert build_report(tmp_path / "predicted").is_file()


def test_simulate_sweep_out_overlays_on_a_measured_sweep(tmp_path):
    measured = sweep("bench", [50, 95, 170, 190], [0.05, 0.06, 0.09, 0.2])
    measured.save(tmp_path / "measured" / "summary.json")
    _simulate("--sweep", "concurrency=1,2,4,8", "--requests", "16", "--out", str(tmp_path / "predicted"))
    predicted = SweepSummary.load(tmp_path / "predicted" / "summary.json")
    text = build_report(tmp_path / "measured", tmp_path / "out", tmp_path / "predicted").read_text(encoding="utf-8")
    assert sections(text) >= {"sweep", "overlay"}
    overlay = text[text.index('<section id="overlay">'):]
    rows = re.findall(r'<tr><td>([0-9.]+)</td><td class="text">output tok/s</td><td>([0-9.,]+)</td><td>([0-9.,]+)</td>', overlay)
    assert [r[0] for r in rows] == ["1", "2", "4", "8"]
    assert [float(r[2].replace(",", "")) for r in rows] == pytest.approx([p.output_tok_s for p in predicted.points], rel=0.01)
    assert build_report(tmp_path / "predicted").is_file()


def test_report_of_a_simulated_run_above_saturation_says_the_queue_grows(tmp_path):
    _simulate("--rate", "5000", "--requests", "300", "--max-seqs", "8", "--out", str(tmp_path / "over"))
    predicted = RunSummary.load(tmp_path / "over" / "summary.json")
    rate = predicted.simulation["saturation_request_s"]
    text = build_report(tmp_path / "over").read_text(encoding="utf-8")
    summary = text[text.index('<section id="summary">'):]
    summary = " ".join(summary[: summary.index("</section>")].split())
    assert "grows without bound" in summary and f"saturation rate {rate:.3g} req/s" in summary
    _simulate("--sweep", "rate=1,5000", "--requests", "200", "--max-seqs", "8", "--out", str(tmp_path / "sweep"))
    text = " ".join(build_report(tmp_path / "sweep").read_text(encoding="utf-8").split())
    assert "At rate 5000, the offered rate 5000 req/s exceeds" in text and "At rate 1," not in text


def compared_sweep(method: str = "simulate") -> SweepSummary:
    """A measured sweep whose levels carry what `bench --compare-estimate` predicted (an estimate block each)."""
    measured = sweep("bench", [50, 95, 170, 190], [0.05, 0.06, 0.09, 0.2])
    for point, tok_s in zip(measured.points, [55.0, 100.0, None, 210.0]):
        rows = {"ttft_s.p50": Comparison(measured=point.ttft_s.p50, predicted=point.ttft_s.p50 / 2),
                "ttft_s.p99": Comparison(measured=point.ttft_s.p99, predicted=float("nan")),
                "tpot_s.p50": Comparison(measured=point.tpot_s.p50, predicted=0.02)}
        if tok_s is not None:  # the third level's prediction has no throughput: it is not drawn
            rows["output_tok_s"] = Comparison(measured=point.output_tok_s, predicted=tok_s)
        point.estimate = PredictionBlock(model="m", hardware="h", method=method, comparison=rows)
    return measured


@pytest.mark.parametrize("method, label", [("simulate", "predicted (replay)"), ("estimate", "predicted (estimate)")])
def test_compared_points_are_the_stored_predictions_level_by_level(method, label):
    name, points = compared_points(compared_sweep(method))
    assert name == label
    assert [(p.sweep_value, p.output_tok_s) for p in points] == [(1.0, 55.0), (2.0, 100.0), (8.0, 210.0)]
    assert [p.ttft_s.p50 for p in points] == [0.025, 0.03, 0.1]
    assert all(p.ttft_s.p99 is None and p.tpot_s.p50 == 0.02 and p.tpot_s.p99 is None for p in points)
    assert compared_points(sweep("bench", [1, 2, 3, 4], [0.1] * 4)) == ("predicted (estimate)", [])


def test_a_compared_sweep_draws_its_predictions_on_the_sweep_plot(tmp_path):
    """`bench --sweep ... --compare-estimate` then `report`: the stored predictions are a curve on the sweep plot,
    and the text says what the dotted curve is."""
    compared_sweep().save(tmp_path / "compared" / "summary.json")
    sweep("bench", [50, 95, 170, 190], [0.05, 0.06, 0.09, 0.2]).save(tmp_path / "plain" / "summary.json")
    compared = build_report(tmp_path / "compared", tmp_path / "out-compared")
    plain = build_report(tmp_path / "plain", tmp_path / "out-plain")
    text = compared.read_text(encoding="utf-8")
    assert "Dotted with triangles: predicted (replay), what --compare-estimate predicted at each level" in text
    assert "Dotted with triangles" not in plain.read_text(encoding="utf-8")
    assert (compared.parent / "sweep.png").read_bytes() != (plain.parent / "sweep.png").read_bytes()
