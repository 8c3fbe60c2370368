"""`speedlimit verify` and `speedlimit calibrate`: measure this machine, run a real model, compare with the estimator.

Modules: `membench` (STREAM-style bandwidth and numpy matmul FLOP/s), `engine` (llama-cpp-python runner:
prefill/decode timing, crash-safe preflight), `run` (orchestration, predictions and the result record),
`command` (the typer commands). The fitting side of `calibrate` lives in `speedlimit.verify.fit`.
"""
