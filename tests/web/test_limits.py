"""What the web API refuses before estimating: oversized bodies (413, without reading them), files on the server
(no existence oracle), and CLI flags in its errors; plus the offline /docs."""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time

import pytest
from fastapi.testclient import TestClient

from speedlimit.web.app import create_app
from speedlimit.web.limits import MAX_BODY_BYTES, web_wording


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


@pytest.fixture(scope="module")
def live_port():
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def _response(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 10:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_body_just_under_the_cap_is_read(client):
    body = json.dumps({"model": "llama-3.1-8b", "hardware": "h100-sxm", "config": None, "pad": "x" * (MAX_BODY_BYTES - 200)})
    assert len(body) <= MAX_BODY_BYTES
    response = client.post("/api/estimate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and "unknown field" in response.json()["detail"]  # read and parsed: pad is not a field


def test_declared_oversize_body_is_413_before_any_byte_is_sent(live_port):
    with socket.create_connection(("127.0.0.1", live_port)) as sock:
        sock.sendall(b"POST /api/estimate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 314572800\r\n\r\n")  # 300 MB announced, none sent
        reply = _response(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"larger than 1,048,576 bytes" in reply


def test_chunked_oversize_body_is_413_after_reading_only_about_the_cap(live_port):
    chunk = b"x" * 65536
    sent = 0
    with socket.create_connection(("127.0.0.1", live_port)) as sock:
        sock.sendall(b"POST /api/curve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        sock.setblocking(False)
        reply = b""
        while sent < 256 * MAX_BODY_BYTES:  # would be 256 MB; the server must answer long before
            readable, writable, _ = select.select([sock], [sock], [], 5)
            if readable:
                reply = sock.recv(65536)
                break
            if not writable:
                break
            try:
                sent += sock.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        reply += b"" if reply else _response(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert sent < 32 * MAX_BODY_BYTES  # the cap plus what socket buffers hold, not the whole upload


@pytest.mark.parametrize("name", ["serve.log", "models", "llama-3.1-8b.bin", "sub/notes.txt"])
def test_a_name_that_is_a_server_file_gets_the_same_error_as_any_unknown_name(client, name, tmp_path, monkeypatch):
    for path in ("serve.log", "llama-3.1-8b.bin", "sub/notes.txt"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text("secret", encoding="utf-8")
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)  # the server's working directory holds these files

    def detail(model: str) -> tuple[int, str]:
        response = client.post("/api/estimate", json={"model": model, "hardware": "h100-sxm"})
        return response.status_code, re.sub(r"; did you mean[^;]*", "", response.json()["detail"].replace(repr(model), "NAME"))

    assert (tmp_path / name).exists()
    assert detail(name) == detail("nope-" + name.replace("/", "-")) == (422, "unknown model NAME; pick a catalog model or give a size like 7B")


@pytest.mark.parametrize(("model", "expected"), [("7B", "7B"), ("Llama-3.1-8B", "Llama 3.1 8B"), ("70e9", None)])
def test_sizes_and_aliases_resolve_without_files(client, model, expected):
    response = client.post("/api/estimate", json={"model": model, "hardware": "h100-sxm"})
    assert response.status_code == 200, response.text
    if expected:
        assert expected.lower().replace(" ", "") in response.json()["model"].lower().replace(" ", "").replace("-", "")


def test_cli_flags_are_reworded_as_field_names():
    assert web_wording("--bw-efficiency must be a fraction in (0, 1], got 3") == "bw_efficiency must be a fraction in (0, 1], got 3"
    assert web_wording("--batch must be between 1 and 1,000,000") == "batch must be between 1 and 1,000,000"
    assert web_wording("use --tp 2 or --allow-no-fit; q4--k stays") == "use tp 2 or allow_no_fit; q4--k stays"


def test_docs_work_offline(client):
    page = client.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r'(?:href|src)="([^"]+)"', page.text)
    assert assets and all(url.startswith("/") for url in assets), assets
    assert not re.search(r"https?://", page.text)
    for url in assets:
        assert client.get(url).status_code == 200, url
    assert len(client.get("/vendor/swagger-ui/swagger-ui-bundle.js").content) > 500_000
    assert client.get("/redoc").status_code == 404  # redoc would load from a CDN


def test_a_pasted_config_of_10000_layers_on_apple_m2_ultra_is_estimated_not_422(client):
    """Issue 10: 7 µs × kernels × 10,000 layers is a per-step overhead over 1 s: slow, not invalid (was 422)."""
    config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 10_000,
              "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096}
    response = client.post("/api/estimate", json={"config": config, "hardware": "apple-m2-ultra"})
    assert response.status_code == 200, response.text
    assert response.json()["step_overhead_s"] > 1
