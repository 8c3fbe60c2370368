"""Server /metrics: parsing real-format Prometheus text of vLLM, SGLang, TGI and llama.cpp, mapping it onto the
summary's server block, and the scraper's failure modes (one warning, never a failed run)."""

from __future__ import annotations

import asyncio
import json
import math

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speedlimit.bench.server_metrics import (MetricsScraper, NotPrometheus, Scrape, detect_engine, histogram_quantile,
                                             beside_metrics, llamacpp_slot_history, llamacpp_slots,
                                             load_series, parse_metrics, server_version,
                                             sglang_deployment, summarize_server)

# vLLM V1 as `curl /metrics` prints it (prometheus_client's exposition: float values, _created samples, labels).
VLLM_BEFORE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 100.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
vllm:prompt_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7330e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 500.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 123.4
"""


def vllm_after() -> str:
    """The same server after a run of 100 requests: TTFT of 20 in (0.02, 0.04], 80 in (0.04, 0.1]."""
    text = VLLM_BEFORE
    for old, new in [
        ("vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0",
         "vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0"),
        ("prefix_cache_queries_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1000.0",
         "prefix_cache_queries_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 13800.0"),
        ("prefix_cache_hits_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 100.0",
         "prefix_cache_hits_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3300.0"),
        ("vllm:prompt_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1000.0",
         "vllm:prompt_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 13800.0"),
        ("generation_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 500.0",
         "generation_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 6900.0"),
        ("seconds_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.0",
         "seconds_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 7.0"),
        ("le=\"0.04\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 5.0",
         "le=\"0.04\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 25.0"),
        ("le=\"0.1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 10.0",
         "le=\"0.1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 110.0"),
        ("le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 10.0",
         "le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 110.0"),
        ("seconds_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 10.0",
         "seconds_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 110.0"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    return text


def vllm_during(running: float, kv: float) -> str:
    return (VLLM_BEFORE
            .replace('vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0',
                     f'vllm:num_requests_running{{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {running}')
            .replace('vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0',
                     f'vllm:kv_cache_usage_perc{{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {kv}'))


# SGLang, from its "Production Metrics" page (values shortened).
SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} {prompt}
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} {gen}
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} {cached}
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} {tsum}
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} {b1}
sglang:time_to_first_token_seconds_bucket{le="0.2",model_name="meta-llama/Llama-3.1-8B-Instruct"} {b2}
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} {b2}
sglang:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} {b2}
"""

