"""Pure metrics shared by bench and simulate: percentiles, SLO/goodput, the run summary of records, the sweep knee.

No I/O here: everything takes records (`speedlimit.artifacts.RequestRecord`) and returns typed artifacts, so it is unit-tested with fabricated
timings. Definitions (seconds throughout):

- TTFT: request sent -> first SSE event that carries generated text.
- TTFT: request sent (its last byte on the socket) -> first SSE event that carries generated text.
- ITL per chunk (`itl_s`): every gap between consecutive text-carrying events of one request (pooled over requests).
- ITL per token (`itl_token_s`): each chunk gap divided by its request's mean tokens per chunk
  (output_tokens / output_chunks), one sample per gap. Equal to the per-chunk ITL when every chunk carries one
  token; against a server that sends 4 tokens per chunk it is a quarter of it. `--slo itl=` and `--compare-estimate`
  use this one: an SLO or an estimate is about tokens, not about how the server packs them into events.
- TPOT: (E2E - TTFT) / (output_tokens - 1), so it spreads multi-token chunks over their tokens.
- E2E: request sent -> end of the response stream.
- Throughput figures divide totals of *completed* requests by the run's wall time (first send -> last end).
- Retried: requests re-sent once on a fresh connection because a reused keep-alive connection failed before any
  response (see bench/client.py); a retried request is timed from its retry.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Iterable, Sequence

import numpy as np

from speedlimit.artifacts import Distribution, RequestRecord, RunSummary
from speedlimit.errors import SpeedlimitError

PERCENTILES = (50, 90, 95, 99)

#: Error kinds a request can end with (None = completed). `http_<status>` covers every non-200 status.
ERROR_KINDS = ("connect", "disconnect", "truncated", "malformed_sse", "timeout", "empty", "server_error",
               "http_<status>", "client", "cancelled")


def distribution(values: Iterable[float | None]) -> Distribution:
    """mean/p50/p90/p95/p99/min/max/n of `values` (linear-interpolated percentiles); None fields when empty."""
    if isinstance(values, np.ndarray):  # an array argument is reordered in place (percentiles partition it)
        array = values.astype(float, copy=False)
    else:
        array = np.fromiter((v for v in values if v is not None), dtype=float)
    if array.size == 0:
        return Distribution()
    mean, low, high = float(array.mean()), float(array.min()), float(array.max())
    quantiles = np.percentile(array, PERCENTILES, overwrite_input=True)
    return Distribution(mean=mean, **{f"p{p}": float(q) for p, q in zip(PERCENTILES, quantiles)},
                        min=low, max=high, n=int(array.size))


# --- SLOs and goodput ---------------------------------------------------------------------------

SLO_KEYS = {
    "ttft": "time to first token of the request",
    "itl": "p99 (nearest rank: the max when < 100 gaps) of the request's own per-token gaps (chunk gap / tokens per "
           "chunk)",
    "tpot": "time per output token of the request",
    "e2e": "end-to-end latency of the request",
}

_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ms|s|us)?\s*$", re.IGNORECASE)


def parse_duration_s(text: str) -> float:
    """'0.5', '0.5s', '500ms', '800us' -> seconds."""
    match = _DURATION_RE.match(text)
    if not match:
        raise SpeedlimitError(f"cannot read duration {text!r}: use seconds like 0.5, 0.5s or 500ms")
    value = float(match.group(1))
    unit = (match.group(2) or "s").lower()
    return value * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=500ms,itl=50ms' -> {'ttft': 0.5, 'itl': 0.05}; keys from SLO_KEYS."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise SpeedlimitError(f"bad --slo part {part!r}: use key=duration with keys {', '.join(SLO_KEYS)}")
        slo[key] = parse_duration_s(value)
    return slo


def tokens_per_chunk(record: RequestRecord) -> float:
    """The request's mean output tokens per text-carrying event (1 when unknown)."""
    if record.output_tokens and record.output_chunks:
        return max(record.output_tokens / record.output_chunks, 1e-9)
    return 1.0


def token_gaps_s(record: RequestRecord) -> list[float]:
    """Per-token inter-token gaps of one request: each chunk gap divided by its mean tokens per chunk."""
    per_chunk = tokens_per_chunk(record)
    return [gap / per_chunk for gap in record.itl_s] if per_chunk != 1.0 else list(record.itl_s)


def request_itl_p99_s(record: RequestRecord) -> float | None:
    """Nearest-rank p99 of the request's per-token gaps: the ceil(0.99 n)-th smallest, so its max when n < 100."""
    gaps = token_gaps_s(record)
    if not gaps:
        return None
    return float(np.percentile(np.asarray(gaps, dtype=float), 99, method="inverted_cdf"))


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    """True when a completed request meets every SLO bound; a missing measurement (e.g. no ITL) passes that bound."""
    if not record.ok:
        return False
    measured = {"ttft": lambda: record.ttft_s, "itl": lambda: request_itl_p99_s(record), "tpot": lambda: record.tpot_s,
                "e2e": lambda: record.e2e_s}  # only the bounds asked for are computed (ITL p99 sorts the gaps)
    for key, bound in slo.items():
        value = measured[key]()
        if value is not None and value > bound:
            return False
    return True


# --- run summary --------------------------------------------------------------------------------


def _dominant_source(sources: Sequence[str]) -> tuple[str, dict[str, int]]:
    counts: dict[str, int] = {}
    for source in sources:
        counts[source] = counts.get(source, 0) + 1
    if not counts:
        return "none", counts
    return (next(iter(counts)) if len(counts) == 1 else "mixed"), counts


