"""The serving simulator: a discrete-event simulation of an engine's scheduler, priced by the one step-cost model.

`simulate()` predicts a run in bench's own terms (records and a `RunSummary`); `engine` is the pure core.
"""

from speedlimit.simulator.api import (Simulation, Workload, build_workload, engine_config, parse_engine_spec, replay,
                                      run_workload, simulate, sweep)
from speedlimit.simulator.engine import EngineConfig

__all__ = ["EngineConfig", "Simulation", "Workload", "build_workload", "engine_config", "parse_engine_spec", "replay",
           "run_workload", "simulate", "sweep"]
