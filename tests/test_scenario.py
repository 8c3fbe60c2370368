"""The one scenario model: validated once, and the same inputs on every face (Python API, CLI, web API)."""

from __future__ import annotations

import json

import pytest
import typer
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedlimit.cli import app as cli_app
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import estimate
from speedlimit.estimator.api import estimate_scenario, resolve
from speedlimit.scenario import SCENARIO_FIELDS, Flag, Scenario, flag_name, scenario_from
from speedlimit.web.app import EstimateRequest, create_app

runner = CliRunner()


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


@pytest.mark.parametrize(
    ("inputs", "names"),
    [
        ({"hardware": "h100-sxm", "bandwidth": 1e12}, ("--hardware", "--bandwidth")),
        ({"hardware": "h100-sxm", "profile": "x"}, ("--hardware", "--profile")),
        ({"profile": "x", "bandwidth": "3.35TB"}, ("--profile", "--bandwidth")),
        ({"hardware": "h100-sxm", "ideal": True, "bw_efficiency": 0.5}, ("--ideal", "--bw-efficiency")),
        ({"hardware": "h100-sxm", "ideal": True, "step_overhead_s": 0.001}, ("--ideal", "--step-overhead")),
        ({"hardware": "h100-sxm", "memory": 80e9}, ("--memory", "--bandwidth")),
        ({}, ("--hardware", "--bandwidth")),
    ],
)
def test_conflicts_name_both_inputs(inputs: dict, names: tuple[str, str]) -> None:
    with pytest.raises(SpeedlimitError) as error:
        scenario_from(model="7B", **inputs)
    assert all(name in str(error.value) for name in names), str(error.value)


@pytest.mark.parametrize(
    ("inputs", "fragment"),
    [
        ({"batch": 0}, "--batch"),
        ({"batch": 2.5}, "--batch"),
        ({"batch": True}, "--batch"),
        ({"prompt": -1}, "--prompt"),
        ({"output": 0}, "--output"),
        ({"tp": 10**6}, "--tp"),
        ({"bw_efficiency": 1.5}, "fraction"),
        ({"flops_efficiency": float("nan")}, "--flops-efficiency"),
        ({"usd_per_hour": -1}, "--usd-per-hour"),
        ({"compute": "fp7"}, "--compute"),
        ({"weights": True}, "--weights"),
        ({"batchsize": 4}, "--batchsize"),
        ({"model": ""}, "--model"),
        ({"model": "x" * 5000}, "characters long"),
    ],
)
def test_bad_values_name_the_flag(inputs: dict, fragment: str) -> None:
    with pytest.raises(SpeedlimitError) as error:
        scenario_from(**{"model": "7B", "hardware": "h100-sxm", **inputs})
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_custom_hardware_takes_quantities_and_bounds_them() -> None:
    scenario = scenario_from(model="7B", bandwidth="3.35TB", flops="989T", memory="80GB")
    assert (scenario.bandwidth, scenario.flops, scenario.memory) == (3.35e12, 989e12, 80e9)
    for bad in ("1e-300", "1e30", "-5", "nan"):
        with pytest.raises(SpeedlimitError):
            scenario_from(model="7B", bandwidth=bad)


def test_estimate_keeps_its_signature_and_equals_the_scenario_path() -> None:
    by_kwargs = estimate("llama-3.1-70b", "h100-sxm", tp=4, batch=64, prompt=2048, output=512, usd_per_hour=2.5)
    by_scenario = estimate_scenario(Scenario(model="llama-3.1-70b", hardware="h100-sxm", tp=4, batch=64, prompt=2048,
                                             output=512, usd_per_hour=2.5))
    assert by_kwargs == by_scenario
    assert estimate("7B", bandwidth=3.35e12, weights=16, ideal=True).decode_tok_s == pytest.approx(3.35e12 / 14e9)


def test_resolve_gives_what_a_simulator_needs() -> None:
    resolved = resolve(scenario_from(model="llama-3.1-70b", hardware="h100-sxm", tp=4, weights="fp8"))
    assert resolved.arch.n_layers == 80 and resolved.device.key == "h100-sxm"
    assert resolved.machine.tp == 4 and resolved.compute_dtype == "fp8"
    # fp8 as the engines run it: 1 byte a weight, but the embedding table and the untied LM head stay 16-bit
    arch = resolved.arch
    vocab = arch.embedding_params + arch.lm_head_params
    assert resolved.cost.total_weight_bytes == pytest.approx(arch.total_params + vocab)
    assert resolved.weight_bits == pytest.approx(8 * (arch.total_params + vocab) / arch.total_params)
    # the per-step overhead is the kind's fixed cost plus one launch per kernel the architecture runs
    efficiency = resolved.efficiency
    assert resolved.step_overhead_s == pytest.approx(efficiency.step_overhead_s + efficiency.kernel_overhead_s * resolved.arch.decode_kernels)