def _pooled_gaps(records: Sequence[RequestRecord], per_token: bool = False) -> np.ndarray:
    """Every inter-token gap of these records (per chunk, or per token as `token_gaps_s` gives them), pooled into one
    array sized first: no intermediate lists, so millions of gaps from a simulation cost one float64 array."""
    count = sum(len(record.itl_s) for record in records)

    def gaps(record: RequestRecord):
        per_chunk = tokens_per_chunk(record) if per_token else 1.0
        return record.itl_s if per_chunk == 1.0 else token_gaps_s(record)

    return np.fromiter(itertools.chain.from_iterable(gaps(record) for record in records), dtype=float, count=count)


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: dict[str, float] | None = None,
              **context: Any) -> RunSummary:
    """The run summary of these records; ``context`` fills the summary's other fields (load, endpoint, source)."""
    slo = slo or {}
    done = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for record in records:
        if record.error_kind:
            errors[record.error_kind] = errors.get(record.error_kind, 0) + 1
    output_tokens = sum(r.output_tokens or 0 for r in done)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in done)
    good = sum(1 for r in done if meets_slo(r, slo))
    rate = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    token_source, token_sources = _dominant_source([r.token_count_source for r in done])
    prompt_source, prompt_sources = _dominant_source([r.prompt_token_source for r in done])
    busy_s = sum(r.e2e_s or 0.0 for r in records)
    return RunSummary(
        requests=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        cancelled=errors.get("cancelled", 0),
        retried=sum(1 for r in records if r.retries),
        errors=dict(sorted(errors.items())),
        duration_s=duration_s,
        ttft_s=distribution(r.ttft_s for r in done),
        itl_s=distribution(_pooled_gaps(done)),
        itl_token_s=distribution(_pooled_gaps(done, per_token=True)),
        tpot_s=distribution(r.tpot_s for r in done),
        e2e_s=distribution(r.e2e_s for r in done),
        request_s=rate(len(done)),
        output_tok_s=rate(output_tokens),
        input_tok_s=rate(prompt_tokens),
        total_tok_s=rate(output_tokens + prompt_tokens),
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        mean_in_flight=rate(busy_s),
        slo=dict(slo),
        goodput_requests=good,
        goodput_request_s=rate(good),
        token_count_source=token_source,
        token_count_sources=token_sources,
        prompt_token_source=prompt_source,
        prompt_token_sources=prompt_sources,
        **context,
    )


def run_warnings(records: Sequence[RequestRecord], requested_output_tokens: int | None = None,
                 forced_output: bool = False) -> list[str]:
    """What a reader of this run's numbers must know: token counts that are only chunk counts, all-failed runs."""
    warnings = []
    done = [r for r in records if r.ok]
    ended = [r for r in records if r.error_kind != "cancelled"]  # cancelled: stopped by us, not the server
    if ended and not done:
        errors: dict[str, int] = {}
        for record in ended:
            errors[record.error_kind or "?"] = errors.get(record.error_kind or "?", 0) + 1
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(errors.items()))
        warnings.append(f"every request failed ({kinds}): these are no measurements of the server")
    chunks = [r for r in done if r.token_count_source == "chunks"]
    if not chunks:
        return warnings
    hint = ("pass --tokenizer PATH (the model's tokenizer.json or .gguf) to count them exactly, or use a server that "
            "reports usage")
    contradicting = [r for r in chunks if forced_output and requested_output_tokens
                     and r.finish_reason == "length" and r.output_chunks < requested_output_tokens]
    if contradicting:
        mean_chunks = sum(r.output_chunks for r in contradicting) / len(contradicting)
        warnings.append(
            f"output tokens are stream chunks, and they contradict the forced --output-tokens "
            f"{requested_output_tokens}: {len(contradicting)} request(s) ended with finish_reason 'length' after "
            f"{mean_chunks:.1f} chunks on average, so the server sends ~{requested_output_tokens / mean_chunks:.1f} "
            f"tokens per chunk and tok/s, TPOT and per-token ITL are off by that factor; {hint}")
    else:
        warnings.append(f"output tokens of {len(chunks)} of {len(done)} completed request(s) are counted as stream "
                        f"chunks (no usage from the server, no tokenizer): if a chunk carries several tokens, tok/s, "
                        f"TPOT and per-token ITL are wrong; {hint}")
    return warnings


# --- sweeps: knee and saturation -----------------------------------------------------------------


def find_knee(loads: Sequence[float], output_tok_s: Sequence[float], fraction: float = 0.9) -> dict[str, Any]:
    """Saturation throughput = the best measured output tok/s; knee = the lowest load reaching `fraction` of it.

    Past the knee, more load buys < (1 - fraction) more throughput and only adds queueing latency.
    """
    if len(loads) != len(output_tok_s) or not loads:
        raise SpeedlimitError("a sweep needs at least one point with a throughput")
    if not 0 < fraction <= 1:
        raise SpeedlimitError("the knee fraction must be in (0, 1]")
    order = sorted(range(len(loads)), key=lambda i: loads[i])
    saturation = max(output_tok_s)
    knee_index = next(i for i in order if output_tok_s[i] >= fraction * saturation - 1e-12)
    best_index = max(order, key=lambda i: (output_tok_s[i], -loads[i]))
    return {
        "saturation_output_tok_s": float(saturation),
        "saturation_load": loads[best_index],
        "knee_load": loads[knee_index],
        "knee_output_tok_s": float(output_tok_s[knee_index]),
        "knee_fraction": fraction,
    }