# TGI's exporter (metrics-exporter-prometheus): no HELP lines, bare names.
TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 16
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} {d1}
tgi_request_duration_bucket{le="1"} {d2}
tgi_request_duration_bucket{le="+Inf"} {d2}
tgi_request_duration_sum {dsum}
tgi_request_duration_count {d2}
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="64"} {d2}
tgi_request_generated_tokens_bucket{le="+Inf"} {d2}
tgi_request_generated_tokens_sum {gen}
tgi_request_generated_tokens_count {d2}
"""

# llama.cpp's llama-server --metrics (tools/server/server-task.cpp to_metrics: stringstream numbers).
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total {cached}
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 2.90363
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {gen}
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 2.37151
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {running}
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


def fill(template: str, **values) -> str:
    for key, value in values.items():
        template = template.replace("{" + key + "}", str(value))
    return template


def scrapes(*texts: str) -> list[Scrape]:
    phases = ["before"] + ["during"] * (len(texts) - 2) + ["after"]
    return [Scrape(float(i), phase, parse_metrics(text)) for i, (phase, text) in enumerate(zip(phases, texts))]


def test_parse_keeps_engine_families_sums_labels_and_keys_buckets_by_bound():
    samples = parse_metrics(VLLM_BEFORE)
    assert samples["vllm:prompt_tokens_total"] == 1000.0
    assert samples['vllm:time_to_first_token_seconds_bucket{le="0.04"}'] == 5.0
    assert samples['vllm:time_to_first_token_seconds_bucket{le="+Inf"}'] == 10.0
    assert not any(name.startswith("process_") for name in samples)
    two_engines = VLLM_BEFORE + VLLM_BEFORE.replace('engine="0"', 'engine="1"').replace(
        "# HELP", "# XHELP").replace("# TYPE", "# XTYPE")
    summed = parse_metrics(two_engines)
    assert summed["vllm:prompt_tokens_total"] == 2000.0  # counters add up over data-parallel engines
    assert summed["vllm:kv_cache_usage_perc"] == 0.0  # fractions are averaged, not added
    summary_family = ('# TYPE tgi_x summary\ntgi_x{quantile="0.5"} 3\ntgi_x{quantile="0.99"} 9\n'
                      "tgi_x_sum 12\ntgi_x_count 4\n")
    assert parse_metrics(summary_family) == {"tgi_x_sum": 12.0, "tgi_x_count": 4.0}


@pytest.mark.parametrize("text, engine", [
    (VLLM_BEFORE, "vllm"),
    (fill(SGLANG, prompt=1, gen=1, cached=0, tsum=0, b1=0, b2=0), "sglang"),
    (fill(TGI, d1=0, d2=0, dsum=0, gen=0), "tgi"),
    (fill(LLAMACPP, prompt=0, cached=0, gen=0, running=0), "llamacpp"),
])
def test_detect_engine(text, engine):
    assert detect_engine(parse_metrics(text)) == engine


@pytest.mark.parametrize("text", ["<html><body>Welcome</body></html>\n", "", "# just a comment\n",
                                  "vllm:num_requests_running{engine=0 1\n"])
def test_text_that_is_not_prometheus_is_rejected(text):
    with pytest.raises(NotPrometheus):
        parse_metrics(text)


def test_histogram_quantile_interpolates_like_prometheus():
    buckets = {0.02: 0.0, 0.04: 20.0, 0.1: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.02 + 0.02 * 10 / 20)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.04 + 0.06 * 30 / 80)
    assert histogram_quantile(0.99, {1.0: 50.0, math.inf: 100.0}) == 1.0  # rank in +Inf: largest finite bound
    assert histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None
    assert histogram_quantile(0.5, {1.0: 3.0}) is None  # no +Inf bucket: not a histogram


def test_vllm_run_maps_onto_the_server_block():
    block = summarize_server(scrapes(VLLM_BEFORE, vllm_during(8.0, 0.5), vllm_during(4.0, 0.25), vllm_after()),
                             url="http://h/metrics", interval_s=1.0)
    assert block.engine == "vllm" and block.scrapes == 4
    assert block.running.metric == "vllm:num_requests_running"
    assert block.running.mean == pytest.approx(3.0) and block.running.max == 8.0
    assert block.kv_cache_usage.max == 0.5
    assert block.counters["prompt_tokens"] == 12800 and block.counters["generation_tokens"] == 6400
    assert block.prefix_cache_hit_rate == pytest.approx(3200 / 12800)
    ttft = block.histograms["ttft_s"]
    assert ttft.n == 100 and ttft.mean == pytest.approx(6.0 / 100)  # only the run: after minus before
    assert ttft.p50 == pytest.approx(0.04 + 0.06 * 30 / 80)
    assert "tpot_s" not in block.histograms  # not exported: no block, not a zero


def test_sglang_tgi_and_llamacpp_map():
    sglang = summarize_server(scrapes(fill(SGLANG, prompt=100, gen=10, cached=0, tsum=1.0, b1=4, b2=10),
                                      fill(SGLANG, prompt=1100, gen=510, cached=250, tsum=3.0, b1=14, b2=30)),
                              url="u", interval_s=1)
    assert sglang.running.mean == 12 and sglang.waiting.mean == 3 and sglang.kv_cache_usage.mean == 0.28
    assert sglang.counters == {"prompt_tokens": 1000, "generation_tokens": 500, "cached_prompt_tokens": 250}
    assert sglang.prefix_cache_hit_rate == pytest.approx(0.25)
    assert sglang.histograms["ttft_s"].n == 20 and sglang.histograms["ttft_s"].mean == pytest.approx(0.1)

    tgi = summarize_server(scrapes(fill(TGI, d1=1, d2=2, dsum=1.0, gen=100),
                                   fill(TGI, d1=5, d2=12, dsum=8.0, gen=740)), url="u", interval_s=1)
    assert tgi.waiting.mean == 4 and tgi.running.mean == 16
    assert tgi.counters["generation_tokens"] == 640
    assert tgi.histograms["e2e_s"].n == 10 and tgi.histograms["e2e_s"].mean == pytest.approx(0.7)
    assert "ttft_s" not in tgi.histograms

    llama = summarize_server(scrapes(fill(LLAMACPP, prompt=10, cached=0, gen=5, running=0),
                                     fill(LLAMACPP, prompt=70, cached=20, gen=65, running=3),
                                     fill(LLAMACPP, prompt=130, cached=40, gen=125, running=0)),
                             url="u", interval_s=1)
    assert llama.engine == "llamacpp" and llama.running.max == 3
    assert llama.counters["prompt_tokens"] == 120 and llama.counters["generation_tokens"] == 120
    assert llama.prefix_cache_hit_rate == pytest.approx(40 / 160)  # llama.cpp's prompt count excludes cached ones
    assert llama.histograms == {}


def test_a_counter_reset_counts_from_zero_and_one_scrape_gives_no_deltas():
    reset = summarize_server(scrapes(fill(LLAMACPP, prompt=500, cached=0, gen=500, running=0),
                                     fill(LLAMACPP, prompt=30, cached=0, gen=20, running=0)), url="u", interval_s=1)
    assert reset.counters["generation_tokens"] == 20
    single = summarize_server(scrapes(VLLM_BEFORE, VLLM_BEFORE)[:1], url="u", interval_s=1)
    assert single.scrapes == 1 and single.counters == {} and single.running is None


class _MetricsApp:
    """A tiny aiohttp server whose /metrics does what `behaviour` says."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.hits = 0

    async def handle(self, request):
        from aiohttp import web

        self.hits += 1
        if self.behaviour == "404":
            return web.Response(status=404, text="not found")
        if self.behaviour == "garbage":
            return web.Response(text="<html>hi</html>", content_type="text/html")
        if self.behaviour == "hang":
            await asyncio.sleep(2)
        if self.behaviour == "flaky" and self.hits > 2:
            return web.Response(status=500, text="boom")
        return web.Response(text=VLLM_BEFORE, content_type="text/plain")


