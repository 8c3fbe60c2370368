"""`speedlimit serve`: run the web calculator with uvicorn (FastAPI is imported only when it runs).

The listening socket is bound here, before uvicorn starts, so a busy port is a one-line error and ``--port 0``
prints the port the system picked. Ctrl-C (or SIGTERM) is ours, not uvicorn's: our handler is in place before the
event loop starts and asks the server to stop, and the command then exits 130 with one line. uvicorn's own capture
swaps handlers in and out inside the loop and re-raises the signal after shutdown, which left windows where a Ctrl-C
ended the process by the signal itself or with a warning after the line.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
from collections.abc import Iterator
from typing import Annotated

import typer

from speedlimit.cli import interrupt
from speedlimit.errors import SpeedlimitError


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a one-line error saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except socket.gaierror:
        sock.close()
        raise SpeedlimitError(f"--host {host!r} is not an address this machine has; use 127.0.0.1 or 0.0.0.0") from None
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise SpeedlimitError(f"port {port} on {host} is already in use; pass --port N (or --port 0 for any free port)") from None
        raise SpeedlimitError(f"cannot listen on {host}:{port} ({error.strerror}); try another --host/--port") from None
    return sock


def serve_command(
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1 keeps it on this machine).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free port; the one picked is printed).")] = 8000,
) -> None:
    """Serve the web calculator and its JSON API (docs at /docs).

    Examples: `speedlimit serve`; `speedlimit serve --port 0` (prints the port it got).
    """
    if not 0 <= port <= 65535:
        raise SpeedlimitError(f"--port must be between 0 and 65535, got {port}")
    sock = _listen(host, port)
    import uvicorn

    from speedlimit.web.app import create_app

    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"speedlimit calculator on http://{shown}:{sock.getsockname()[1]}/  (API docs at /docs; Ctrl-C stops it)")
    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the handlers installed below stay in place
            yield

    server = Server(uvicorn.Config(create_app(), log_level="warning"))
    stops: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stops.append(signum)
        server.should_exit = True
        server.force_exit = len(stops) > 1  # a second Ctrl-C does not wait for open connections

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if stops:
        interrupt.interrupted()
