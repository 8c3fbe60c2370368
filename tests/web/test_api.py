"""The web calculator's JSON API: parity with `speedlimit estimate --json`, the curve, catalogs, and 422s."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedlimit.catalog import hardware_names, model_names
from speedlimit.cli import app as cli_app
from speedlimit.estimator import estimate
from speedlimit.web.app import create_app

LLAMA_8B_CONFIG = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}  # fmt: skip


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


CASES = [
    ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "4"}, ["--weights", "4"]),
    ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "16", "ideal": True}, ["--weights", "16", "--ideal"]),
    ({"model": "qwen2.5-7b", "hardware": "rtx-4090", "weights": "q4_k_m", "kv": "fp8", "batch": 8, "prompt": 2000, "output": 1000},
     ["--weights", "q4_k_m", "--kv", "fp8", "--batch", "8", "--prompt", "2000", "--output", "1000"]),
    ({"model": "llama-3.1-70b", "hardware": "h100-sxm", "weights": "fp8", "tp": 2, "batch": 16}, ["--weights", "fp8", "--tp", "2", "--batch", "16"]),
    ({"model": "mixtral-8x7b", "hardware": "h200", "batch": 4}, ["--batch", "4"]),
    ({"model": "llama-3.1-8b", "hardware": "amd-epyc-9654-2p", "weights": "q4_k_m", "threads": 96, "numa": "distribute"},
     ["--weights", "q4_k_m", "--threads", "96", "--numa", "distribute"]),
    ({"model": "deepseek-v3", "hardware": "h200", "weights": "fp8", "tp": 2, "pp": 2, "dp": 2, "ep": 4, "batch": 64},
     ["--weights", "fp8", "--tp", "2", "--pp", "2", "--dp", "2", "--ep", "4", "--batch", "64"]),
]  # fmt: skip


@pytest.mark.parametrize(("body", "flags"), CASES)
def test_estimate_equals_cli_json(client, body, flags):
    cli = CliRunner().invoke(cli_app, ["estimate", "--model", body["model"], "--hardware", body["hardware"], *flags, "--json"])
    assert cli.exit_code == 0, cli.output
    response = client.post("/api/estimate", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == json.loads(cli.output)


def test_numeric_weights_equal_string_weights(client):
    as_number = client.post("/api/estimate", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": 4}).json()
    as_text = client.post("/api/estimate", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "4"}).json()
    assert as_number == as_text
    assert as_number["weight_bits"] == 4.0


def test_pasted_config_matches_catalog_model(client):
    pasted = client.post("/api/estimate", json={"config": LLAMA_8B_CONFIG, "hardware": "h100-sxm", "weights": "bf16"}).json()
    catalog = estimate("llama-3.1-8b", "h100-sxm", weights="bf16").to_dict()
    assert pasted["model"] == "pasted config.json"
    for key in ("decode_tok_s", "weights_bytes", "kv_bytes_per_token", "ttft_s", "total_params"):
        assert pasted[key] == pytest.approx(catalog[key], rel=1e-12), key


def test_curve_points_equal_estimate_per_batch(client):
    body = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "q4_k_m", "kv": "fp8", "batch": 12, "prompt": 1000, "output": 1000}
    data = client.post("/api/curve", json=body).json()
    assert data["estimate"] == client.post("/api/estimate", json=body).json()
    batches = [p["batch"] for p in data["points"]]
    assert batches == sorted(batches) and batches[0] == 1 and 12 in batches
    for point in data["points"][::4]:
        expected = estimate("llama-3.1-8b", "h100-sxm", weights="q4_k_m", kv="fp8", batch=point["batch"], prompt=1000, output=1000)
        assert point["itl_s"] == pytest.approx(expected.itl_s, rel=1e-9)
        assert point["fits"] == expected.fits
        assert point["regime"] == expected.regime
    assert data["knee_batch"] in batches
    roof = data["roofline"]
    assert roof["point"]["intensity"] == pytest.approx(data["estimate"]["arithmetic_intensity"])
    assert roof["point"]["regime"] == data["estimate"]["regime"]
    assert len(roof["intensity"]) == len(roof["peak_roof_flops"]) == len(roof["effective_roof_flops"])


def test_curve_with_explicit_batches(client):
    data = client.post("/api/curve", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", "batches": [64, 1, 8]}).json()
    assert [p["batch"] for p in data["points"]] == [1, 8, 64]


def test_catalog_endpoints(client):
    models = client.get("/api/models").json()
    hardware = client.get("/api/hardware").json()
    assert [m["name"] for m in models] == model_names()
    assert [h["name"] for h in hardware] == hardware_names()
    h100 = next(h for h in hardware if h["name"] == "h100-sxm")
    assert h100["memory_bandwidth_Bps"] == 3.35e12


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "llama-9000", "hardware": "h100-sxm"}, "unknown model"),
        ({"model": "llama-3.1-8b", "hardware": "h1000"}, "unknown hardware"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 0}, "batch"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": "many"}, "batch"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": 2.5}, "batch"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "q9_z"}, "weights format"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "tp": 10**9}, "tp"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "tp": 2, "ep": 2}, "dense model"),
        ({"model": "mixtral-8x7b", "hardware": "h100-sxm", "tp": 2, "ep": 4}, "ep"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "bw_efficiency": 3}, "bw_efficiency: must be"),
        ({"model": "llama-3.1-8b"}, "hardware"),
        ({"hardware": "h100-sxm"}, "model"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "batchsize": 4}, "unknown field"),
        ({"model": "llama-3.1-8b", "hardware": "h100-sxm", "threads": 8}, "threads describes the threads of a CPU"),
        ({"model": "llama-3.1-8b", "hardware": "amd-epyc-9654", "numa": "mirror"}, "numa"),
        ({"model": "/etc/passwd", "hardware": "h100-sxm"}, "does not read files"),
        ({"model": "x.gguf", "hardware": "h100-sxm"}, "does not read files"),
        ({"config": {"model_type": "llama"}, "hardware": "h100-sxm"}, "config is missing"),
        ({"config": {**LLAMA_8B_CONFIG, "hidden_size": [1, 2]}, "hardware": "h100-sxm"}, "hidden_size"),
        ({"config": {**LLAMA_8B_CONFIG, "num_key_value_heads": 7}, "hardware": "h100-sxm"}, "multiple"),
        ({"config": "not an object", "hardware": "h100-sxm"}, "config"),
        ({"model": "x" * 10_000, "hardware": "h100-sxm"}, "characters long"),
        ({"config": {**LLAMA_8B_CONFIG, "num_hidden_layers": 10**9}, "hardware": "h100-sxm"}, "absurd"),
    ],
)
@pytest.mark.parametrize("endpoint", ["/api/estimate", "/api/curve"])
def test_bad_input_is_422_with_one_readable_line(client, endpoint, body, fragment):
    response = client.post(endpoint, json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    assert fragment in detail
    assert "--" not in detail  # the API's field names, not the CLI's flags


def test_malformed_json_body_is_422(client):
    response = client.post("/api/estimate", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"]


def test_too_many_curve_batches_is_422(client):
    response = client.post("/api/curve", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", "batches": list(range(1, 300))})
    assert response.status_code == 422
    assert "batches" in response.json()["detail"]


def test_page_and_assets_are_served_locally(client):
    page = client.get("/")
    assert page.status_code == 200
    assert "/vendor/plotly.min.js" in page.text and "/static/app.js" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from the network
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/style.css").status_code == 200
    plotly = client.get("/vendor/plotly.min.js")
    assert plotly.status_code == 200 and len(plotly.content) > 1_000_000
    assert client.get("/openapi.json").json()["paths"].keys() >= {"/api/estimate", "/api/curve", "/api/models", "/api/hardware"}


def test_curve_call_is_fast_enough_for_live_updates(client):
    body = {"model": "llama-3.1-70b", "hardware": "h100-sxm", "weights": "4", "batch": 8}
    client.post("/api/curve", json=body)
    durations = []
    for batch in range(1, 11):
        started = time.perf_counter()
        assert client.post("/api/curve", json={**body, "batch": batch}).status_code == 200
        durations.append(time.perf_counter() - started)
    assert sorted(durations)[len(durations) // 2] < 0.1  # median per change, including HTTP handling


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
FIELDS = ["model", "hardware", "weights", "kv", "batch", "prompt", "output", "tp", "pp", "dp", "ep", "ideal", "bw_efficiency",
          "config", "batches"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(overrides=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=3), endpoint=st.sampled_from(["/api/estimate", "/api/curve"]))
def test_any_json_body_is_200_or_422_never_500(overrides, endpoint):
    client = TestClient(create_app(), raise_server_exceptions=False)
    response = client.post(endpoint, json={"model": "llama-3.1-8b", "hardware": "h100-sxm", **overrides})
    assert response.status_code in (200, 422), (overrides, response.text)
    if response.status_code == 422:
        assert isinstance(response.json()["detail"], str)