async def scrape_routes(routes: dict, *, run_s: float = 0.25, path=None, fallback: bool = False):
    """Serve ``routes`` (path -> aiohttp handler) on 127.0.0.1 and run a scraper of its /metrics for ``run_s``; with
    ``fallback``, as bench's default URL is scraped: with trtllm-serve's /prometheus/metrics to fall back on."""
    from aiohttp import web

    app = web.Application()
    for route, handler in routes.items():
        app.router.add_get(route, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            root = f"http://127.0.0.1:{port}"
            scraper = MetricsScraper(session, root + "/metrics", interval_s=0.05, path=path, timeout_s=0.3,
                                     fallback_url=root + "/prometheus/metrics" if fallback else None)
            await scraper.start()
            await asyncio.sleep(run_s)
            await scraper.finish()
            return scraper
    finally:
        await runner.cleanup()


async def _scrape_with(behaviour: str, tmp_path, run_s: float = 0.25):
    app_state = _MetricsApp(behaviour)
    return await scrape_routes({"/metrics": app_state.handle}, run_s=run_s, path=tmp_path / "server_metrics.jsonl")


@pytest.mark.parametrize("behaviour, why", [("garbage", "no Prometheus metrics"),
                                            ("hang", "did not answer within 0.3 s")])
def test_a_broken_endpoint_gives_one_warning_and_stops_scraping(behaviour, why, tmp_path):
    scraper = asyncio.run(_scrape_with(behaviour, tmp_path))
    assert scraper.warning is not None and why in scraper.warning and "\n" not in scraper.warning
    assert scraper.note is None
    assert scraper.failures == 1 and scraper.scrapes == [] and scraper.summary() is None


def test_no_endpoint_is_a_note_not_a_warning(tmp_path):
    scraper = asyncio.run(_scrape_with("404", tmp_path))
    assert scraper.warning is None and "HTTP 404" in scraper.note and "\n" not in scraper.note
    assert scraper.failures == 1 and scraper.scrapes == [] and scraper.summary() is None


def test_scrapes_before_during_after_are_written_as_they_come(tmp_path):
    scraper = asyncio.run(_scrape_with("ok", tmp_path))
    rows = load_series(tmp_path / "server_metrics.jsonl")
    assert [r["phase"] for r in rows][0] == "before" and rows[-1]["phase"] == "after"
    assert sum(r["phase"] == "during" for r in rows) >= 2
    assert rows[0]["samples"]["vllm:prompt_tokens_total"] == 1000.0
    assert [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)
    assert scraper.warning is None and scraper.summary().engine == "vllm"


def test_a_scrape_failing_mid_run_keeps_what_came_before(tmp_path):
    scraper = asyncio.run(_scrape_with("flaky", tmp_path))
    assert len(scraper.scrapes) == 2 and "after 2 scrape(s)" in scraper.warning
    assert scraper.summary().scrapes == 2
    lines = (tmp_path / "server_metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["samples"] for line in lines)


# vLLM's cache info gauge (docs/design/metrics.md: "vllm:cache_config_info", "Information of the LLMEngine CacheConfig"):
# value 1, the configuration in its labels; one line per engine under data parallelism.
VLLM_CACHE_INFO = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="%s"} 1.0
"""


def test_vllm_cache_info_gives_the_kv_capacity_it_allocated():
    text = VLLM_BEFORE + VLLM_CACHE_INFO % "38263"
    samples = parse_metrics(text)
    assert "vllm:cache_config_info" not in samples  # the info gauge's value (1) says nothing; its labels do
    block = summarize_server(scrapes(text, text), url="u", interval_s=1)
    assert block.kv_capacity_tokens == 38263 * 16 and block.kv_block_size == 16
    # two engines (data parallel): their caches add up, the block size does not
    two = VLLM_BEFORE + VLLM_CACHE_INFO % "100" + (VLLM_CACHE_INFO % "300").split("\n", 2)[2].replace('engine="0"', 'engine="1"')
    block = summarize_server(scrapes(two, two), url="u", interval_s=1)
    assert block.kv_capacity_tokens == 400 * 16 and block.kv_block_size == 16


@pytest.mark.parametrize("blocks", ["", "-5", "0", "1e3", "abc", "9" * 20, "<script>", "²", "٣"])
def test_a_cache_info_label_that_is_no_whole_number_gives_no_capacity(blocks):
    text = VLLM_BEFORE + VLLM_CACHE_INFO % blocks
    block = summarize_server(scrapes(text, text), url="u", interval_s=1)
    assert block.kv_capacity_tokens is None and block.kv_block_size is None


def test_sglang_token_pool_is_its_kv_capacity_and_others_have_none():
    pool = ('# HELP sglang:max_total_num_tokens Maximum total number of tokens\n# TYPE sglang:max_total_num_tokens gauge\n'
            'sglang:max_total_num_tokens{name="google/gemma-2-9b-it"} 161721.0\n')
    first = fill(SGLANG, prompt=100, gen=10, cached=0, tsum=1.0, b1=4, b2=10) + pool
    last = fill(SGLANG, prompt=1100, gen=510, cached=250, tsum=3.0, b1=14, b2=30) + pool
    block = summarize_server(scrapes(first, last), url="u", interval_s=1)
    assert block.kv_capacity_tokens == 161721 and block.kv_block_size is None
    without = summarize_server(scrapes(fill(SGLANG, prompt=100, gen=10, cached=0, tsum=1.0, b1=4, b2=10),
                                       fill(SGLANG, prompt=1100, gen=510, cached=250, tsum=3.0, b1=14, b2=30)),
                               url="u", interval_s=1)
    assert without.kv_capacity_tokens is None
    vllm = summarize_server(scrapes(VLLM_BEFORE, vllm_after()), url="u", interval_s=1)
    assert vllm.kv_capacity_tokens is None  # no cache info exported: none, not a guess


def test_the_summary_shows_the_kv_capacity_the_server_reported():
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.describe import server_lines

    rows = dict(server_lines(ServerMetrics(engine="vllm", url="u", scrapes=2, kv_capacity_tokens=303296.0,
                                           kv_block_size=64)))
    assert rows["  KV capacity"] == "303,296 tokens (4,739 blocks of 64)"
    pool = dict(server_lines(ServerMetrics(engine="sglang", url="u", scrapes=2, kv_capacity_tokens=161721.0)))
    assert pool["  KV capacity"] == "161,721 tokens"
    assert "  KV capacity" not in dict(server_lines(ServerMetrics(engine="vllm", url="u", scrapes=2)))


@settings(max_examples=60, deadline=None)
@given(blocks=st.text(max_size=12), size=st.text(max_size=6))
def test_any_cache_info_labels_give_a_whole_positive_capacity_or_none(blocks, size):
    """The labels come from the server: whatever they hold, parsing neither raises nor invents a capacity."""
    escape = lambda text: text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    text = VLLM_BEFORE + (f'vllm:cache_config_info{{block_size="{escape(size)}",num_gpu_blocks="{escape(blocks)}"}} 1.0\n')
    block = summarize_server(scrapes(text, text), url="u", interval_s=1)
    whole = lambda text: text.isascii() and text.isdigit() and 0 < int(text) < 10**15  # noqa: E731
    if whole(blocks) and whole(size):
        assert block.kv_capacity_tokens == int(blocks) * int(size) and block.kv_block_size == int(size)
    else:
        assert block.kv_capacity_tokens is None and block.kv_block_size is None


# llama-server's /props (tools/server/server-context.cpp): its slots and one slot's context, beside /metrics.
LLAMACPP_PROPS = {"default_generation_settings": {"params": {"n_predict": -1}, "n_ctx": 1024}, "total_slots": 4,
                  "model_path": "/m/SmolLM2-135M-Instruct.Q4_1.gguf", "build_info": "b1-0c1e570"}


@pytest.mark.parametrize("props, slots", [
    (LLAMACPP_PROPS, (4, 1024)),
    ({"total_slots": 8}, (8, None)),
    ({"total_slots": True, "default_generation_settings": {"n_ctx": False}}, (None, None)),  # JSON true is no count
    ({"total_slots": 0, "default_generation_settings": {"n_ctx": -5}}, (None, None)),
    ({"total_slots": 4.0, "default_generation_settings": {"n_ctx": "1024"}}, (None, None)),
    ({"total_slots": 10**7, "default_generation_settings": {"n_ctx": 10**12}}, (None, None)),
    ({"total_slots": "<script>", "default_generation_settings": ["n_ctx"]}, (None, None)),
    ([4, 1024], (None, None)), ("props", (None, None)), (None, (None, None)),
])
def test_llama_server_props_give_its_slots_only_as_whole_numbers_in_range(props, slots):
    assert llamacpp_slots(props) == slots


@settings(max_examples=80, deadline=None)
@given(props=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                              st.sampled_from(["total_slots", "default_generation_settings", "n_ctx", "x"]), inner,
                              max_size=3), max_leaves=8))
def test_any_props_answer_gives_whole_positive_slots_or_none(props):
    slots, context = llamacpp_slots(props)
    for value, high in ((slots, 10**6), (context, 10**9)):
        assert value is None or (type(value) is int and 0 < value <= high)


@pytest.mark.parametrize("metrics, props", [
    ("http://127.0.0.1:8080/metrics", "http://127.0.0.1:8080/props"),
    ("http://h:1/api/metrics?x=1#f", "http://h:1/api/props"),
    ("http://h:1/stats", None),
    ("http://h:1/prometheus/metrics", "http://h:1/props"),  # trtllm-serve's: the server root is above /prometheus
])
def test_props_sit_beside_the_metrics_endpoint(metrics, props):
    assert beside_metrics(metrics, "/props") == props


@pytest.mark.parametrize("answer, version", [
    ({"version": "0.7.3.dev138+g21f6ca217"}, "0.7.3.dev138+g21f6ca217"), ({"version": "0.5.3.post3", "tp_size": 8}, "0.5.3.post3"),
    ({"version": "<script>alert(1)</script>"}, None), ({"version": "1" * 41}, None), ({"version": ""}, None),
    ({"version": 7}, None), ({"version": "٣.1"}, None), ({"version": "0.7\n"}, None), (["0.7"], None), (None, None),
])
def test_a_server_version_is_kept_only_as_a_plain_version_string(answer, version):
    assert server_version(answer) == version


def _slot(slot: int, task: int | None = None, busy: bool = False) -> dict:
    """One entry of llama-server's /slots as `server_slot::to_json` writes it (metrics only: no prompt text)."""
    entry = {"id": slot, "n_ctx": 1024, "speculative": False, "is_processing": busy}
    if task is not None:
        entry |= {"id_task": task, "n_prompt_tokens": 40, "next_token": [{"n_decoded": 8}]}
    return entry


@pytest.mark.parametrize("answer, slots, found", [
    ([_slot(0), _slot(1), _slot(2), _slot(3)], 4, ([], 0)),  # a fresh server
    ([_slot(0), _slot(1), _slot(2), _slot(3, task=1)], 4, ([3], 0)),  # a warm-up took the top slot (seen on 0c1e570)
    # least recently used first, by the order of each slot's last task (the log of the same server: tasks 12, 13, 24)
    ([_slot(0), _slot(1, task=13), _slot(2, task=12), _slot(3, task=24)], 4, ([2, 1, 3], 0)),
    ([_slot(0, task=50, busy=True), _slot(1, task=7)], 2, ([1, 0], 1)),  # a busy slot is released last
    ([_slot(0), _slot(1)], None, ([], 0)),  # /props not read: any slot count
    ([_slot(0), _slot(1)], 4, (None, None)),  # not one entry per slot
    ([_slot(0), _slot(0)], 2, (None, None)), ([_slot(0), _slot(2)], 2, (None, None)),  # a slot twice, one out of range
    ([_slot(0, task=True), _slot(1)], 2, (None, None)), ([_slot(0, task=-1)], 1, (None, None)),
    ([_slot(0, task=2**64)], 1, (None, None)), ([{"id": 0, "is_processing": "no"}], 1, (None, None)),
    ([{"id": True, "is_processing": False}], 1, (None, None)), ([{"id": "0", "is_processing": False}], 1, (None, None)),
    ([], None, (None, None)), ({"slots": []}, None, (None, None)), ("<script>", None, (None, None)), (None, 4, (None, None)),
])
def test_llama_server_slots_give_the_slots_used_before_the_run_least_recently_first(answer, slots, found):
    assert llamacpp_slot_history(answer, slots) == found


@settings(max_examples=80, deadline=None)
@given(answer=st.recursive(st.none() | st.booleans() | st.integers(-2, 2**65) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                               st.sampled_from(["id", "id_task", "is_processing", "x"]), inner, max_size=4),
                           max_leaves=12),
       slots=st.none() | st.integers(1, 4))
