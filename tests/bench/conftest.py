"""Fixtures for the bench tests: the deliberately faulty fake server, and a real llama-cpp-python server.

The real server (`llama_server`) runs the bundled SmolLM2-135M GGUF on 127.0.0.1 for the whole session; it is
started on first use and stopped at the end. If it does not come up, the test fails with the server's stderr.
`--interrupt_requests False` matters: by default llama-cpp-python cuts a running stream with `[DONE]` as soon as
another request waits, which would make every concurrent benchmark measure truncated replies.

`llama_cpp_server` is llama.cpp's own C++ `llama-server` (continuous batching over 4 slots, /metrics, /slots) on the
same GGUF. Its binary comes from $SPEEDLIMIT_LLAMA_SERVER, or scripts/build_llama_server.sh (cached; the first build
takes about 7 minutes on 2 cores, and .ci/run builds it before the tests).
"""

from __future__ import annotations

import contextlib
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
    log_path: Path | None = None  # the server's own log, while it runs

    @property
    def root_url(self) -> str:
        return self.base_url.removesuffix("/v1")


ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build_llama_server.sh"
BUILD_TIMEOUT_S = 3600


def llama_server_binary() -> Path:
    """The C++ llama-server: $SPEEDLIMIT_LLAMA_SERVER, else the build script's cached (or freshly built) binary."""
    given = os.environ.get("SPEEDLIMIT_LLAMA_SERVER")
    if given:
        if not os.access(given, os.X_OK):
            pytest.fail(f"SPEEDLIMIT_LLAMA_SERVER={given} is not an executable file")
        return Path(given)
    try:
        result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                env={**os.environ, "PYTHON": sys.executable})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{BUILD_SCRIPT} did not finish within {BUILD_TIMEOUT_S} s")
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        pytest.fail(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Path(lines[-1])


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@contextlib.contextmanager
def running_llama_cpp_server(parallel: int = 4, context: int = 4096):
    """llama.cpp's C++ llama-server on the bundled GGUF (2 threads, ``parallel`` slots over ``context`` tokens), from
    start to stop."""
    from speedlimit.bundled import default_gguf_path

    binary = llama_server_binary()
    gguf = default_gguf_path()
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="llama_cpp_server_", suffix=".log", delete=False)
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", "2",
               "--parallel", str(parallel), "-c", str(context), "--metrics", "--slots"]
    # LLAMA_ARG_* variables would silently override these flags
    env = {key: value for key, value in os.environ.items() if not key.startswith("LLAMA_ARG_")}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    root_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama-server exited with {process.returncode}:\n{Path(log.name).read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(root_url + "/health", timeout=2) as response:
                    if response.status == 200:  # 503 while the model loads
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server did not answer /health within {SERVER_START_TIMEOUT_S} s:\n"
                            f"{Path(log.name).read_text()[-4000:]}")
            time.sleep(0.25)
        yield RealServer(root_url + "/v1", str(gguf), gguf, Path(log.name))  # its /v1/models id is the -m path
    finally:
        stop_process(process)
        log.close()
        os.unlink(log.name)


@pytest.fixture(scope="session")
def llama_cpp_server():
    """llama.cpp's C++ llama-server on the bundled GGUF: 2 threads, 4 parallel slots over a 4,096-token context."""
    with running_llama_cpp_server() as server:
        yield server


@pytest.fixture
def fresh_llama_cpp_server():
    """A llama-server of the test's own (the same set-up as `llama_cpp_server`), whose slots no other test used."""
    with running_llama_cpp_server() as server:
        yield server


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
        stop_process(process)
        log.close()
        os.unlink(log.name)
