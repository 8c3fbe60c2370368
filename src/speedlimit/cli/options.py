"""Typer options derived from `speedlimit.scenario.Scenario`, the CLI's spelling of boolean flags, and the click
classes of the app and its commands.

`scenario_options("model", "batch", ...)` adds those Scenario fields to a command as options, with the flag
names, help text and defaults the Scenario declares; the command receives what was typed as one dict,
``inputs``, to pass to `scenario_from`. So an input is described once, in the Scenario, for the CLI, the web
and the Python API alike.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, Optional, get_args, get_origin

import typer
import typer.core

from speedlimit.cli.interrupt import Interruptible
from speedlimit.scenario import Flag, Scenario


def flag_option(names: str, help: str, *, default: bool | None = None) -> Any:
    """A boolean ``--flag/--no-flag`` option, shown without a ``<bool>`` value (it takes none).

    Inside ``Annotated[bool, ...]`` leave ``default`` out; as a parameter's default value, give it.
    """
    if default is None:
        return typer.Option(names, metavar="", help=help)
    return typer.Option(default, names, metavar="", help=help)


# The load and workload options `bench` sends and `simulate` replays draw for draw, declared once for both (each
# command's parameter gives the default): `prompt_tokens: PromptTokens = "128"`.
PromptTokens = Annotated[str, typer.Option(help="Prompt length in tokens: N, uniform:LOW:HIGH or normal:MEAN:STD.")]
PrefixGroups = Annotated[int, typer.Option(help="--prefix-tokens: this many distinct prefixes, prompt i starting with "
                                                "prefix i mod groups.")]
TimeScale = Annotated[float, typer.Option(help="--trace: multiply its recorded times by this (0.5 = twice the rate).")]
Concurrency = Annotated[Optional[int], typer.Option(help="Closed loop: this many requests in flight (default 1).")]
Rate = Annotated[Optional[float], typer.Option(help="Open loop: mean arrivals per second (inf = all at once).")]
Burstiness = Annotated[float, typer.Option(help="Gamma shape of arrivals: 1 Poisson, <1 burstier, >1 steadier.")]
Requests = Annotated[Optional[int], typer.Option(help="Requests to send (default 100 unless --duration).")]
Sweep = Annotated[Optional[str], typer.Option(help="concurrency=1,2,4 or rate=0.5,1,2: one run per value + knee (each "
                                                   "level with prompts of its own).")]
KneeFraction = Annotated[float, typer.Option(help="Knee = lowest load reaching this fraction of peak tok/s.")]


class _FlagHelp:
    """``--help`` shown as the flag it is: typer gives its own help option no metavar, so it prints ``<bool>``."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


@cache
def group_class() -> type:
    """The app's click group: Ctrl-C handling (`Interruptible`) and a plain ``--help``."""
    return type("SpeedlimitGroup", (Interruptible, _FlagHelp, typer.core.TyperGroup), {})


@cache
def command_class() -> type:
    """Every command's click class: a plain ``--help``."""
    return type("SpeedlimitCommand", (_FlagHelp, typer.core.TyperCommand), {})


def _annotation(field: str, flag: Flag, required: bool) -> Any:
    """The type typer parses the option as: text for quantities and names (the Scenario parses them)."""
    annotation = Scenario.model_fields[field].annotation
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    plain = [arg for arg in (get_args(annotation) or (annotation,)) if arg is not type(None)]
    if flag.text:
        return str if required else str | None
    kind = next((arg for arg in plain if arg in (bool, int, float)), str)
    return kind if required or kind is bool else kind | None


def scenario_option(field: str, *, override_help: str | None = None) -> inspect.Parameter:
    """The typer parameter for one Scenario field."""
    info = Scenario.model_fields[field]
    flag = next(m for m in info.metadata if isinstance(m, Flag))
    required = info.is_required()
    annotation = _annotation(field, flag, required)
    help_text = override_help or info.description or ""
    if annotation is bool:
        option = flag_option(f"{flag.names[0]}/--no-{flag.names[0].removeprefix('--')}", help_text)
        default = bool(info.default)
    else:
        option = typer.Option(*flag.names, help=help_text, show_default=info.default is not None)
        default = inspect.Parameter.empty if required else info.default
    return inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, option])


def scenario_options(*fields: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: add the Scenario ``fields`` as options before the command's own; it gets them as ``inputs``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values() if p.name != "inputs"]
        added = [scenario_option(field) for field in fields]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            inputs = {field: kwargs.pop(field) for field in fields}
            return command(inputs=inputs, **kwargs)

        parameters = added + rest
        wrapper.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate
