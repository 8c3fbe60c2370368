"""The `speedlimit` command line: thin typer shells over the library, one module per leg, and their rich output.

`estimate` (estimate, sweep, models, hardware, engines), `simulate`, `bench` (+ `bench_view`, its tables and progress), `verify`
(verify, calibrate), `report`, `serve`. Heavy imports happen inside the commands. This file registers them and
turns `SpeedlimitError` into one line on stderr and exit code 2, and a Ctrl-C anywhere into ``interrupted`` and exit
code 130 (`speedlimit.cli.interrupt`).
"""

from __future__ import annotations

from speedlimit.cli import interrupt

_startup = interrupt.exit_on_interrupt()  # a Ctrl-C while the commands below import: "interrupted", exit 130

import sys
from collections.abc import Callable

import typer

from speedlimit.cli.bench import bench_command
from speedlimit.cli.estimate import engines_command, estimate_command, hardware_command, models_command, sweep_command
from speedlimit.cli.options import command_class, group_class
from speedlimit.cli.report import report_command
from speedlimit.cli.serve import serve_command
from speedlimit.cli.simulate import simulate_command
from speedlimit.cli.verify import calibrate_command, verify_command
from speedlimit.errors import SpeedlimitError

interrupt.restore(_startup)  # from here on a Ctrl-C is a KeyboardInterrupt, caught by the group and by main()

app = typer.Typer(
    cls=group_class(),
    name="speedlimit",
    help="How fast will this LLM run on this hardware, and how fast is it really running?",
    epilog="Examples:\n\n" + "\n\n".join(f"  $ {line}" for line in (
        "speedlimit estimate -m llama-3.1-8b -H h100-sxm", "speedlimit models", "speedlimit estimate --help")),
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Shown under each command's --help: commands a newcomer can paste as they are (catalog names, bundled model).
EXAMPLES = {
    "estimate": [
        "speedlimit estimate -m llama-3.1-8b -H h100-sxm",
        "speedlimit estimate -m llama-3.1-70b -H h100-sxm --tp 4 --batch 64 --prompt 2048 --output 512 --json",
        "speedlimit estimate -m llama-3.1-70b -H l40s --tp 2 --pp 2 --batch 32 --weights fp8",
        "speedlimit estimate -m deepseek-v3 -H h200 --weights fp8 --dp 8 --ep 8 --batch 256",
        "speedlimit estimate -m 7B --weights 16 --bandwidth 3.35e12 --ideal",
        "speedlimit estimate -m path/to/config.json -H local --weights q4_k_m",
    ],
    "sweep": [
        "speedlimit sweep -m 7B -m 70B -H h100-sxm --weights 16,8,4 --ideal",
        "speedlimit sweep -m llama-3.1-8b -H rtx-4090 -H l4 --batch 1:256 --context 512,8192 --format json --out grid.json",
    ],
    "models": ["speedlimit models", "speedlimit models --json"],
    "hardware": ["speedlimit hardware", "speedlimit hardware --json"],
    "engines": ["speedlimit engines", "speedlimit engines vllm", "speedlimit engines tensorrt-llm --json"],
    "bench": [
        "speedlimit bench --url http://127.0.0.1:8000/v1 --concurrency 4 --requests 32",
        "speedlimit bench --url http://127.0.0.1:8000/v1 --sweep concurrency=1,2,4,8 --slo ttft=500ms,itl=50ms --out runs/a",
        "speedlimit bench --url http://127.0.0.1:8000/v1 --rate 2 --duration 60 --compare-estimate --hardware local",
        "speedlimit bench --url http://127.0.0.1:8000/v1 --concurrency 8 --prefix-tokens 2000 --prefix-groups 4",
    ],
    "simulate": [
        "speedlimit simulate -m llama-3.1-8b -H h100-sxm --concurrency 64 --requests 1000 --prompt-tokens 1024 --output-tokens 256",
        "speedlimit simulate -m llama-3.1-8b -H h100-sxm --sweep rate=5,10,20,40 --slo ttft=1s,tpot=50ms --out runs/sim",
        "speedlimit simulate -m smollm2-135m -H local --engine llama-cpp-python --concurrency 4 --requests 16 --json",
        "speedlimit simulate -m llama-3.1-70b -H h100-sxm --tp 4 --engine vllm --concurrency 64 --requests 500",
        "speedlimit simulate -m llama-3.1-70b -H l40s --tp 2 --pp 2 --weights fp8 --engine vllm --concurrency 32 --requests 200",
        "speedlimit simulate -m llama-3.1-8b -H h100-sxm --dp 4 --engine vllm --rate 40 --requests 2000",
        "speedlimit simulate -m llama-3.1-8b -H h100-sxm --engine vllm --concurrency 32 --prefix-tokens 2000 --prefix-groups 4 --no-prefix-caching",
    ],
    "verify": ["speedlimit verify --quick", "speedlimit verify --out verify.json"],
    "calibrate": ["speedlimit calibrate verify.json", "speedlimit calibrate verify.json runs/a/summary.json --name box --out box.toml",
                  "speedlimit calibrate runs/a --hardware h100-sxm --model llama-3.1-8b --engine vllm --name h100-vllm"],
    "serve": ["speedlimit serve", "speedlimit serve --port 8080"],
    "report": ["speedlimit report runs/a", "speedlimit report runs/a/requests.jsonl --out /tmp/report"],
}


def _epilog(command: str) -> str:
    return "Examples:\n\n" + "\n\n".join(f"  $ {line}" for line in EXAMPLES[command])


@app.callback(invoke_without_command=True)
def _root(context: typer.Context) -> None:
    """Bare `speedlimit` prints this help and exits 0."""
    if context.invoked_subcommand is None:
        typer.echo(context.get_help())
        raise typer.Exit(0)


def _register(name: str, command: Callable[..., None]) -> None:
    app.command(name, epilog=_epilog(name), cls=command_class())(command)


# estimate leg
_register("estimate", estimate_command)
_register("sweep", sweep_command)
_register("models", models_command)
_register("hardware", hardware_command)
_register("engines", engines_command)
# bench leg
_register("bench", bench_command)
_register("simulate", simulate_command)
# verify leg
_register("verify", verify_command)
_register("calibrate", calibrate_command)
# pictures
_register("serve", serve_command)
_register("report", report_command)


def main() -> None:
    """Console-script entry point: bad input is one line and exit 2, a Ctrl-C one line and exit 130."""
    try:
        try:
            app()
        except SpeedlimitError as error:
            typer.echo(f"error: {error}", err=True)
            sys.exit(2)
    except KeyboardInterrupt:
        interrupt.interrupted()


if __name__ == "__main__":
    main()
