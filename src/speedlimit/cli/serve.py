"""`speedlimit serve`: run the web calculator with uvicorn (FastAPI is imported only when it runs)."""

from __future__ import annotations

import errno
import socket
from typing import Annotated

import typer

from speedlimit.errors import SpeedlimitError


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror:
            raise SpeedlimitError(f"--host {host!r} is not an address this machine has; use 127.0.0.1 or 0.0.0.0") from None
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise SpeedlimitError(f"port {port} on {host} is already in use; pass --port N (or --port 0 for any free port)") from None
            raise SpeedlimitError(f"cannot listen on {host}:{port} ({error.strerror}); try another --host/--port") from None


def serve_command(
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1 keeps it on this machine).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
) -> None:
    """Serve the web calculator and its JSON API (docs at /docs)."""
    if not 0 <= port <= 65535:
        raise SpeedlimitError(f"--port must be between 0 and 65535, got {port}")
    _check_port_free(host, port)
    import uvicorn

    from speedlimit.web.app import create_app

    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"speedlimit calculator on http://{shown}:{port}/  (API docs at /docs; Ctrl-C stops it)")
    uvicorn.run(create_app(), host=host, port=port, log_level="warning")
