"""What the server saw: its Prometheus ``/metrics``, scraped before, during and after a bench run.

vLLM (``vllm:``), SGLang (``sglang:``), TGI (``tgi_``), llama.cpp's ``llama-server --metrics`` (``llamacpp:``) and
TensorRT-LLM's ``trtllm-serve`` (``trtllm_``) export their own view of a run: requests running and waiting, KV-cache
use, prefix-cache hits, token counters and (vLLM, SGLang, TGI, TensorRT-LLM) latency histograms. The text is parsed
with ``prometheus_client.parser`` (the Prometheus project's Python client), never by hand. Each scrape becomes one
line of ``server_metrics.jsonl`` in the run directory: every sample of the server's own families, summed over label
sets (histogram buckets keep their ``le``).

`summarize_server` maps the known names onto one typed `ServerMetrics` block: gauges as mean/max over the run's
scrapes, counters and histograms as the difference between the scrape after the run and the one before it (so what
other clients sent before the run does not count). Histogram percentiles are estimated from the bucket counts the way
Prometheus' ``histogram_quantile`` does (linear within a bucket); means are exact (``_sum``/``_count``).

A server without ``/metrics`` (404, 405 or 501 before the run) leaves one note line; an answer that is not Prometheus
text, an endpoint that hangs or fails mid-run leaves one warning line. None of them fails the run: the scraper stops.

Metric names (checked against each project's docs and source, Dec 2026):
- vLLM: docs.vllm.ai "Production Metrics" and docs/design/metrics.md (V1: ``kv_cache_usage_perc``,
  ``prefix_cache_queries/hits``, ``inter_token_latency_seconds``; V0: ``gpu_cache_usage_perc``,
  ``time_per_output_token_seconds``; both: ``cache_config_info``, "Information of the LLMEngine CacheConfig", whose
  labels ``num_gpu_blocks`` and ``block_size`` give the KV cache the engine allocated).
- SGLang: docs.sglang.io "Production Metrics" (``num_running_reqs``, ``num_queue_reqs``, ``token_usage``,
  ``cache_hit_rate``, ``cached_tokens_total``, ``queue_time_seconds``; builds that export it:
  ``max_total_num_tokens``, "Maximum total number of tokens", the KV pool).
- TGI: huggingface.co/docs/text-generation-inference/reference/metrics (``tgi_queue_size``, ``tgi_batch_current_size``,
  ``tgi_request_*`` histograms).
- llama.cpp: tools/server/server-task.cpp ``to_metrics`` (``requests_processing``, ``requests_deferred``,
  ``prompt_tokens_cached_total``; older builds also ``kv_cache_usage_ratio``). It exports no KV size, but its
  ``/props`` beside ``/metrics`` says how many sequences it runs at once and the context of each
  (tools/server/server-context.cpp: ``total_slots`` = ``--parallel``, ``default_generation_settings.n_ctx`` = one
  slot's context): read once before the run (`llamacpp_slots`). One slot's context times the slots is not its KV
  cache when the cache is unified (``--kv-unified``, where every slot reports the whole pool), so no capacity is
  derived from them. Its ``/slots`` (on by default; ``server_slot::to_json``) says which slots served a request
  before the run, and which are serving one as it begins (`llamacpp_slot_history`): the slot a new request gets
  depends on it (``get_available_slot``: the idle slot released longest ago).

- TensorRT-LLM: ``trtllm-serve`` with ``return_perf_metrics`` (builds with the ``trtllm_`` prefix, from about
  1.3.0rc5 per ai-dynamo/dynamo PR #6469; tensorrt_llm/metrics/collector.py) exports Prometheus text at
  ``/prometheus/metrics`` while its ``/metrics`` answers JSON iteration statistics, so where bench's default URL
  answers without Prometheus text it looks there once (`TRTLLM_METRICS_PATH`; never where ``--metrics-url`` was
  given). Its gauges also say its layout
  (``trtllm_parallel_config_info`` labels), its KV cache (``kv_cache_max_blocks`` x ``kv_cache_tokens_per_block``,
  one rank's) and its step limits (`trtllm_deployment`). Builds before the prefix exported five unprefixed families
  that name no engine: they are not read.

The engine's version is read once before the run where its server says it: vLLM's ``GET /version`` (``{"version":
...}``, vllm/entrypoints/openai/api_server.py ``show_version``), SGLang's ``GET /get_server_info`` (its server
arguments and ``"version"``, sglang/srt/entrypoints/http_server.py in the 0.4.3.post2 and 0.5.3.post3 wheels) and
TensorRT-LLM's ``GET /version`` (``{"version": ...}``, tensorrt_llm/serve/openai_server.py); SGLang's answer
also says how SGLang lays out and schedules the deployment (`sglang_deployment`: tensor-, data- and
expert-parallel sizes, data-parallel attention, the chunked-prefill budget, a running-request cap, the KV pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from speedlimit.artifacts import ServerGauge, ServerHistogram, ServerMetrics

#: Families kept from a scrape: the engines' own prefixes (process_*/python_* and the like are left out).
ENGINE_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "tgi_": "tgi", "llamacpp:": "llamacpp", "trtllm_": "trtllm"}
#: Default seconds between scrapes during a run.
DEFAULT_INTERVAL_S = 1.0
#: Seconds one scrape may take before it counts as hanging.
SCRAPE_TIMEOUT_S = 5.0
#: Samples kept per scrape at most (a server with thousands of label sets would otherwise bloat the file).
MAX_SAMPLES = 5000

# --- the mapping ---------------------------------------------------------------------------------------------------
# For each engine: field -> metric names in order of preference (the first one the server exports is used).

GAUGES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
             "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
    "sglang": {"running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
               "kv_cache_usage": ("sglang:token_usage",)},
    "tgi": {"running": ("tgi_batch_current_size",), "waiting": ("tgi_queue_size",)},
    "llamacpp": {"running": ("llamacpp:requests_processing",), "waiting": ("llamacpp:requests_deferred",),
                 "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",)},
    "trtllm": {"running": ("trtllm_num_requests_running",), "waiting": ("trtllm_num_requests_waiting",),
               "kv_cache_usage": ("trtllm_kv_cache_utilization",)},
}
#: vLLM's info gauge whose labels say how large a KV cache the engine allocated, and the samples made of them: the
#: blocks (summed over engines, as the other gauges are) and the tokens a block holds (averaged).
CACHE_INFO = "vllm:cache_config_info"
CACHE_BLOCKS = CACHE_INFO + '{num_gpu_blocks}'
CACHE_BLOCK_SIZE = CACHE_INFO + '{block_size}'
#: TensorRT-LLM's info gauge whose labels say the parallel layout, and the samples made of them (averaged: the
#: server's processes may each export it, with a ``pid`` label).
PARALLEL_INFO = "trtllm_parallel_config_info"
PARALLEL_SIZES = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "ep": "expert_parallel_size"}
#: The KV cache's capacity in tokens, per engine: vLLM's blocks x block size, SGLang's token pool, TensorRT-LLM's
#: blocks x tokens per block (one rank's KV-cache manager).
KV_CAPACITY = {"vllm": (CACHE_BLOCKS, CACHE_BLOCK_SIZE), "sglang": ("sglang:max_total_num_tokens", None),
               "trtllm": ("trtllm_kv_cache_max_blocks", "trtllm_kv_cache_tokens_per_block")}
#: TensorRT-LLM's scheduler limits (gauges; 0, as the PyTorch backend may leave them, means not reported).
TRTLLM_SCHEDULER = {"max_running": "trtllm_max_batch_size_runtime", "batched_tokens": "trtllm_max_num_tokens_runtime"}
#: Gauges that are a fraction, a size or a limit per engine instance: averaged over label sets, not summed.
FRACTION_GAUGES = {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                   "sglang:cache_hit_rate", "llamacpp:kv_cache_usage_ratio", "vllm:gpu_prefix_cache_hit_rate",
                   CACHE_BLOCK_SIZE, "trtllm_kv_cache_utilization", *KV_CAPACITY["trtllm"],
                   *TRTLLM_SCHEDULER.values(), *(f"{PARALLEL_INFO}{{{label}}}" for label in PARALLEL_SIZES.values())}

COUNTERS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"prompt_tokens": ("vllm:prompt_tokens_total",), "generation_tokens": ("vllm:generation_tokens_total",),
             "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
             "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
             "preemptions": ("vllm:num_preemptions_total",)},
    "sglang": {"prompt_tokens": ("sglang:prompt_tokens_total",),
               "generation_tokens": ("sglang:generation_tokens_total",),
               "cached_prompt_tokens": ("sglang:cached_tokens_total",)},
    "tgi": {"prompt_tokens": ("tgi_request_input_length_sum",),
            "generation_tokens": ("tgi_request_generated_tokens_sum",)},
    "llamacpp": {"prompt_tokens": ("llamacpp:prompt_tokens_total",),
                 "generation_tokens": ("llamacpp:tokens_predicted_total",),
                 "cached_prompt_tokens": ("llamacpp:prompt_tokens_cached_total",),
                 "prompt_seconds": ("llamacpp:prompt_seconds_total",),
                 "generation_seconds": ("llamacpp:tokens_predicted_seconds_total",)},
    "trtllm": {"prompt_tokens": ("trtllm_prompt_tokens_total",),
               "generation_tokens": ("trtllm_generation_tokens_total",),
               "cached_prompt_tokens": ("trtllm_prompt_cached_tokens_total",)},
}

HISTOGRAMS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {"ttft_s": ("vllm:time_to_first_token_seconds",),
             "tpot_s": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
             "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
             "e2e_s": ("vllm:e2e_request_latency_seconds",), "queue_s": ("vllm:request_queue_time_seconds",),
             "prefill_s": ("vllm:request_prefill_time_seconds",), "decode_s": ("vllm:request_decode_time_seconds",)},
    "sglang": {"ttft_s": ("sglang:time_to_first_token_seconds",),
               "tpot_s": ("sglang:time_per_output_token_seconds",),
               "itl_s": ("sglang:inter_token_latency_seconds",), "e2e_s": ("sglang:e2e_request_latency_seconds",),
               "queue_s": ("sglang:queue_time_seconds",)},
    "tgi": {"tpot_s": ("tgi_request_mean_time_per_token_duration",), "e2e_s": ("tgi_request_duration",),
            "queue_s": ("tgi_request_queue_duration",), "inference_s": ("tgi_request_inference_duration",)},
    "llamacpp": {},
    "trtllm": {"ttft_s": ("trtllm_time_to_first_token_seconds",), "tpot_s": ("trtllm_time_per_output_token_seconds",),
               "e2e_s": ("trtllm_e2e_request_latency_seconds",), "queue_s": ("trtllm_request_queue_time_seconds",),
               "prefill_s": ("trtllm_request_prefill_time_seconds",),
               "decode_s": ("trtllm_request_decode_time_seconds",)},
}


# --- parsing -------------------------------------------------------------------------------------------------------


class NotPrometheus(ValueError):
    """The answer is no Prometheus text exposition."""


class MetricsAbsent(NotPrometheus):
    """The server has no metrics endpoint there (404, 405, 501: e.g. llama-server without --metrics)."""


#: Statuses that mean "no metrics here" rather than "metrics broken".
ABSENT_STATUSES = (404, 405, 501)


def _label_key(name: str, labels: dict[str, str]) -> str:
    return f'{name}{{le="{labels["le"]}"}}' if "le" in labels and name.endswith("_bucket") else name


#: The largest whole number believed from a label (a cache of more blocks than this is no real server's).
MAX_LABEL_COUNT = 10**15 - 1


def _whole_label(labels: dict[str, str], key: str) -> float | None:
    """A label that holds a positive whole number (vLLM's cache_config_info: num_gpu_blocks, block_size), else None."""
    text = labels.get(key, "")
    count = _whole_count(int(text), MAX_LABEL_COUNT) if text.isascii() and text.isdigit() else None
    return float(count) if count is not None else None


def _samples_of(name: str, labels: dict[str, str], value: float) -> list[tuple[str, float]]:
    """The (key, value) pairs one sample adds: itself, or for an info gauge the sizes its labels give (vLLM's cache
    config, TensorRT-LLM's parallel config)."""
    if name == PARALLEL_INFO:
        return [(f"{name}{{{label}}}", size) for label in PARALLEL_SIZES.values()
                if (size := _whole_label(labels, label)) is not None]
    if name != CACHE_INFO:
        return [(_label_key(name, labels), value)]
    blocks, size = _whole_label(labels, "num_gpu_blocks"), _whole_label(labels, "block_size")
    return [(CACHE_BLOCKS, blocks), (CACHE_BLOCK_SIZE, size)] if blocks and size else []


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value}, samples of the engines' families only, summed over label sets
    (fractions averaged); histogram buckets keep their bound as ``name{le="0.5"}``. Raises `NotPrometheus` on text
    the Prometheus parser rejects, or that holds no sample at all."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    any_sample = False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                any_sample = True
                if not sample.name.startswith(tuple(ENGINE_PREFIXES)) or "quantile" in sample.labels:
                    continue  # other families; summaries' quantiles cannot be added up over label sets
                for key, value in _samples_of(sample.name, sample.labels, float(sample.value)):
                    if key not in sums and len(sums) >= MAX_SAMPLES:
                        continue
                    sums[key] = sums.get(key, 0.0) + value
                    counts[key] = counts.get(key, 0) + 1
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise NotPrometheus(str(error)[:120] or type(error).__name__) from None
    if not any_sample:
        raise NotPrometheus("no metric samples in the answer")
    return {k: (v / counts[k] if k in FRACTION_GAUGES else v) for k, v in sums.items()}


