"""The `speedlimit` command line: a thin typer shell over the library.

Every command lives in the module that owns its leg; this file only registers them and turns
`SpeedlimitError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer

from speedlimit.errors import SpeedlimitError

app = typer.Typer(
    name="speedlimit",
    help="How fast will this LLM run on this hardware, and how fast is it really running?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# --- command registration (one line per leg) ---------------------------------------------
from speedlimit.bench.cli import bench_command  # noqa: E402

app.command("bench")(bench_command)
from speedlimit.estimator.command import estimate_command, hardware_command, models_command, sweep_command  # noqa: E402

app.command("estimate")(estimate_command)
app.command("sweep")(sweep_command)
app.command("models")(models_command)
app.command("hardware")(hardware_command)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except SpeedlimitError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
