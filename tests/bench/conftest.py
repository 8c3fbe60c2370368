"""Fixtures for the bench tests: the deliberately faulty fake server, and a real llama-cpp-python server.

The real server (`llama_server`) runs the bundled SmolLM2-135M GGUF on 127.0.0.1 for the whole session; it is
started on first use and stopped at the end. If it does not come up, the test fails with the server's stderr.
`--interrupt_requests False` matters: by default llama-cpp-python cuts a running stream with `[DONE]` as soon as
another request waits, which would make every concurrent benchmark measure truncated replies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from faulty_server import FaultyOpenAIServer, free_port  # noqa: E402

SERVER_START_TIMEOUT_S = 120


@pytest.fixture
def run_cli(capsys):
    """Run speedlimit's real console entry point in-process: argv -> (exit code, stdout, stderr)."""
    from speedlimit import cli

    def run(argv: list[str]) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = ["speedlimit", *argv]
        try:
            cli.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        finally:
            sys.argv = old
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="session")
def faulty_server():
    with FaultyOpenAIServer() as server:
        yield server


@dataclass
class RealServer:
    base_url: str
    model: str
    gguf_path: Path


@pytest.fixture(scope="session")
def llama_server():
    from speedlimit.bundled import default_gguf_path

    gguf = default_gguf_path()
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="llama_server_", suffix=".log", delete=False)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "2048", "--n_threads", "2", "--interrupt_requests", "False"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {process.returncode}:\n{Path(log.name).read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(base_url + "/models", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer /v1/models within {SERVER_START_TIMEOUT_S} s:\n"
                            f"{Path(log.name).read_text()[-4000:]}")
            time.sleep(0.25)
        yield RealServer(base_url, str(gguf), gguf)
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()
        os.unlink(log.name)