#: The most of a JSON answer beside /metrics read (llama-server's /props carries the chat template, SGLang's server
#: info its arguments: a real one is a few kB).
PROPS_MAX_BYTES = 1 << 20
#: Largest slot count and slot context believed from /props (a real server's are far below).
MAX_SLOTS = 1_000_000
MAX_SLOT_CONTEXT_TOKENS = 10**9


#: Where each engine's server says its version, beside /metrics.
VERSION_PATHS = {"vllm": "/version", "sglang": "/get_server_info", "trtllm": "/version"}
#: A version is kept only as up to 40 characters of ASCII letters, digits and . + - _ (it comes from the server).
VERSION_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,39}")


def server_version(answer: Any) -> str | None:
    """The ``version`` of a server's JSON answer, where it is a plain version string (`VERSION_PATTERN`)."""
    version = answer.get("version") if isinstance(answer, dict) else None
    return version if isinstance(version, str) and VERSION_PATTERN.fullmatch(version) else None


#: The largest tensor-parallel, data-parallel or expert-parallel size believed from a server's answer.
MAX_SERVER_TP = 4096
#: The largest token budget, running-request cap or KV pool believed from a server's answer.
MAX_SERVER_TOKENS = 10**12


def sglang_deployment(info: Any) -> dict[str, Any]:
    """What SGLang's ``/get_server_info`` answer (its server arguments after their own adjustments, and its first
    scheduler's figures) says of the deployment, each key only where the answer holds a plain value in range:

    - ``tp``: ``tp_size``, the GPUs of one replica (with data-parallel attention, every GPU of the server);
    - ``dp``: ``dp_size`` where > 1; ``dp_attention``: ``enable_dp_attention`` where true (the ``dp`` ranks each run
      attention for their own requests, the MoE spans every GPU);
    - ``ep``: ``ep_size`` where > 1 (``--enable-ep-moe`` sets it to ``tp_size`` in 0.4.x);
    - ``batched_tokens``: ``chunked_prefill_size`` where > 0, the tokens one scheduler prefills in a step (SGLang has
      already divided it for data-parallel attention: by 2 in 0.4.3, by ``dp_size`` in 0.5.3);
    - ``max_running``: ``max_running_requests`` where the server was given one (0.5.3 divides it among
      data-parallel-attention ranks itself, so it is kept only without them);
    - ``kv_tokens``: ``max_total_num_tokens``, the KV pool of one scheduler (one replica or rank).

    Sources: sglang/srt/server_args.py ``__post_init__`` (0.4.3.post2 lines 208-273, 0.5.3.post3 lines 1085-1128),
    http_server.py ``get_server_info``, scheduler.py's ready message, tp_worker.py ``max_running_requests``
    (0.5.3.post3 lines 139-147)."""
    if not isinstance(info, dict):
        return {}
    found: dict[str, Any] = {}
    for key, name, low in (("tp", "tp_size", 1), ("dp", "dp_size", 2), ("ep", "ep_size", 2)):
        value = _whole_count(info.get(name), MAX_SERVER_TP)
        if value is not None and value >= low:
            found[key] = value
    if info.get("enable_dp_attention") is True:
        found["dp_attention"] = True
    for key, name in (("batched_tokens", "chunked_prefill_size"), ("max_running", "max_running_requests"),
                      ("kv_tokens", "max_total_num_tokens")):
        value = _whole_count(info.get(name), MAX_SERVER_TOKENS)
        if value is not None:
            found[key] = value
    if found.get("dp_attention"):
        found.pop("max_running", None)
    return found


