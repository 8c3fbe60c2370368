"""`--compare-estimate`: put a measured run next to the estimator's prediction for the same model, hardware and
workload, with measured/predicted ratios (> 1 means slower than predicted for latencies, faster for throughputs).

The workload maps onto `estimate()` as: batch = the concurrency (closed loop) or the measured mean number of requests
in flight (open loop, Little's law), prompt = mean prompt tokens, output = mean output tokens.
"""

from __future__ import annotations

from typing import Any

from speedlimit.errors import SpeedlimitError

#: (label, measured summary path, predicted key)
COMPARED = (
    ("ttft_s", ("ttft_s", "p50"), "ttft_s"),
    ("itl_s", ("itl_s", "mean"), "itl_s"),
    ("e2e_s", ("e2e_s", "p50"), "e2e_s"),
    ("output_tok_s", ("output_tok_s",), "throughput_tok_s"),
    ("decode_tok_s_per_user", ("decode_tok_s_per_user",), "decode_tok_s"),
)


def estimate_inputs(summary: dict[str, Any]) -> dict[str, int]:
    """batch/prompt/output for `estimate()` from a run summary (pure)."""
    completed = max(1, summary.get("completed") or 0)
    load = summary.get("load") or {}
    batch = load.get("concurrency") or summary.get("mean_in_flight") or 1
    return {
        "batch": max(1, int(round(batch))),
        "prompt": max(0, int(round((summary.get("prompt_tokens") or 0) / completed))),
        "output": max(1, int(round((summary.get("output_tokens") or 0) / completed))),
    }


def _lookup(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def compare(summary: dict[str, Any], predicted: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """measured, predicted and measured/predicted for each compared metric (pure)."""
    itl_mean = _lookup(summary, ("itl_s", "mean"))
    measured_all = dict(summary)
    measured_all["decode_tok_s_per_user"] = 1.0 / itl_mean if itl_mean else None
    rows = {}
    for label, path, key in COMPARED:
        measured = _lookup(measured_all, path)
        expected = predicted.get(key)
        expected = float(expected) if isinstance(expected, (int, float)) else None
        ratio = measured / expected if measured is not None and expected else None
        rows[label] = {"measured": measured, "predicted": expected, "ratio": ratio}
    return rows


def estimate_for(summary: dict[str, Any], *, hardware: str, served_model: str | None,
                 estimate_model: str | None) -> dict[str, Any]:
    """Run the estimator for this run and return the summary's `estimate` block."""
    try:
        from speedlimit.estimator import estimate
    except ImportError as error:  # the estimate leg is not installed in this build
        raise SpeedlimitError(f"--compare-estimate needs speedlimit.estimator ({error})") from None
    inputs = estimate_inputs(summary)
    model = estimate_model or served_model
    if not model:
        raise SpeedlimitError("--compare-estimate needs --estimate-model NAME_OR_PATH (the served model is unknown)")
    from speedlimit.catalog import resolve_model

    try:
        architecture = resolve_model(model)
    except SpeedlimitError as error:
        if estimate_model:
            raise
        raise SpeedlimitError(f"the served model {model!r} is not something the estimator knows ({error}); "
                              "pass --estimate-model CATALOG_NAME_OR_PATH") from None
    prediction = estimate(architecture, hardware, **inputs)
    predicted = prediction.to_dict()
    return {"model": model, "hardware": hardware, "inputs": inputs, "predicted": predicted,
            "comparison": compare(summary, predicted)}
