"""`speedlimit serve` as a user runs it: a real process on 127.0.0.1, and its one-line errors."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_starts_serves_and_stops():
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "speedlimit.cli", "serve", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                page = httpx.get(base + "/", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1]
                assert time.monotonic() < deadline, "speedlimit serve did not come up"
                time.sleep(0.1)
        assert page.status_code == 200 and "speedlimit" in page.text
        result = httpx.post(base + "/api/estimate", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": 4}).json()
        assert result["weights"] == "int4"
        assert httpx.post(base + "/api/estimate", json={"model": "llama-3.1-8b", "hardware": "h100-sxm", "batch": -1}).status_code == 422
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=15)
    assert f"http://127.0.0.1:{port}/" in out


def test_port_in_use_and_bad_port_are_one_line_errors():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "serve", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"error: port {port} on 127.0.0.1 is already in use; pass --port N (or --port 0 for any free port)\n"
    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "serve", "--port", "70000"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: --port must be between 0 and 65535")


def test_port_0_prints_the_port_it_got():
    process = subprocess.Popen([sys.executable, "-m", "speedlimit.cli", "serve", "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        port = int(match.group(1))
        assert port != 0
        deadline = time.monotonic() + 30
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/docs", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "speedlimit serve did not come up"
                time.sleep(0.1)
        assert page.status_code == 200 and "swagger-ui" in page.text
    finally:
        process.terminate()
        process.communicate(timeout=15)