def trtllm_deployment(samples: dict[str, float]) -> dict[str, int]:
    """TensorRT-LLM's layout and scheduler limits from a scrape (tensorrt_llm/metrics/collector.py,
    ``log_config_info`` and ``log_iteration_stats``): ``tp``, ``pp`` and ``ep`` from the parallel-config info gauge's
    labels (``expert_parallel_size`` only where the server runs its MoE expert-parallel; pp and ep kept where > 1),
    ``max_running`` and ``batched_tokens`` from its runtime batch-size and token limits (the PyTorch backend's
    executor does not appear to fill them, leaving 0: not kept). Each only where it is a whole number in range."""
    found: dict[str, int] = {}
    for key, label in PARALLEL_SIZES.items():
        value = _whole_gauge(samples.get(f"{PARALLEL_INFO}{{{label}}}"), MAX_SERVER_TP)
        if value is not None and (key == "tp" or value > 1):
            found[key] = value
    for key, name in TRTLLM_SCHEDULER.items():
        value = _whole_gauge(samples.get(name), MAX_SERVER_TOKENS)
        if value is not None:
            found[key] = value
    return found


def _whole_gauge(value: float | None, high: int) -> int | None:
    """A gauge's value where it is a whole number from 1 to ``high``."""
    if value is None or not math.isfinite(value) or value != int(value):
        return None
    return _whole_count(int(value), high)


