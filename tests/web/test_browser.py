"""The calculator page in a real browser: Debian's chromium (headless) via playwright against a live uvicorn.

Moves the weight-precision slider from 16 to 4 bits for a memory-bound case and checks the shown tok/s,
that both charts drew, that the state is in the URL, and saves a screenshot.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from speedlimit.estimator import estimate

CHROMIUM = os.environ.get("SPEEDLIMIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
BITS = [2, 3, 4, 5, 6, 8, 16]  # the slider's stops (index -> bits), as in static/app.js

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server_url():
    import uvicorn

    from speedlimit.web.app import create_app

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _settle(page, renders_before: int) -> None:
    """Wait until the page drew a newer result and has no request in flight."""
    page.wait_for_function(
        "(n) => window.speedlimit && window.speedlimit.renders > n && !window.speedlimit.pending"
        " && window.speedlimit.chartSeq === window.speedlimit.cardSeq",
        arg=renders_before,
        timeout=15000,
    )


def _shown_tok_s(page) -> float:
    return float(page.locator("#decode-tok-s").get_attribute("data-value"))


def _renders(page) -> int:
    return page.evaluate("window.speedlimit.renders")


@pytest.mark.parametrize("ideal", [True, False], ids=["ideal", "default"])
def test_precision_slider_scales_memory_bound_speed(browser, server_url, tmp_path, ideal):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    network = []
    page.on("request", lambda request: network.append(request.url))
    query = "model=llama-3.1-8b&hardware=h100-sxm&weights=16&batch=1&prompt=512&output=1000" + ("&ideal=1" if ideal else "")
    page.goto(f"{server_url}/?{query}")
    _settle(page, 0)
    assert page.locator("#weights-label").inner_text() == "16 bits"
    tok_s_16 = _shown_tok_s(page)
    expected_16 = estimate("llama-3.1-8b", "h100-sxm", weights=16, output=1000, ideal=ideal)
    assert tok_s_16 == pytest.approx(expected_16.decode_tok_s, rel=1e-9)
    assert expected_16.regime == "memory"

    before = _renders(page)
    page.locator("#weights-bits").fill(str(BITS.index(4)))  # move the slider to 4 bits
    _settle(page, before)
    assert page.locator("#weights-label").inner_text() == "4 bits"
    tok_s_4 = _shown_tok_s(page)
    expected_4 = estimate("llama-3.1-8b", "h100-sxm", weights=4, output=1000, ideal=ideal)
    assert tok_s_4 == pytest.approx(expected_4.decode_tok_s, rel=1e-9)
    ratio = tok_s_4 / tok_s_16
    if ideal:
        assert ratio == pytest.approx(4.0, rel=0.02)  # the seed formula: a quarter of the bytes, four times the speed
    else:
        # With step overhead the gain is less than 4x; it must still be the estimator's own ratio and well above 1.
        assert ratio == pytest.approx(expected_4.decode_tok_s / expected_16.decode_tok_s, rel=1e-9)
        assert 1.5 < ratio <= 4.0
    shown_text = page.locator("#decode-tok-s").inner_text().replace(",", "")
    assert float(shown_text) == pytest.approx(tok_s_4, rel=0.01)

    # state is in the URL
    assert "weights=4" in page.url and "model=llama-3.1-8b" in page.url and ("ideal=1" in page.url) == ideal

    # both charts drew (plotly renders SVG), with the current point and the knee
    for chart in ("#roofline-chart", "#curve-chart"):
        assert page.locator(f"{chart} svg.main-svg").count() >= 1
        assert page.locator(f"{chart} .scatterlayer .trace").count() >= 2
    assert "bound" in page.locator("#roofline-chart .gtitle").text_content()
    assert page.locator("#curve-chart .legendtext", has_text="knee").count() == 1
    assert page.locator("#mem-weights").evaluate("e => parseFloat(e.style.width)") > 0
    assert page.locator("#error").is_hidden()
    assert all(url.startswith(server_url) for url in network), [u for u in network if not u.startswith(server_url)]

    screenshot = tmp_path / f"calculator-{'ideal' if ideal else 'default'}.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 20_000
    keep = os.environ.get("SPEEDLIMIT_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(keep) / screenshot.name)
    page.close()


def test_the_weight_menu_prices_a_checkpoint_as_it_ships(browser, server_url):
    """'shipped' in the weight menu: DeepSeek-R1 at its fp8 (it does not fit 8 x H200 at the slider's 16 bits)."""
    page = browser.new_page()
    page.goto(f"{server_url}/?model=deepseek-r1&hardware=h200&weights=shipped&batch=1&prompt=512&output=500&tp=8")
    _settle(page, 0)
    assert page.locator("#weights-format").input_value() == "shipped"
    expected = estimate("deepseek-r1", "h200", weights="shipped", tp=8, batch=1, prompt=512, output=500)
    assert expected.weights == "fp8"
    assert _shown_tok_s(page) == pytest.approx(expected.decode_tok_s, rel=1e-9)
    assert page.locator("#error").is_hidden()
    page.close()


def test_shared_url_restores_state_and_bad_input_shows_error(browser, server_url):
    page = browser.new_page()
    page.goto(f"{server_url}/?model=qwen2.5-7b&hardware=rtx-4090&weights=q4_k_m&kv=fp8&batch=8&prompt=2000&output=500&tp=1")
    _settle(page, 0)
    assert page.locator("#model").input_value() == "qwen2.5-7b"
    assert page.locator("#weights-format").input_value() == "q4_k_m"
    assert page.locator("#batch").input_value() == "8"
    expected = estimate("qwen2.5-7b", "rtx-4090", weights="q4_k_m", kv="fp8", batch=8, prompt=2000, output=500)
    assert _shown_tok_s(page) == pytest.approx(expected.decode_tok_s, rel=1e-9)
    assert page.locator("#reply-tokens").inner_text() == "500"

    before = _renders(page)
    page.locator("#config-box summary").click()
    page.locator("#config").fill('{"model_type": "llama"}')
    page.wait_for_function("() => !window.speedlimit.pending && !document.getElementById('error').hidden", timeout=15000)
    assert "config is missing" in page.locator("#error").inner_text()
    assert _renders(page) == before  # the last good result stays on screen

    page.locator("#config-clear").click()
    _settle(page, before)
    assert page.locator("#error").is_hidden()
    page.close()


def _settled_or_error(page) -> None:
    page.wait_for_function("() => window.speedlimit && !window.speedlimit.pending && (window.speedlimit.renders > 0"
                           " || !document.getElementById('error').hidden)", timeout=15000)


@pytest.mark.parametrize(("query", "selected", "label"), [
    ("model=7B", "7B", "7B (as given)"),
    ("model=Llama-3.1-8B", "llama-3.1-8b", "llama-3.1-8b — Llama 3.1 8B"),
    ("model=LLAMA_3.1_8B", "llama-3.1-8b", "llama-3.1-8b — Llama 3.1 8B"),
])
def test_url_model_by_size_or_alias_is_never_a_blank_dropdown(browser, server_url, query, selected, label):
    page = browser.new_page()
    page.goto(f"{server_url}/?{query}")
    _settled_or_error(page)
    assert page.locator("#model").input_value() == selected
    assert page.locator("#model option:checked").inner_text() == label
    assert page.locator("#error").is_hidden()
    assert _shown_tok_s(page) > 0
    page.close()


def test_url_with_unknown_weights_shows_the_error_not_16_bits(browser, server_url):
    page = browser.new_page()
    page.goto(f"{server_url}/?model=llama-3.1-8b&weights=q9_9")
    _settled_or_error(page)
    assert page.locator("#weights-format").input_value() == "q9_9"
    assert page.locator("#weights-label").inner_text() == "q9_9"
    assert "unknown weights format 'q9_9'" in page.locator("#error").inner_text()
    assert _renders(page) == 0
    page.close()


def test_wording_cards_and_efficiency_basis_as_a_person_sees_them(browser, server_url, tmp_path):
    page = browser.new_page(viewport={"width": 1250, "height": 1000})
    page.goto(f"{server_url}/?model=llama-3.1-8b&hardware=h100-sxm&batch=8")
    _settle(page, 0)
    memory = page.locator("#memory-text").inner_text()
    assert re.search(r"max batch \d[\d,]*$", memory), memory  # "282", never "282.0"
    assert ".0" not in memory.rsplit("max batch", 1)[1]
    assert re.search(r"peak \d+ TFLOP/s", page.locator("#basis-text").inner_text())  # a space before the prefix
    # six cards, rows of equal length at this width and at others (no card alone on a row)
    for width in (1400, 1250, 1100, 900, 700, 420):
        page.set_viewport_size({"width": width, "height": 1000})
        tops = page.locator(".cards .card").evaluate_all("cards => cards.map(c => Math.round(c.getBoundingClientRect().top))")
        per_row = [tops.count(top) for top in sorted(set(tops))]
        assert len(tops) == 6 and len(set(per_row)) == 1, (width, per_row)
    # the basis: collapsed by default, a list of links once opened, links only to http(s) addresses
    page.set_viewport_size({"width": 1400, "height": 1000})
    assert not page.locator("#basis-list").is_visible()
    page.locator("#basis-details summary").click()
    items = page.locator("#basis-list li")
    assert items.count() >= 2
    hrefs = page.locator("#basis-list a").evaluate_all("links => links.map(a => a.href)")
    assert hrefs and all(href.startswith(("https://", "http://")) for href in hrefs)
    assert any("github.com/NVIDIA/cccl/pull/9881" in href for href in hrefs)
    page.screenshot(path=str(tmp_path / "basis.png"), full_page=True)
    page.close()


def test_efficiency_basis_renders_hostile_text_as_text(browser, server_url):
    page = browser.new_page()
    page.goto(f"{server_url}/?model=llama-3.1-8b")
    _settle(page, 0)
    hostile = '<img src=x onerror=alert(1)>; see javascript:alert(1)/x and evil.example/<b>bold</b>; data.example/x" onclick="y'
    page.evaluate("(text) => renderBasis(text)", hostile)
    assert page.locator("#basis-list img, #basis-list b").count() == 0
    assert "<img src=x onerror=alert(1)>" in page.locator("#basis-list").text_content()
    hrefs = page.locator("#basis-list a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert all(href.startswith("https://") for href in hrefs), hrefs
    assert page.locator("#basis-list a[onclick]").count() == 0
    page.close()


def test_api_docs_render_offline(browser, server_url):
    """Swagger UI from the installed wheel renders this app's OpenAPI 3.1 schema with no request leaving the server."""
    page = browser.new_page()
    network = []
    page.on("request", lambda request: network.append(request.url))
    page.goto(f"{server_url}/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=20000)
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("speedlimit")
    assert page.locator(".opblock-summary-path", has_text="/api/estimate").count() == 1
    assert all(url.startswith(server_url) for url in network), [u for u in network if not u.startswith(server_url)]
    page.close()


def _settle_serving(page, renders_before: int, errors_before: int | None = None) -> None:
    """Wait until the serving view drew a newer simulation (or showed a newer error) and has none in flight."""
    page.wait_for_function(
        "([n, e]) => window.speedlimit && !window.speedlimit.simPending"
        " && (window.speedlimit.simRenders > n || (e !== null && window.speedlimit.simErrors > e))",
        arg=[renders_before, errors_before], timeout=30000)


def test_serving_view_draws_latency_and_throughput_against_load(browser, server_url, tmp_path):
    """Choose concurrency, then rate, and set an SLO: the chart, the knee / saturation / SLO cards and the notes show
    exactly what POST /api/simulate (and so `speedlimit simulate --sweep`) computes."""
    from fastapi.testclient import TestClient

    from speedlimit.web.app import create_app

    api = TestClient(create_app())
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.goto(f"{server_url}/?model=llama-3.1-8b&hardware=h100-sxm&prompt=512&output=128&sim_values=1,4,16,64")
    _settle_serving(page, 0)
    data = page.evaluate("window.speedlimit.simLast")
    expected = api.post("/api/simulate", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "16",
                                               "batch": 1, "prompt": 512, "output": 128, "tp": 1,
                                               "ideal": False, "load": "concurrency", "values": [1, 4, 16, 64]}
                        ).json()  # the page's default: the engine profile's own scheduler (llama.cpp)
    assert [p["load"] for p in data["points"]] == [1, 4, 16, 64]
    assert data["points"] == expected["points"]
    assert float(page.locator("#sim-knee").get_attribute("data-value")) == expected["knee_load"]
    assert float(page.locator("#sim-saturation").get_attribute("data-value")) == expected["saturation_output_tok_s"]
    assert page.locator("#sim-slo-max").inner_text() == "–"
    names = page.locator("#serving-chart .legendtext").evaluate_all("els => els.map(e => e.textContent)")
    assert {"TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "output tok/s"} <= set(names)
    assert page.locator("#serving-chart .scatterlayer .trace").count() == 5
    assert "knee" in page.locator("#serving-chart").text_content()
    assert page.locator("#sim-command").inner_text().startswith("speedlimit simulate -m llama-3.1-8b -H h100-sxm")

    # an SLO: the highest concurrency meeting it, as the API says
    before = page.evaluate("window.speedlimit.simRenders")
    page.locator("#sim-slo-ttft").fill("150")
    page.locator("#sim-slo-tpot").fill("12")
    _settle_serving(page, before)
    data = page.evaluate("window.speedlimit.simLast")
    assert data["slo"] == {"ttft": 0.15, "tpot": 0.012}
    shown = page.locator("#sim-slo-max").get_attribute("data-value")
    assert (float(shown) if shown else None) == data["slo_max_load"]
    assert "TTFT 150 ms" in page.locator("#sim-slo-sub").inner_text()
    assert "slo_ttft=150" in page.url and "slo_tpot=12" in page.url

    # rate: default levels around the engine's saturation rate; past it, the page says the queue grows
    before = page.evaluate("window.speedlimit.simRenders")
    page.locator("#sim-values").fill("")
    page.locator("#sim-load").select_option("rate")
    page.locator("#sim-max-seqs").fill("16")
    _settle_serving(page, before)
    data = page.evaluate("window.speedlimit.simLast")
    assert data["parameter"] == "rate" and data["saturation_request_s"] > 0
    assert "saturates at" in page.locator("#sim-saturation-sub").inner_text()
    notes = page.locator("#sim-notes li").all_inner_texts()
    assert notes and all("grows without bound" in note for note in notes)
    assert "sim_load=rate" in page.url and "sim_max_seqs=16" in page.url
    assert "arrival rate" in page.locator("#serving-chart").text_content()
    page.screenshot(path=str(tmp_path / "serving.png"), full_page=True)
    keep = os.environ.get("SPEEDLIMIT_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "serving.png", Path(keep) / "serving.png")

    # bad input: one line from the API on the page, the last good chart kept (dimmed)
    before, errors = page.evaluate("[window.speedlimit.simRenders, window.speedlimit.simErrors]")
    page.locator("#sim-values").fill("0,2")
    _settle_serving(page, before, errors)
    assert "positive" in page.locator("#sim-error").inner_text()
    assert page.evaluate("window.speedlimit.simRenders") == before
    before, errors = page.evaluate("[window.speedlimit.simRenders, window.speedlimit.simErrors]")
    page.locator("#sim-values").fill("1,x")
    _settle_serving(page, before, errors)
    assert "not a number" in page.locator("#sim-error").inner_text()
    page.locator("#sim-values").fill("1,2")
    _settle_serving(page, before)
    assert page.locator("#sim-error").is_hidden()
    page.close()


def test_serving_view_shows_hostile_url_values_as_text(browser, server_url):
    page = browser.new_page()
    hostile = "<img src=x onerror=alert(1)>"
    page.goto(f"{server_url}/?model=llama-3.1-8b&output=64&sim_engine={hostile}&sim_values=1,2")
    _settle_serving(page, 0, 0)
    assert page.locator("#serving img").count() == 0
    assert page.locator("#sim-engine").input_value() == hostile  # sent as given, refused by the API
    assert "scheduler" in page.locator("#sim-error").inner_text()
    page.close()


def test_engine_selector_sends_the_profile_and_shows_exactly_the_apis_answer(browser, server_url):
    """The Engine select is filled from GET /api/engines (default: unset, llama.cpp); choosing vllm puts engine=vllm in
    every body (/api/curve, /api/simulate) and in the URL, and the cards, curve and serving view show what the API
    answers for engine=vllm, which differs from the default's."""
    from fastapi.testclient import TestClient

    from speedlimit.web.app import create_app

    api = TestClient(create_app())
    engines = api.get("/api/engines").json()
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    bodies = []
    page.on("request", lambda request: bodies.append((request.url.rsplit("/", 1)[-1], request.post_data_json))
            if request.method == "POST" else None)
    page.goto(f"{server_url}/?model=llama-3.1-8b&hardware=h100-sxm&prompt=512&output=128&sim_values=1,4")
    _settle(page, 0)
    _settle_serving(page, 0)
    assert page.locator("#engine").input_value() == ""
    options = page.locator("#engine option").evaluate_all("os => os.map(o => [o.value, o.textContent])")
    default = next(e for e in engines if e["default"])
    assert options[0] == ["", f"default ({default['label']})"]
    assert [value for value, _ in options[1:]] == [e["name"] for e in engines]
    assert ["vllm", "vllm — vLLM (V1 engine)"] in options
    # unset: the API's default profile, and that engine's default KV format
    assert bodies and all("engine" not in body and "kv" not in body for _, body in bodies)
    default_tok_s = _shown_tok_s(page)

    base = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "16", "batch": 1, "prompt": 512,
            "output": 128, "tp": 1, "ideal": False}
    assert default_tok_s == api.post("/api/curve", json=base).json()["estimate"]["decode_tok_s"]
    bodies.clear()
    before, sim_before = _renders(page), page.evaluate("window.speedlimit.simRenders")
    page.locator("#engine").select_option("vllm")
    _settle(page, before)
    _settle_serving(page, sim_before)
    curve = api.post("/api/curve", json={**base, "engine": "vllm"}).json()
    served = api.post("/api/simulate", json={**base, "engine": "vllm", "load": "concurrency", "values": [1, 4]}).json()
    assert page.evaluate("window.speedlimit.last") == curve
    assert _shown_tok_s(page) == curve["estimate"]["decode_tok_s"] != default_tok_s
    assert float(page.locator("#throughput").get_attribute("data-value")) == curve["estimate"]["throughput_tok_s"]
    sim = page.evaluate("window.speedlimit.simLast")
    assert sim["points"] == served["points"] and sim["engine"] == served["engine"]
    assert sim["engine"]["engine"] == "vllm" and sim["engine"]["max_seqs"] == 1024  # vllm's profile, not llama.cpp's 4
    assert "vllm engine profile, continuous scheduling, up to 1,024 sequences" in page.locator("#sim-caption").inner_text()
    assert float(page.locator("#sim-knee").get_attribute("data-value")) == served["knee_load"]
    assert page.locator("#sim-command").inner_text() == served["command"]
    assert served["command"].endswith("--engine vllm")
    sent = {path for path, body in bodies if body.get("engine") == "vllm"}
    assert sent == {"curve", "simulate"} and all(body.get("engine") == "vllm" for _, body in bodies)
    assert "engine=vllm" in page.url

    # the URL restores it; back to the default drops it from the URL and the bodies
    page.goto(page.url)
    _settle(page, 0)
    assert page.locator("#engine").input_value() == "vllm"
    assert _shown_tok_s(page) == curve["estimate"]["decode_tok_s"]
    before = _renders(page)
    page.locator("#engine").select_option("")
    _settle(page, before)
    assert _shown_tok_s(page) == default_tok_s and "engine=" not in page.url.replace("sim_engine=", "")
    page.close()


def test_unknown_engine_in_the_url_is_refused_by_the_api_and_shown_as_text(browser, server_url):
    page = browser.new_page()
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    hostile = '<img src=x onerror=alert(1)>"><b>x</b>'
    page.goto(f"{server_url}/?model=llama-3.1-8b&output=64&sim_values=1,2&engine={quote(hostile)}")
    _settled_or_error(page)
    _settle_serving(page, 0, 0)
    assert page.locator("#engine").input_value() == hostile  # shown and sent as given
    assert page.locator("#engine option:checked").text_content() == f"{hostile} (as given)"
    for box in ("#error", "#sim-error"):
        text = page.locator(box).inner_text()
        assert text.startswith("unknown engine") and hostile in text and "\n" not in text, text
    assert page.locator("img, b").count() == 0 and not dialogs
    assert _renders(page) == 0 and page.evaluate("window.speedlimit.simRenders") == 0
    page.close()
