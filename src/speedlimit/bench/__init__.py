"""The bench leg: load-test any OpenAI-compatible streaming server and measure what it really delivers.

Modules: `sse` (pure SSE decoding and per-server chunk interpretation), `metrics` (pure per-request record,
percentiles, goodput, summary, sweep knee), `workload` (seeded prompts, lengths, arrivals), `tokenizer` (the served
model's tokenizer over HTTP), `client` (one streaming request, aiohttp), `runner` (closed/open loop, sweeps, files),
`compare` (estimator prediction vs measurement), `report` (rich output), `cli` (the `speedlimit bench` command).
"""

from speedlimit.bench.client import Endpoint, send_request
from speedlimit.bench.metrics import RequestRecord, distribution, find_knee, summarize
from speedlimit.bench.runner import BenchRunner, LoadPlan, WorkloadPlan

__all__ = ["BenchRunner", "Endpoint", "LoadPlan", "RequestRecord", "WorkloadPlan", "distribution", "find_knee",
           "send_request", "summarize"]