def llamacpp_slots(props: Any) -> tuple[int | None, int | None]:
    """(slots, tokens of context per slot) from llama-server's ``/props`` JSON, each None where the answer does not
    hold a whole number in range: the text comes from the server and nothing else in it is used."""
    if not isinstance(props, dict):
        return None, None
    settings = props.get("default_generation_settings")
    context = settings.get("n_ctx") if isinstance(settings, dict) else None
    return _whole_count(props.get("total_slots"), MAX_SLOTS), _whole_count(context, MAX_SLOT_CONTEXT_TOKENS)


def llamacpp_slot_history(answer: Any, slots: int | None) -> tuple[list[int] | None, int | None]:
    """(the slots that had served a request, least recently used first; how many were serving one) from llama-server's
    ``/slots`` JSON, read as a run begins; (None, None) where the answer is not one entry per slot, each with a whole
    ``id`` below the slot count, a boolean ``is_processing`` and, once the slot has served a request, a whole
    ``id_task`` (tools/server/server-context.cpp ``server_slot::to_json``: its last task's id).

    The server gives a new request the idle slot released longest ago (``get_available_slot``, by ``t_last_used``),
    which /slots does not report. Task ids count up as requests arrive, so the order of the slots' last task ids is
    taken for the order of their release: exact where each earlier request also ended first (a closed loop of equal
    replies, a warm-up). A busy slot is released during the run, after every idle one: it comes last."""
    if not isinstance(answer, list) or not answer or len(answer) > MAX_SLOTS or (slots is not None and len(answer) != slots):
        return None, None
    last_task: dict[int, int] = {}
    seen: set[int] = set()
    busy: set[int] = set()
    for entry in answer:
        if not isinstance(entry, dict) or not isinstance(entry.get("is_processing"), bool):
            return None, None
        slot, task = entry.get("id"), entry.get("id_task")
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < len(answer) or slot in seen:
            return None, None
        seen.add(slot)
        if entry["is_processing"]:
            busy.add(slot)
        if task is None:
            continue
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < 2**63:
            return None, None
        last_task[slot] = task
    used = sorted(last_task, key=lambda slot: (slot in busy, last_task[slot], slot))
    return used, len(busy)


