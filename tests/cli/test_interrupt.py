"""Ctrl-C anywhere: one line, ``interrupted``, on stderr and exit code 130, never a traceback (issue 10).

Each phase a Ctrl-C can land in is driven deterministically: while `speedlimit.cli` imports (an import hook sends
the signal), while typer parses, and while each command runs (in-process: the command raises KeyboardInterrupt; in a
child process: a patched step of the command sleeps and the test sends a real SIGINT). `serve` gets a real SIGINT
while uvicorn serves. verify's own handling (stop between measurements, partial --out) is in tests/verify.
"""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from speedlimit import cli
from tests.test_fuzz import verify_result

READY = "READY"

# (argv, the function that command calls that the child replaces with a sleep): each command once.
SLOW_STEPS = {
    "estimate": (["estimate", "-m", "7B", "-H", "h100-sxm"], "speedlimit.cli.estimate", "estimate_scenario"),
    "sweep": (["sweep", "-m", "7B", "-H", "l4"], "speedlimit.estimator.sweep", "sweep_grid"),
    "models": (["models"], "speedlimit.cli.estimate", "catalog_model"),
    "hardware": (["hardware"], "speedlimit.cli.estimate", "catalog_hardware"),
    "engines": (["engines"], "speedlimit.cli.estimate", "catalog_engine"),
    "simulate": (["simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm"], "speedlimit.simulator.api", "run_workload"),
    "calibrate": (["calibrate", "RESULTS"], "speedlimit.verify.fit", "fit_calibration"),
    "report": (["report", "RESULTS"], "speedlimit.report.results", "load_results"),
}  # verify stops between measurements instead: tests/verify/test_interrupt.py

VERIFY_RESULT = verify_result()  # a minimal verify result calibrate and report accept


def child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for(process: subprocess.Popen, marker: str, timeout: float = 60) -> list[str]:
    """Lines of the child's stderr up to and including the one holding ``marker``."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    process.kill()
    raise AssertionError(f"the child never printed {marker!r}: {''.join(lines)}{process.stderr.read()}")


def finish(process: subprocess.Popen, timeout: float = 30) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def assert_interrupted(code: int, err: str) -> None:
    assert code == 130, f"exit {code}: {err}"
    assert "Traceback" not in err and "Exception ignored" not in err and "Aborted" not in err, err
    assert err.strip().splitlines()[-1] == "interrupted", err


# --------------------------------------------------------------------------------------------
# while the command line imports


@pytest.mark.parametrize("module", ["typer", "rich.table", "pydantic", "speedlimit.cli.verify"])
def test_ctrl_c_while_the_commands_import(module: str) -> None:
    """The signal arrives when `speedlimit.cli` first imports ``module`` (an import hook sends it)."""
    code = f"""
        import os, signal, sys

        class SignalOnImport:
            def find_spec(self, name, path=None, target=None):
                if name == {module!r}:
                    os.kill(os.getpid(), signal.SIGINT)
                return None

        sys.meta_path.insert(0, SignalOnImport())
        sys.argv = ["speedlimit", "models"]
        from speedlimit.cli import main
        main()
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert_interrupted(done.returncode, done.stderr)
    assert done.stderr == "interrupted\n" and done.stdout == ""


def test_import_leaves_the_sigint_handler_as_it_was() -> None:
    code = "import signal; before = signal.getsignal(signal.SIGINT); import speedlimit.cli; " \
           "assert signal.getsignal(signal.SIGINT) is before"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


# --------------------------------------------------------------------------------------------
# in-process: every command, and the parser


def _invoke(*argv: str) -> tuple[int | None, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["speedlimit", *argv]
    code: int | None = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            cli.main()
    except SystemExit as exit_:
        code = exit_.code  # type: ignore[assignment]
    finally:
        sys.argv = saved
    return code, out.getvalue(), err.getvalue()


def _commands() -> list[str]:
    return [info.name for info in cli.app.registered_commands]


@pytest.mark.parametrize("command", _commands())
def test_keyboard_interrupt_in_any_command(command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    info = next(info for info in cli.app.registered_commands if info.name == command)

    @functools.wraps(info.callback)
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "callback", interrupted)
    required = {"estimate": ["-m", "7B"], "sweep": ["-m", "7B", "-H", "l4"], "simulate": ["-m", "7B"],
                "bench": ["--url", "http://127.0.0.1:9/v1"], "calibrate": [str(tmp_path)], "report": [str(tmp_path)]}
    code, _, err = _invoke(command, *required.get(command, []))
    assert (code, err) == (130, "interrupted\n")


def test_keyboard_interrupt_while_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer.core

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(typer.core.TyperGroup, "parse_args", interrupted)
    assert _invoke("models")[0::2] == (130, "interrupted\n")


def test_keyboard_interrupt_outside_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """While typer builds the click command from the registered functions (before click's own handling)."""
    import typer.main

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(typer.main, "get_command", interrupted)
    assert _invoke("models")[0::2] == (130, "interrupted\n")


# --------------------------------------------------------------------------------------------
# a real SIGINT to a child process, in every command


@pytest.mark.parametrize("command", sorted(SLOW_STEPS))
def test_sigint_while_a_command_runs(command: str, tmp_path: Path) -> None:
    argv, module, name = SLOW_STEPS[command]
    results = tmp_path / "verify.json"
    results.write_text(json.dumps(VERIFY_RESULT))
    argv = [str(results) if a == "RESULTS" else a for a in argv]
    process = child(f"""
        import importlib, sys, time
        sys.argv = ["speedlimit", *{argv!r}]
        from speedlimit.cli import main

        def slow(*args, **kwargs):
            print({READY!r}, file=sys.stderr, flush=True)
            time.sleep(60)

        setattr(importlib.import_module({module!r}), {name!r}, slow)
        main()
    """)
    wait_for(process, READY)
    process.send_signal(signal.SIGINT)
    code, _, err = finish(process)
    assert_interrupted(code, err)
    assert err == "interrupted\n", err  # (READY was read before the signal)


def test_sigint_to_bench_waiting_for_a_hanging_server() -> None:
    """bench keeps its own message (what finished, where it is written) and exit code 130."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    from faulty_server import FaultyOpenAIServer

    with FaultyOpenAIServer() as server:
        process = child(f"""
            import sys
            sys.argv = ["speedlimit", "bench", "--url", "{server.url('hang')}", "--no-progress", "--requests", "2"]
            print({READY!r}, file=sys.stderr, flush=True)
            from speedlimit.cli import main
            main()
        """)
        wait_for(process, READY)
        deadline = time.monotonic() + 60  # a loaded box may take long to import: wait for the server to see bench
        while len(server.served) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        time.sleep(0.5)  # the pre-flight is answered, the first request hangs
        process.send_signal(signal.SIGINT)
        code, _, err = finish(process)
    assert code == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted"), err


def test_sigint_to_serve() -> None:
    process = subprocess.Popen([sys.executable, "-m", "speedlimit.cli", "serve", "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "speedlimit calculator on http://" in line, line + process.stderr.read()
        process.send_signal(signal.SIGINT)
        code, _, err = finish(process)
    finally:
        process.kill()
    assert_interrupted(code, err)
