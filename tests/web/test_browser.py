"""The calculator page in a real browser: Debian's chromium (headless) via playwright against a live uvicorn.

Moves the weight-precision slider from 16 to 4 bits for a memory-bound case and checks the shown tok/s,
that both charts drew, that the state is in the URL, and saves a screenshot.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

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