def _whole_count(value: Any, high: int) -> int | None:
    # JSON true is a Python int: not a count
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= high:
        return None
    return value


#: Where TensorRT-LLM's trtllm-serve exports Prometheus text (its /metrics answers JSON iteration statistics):
#: tensorrt_llm/serve/openai_server.py ``mount_metrics``, with ``return_perf_metrics`` set.
TRTLLM_METRICS_PATH = "/prometheus/metrics"


def beside_metrics(metrics_url: str, path: str) -> str | None:
    """The URL of ``path`` (``/props``, ``/version``) at the server root of a /metrics URL (one ending in /metrics or
    TensorRT-LLM's /prometheus/metrics; None for any other)."""
    try:
        parts = urlsplit(metrics_url)
    except ValueError:
        return None
    if not parts.path.endswith("/metrics"):
        return None
    root = parts.path.removesuffix(TRTLLM_METRICS_PATH) if parts.path.endswith(TRTLLM_METRICS_PATH) \
        else parts.path.removesuffix("/metrics")
    return urlunsplit((parts.scheme, parts.netloc, root + path, "", ""))


def detect_engine(samples: dict[str, float]) -> str:
    """vllm | sglang | tgi | llamacpp | unknown: the prefix most samples carry."""
    tally: dict[str, int] = {}
    for name in samples:
        for prefix, engine in ENGINE_PREFIXES.items():
            if name.startswith(prefix):
                tally[engine] = tally.get(engine, 0) + 1
    return max(tally, key=tally.get) if tally else "unknown"


# --- summary -------------------------------------------------------------------------------------------------------