def test_any_slots_answer_gives_distinct_slots_in_range_or_none(answer, slots):
    used, busy = llamacpp_slot_history(answer, slots)
    if used is None:
        assert busy is None
    else:
        assert len(set(used)) == len(used) and all(type(s) is int and 0 <= s < len(answer) for s in used)
        assert type(busy) is int and 0 <= busy <= len(answer)


class _LlamaServerApp:
    """A fake llama-server (for the fault paths; the real one is in test_bench_llama_server_metrics.py): llama.cpp's
    /metrics, and a /props that does what `behaviour` says."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.props_hits = 0
        self.slots_hits = 0

    async def metrics(self, request):
        from aiohttp import web

        return web.Response(text=fill(LLAMACPP, prompt=10, cached=0, gen=5, running=1), content_type="text/plain")

    async def props(self, request):
        from aiohttp import web

        self.props_hits += 1
        return await self._answer(LLAMACPP_PROPS)

    async def _answer(self, body):
        from aiohttp import web

        if self.behaviour == "404":
            return web.Response(status=404, text="not found")
        if self.behaviour == "hang":
            await asyncio.sleep(2)
        if self.behaviour == "garbage":
            return web.Response(text="<html>" + "[" * 100000, content_type="text/html")
        if self.behaviour == "huge":
            return web.json_response({"total_slots": 4, "pad": "x" * (2 << 20)})
        return web.json_response(body)

    async def slots(self, request):
        self.slots_hits += 1
        return await self._answer([_slot(0), _slot(1, task=9), _slot(2, task=3), _slot(3, task=11, busy=True)])


async def _scrape_llama_server(behaviour: str, tmp_path):
    state = _LlamaServerApp(behaviour)
    scraper = await scrape_routes({"/metrics": state.metrics, "/props": state.props, "/slots": state.slots},
                                  run_s=0.15, path=tmp_path / "server_metrics.jsonl")
    return scraper, state


@pytest.mark.parametrize("behaviour", ["ok", "404", "hang", "garbage", "huge"])
def test_the_scraper_reads_llama_servers_slots_once_and_a_bad_props_costs_nothing(behaviour, tmp_path):
    scraper, state = asyncio.run(_scrape_llama_server(behaviour, tmp_path))
    block = scraper.summary()
    assert state.props_hits == state.slots_hits == 1 and scraper.warning is None and scraper.note is None
    assert block.engine == "llamacpp" and block.scrapes >= 3  # the run's scrapes went on
    if behaviour == "ok":
        assert (block.slots, block.slot_context_tokens) == (4, 1024)
        assert (block.slot_history, block.slots_busy) == ([2, 1, 3], 1)
    else:
        assert block.slots is None and block.slot_context_tokens is None
        assert block.slot_history is None and block.slots_busy is None


async def _scrape_with_props_counted():
    """A vLLM-looking /metrics: its server's /props (if any) is not llama-server's and is not asked for."""
    from aiohttp import web

    hits = []

    async def props(request):
        hits.append(1)
        return web.json_response(LLAMACPP_PROPS)

    async def metrics(request):
        return web.Response(text=VLLM_BEFORE, content_type="text/plain")

    scraper = await scrape_routes({"/metrics": metrics, "/props": props}, run_s=0.0)
    assert scraper.summary().slots is None
    return len(hits)


def test_props_are_read_only_from_llama_server():
    scraper = asyncio.run(_scrape_with_props_counted())
    assert scraper == 0


def test_the_summary_shows_llama_servers_slots():
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.describe import server_lines

    rows = dict(server_lines(ServerMetrics(engine="llamacpp", url="u", scrapes=2, slots=4, slot_context_tokens=1024)))
    assert rows["  slots"] == "4 (1,024-token context each)"
    assert dict(server_lines(ServerMetrics(engine="llamacpp", url="u", scrapes=2, slots=2)))["  slots"] == "2"
    assert "  slots" not in dict(server_lines(ServerMetrics(engine="vllm", url="u", scrapes=2)))
    rows = dict(server_lines(ServerMetrics(engine="llamacpp", url="u", scrapes=2, slots=4, slot_history=[2, 1, 3],
                                           slots_busy=1)))
    assert rows["  slots"] == "4; used before the run: 2, 1, 3, 1 busy"


class _VersionedApp:
    """A fake vLLM or SGLang (for the fault paths and the mapping; no real one runs here): their /metrics, and the
    version endpoint each has (vLLM's /version, SGLang's /get_server_info) doing what `behaviour` says."""

    def __init__(self, engine: str, behaviour: str, version: str) -> None:
        self.engine, self.behaviour, self.version = engine, behaviour, version
        self.hits = 0

    async def metrics(self, request):
        from aiohttp import web

        text = VLLM_BEFORE if self.engine == "vllm" else fill(SGLANG, prompt=1, gen=1, cached=0, tsum=1.0, b1=1, b2=1)
        return web.Response(text=text, content_type="text/plain")

    async def version_endpoint(self, request):
        from aiohttp import web

        self.hits += 1
        if self.behaviour == "404":
            return web.Response(status=404)
        if self.behaviour == "hang":
            await asyncio.sleep(2)
        if self.behaviour == "garbage":
            return web.Response(text="{not json")
        body = {"version": self.version}
        if self.engine == "sglang":
            attention = self.behaviour == "dp-attention"
            body |= {"tp_size": 8, "dp_size": 8 if attention else 1, "enable_dp_attention": attention,
                     "chunked_prefill_size": 4096, "max_running_requests": 64 if attention else None,
                     "max_total_num_tokens": 161721}
        return web.json_response(body)


async def _scrape_versioned(engine: str, behaviour: str, version: str):
    state = _VersionedApp(engine, behaviour, version)
    path = "/version" if engine == "vllm" else "/get_server_info"
    scraper = await scrape_routes({"/metrics": state.metrics, path: state.version_endpoint}, run_s=0.1)
    return scraper, state


@pytest.mark.parametrize("engine, behaviour, version, kept", [
    ("vllm", "ok", "0.7.3", "0.7.3"), ("sglang", "ok", "0.4.3.post2", "0.4.3.post2"), ("vllm", "404", "0.7.3", None),
    ("sglang", "hang", "0.5.3", None), ("vllm", "garbage", "0.7.3", None), ("vllm", "ok", "0.7.3 <b>", None),
])
def test_the_scraper_reads_the_engines_version_once_and_a_bad_answer_costs_nothing(engine, behaviour, version, kept):
    scraper, state = asyncio.run(_scrape_versioned(engine, behaviour, version))
    block = scraper.summary()
    assert state.hits == 1 and scraper.warning is None and block.engine == engine and block.version == kept
    assert block.scrapes >= 2  # the run's scrapes went on
    assert block.tp == (8 if engine == "sglang" and behaviour == "ok" else None)  # SGLang's server info: tp_size


def test_sglang_data_parallel_attention_is_recorded_with_its_layout():
    from speedlimit.bench.describe import server_lines

    scraper, _ = asyncio.run(_scrape_versioned("sglang", "dp-attention", "0.4.3.post2"))
    block = scraper.summary()
    assert block.version == "0.4.3.post2" and (block.tp, block.dp, block.dp_attention) == (8, 8, True)
    assert block.kv_capacity_tokens == 161721 and block.max_running is None  # one rank's pool; no cap under DPA
    rows = dict(server_lines(block))
    assert rows["  layout"] == "tp 8, dp 8, data-parallel attention" and rows["  scheduler"] == "4,096 tokens a prefill step"


@pytest.mark.parametrize("info, found", [
    ({"tp_size": 8}, {"tp": 8}), ({"tp_size": 4, "dp_size": 1, "enable_dp_attention": False}, {"tp": 4}),
    ({"tp_size": 2, "dp_size": 4}, {"tp": 2, "dp": 4}),
    ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True, "chunked_prefill_size": 4096, "max_running_requests": 64},
     {"tp": 8, "dp": 8, "dp_attention": True, "batched_tokens": 4096}),  # a cap under DPA is divided by the server
    ({"tp_size": 8, "ep_size": 8, "chunked_prefill_size": -1, "max_running_requests": 64, "max_total_num_tokens": 9},
     {"tp": 8, "ep": 8, "max_running": 64, "kv_tokens": 9}),  # -1: no chunked prefill, no budget taken
    ({"tp_size": 8, "enable_dp_attention": "no"}, {"tp": 8}), ({"tp_size": 8, "dp_size": True}, {"tp": 8}),
    ({"tp_size": True}, {}), ({"tp_size": 0}, {}), ({"tp_size": 8.0}, {}), ({"tp_size": 10**6}, {}),
    ({"tp_size": "8"}, {}), ({"max_total_num_tokens": 10**13}, {}), ({"chunked_prefill_size": None}, {}),
    ([8], {}), (None, {}),
])
def test_sglang_server_info_gives_what_it_holds_in_range_and_nothing_else(info, found):
    assert sglang_deployment(info) == found


def test_a_replay_runs_the_profile_of_the_version_the_server_reported():
    """vLLM 0.7.x and SGLang 0.4.1-0.4.3 servers replay on their versioned profiles (engines.toml server_versions);
    other versions, or none, on the engine's latest; on an AMD GPU the versioned profile's ROCm build."""
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import server_profile
    from speedlimit.bench.describe import server_lines
    from speedlimit.catalog import engine_for_server

    assert engine_for_server("vllm", "0.7.3.dev138+g21f6ca217") == "vllm-0.7"
    assert engine_for_server("vllm", "0.11.0") == engine_for_server("vllm", None) == "vllm"
    assert engine_for_server("sglang", "0.4.3.post2") == "sglang-0.4" and engine_for_server("sglang", "0.5.3") == "sglang"
    assert engine_for_server("llama-cpp", "0.7.3") == "llama-cpp"  # another engine's versioned profile is not its own
    assert server_profile(ServerMetrics(engine="vllm", version="0.7.4.dev181"), "h200") == "vllm-0.7"
    assert server_profile(ServerMetrics(engine="sglang", version="0.4.3"), "h200") == "sglang-0.4"
    rows = dict(server_lines(ServerMetrics(engine="vllm", version="0.7.3", url="u", scrapes=2, interval_s=1)))
    assert rows["server metrics"].startswith("vllm 0.7.3 at u")


# trtllm-serve with return_perf_metrics: its Prometheus text at /prometheus/metrics (tensorrt_llm/metrics/collector.py:
# the trtllm_ prefix, multiprocess gauges with a pid label, info gauges whose labels are the configuration), while its
# /metrics answers JSON iteration statistics; /version answers {"version": ...}
TRTLLM = """\
# HELP trtllm_num_requests_running Number of active requests
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="pytorch",model_name="m",pid="11"} {running}
# HELP trtllm_kv_cache_utilization KV cache utilization
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="pytorch",model_name="m",pid="11"} 0.25
# HELP trtllm_kv_cache_max_blocks Maximum number of KV cache blocks
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{engine_type="pytorch",model_name="m",pid="11"} 4096.0
trtllm_kv_cache_max_blocks{engine_type="pytorch",model_name="m",pid="12"} 4096.0
# HELP trtllm_kv_cache_tokens_per_block Number of tokens per KV cache block
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{engine_type="pytorch",model_name="m",pid="11"} 32.0
# HELP trtllm_max_batch_size_runtime Runtime maximum batch size
# TYPE trtllm_max_batch_size_runtime gauge
trtllm_max_batch_size_runtime{engine_type="pytorch",model_name="m",pid="11"} 0.0
# HELP trtllm_max_num_tokens_runtime Runtime maximum number of tokens
# TYPE trtllm_max_num_tokens_runtime gauge
trtllm_max_num_tokens_runtime{engine_type="pytorch",model_name="m",pid="11"} 8192.0
# HELP trtllm_parallel_config_info Parallelism configuration info
# TYPE trtllm_parallel_config_info gauge
trtllm_parallel_config_info{context_parallel_size="1",engine_type="pytorch",expert_parallel_size="{ep}",gpu_count="4",model_name="m",pid="11",pipeline_parallel_size="{pp}",tensor_parallel_size="4"} 1.0
# HELP trtllm_prompt_tokens_total Cumulative number of prompt (input) tokens processed.
# TYPE trtllm_prompt_tokens_total counter
trtllm_prompt_tokens_total{engine_type="pytorch",model_name="m"} {prompt}
# HELP trtllm_generation_tokens_total Cumulative number of generation (output) tokens produced.
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{engine_type="pytorch",model_name="m"} {gen}
# HELP trtllm_time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE trtllm_time_to_first_token_seconds histogram
trtllm_time_to_first_token_seconds_bucket{engine_type="pytorch",le="0.1",model_name="m"} {b1}
trtllm_time_to_first_token_seconds_bucket{engine_type="pytorch",le="+Inf",model_name="m"} {b2}
trtllm_time_to_first_token_seconds_count{engine_type="pytorch",model_name="m"} {b2}
trtllm_time_to_first_token_seconds_sum{engine_type="pytorch",model_name="m"} {tsum}
"""


class _TrtllmApp:
    def __init__(self, ep: int = 4, pp: int = 1):
        self.ep, self.pp, self.scrapes, self.json_hits = ep, pp, 0, 0

    async def json_metrics(self, request):
        from aiohttp import web

        self.json_hits += 1
        return web.json_response([])  # iteration stats: none since the last read

    async def prometheus(self, request):
        from aiohttp import web

        first = self.scrapes == 0
        self.scrapes += 1
        text = fill(TRTLLM, running=0 if first else 2, prompt=0 if first else 400, gen=0 if first else 80,
                    b1=0 if first else 3, b2=0 if first else 4, tsum=0 if first else 0.32, ep=self.ep, pp=self.pp)
        return web.Response(text=text, content_type="text/plain")

    async def version(self, request):
        from aiohttp import web

        return web.json_response({"version": "1.3.0rc5"})


async def _scrape_trtllm(app: _TrtllmApp, *, fallback: bool = True):
    return await scrape_routes({"/metrics": app.json_metrics, "/prometheus/metrics": app.prometheus,
                                "/version": app.version}, run_s=0.1, fallback=fallback)


def test_trtllm_serve_is_scraped_where_it_exports_prometheus_text():
    """bench's default URL (/metrics) gets trtllm-serve's JSON; the scraper moves to /prometheus/metrics and reads
    the engine, its version, layout, KV cache, step budget, counters and histograms there."""
    from speedlimit.bench.describe import server_lines

    app = _TrtllmApp()
    scraper = asyncio.run(_scrape_trtllm(app))
    block = scraper.summary()
    assert app.json_hits == 1 and scraper.warning is None and scraper.note is None and block.failures == 0
    assert block.url.startswith("http://127.0.0.1:") and block.url.endswith("/prometheus/metrics")
    assert block.engine == "trtllm" and block.version == "1.3.0rc5"
    assert (block.tp, block.ep, block.pp) == (4, 4, None)
    assert block.kv_capacity_tokens == 4096 * 32 and block.kv_block_size == 32  # one rank's, not summed over pids
    assert block.batched_tokens == 8192 and block.max_running is None  # 0: the PyTorch backend leaves it unset
    assert block.counters == {"prompt_tokens": 400.0, "generation_tokens": 80.0}
    assert block.histograms["ttft_s"].n == 4 and block.histograms["ttft_s"].mean == pytest.approx(0.08)
    assert block.running.max == 2 and block.kv_cache_usage.mean == pytest.approx(0.25)
    rows = dict(server_lines(block))
    assert rows["  layout"] == "tp 4, ep 4" and rows["  scheduler"] == "8,192 tokens a prefill step"


def test_a_metrics_url_given_is_kept_even_where_it_has_no_prometheus_text():
    scraper = asyncio.run(_scrape_trtllm(_TrtllmApp(), fallback=False))
    assert scraper.summary() is None and "gave no Prometheus metrics" in scraper.warning
    assert scraper.url.endswith("/metrics") and "prometheus" not in scraper.url


def test_a_trtllm_deployment_replays_on_its_profile_and_layout():
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import server_layout, server_profile

    server = ServerMetrics(engine="trtllm", version="1.3.0rc5", tp=4, ep=4)
    assert server_profile(server, "h100-sxm") == "tensorrt-llm"
    assert server_layout(server) == {"tp": 4, "dp": 1, "ep": 4}
    from speedlimit.errors import SpeedlimitError

    with pytest.raises(SpeedlimitError, match="pp_size 2"):
        server_layout(ServerMetrics(engine="trtllm", tp=4, pp=2))


@pytest.mark.parametrize("samples, found", [
    ({}, {}),
    ({"trtllm_parallel_config_info{tensor_parallel_size}": 8.0, "trtllm_parallel_config_info{pipeline_parallel_size}": 1.0,
      "trtllm_parallel_config_info{expert_parallel_size}": 1.0}, {"tp": 8}),
    ({"trtllm_parallel_config_info{tensor_parallel_size}": 2.5}, {}),  # processes that disagree average to a fraction
    ({"trtllm_max_batch_size_runtime": 256.0, "trtllm_max_num_tokens_runtime": float("nan")}, {"max_running": 256}),
    ({"trtllm_max_num_tokens_runtime": 1e20}, {}),
])
def test_trtllm_gauges_give_a_layout_and_limits_only_where_they_are_whole_and_in_range(samples, found):
    from speedlimit.bench.server_metrics import trtllm_deployment

    assert trtllm_deployment(samples) == found


def test_where_neither_url_has_prometheus_text_the_first_answer_is_what_the_note_says():
    """llama-server without --metrics: 404 at /metrics and at /prometheus/metrics; the note names /metrics."""
    scraper = asyncio.run(scrape_routes({}, run_s=0, fallback=True))
    assert scraper.summary() is None and scraper.warning is None and scraper.failures == 1
    assert "prometheus" not in scraper.url and f"GET {scraper.url} answered HTTP 404" in scraper.note


@settings(max_examples=80, deadline=None)
@given(info=st.dictionaries(st.sampled_from(["tp_size", "dp_size", "ep_size", "enable_dp_attention",
                                             "chunked_prefill_size", "max_running_requests", "max_total_num_tokens",
                                             "x"]),
                            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6), max_size=8))
def test_any_sglang_server_info_gives_whole_numbers_in_range_or_nothing(info):
    found = sglang_deployment(info)
    assert set(found) <= {"tp", "dp", "ep", "dp_attention", "batched_tokens", "max_running", "kv_tokens"}
    assert all(v is True if k == "dp_attention" else type(v) is int and 0 < v <= 10**12 for k, v in found.items())


@settings(max_examples=60, deadline=None)
@given(tp=st.text(max_size=8), ep=st.text(max_size=8))
def test_any_trtllm_parallel_labels_give_a_whole_layout_or_none(tp, ep):
    """The labels come from the server: whatever they hold, parsing neither raises nor invents a layout."""
    escape = lambda text: text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    text = (f'trtllm_parallel_config_info{{expert_parallel_size="{escape(ep)}",tensor_parallel_size="{escape(tp)}"}}'
            " 1.0\ntrtllm_num_requests_running 0.0\n")
    block = summarize_server(scrapes(text, text), url="u", interval_s=1)
    whole = lambda text: text.isascii() and text.isdigit() and 0 < int(text) <= 4096  # noqa: E731
    assert block.engine == "trtllm"
    assert block.tp == (int(tp) if whole(tp) else None)
    assert block.ep == (int(ep) if whole(ep) and int(ep) > 1 else None)
