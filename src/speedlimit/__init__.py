"""speedlimit: how fast will this LLM run on this hardware, and how fast is it really running?

The public Python API is what this module exports; everything else is internal and may move:

- `estimate(model, hardware, **options) -> Estimate`: the analytical roofline for one configuration.
- `simulate(model, hardware, **load_and_engine) -> Simulation`: a serving engine under load, step by step, in
  bench's terms (`Simulation.summary` is a `RunSummary`, `Simulation.records` its `RequestRecord`s).
- `step_model(model, hardware, **options) -> StepModel`: a model on hardware resolved for the step-cost core.
- `RequestRecord`, `RunSummary`, `SweepSummary`, `load_summary`: the artifacts bench (and simulate) write.
- `SpeedlimitError`: every error meant for a user (bad input, unusable environment).

Names are imported on first use, so `import speedlimit` stays cheap for the command line.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "estimate": "speedlimit.estimator.api",
    "Estimate": "speedlimit.estimator.api",
    "simulate": "speedlimit.simulator.api",
    "Simulation": "speedlimit.simulator.api",
    "step_model": "speedlimit.estimator.api",
    "StepModel": "speedlimit.estimator.api",
    "RequestRecord": "speedlimit.artifacts",
    "RunSummary": "speedlimit.artifacts",
    "SweepSummary": "speedlimit.artifacts",
    "load_summary": "speedlimit.artifacts",
    "SpeedlimitError": "speedlimit.errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from speedlimit.artifacts import RequestRecord, RunSummary, SweepSummary, load_summary
    from speedlimit.errors import SpeedlimitError
    from speedlimit.estimator.api import Estimate, StepModel, estimate, step_model
    from speedlimit.simulator.api import Simulation, simulate


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'speedlimit' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