@dataclass
class Scrape:
    t_s: float  # seconds since the scrape before the run (taken just before the run's first request)
    phase: str  # before | during | after
    samples: dict[str, float]

    def to_json_line(self) -> str:
        values = {k: (v if math.isfinite(v) else None) for k, v in self.samples.items()}
        return json.dumps({"t_s": round(self.t_s, 6), "phase": self.phase, "samples": values},
                          allow_nan=False) + "\n"


def _first(samples: dict[str, float], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in samples), None)


def _delta(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    if before is None or after < before:  # a counter reset (server restarted): count from zero
        return after
    return after - before


def _buckets(samples: dict[str, float], family: str) -> dict[float, float]:
    prefix = family + '_bucket{le="'
    out = {}
    for key, value in samples.items():
        if key.startswith(prefix):
            bound = key[len(prefix):-2]
            out[math.inf if bound in ("+Inf", "Inf", "inf") else float(bound)] = value
    return out


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile: `q` of cumulative bucket counts {upper bound: count}, linear within the
    bucket the rank falls in (the lower bound of the first bucket is 0; a rank in +Inf gives the largest finite
    bound)."""
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        return None
    total = buckets[math.inf]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == math.inf:
                return lower if len(bounds) > 1 else None
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return None


def _histogram(before: dict[str, float], after: dict[str, float], family: str) -> ServerHistogram | None:
    count = _delta(before.get(family + "_count"), after.get(family + "_count"))
    total = _delta(before.get(family + "_sum"), after.get(family + "_sum"))
    if not count:
        return None
    b0, b1 = _buckets(before, family), _buckets(after, family)
    buckets = {bound: _delta(b0.get(bound), value) or 0.0 for bound, value in b1.items()}
    quantile = {f"p{p}": histogram_quantile(p / 100, buckets) for p in (50, 90, 99)}
    return ServerHistogram(metric=family, n=int(count), mean=total / count if total is not None else None, **quantile)


def summarize_server(scrapes: list[Scrape], *, url: str, interval_s: float, failures: int = 0,
                     slots: tuple[int | None, int | None] = (None, None), version: str | None = None,
                     deployment: dict[str, Any] | None = None,
                     slot_history: tuple[list[int] | None, int | None] = (None, None)) -> ServerMetrics:
    """The server-side block of a run from its scrapes (the first one before the run, the last one after it), the
    engine's version where its server said it, for llama-server its slots and slot context (`llamacpp_slots`) and
    which slots had served requests as the run began (`llamacpp_slot_history`), and
    for SGLang its layout and scheduler (`sglang_deployment`; its KV pool there, one scheduler's, is the capacity)."""
    engine = next((detect_engine(s.samples) for s in scrapes if s.samples), "unknown")
    deployment = dict(deployment or {})
    server_kv = deployment.pop("kv_tokens", None)
    if engine == "trtllm" and scrapes:  # its layout and scheduler limits are gauges of its own
        deployment |= trtllm_deployment(scrapes[-1].samples)
    block = ServerMetrics(engine=engine, version=version, url=url, scrapes=len(scrapes), interval_s=interval_s,
                          failures=failures, slots=slots[0], slot_context_tokens=slots[1],
                          slot_history=slot_history[0], slots_busy=slot_history[1], **deployment)
    if len(scrapes) < 2:
        if server_kv is not None:
            block.kv_capacity_tokens = float(server_kv)
        return block
    before, after = scrapes[0].samples, scrapes[-1].samples
    for name, candidates in GAUGES.get(engine, {}).items():
        metric = next((m for m in candidates if any(m in s.samples for s in scrapes)), None)
        if metric is None:
            continue
        values = [s.samples[metric] for s in scrapes if metric in s.samples and math.isfinite(s.samples[metric])]
        if values:
            setattr(block, name, ServerGauge(metric=metric, mean=sum(values) / len(values), max=max(values),
                                             last=values[-1]))
    counters: dict[str, float] = {}
    for name, candidates in COUNTERS.get(engine, {}).items():
        metric = _first(after, candidates)
        value = _delta(before.get(metric), after.get(metric)) if metric else None
        if value is not None:
            counters[name] = value
    block.counters = counters
    for name, candidates in HISTOGRAMS.get(engine, {}).items():
        metric = next((m for m in candidates if m + "_count" in after), None)
        if metric is not None:
            block.histograms[name] = _histogram(before, after, metric)
    block.histograms = {k: v for k, v in block.histograms.items() if v is not None}
    # prefix-cache hits: vLLM counts blocks (hits/queries), SGLang and llama.cpp cached prompt tokens
    if counters.get("prefix_cache_queries"):
        block.prefix_cache_hit_rate = counters.get("prefix_cache_hits", 0.0) / counters["prefix_cache_queries"]
    elif "cached_prompt_tokens" in counters and engine == "llamacpp":
        seen = counters["cached_prompt_tokens"] + counters.get("prompt_tokens", 0.0)  # llama.cpp excludes cached
        block.prefix_cache_hit_rate = counters["cached_prompt_tokens"] / seen if seen else None
    elif "cached_prompt_tokens" in counters and counters.get("prompt_tokens"):
        block.prefix_cache_hit_rate = counters["cached_prompt_tokens"] / counters["prompt_tokens"]
    elif engine == "sglang" and "sglang:cache_hit_rate" in after:
        block.prefix_cache_hit_rate = after["sglang:cache_hit_rate"]
    block.kv_capacity_tokens, block.kv_block_size = kv_capacity(engine, after)
    if server_kv is not None:  # /metrics sums a gauge over data-parallel ranks; the server info is one scheduler's
        block.kv_capacity_tokens, block.kv_block_size = float(server_kv), None
    return block


def kv_capacity(engine: str, samples: dict[str, float]) -> tuple[float | None, int | None]:
    """(tokens, tokens per block) of the KV cache the server says it allocated, or None where it does not say."""
    names = KV_CAPACITY.get(engine)
    if names is None or not math.isfinite(samples.get(names[0], math.nan)) or samples[names[0]] <= 0:
        return None, None
    count = samples[names[0]]
    if names[1] is None:  # a token pool
        return count, None
    size = samples.get(names[1], math.nan)
    if not (math.isfinite(size) and size >= 1):
        return None, None
    return count * size, int(round(size))


# --- scraping ------------------------------------------------------------------------------------------------------


@dataclass
class MetricsScraper:
    """Scrapes `url` before the run (`start`), every `interval_s` during it, and after it (`finish`), appending each
    scrape to `path` (server_metrics.jsonl) as it arrives. The first failure stops all scraping and becomes
    `warning`; the run goes on."""

    session: aiohttp.ClientSession
    url: str
    interval_s: float = DEFAULT_INTERVAL_S
    path: Path | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None  # None: SCRAPE_TIMEOUT_S, bounded by 5 intervals (at least 1 s)
    scrapes: list[Scrape] = field(default_factory=list)
    warning: str | None = None  # scraping broke (garbage, a hang, an error): the numbers may lack the server's view
    note: str | None = None  # the server has no metrics endpoint (404 before the run): nothing to scrape
    failures: int = 0
    slots: tuple[int | None, int | None] = (None, None)  # llama-server's (slots, slot context), from /props
    slot_history: tuple[list[int] | None, int | None] = (None, None)  # llama-server's slots as the run began (/slots)
    version: str | None = None  # the engine's version, where its server says it (`VERSION_PATHS`)
    deployment: dict[str, Any] = field(default_factory=dict)  # its layout and scheduler (`sglang_deployment`)
    # where else to look when ``url`` answers but not with Prometheus text (bench's default URL only: trtllm-serve's
    # /metrics is JSON, its Prometheus text is at `TRTLLM_METRICS_PATH`)
    fallback_url: str | None = None
    _answered: bool = False  # the last failed scrape got an answer (404, JSON, garbage) rather than none
    _t0_ns: int = 0
    _task: asyncio.Task | None = None
    _file: Any = None

    @property
    def effective_timeout_s(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return min(SCRAPE_TIMEOUT_S, max(self.interval_s * 5, 1.0))

    @property
    def alive(self) -> bool:
        return self.warning is None and self.note is None

    async def _get(self) -> dict[str, float]:
        timeout = aiohttp.ClientTimeout(total=self.effective_timeout_s)
        async with self.session.get(self.url, headers=self.headers, timeout=timeout) as response:
            if response.status in ABSENT_STATUSES:
                raise MetricsAbsent(f"HTTP {response.status}")
            if response.status != 200:
                raise NotPrometheus(f"HTTP {response.status}")
            text = await response.text(errors="replace")
        return await asyncio.to_thread(parse_metrics, text)  # parsing a big vLLM page takes ms: off the loop

    async def scrape(self, phase: str) -> bool:
        if not self.alive:
            return False
        t_s = (time.perf_counter_ns() - self._t0_ns) / 1e9
        try:
            samples = await self._get()
        except (asyncio.TimeoutError, TimeoutError):
            self._fail(f"GET {self.url} did not answer within {self.effective_timeout_s:g} s")
            return False
        except MetricsAbsent as error:
            self._answered = True
            if not self.scrapes:  # a server without metrics: nothing is wrong with the run's numbers
                self.failures += 1
                self.note = (f"server metrics: GET {self.url} answered {error}: the server exports no Prometheus "
                             "metrics there, so there is no server-side block (--metrics-url URL if they are "
                             "elsewhere; --no-server-metrics skips the scrape)")
            else:
                self._fail(f"GET {self.url} gave no Prometheus metrics ({error})")
            return False
        except NotPrometheus as error:
            self._answered = True
            self._fail(f"GET {self.url} gave no Prometheus metrics ({error})")
            return False
        except (aiohttp.ClientError, OSError, UnicodeError) as error:
            self._fail(f"GET {self.url} failed ({str(error)[:120] or type(error).__name__})")
            return False
        scrape = Scrape(t_s, phase, samples)
        self.scrapes.append(scrape)
        if self._file is not None:
            self._file.write(scrape.to_json_line())
            self._file.flush()
        return True

    def _fail(self, why: str) -> None:
        self.failures += 1
        if self.warning is None:
            where = "before the run" if not self.scrapes else f"after {len(self.scrapes)} scrape(s)"
            self.warning = (f"server metrics: {why} {where}; no further scrapes (the run itself is unaffected; "
                            "--no-server-metrics skips them)")

    async def start(self, t0_ns: int | None = None) -> None:
        """The scrape before the run, then the periodic ones in the background."""
        self._t0_ns = t0_ns if t0_ns is not None else time.perf_counter_ns()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")
        if await self.scrape("before") or await self._scrape_fallback():
            engine = detect_engine(self.scrapes[0].samples)
            if engine == "llamacpp":
                self.slots = llamacpp_slots(await self.read_json("/props"))
                self.slot_history = llamacpp_slot_history(await self.read_json("/slots"), self.slots[0])
            if engine in VERSION_PATHS:
                answer = await self.read_json(VERSION_PATHS[engine])
                self.version = server_version(answer)
                if engine == "sglang":
                    self.deployment = sglang_deployment(answer)
            self._task = asyncio.create_task(self._loop())

    async def _scrape_fallback(self) -> bool:
        """The scrape before the run at `fallback_url`, where `url` answered without Prometheus text; on success the
        scraper stays there (the probe of `url` was no failure of the run's scraping), else the first failure
        stands."""
        if self.fallback_url is None or not self._answered:
            return False
        first = (self.url, self.warning, self.note, self.failures)
        self.url, self.warning, self.note, self.failures = self.fallback_url, None, None, 0
        if await self.scrape("before"):
            return True
        self.url, self.warning, self.note, self.failures = first
        return False

    async def read_json(self, path: str) -> Any:
        """The JSON answer of ``path`` beside /metrics (llama-server's /props, an engine's version), once. What it
        says only informs a replay of the run, so any failure (no such endpoint, a hang, no JSON, more than
        `PROPS_MAX_BYTES`) gives None, without a warning."""
        url = beside_metrics(self.url, path)
        if url is None:
            return None
        timeout = aiohttp.ClientTimeout(total=self.effective_timeout_s)
        try:
            async with self.session.get(url, headers=self.headers, timeout=timeout) as response:
                if response.status != 200:
                    return None
                raw = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):  # to the end, within the limit
                    raw += chunk
                    if len(raw) > PROPS_MAX_BYTES:
                        return None
            return json.loads(raw.decode("utf-8", errors="replace"))
        except (asyncio.TimeoutError, TimeoutError, aiohttp.ClientError, OSError, ValueError, RecursionError):
            return None

    def abort(self) -> None:
        """Stop without the scrape after (the run was cancelled); what was scraped stays on disk."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._file is not None:
            self._file.close()
            self._file = None

    async def _loop(self) -> None:
        while self.alive:
            await asyncio.sleep(self.interval_s)
            await self.scrape("during")

    async def finish(self) -> None:
        """Stop the periodic scrapes and take the one after the run."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.scrape("after")
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None

    def summary(self) -> ServerMetrics | None:
        if not self.scrapes:
            return None
        return summarize_server(self.scrapes, url=self.url, interval_s=self.interval_s, failures=self.failures,
                                slots=self.slots, version=self.version, deployment=self.deployment,
                                slot_history=self.slot_history)


def load_series(path: Path) -> list[dict[str, Any]]:
    """The lines of a server_metrics.jsonl (bad lines skipped: a killed run may leave a half line)."""
    rows = []
    try:
        with Path(path).open(encoding="utf-8") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("samples"), dict):
                    rows.append(row)
    except OSError:
        return []
    return rows
