"""`speedlimit verify` and `speedlimit calibrate`: measure this machine, run a real model, compare with the estimator.

Modules: `membench` (STREAM-style bandwidth and numpy matmul FLOP/s), `clock` (the core clock, timed with a
dependent-add chain), `topology` (sockets, NUMA nodes, cores), `engine` (llama-cpp-python runner:
prefill/decode timing, crash-safe preflight), `run` (orchestration, predictions and the result record) and `fit`
(the fitting side of `calibrate`); the typer commands are in `speedlimit.cli.verify`.
"""