@pytest.mark.parametrize(("tp", "ok"), [(2, True), (4, True), (8, True), (16, True), (3, False), (5, False), (128, False)])
def test_tensor_parallel_must_divide_the_heads(tp: int, ok: bool) -> None:
    # llama-3.1-70b: 64 attention heads, 8 KV heads (16 devices replicate each KV head twice)
    if ok:
        assert estimate("llama-3.1-70b", "h100-sxm", tp=tp).tp == tp
    else:
        with pytest.raises(SpeedlimitError, match="heads"):
            estimate("llama-3.1-70b", "h100-sxm", tp=tp)


def test_profile_flag_reads_only_profiles(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(tmp_path))
    with pytest.raises(SpeedlimitError, match="no calibrated profile 'h100-sxm'"):
        estimate("7B", profile="h100-sxm")  # a catalog name is not a profile


def _command(name: str):
    return typer.main.get_command(cli_app).commands[name]


def test_cli_options_are_the_scenario_fields() -> None:
    options = {param.name: param for param in _command("estimate").params}
    for field in SCENARIO_FIELDS:
        info = Scenario.model_fields[field]
        flag = next(m for m in info.metadata if isinstance(m, Flag))
        assert field in options, field
        assert flag.names[0] in options[field].opts and options[field].help == info.description
    sweep = {param.name: param for param in _command("sweep").params}
    for field in ("output", "kv", "tp", "ideal"):
        assert sweep[field].help == Scenario.model_fields[field].description


def test_web_fields_are_the_scenario_fields() -> None:
    web = EstimateRequest.model_fields
    assert set(SCENARIO_FIELDS) <= set(web)
    for field in set(SCENARIO_FIELDS) - {"model", "hardware"}:
        assert web[field].description == Scenario.model_fields[field].description
    assert flag_name("bw_efficiency") == "--bw-efficiency" and flag_name("step_overhead_s") == "--step-overhead"


def _cli_json(body: dict) -> dict:
    argv = ["estimate", "--json", "--allow-no-fit"]
    for field, value in body.items():
        flag = flag_name(field)
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    done = runner.invoke(cli_app, argv)
    assert done.exit_code == 0, done.output
    return json.loads(done.output)


WEB_CASES = [
    {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "4"},
    {"model": "7B", "bandwidth": "3.35e12", "weights": "16", "ideal": True, "output": 1000},
    {"model": "llama-3.1-70b", "bandwidth": "2TB", "flops": "500e12", "memory": "640GB", "tp": 2, "batch": 16},
    {"model": "qwen2.5-7b", "hardware": "rtx-4090", "weights": "q4_k_m", "kv": "fp8", "compute": "fp16",
     "bw_efficiency": 0.7, "flops_efficiency": 0.5, "step_overhead_s": 0.002, "usd_per_hour": 0.7},
    {"model": "mixtral-8x7b", "hardware": "h200", "batch": 4, "prompt": 0},
]  # fmt: skip


@pytest.mark.parametrize("body", WEB_CASES)
def test_web_api_equals_cli_json(client, body: dict) -> None:
    response = client.post("/api/estimate", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == _cli_json(body) == estimate(**body).to_dict()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "gemma-2-9b", "deepseek-v3", "7B"]),
       hardware=st.sampled_from(["h100-sxm", "apple-m2-ultra", "l4", "mi300x"]),
       weights=st.sampled_from(["16", "8", "4", "q4_k_m", "fp8"]), batch=st.integers(1, 512),
       prompt=st.integers(0, 32768), output=st.integers(1, 4096), tp=st.sampled_from([1, 2, 8]),
       ideal=st.booleans(), usd=st.none() | st.floats(0, 100))
def test_web_equals_cli_for_any_valid_scenario(client, model, hardware, weights, batch, prompt, output, tp, ideal, usd) -> None:
    body = {"model": model, "hardware": hardware, "weights": weights, "batch": batch, "prompt": prompt, "output": output,
            "tp": tp, "ideal": ideal}
    if usd is not None:
        body["usd_per_hour"] = usd
    response = client.post("/api/estimate", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == _cli_json(body)
