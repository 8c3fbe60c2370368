"""Every command's --help (issue 10, first-run experience): examples to paste, and boolean flags spelled
``--flag/--no-flag`` that take no value (never ``<bool>``, never ``--ideal true``)."""

from __future__ import annotations

import pytest
import typer.main
from typer.testing import CliRunner

from speedlimit import cli

COMMANDS = [info.name for info in cli.app.registered_commands]


def test_every_command_is_checked() -> None:
    assert {"estimate", "sweep", "models", "hardware", "bench", "simulate", "verify", "calibrate", "serve",
            "report"} <= set(COMMANDS)


@pytest.mark.parametrize("command", [None, *COMMANDS], ids=lambda c: c or "speedlimit")
def test_help_has_examples_and_no_bool_metavar(command: str | None) -> None:
    argv = [command, "--help"] if command else ["--help"]
    done = CliRunner().invoke(cli.app, argv, terminal_width=200)
    assert done.exit_code == 0, done.output
    assert "<bool>" not in done.output
    assert "Examples:" in done.output, done.output
    examples = done.output.split("Examples:")[1]
    assert f"speedlimit {command or ''}".strip() in examples


@pytest.mark.parametrize("command", COMMANDS)
def test_boolean_options_are_flag_pairs(command: str) -> None:
    group = typer.main.get_command(cli.app)
    params = group.commands[command].params  # type: ignore[attr-defined]
    booleans = [p for p in params if p.param_type_name == "option" and p.type_descriptor.annotation is bool]
    assert booleans or command in ("serve", "report")
    for param in booleans:
        assert param.is_flag, f"{command} {param.opts}: a boolean option that takes a value"
        assert [opt for opt in param.secondary_opts if opt.startswith("--no-")], f"{command} {param.opts}: no --no- form"
