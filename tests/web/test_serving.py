"""POST /api/simulate, the serving view: the same figures as `speedlimit simulate --sweep`, bounded work, and bad
input as a one-line 422 (never a 500)."""

from __future__ import annotations

import json
import shlex

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedlimit.cli import app as cli_app
from speedlimit.web import serving
from speedlimit.web.app import create_app

BASE = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "prompt": 512, "output": 128}


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


def _post(client, **body):
    return client.post("/api/simulate", json={**BASE, **body})


def _cli_sweep(command: str) -> dict:
    argv = shlex.split(command)
    assert argv[:2] == ["speedlimit", "simulate"]
    result = CliRunner().invoke(cli_app, [*argv[1:], "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


POINT_KEYS = {"ttft_p50_s": ("ttft_s", "p50"), "ttft_p99_s": ("ttft_s", "p99"), "tpot_p50_s": ("tpot_s", "p50"),
              "tpot_p99_s": ("tpot_s", "p99"), "e2e_p50_s": ("e2e_s", "p50")}


@pytest.mark.parametrize("body", [
    {"load": "concurrency", "values": [1, 4, 16, 64], "slo": "ttft=150ms,tpot=15ms"},
    {"load": "rate", "values": [2, 10, 40], "seed": 3, "max_seqs": 32, "weights": "fp8"},
    {"load": "concurrency", "values": [1, 2, 4], "engine": "serial", "output": 64},
    {"load": "concurrency", "values": [1, 2], "hardware": "amd-epyc-9654-2p", "weights": "q4_k_m", "threads": 96,
     "numa": "distribute", "output": 32},
    {"load": "concurrency", "values": [1, 8], "model": "mixtral-8x7b", "tp": 2, "pp": 2, "ep": 2, "output": 64},
    {"load": "rate", "values": [5, 20], "engine": "vllm", "prefix_tokens": 1000},
    {"load": "concurrency", "values": [2, 8], "engine": "vllm", "prefix_tokens": 1000, "prefix_caching": False},
    {"load": "rate", "values": [10, 40], "engine": "vllm", "dp": 2, "output": 64},
    {"load": "concurrency", "values": [3, 8], "tp": 2, "dp": 2, "output": 64},
    {"load": "rate", "values": [2, 8], "scheduler": "continuous", "max_seqs": 8, "slot_streams": True, "output": 48},
    {"load": "concurrency", "values": [2, 6], "prefix_tokens": 600, "cache_ram": 0, "slot_similarity": 0.5,
     "output": 32},
    {"load": "concurrency", "values": [2, 6], "prefix_tokens": 600, "cache_ram": -1, "cache_idle_slots": False,
     "output": 32},
], ids=["concurrency-slo", "rate", "serial", "cpu-numa", "pipeline-experts", "prefix", "prefix-uncached", "dp-rate",
        "dp-concurrency", "slot-streams", "llama-server-no-prompt-cache", "llama-server-unbounded-cache"])
def test_every_level_equals_the_command_line_it_prints(client, body):
    response = _post(client, **body)
    assert response.status_code == 200, response.text
    web = response.json()
    cli = _cli_sweep(web["command"])
    assert [p["load"] for p in web["points"]] == [p["sweep_value"] for p in cli["points"]] == body["values"]
    for ours, theirs in zip(web["points"], cli["points"]):
        assert ours["output_tok_s"] == theirs["output_tok_s"] and ours["completed"] == theirs["completed"]
        for key, (metric, quantile) in POINT_KEYS.items():
            assert ours[key] == theirs[metric][quantile], key
    for key in ("knee_load", "saturation_output_tok_s", "slo_max_load"):
        assert web[key] == cli["sweep"][key]
    assert web["requests_per_level"] == cli["points"][0]["requests"]
    for ours, theirs in zip(web["points"], cli["points"]):
        assert ours["prefix_cache_hit_rate"] == theirs["simulation"]["prefix_cache_hit_rate"]
    if body.get("prefix_tokens"):
        cached = body.get("prefix_caching", True)
        # llama-server's slots reuse only their own prompts: fewer hits than a block cache, but hits
        assert all(((p["prefix_cache_hit_rate"] or 0) > (0.5 if body.get("engine") else 0.2)) == cached
                   for p in web["points"])


def test_default_concurrency_sweep_shows_knee_saturation_and_slo_max(client):
    response = _post(client, slo="ttft=200ms,tpot=20ms", max_seqs=16)
    assert response.status_code == 200, response.text
    data = response.json()
    loads = [p["load"] for p in data["points"]]
    assert loads == [1, 2, 4, 8, 16, 32]  # up to twice the engine's sequences
    tok_s = [p["output_tok_s"] for p in data["points"]]
    assert tok_s[4] > 8 * tok_s[0]  # batching pays
    assert tok_s[5] == pytest.approx(tok_s[4], rel=0.1)  # past the engine's 16 sequences, only the queue grows
    assert data["saturation_output_tok_s"] == max(tok_s)
    assert data["knee_load"] in loads and data["knee_output_tok_s"] >= 0.9 * max(tok_s)
    met = [p["meets_slo"] for p in data["points"]]
    assert data["slo_max_load"] == max(p["load"] for p in data["points"][:met.index(False) if False in met else None])
    assert all(p["ttft_p99_s"] >= p["ttft_p50_s"] > 0 and p["tpot_p99_s"] >= p["tpot_p50_s"] > 0 for p in data["points"])
    assert data["points"][-1]["queue_max"] > 0 and "queue" in data["notes"][-1]  # 32 clients, 16 sequences
    assert data["work"]["steps"] <= serving.STEP_BUDGET


def test_default_concurrency_levels_stop_where_the_requests_cannot_fill_them(client):
    data = _post(client, scheduler="continuous").json()  # 256 sequences: levels up to 512, but 128-token outputs allow 200 requests
    loads = [p["load"] for p in data["points"]]
    assert loads == [2.0 ** k for k in range(len(loads))] and loads[-1] <= data["requests_per_level"] < 2 * loads[-1]
    assert "left out" in data["notes"][0] and f"{2 * loads[-1]:g}" in data["notes"][0]
    given = _post(client, values=[1, 300], requests=100).json()
    assert "never has that many in flight" in given["notes"][0]


def test_rate_sweep_defaults_around_the_saturation_rate_and_says_the_queue_grows(client):
    response = _post(client, load="rate", max_seqs=16)
    assert response.status_code == 200, response.text
    data = response.json()
    saturation = data["saturation_request_s"]
    assert saturation > 0 and data["saturation_rate_output_tok_s"] == pytest.approx(saturation * 128)
    loads = [p["load"] for p in data["points"]]
    assert loads == pytest.approx([f * saturation for f in serving.RATE_FRACTIONS], rel=0.01)
    above = [p for p in data["points"] if p["load"] > saturation]
    assert above and all(p["saturated"] for p in above)
    assert len(data["notes"]) == len(above)
    assert all("grows without bound" in note and f"{saturation:.3g} req/s" in note for note in data["notes"])
    ttft = [p["ttft_p50_s"] for p in data["points"]]
    assert ttft[-1] > 3 * ttft[0]  # past saturation the queue, not the engine, sets TTFT
    assert data["work"]["steps"] <= serving.STEP_BUDGET


@pytest.mark.parametrize("body", [
    {},  # the page's defaults: output 1,000
    {"output": 1000, "prompt": 512},
    {"load": "rate", "output": 1000},
    {"engine": "serial", "output": 1000},
    {"load": "rate", "engine": "serial", "output": 2000},
    {"model": "llama-3.1-70b", "tp": 4, "output": 4000, "prompt": 8000},
    {"values": [1], "output": 16000},
    {"kv": "fp8", "load": "rate", "max_seqs": 1024, "max_batched_tokens": 2048, "output": 500, "prompt": 4000},
], ids=lambda b: ",".join(f"{k}={v}" for k, v in b.items()) or "defaults")
def test_work_stays_within_the_budget(client, body):
    """The budget is what keeps a call near a second: the steps actually simulated stay within it (the wall time is
    measured in benchmarks/README.md, not asserted here)."""
    response = client.post("/api/simulate", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", **body})
    assert response.status_code in (200, 422), response.text
    if response.status_code == 422:
        assert "speedlimit simulate" in response.json()["detail"]
        return
    work = response.json()["work"]
    assert work["steps"] <= serving.STEP_BUDGET and work["generated_tokens"] <= serving.TOKEN_BUDGET
    assert response.json()["requests_per_level"] >= serving.MIN_REQUESTS_PER_LEVEL


@pytest.mark.parametrize("body,status,needle", [
    ({"load": "warp"}, 422, "load"),
    ({"values": []}, 422, "1 to 12 load levels"),
    ({"values": list(range(1, 14))}, 422, "1 to 12 load levels"),
    ({"values": [0, 1]}, 422, "positive"),
    ({"values": [1.5]}, 422, "whole numbers"),
    ({"values": ["abc"]}, 422, "values.0"),
    ({"requests": 0}, 422, "requests"),
    ({"load": "rate", "values": [1e-300]}, 422, "simulated time"),
    ({"requests": 100_000}, 422, "more than one web call simulates"),
    ({"output": 10_000_000}, 422, "speedlimit simulate"),
    ({"engine": "serial", "max_seqs": 4}, 422, "serial"),
    ({"engine": "warp-drive"}, 422, "engine"),
    ({"engine": "serial", "scheduler": "continuous"}, 422, "conflict"),
    ({"max_seqs": 64, "max_batched_tokens": 32}, 422, "max_batched_tokens"),
    ({"slo": "ttft=fast"}, 422, "duration"),
    ({"slo": "latency=1s"}, 422, "slo"),
    ({"prompt": 0}, 422, "at least 1 token"),
    ({"prompt": 2_000_000, "output": 1}, 422, "can never be admitted"),
    ({"model": "llama-3.1-70b", "hardware": "l4"}, 422, "fit"),
    ({"model": "no-such-model"}, 422, "no-such-model"),
    ({"hardware": "/etc/passwd"}, 422, "hardware"),
    ({"seed": -1}, 422, "seed"),
    ({"turbo": True}, 422, "unknown field"),
])
def test_bad_input_is_a_one_line_422(client, body, status, needle):
    response = _post(client, **body)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and needle in detail, detail
    assert "--" not in detail  # the API's field names, not the CLI's flags


def test_malformed_json_is_a_422(client):
    response = client.post("/api/simulate", content=b'{"model": "llama-3.1-8b",', headers={"content-type": "application/json"})
    assert response.status_code == 422 and "not valid JSON" in response.json()["detail"]


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
anything = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
                     st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=14))


@FUZZ
@given(field=st.sampled_from(["load", "values", "requests", "seed", "engine", "scheduler", "max_seqs", "max_batched_tokens",
                              "chunked_prefill", "slo", "prompt", "output", "tp", "pp", "dp", "ep", "kv", "weights",
                              "prefix_tokens", "prefix_caching", "slot_streams", "slot_similarity", "cache_ram",
                              "cache_idle_slots"]),
       value=anything)
def test_any_value_of_any_field_is_200_or_a_one_line_422(client, field, value):
    response = client.post("/api/simulate", json={**BASE, "output": 32, field: value})
    assert response.status_code in (200, 422), (field, value, response.text)
    if response.status_code == 422:
        detail = response.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail and detail


def test_openapi_documents_the_serving_body(client):
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/api/simulate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    fields = schema["components"]["schemas"][body.rsplit("/", 1)[1]]["properties"]
    assert {"model", "hardware", "weights", "prompt", "output", "load", "values", "engine", "max_seqs", "slo"} <= set(fields)


def test_a_body_over_the_cap_is_refused_before_it_runs(client):
    body = json.dumps({**BASE, "slo": "x" * (1 << 20)}).encode()
    response = client.post("/api/simulate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "larger than" in response.json()["detail"]


def test_whole_prompt_engine_profile_serves_every_request(client):
    """TensorRT-LLM's profile prefills whole prompts (no chunking): the decodes pause during prefill steps, and every
    request still finishes (it used to answer 422 'the simulated engine stalled'); the figures are the CLI's."""
    response = client.post("/api/simulate", json={"model": "llama-3.3-70b", "hardware": "h100-sxm", "weights": "fp8",
                                                  "tp": 2, "prompt": 5000, "output": 500, "engine": "tensorrt-llm",
                                                  "load": "concurrency", "values": [1, 25]})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["engine"]["chunked_prefill"] is False
    assert [p["completed"] for p in data["points"]] == [data["requests_per_level"]] * 2
    cli = _cli_sweep(data["command"])
    assert [p["completed"] for p in cli["points"]] == [data["requests_per_level"]] * 2
    for ours, theirs in zip(data["points"], cli["points"]):
        for key, (metric, quantile) in POINT_KEYS.items():
            assert ours[key] == theirs[metric][quantile], key


def test_data_parallel_replicas_with_expert_parallelism_step_together(client):
    """dp with ep couples the replicas' steps (they share their experts): the sweep runs, and its figures are the
    CLI's for the command it gives."""
    response = _post(client, model="mixtral-8x7b", dp=2, ep=2)
    assert response.status_code == 200, response.text
    data = response.json()
    assert "--dp 2" in data["command"] and "--ep 2" in data["command"]
    cli = _cli_sweep(data["command"])
    for ours, theirs in zip(data["points"], cli["points"]):
        for key, (metric, quantile) in POINT_KEYS.items():
            assert ours[key] == theirs[metric][quantile], key


