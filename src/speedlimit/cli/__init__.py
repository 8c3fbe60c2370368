"""The `speedlimit` command line: thin typer shells over the library, one module per leg, and their rich output.

`estimate` (estimate, sweep, models, hardware), `bench` (+ `bench_view`, its tables and progress), `verify`
(verify, calibrate), `report`, `serve`. Heavy imports happen inside the commands. This file registers them and
turns `SpeedlimitError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer

from speedlimit.cli.bench import bench_command
from speedlimit.cli.estimate import estimate_command, hardware_command, models_command, sweep_command
from speedlimit.cli.report import report_command
from speedlimit.cli.serve import serve_command
from speedlimit.cli.verify import calibrate_command, verify_command
from speedlimit.errors import SpeedlimitError

app = typer.Typer(
    name="speedlimit",
    help="How fast will this LLM run on this hardware, and how fast is it really running?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# estimate leg
app.command("estimate")(estimate_command)
app.command("sweep")(sweep_command)
app.command("models")(models_command)
app.command("hardware")(hardware_command)
# bench leg
app.command("bench")(bench_command)
# verify leg
app.command("verify")(verify_command)
app.command("calibrate")(calibrate_command)
# pictures
app.command("serve")(serve_command)
app.command("report")(report_command)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except SpeedlimitError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
