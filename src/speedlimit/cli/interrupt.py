"""Ctrl-C anywhere in the command line: one line, ``interrupted``, on stderr and exit code 130, never a traceback.

A Ctrl-C can land in three places, and each has its catcher:

- while `speedlimit.cli` imports its commands (typer, rich, pydantic: a good part of a second on a slow machine),
  `exit_on_interrupt` (begun at the top of ``speedlimit/cli/__init__.py``, ended after its imports) makes SIGINT
  end the process at once: nothing has been read or written yet;
- while typer parses the arguments or a command runs, Python raises `KeyboardInterrupt`; `Interruptible` (mixed
  into the app's click group) and `speedlimit.cli.main` turn it into the line and the exit code, where click would print
  "Aborted!" and exit 1;
- commands that must keep what they measured catch SIGINT/SIGTERM themselves, stop between measurements, write
  what they have and exit 130 too: bench (`BenchRunner.stop_on_signals`), verify (`speedlimit.verify.run.StopFlag`).

What is left: a Ctrl-C within the first few milliseconds, while the Python interpreter itself starts and before
this package's first line runs, gets Python's own handling.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any, NoReturn

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a process stopped by Ctrl-C
MESSAGE = "interrupted"


def _exit_now(signum: int, frame: FrameType | None) -> None:
    os.write(2, f"{MESSAGE}\n".encode())
    os._exit(EXIT_INTERRUPTED)


def exit_on_interrupt() -> Any:
    """Until `restore`: SIGINT prints the line and exits 130 at once. Returns the handler it replaced (None when
    it could not install one: not the main thread)."""
    try:
        return signal.signal(signal.SIGINT, _exit_now)
    except ValueError:  # signal handlers can only be set from the main thread
        return None


def restore(previous: Any) -> None:
    """Put back the SIGINT handler `exit_on_interrupt` replaced (if it is still the one installed)."""
    if previous is not None and signal.getsignal(signal.SIGINT) is _exit_now:
        signal.signal(signal.SIGINT, previous)


def interrupted() -> NoReturn:
    """Print the line and exit with 130."""
    sys.stdout.flush()
    print(MESSAGE, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INTERRUPTED)


class Interruptible:
    """Mixed into the app's click group: a KeyboardInterrupt while parsing or running a command is `interrupted()`,
    not click's "Aborted!" and exit 1."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)  # type: ignore[misc]
        except KeyboardInterrupt:
            interrupted()

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except KeyboardInterrupt:
            interrupted()

