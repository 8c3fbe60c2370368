"""What-if, not a score: the held-out NVIDIA NIM serving rows simulated with another KV-cache format.

Run: python benchmarks/accuracy/whatif_kv.py [--kv bf16]
Prints the median and mean absolute % error of throughput, TPOT and TTFT on the NIM rows of measurements.csv when the
TensorRT-LLM profile's cited default KV format for these fp8 rows (fp8: `fp8_weights_kv` in engines.toml, NVIDIA's
recommended config for its FP8 checkpoint) is replaced by ``--kv``. Nothing here feeds a default.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import score  # noqa: E402

from speedlimit.simulator.api import simulate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", default="bf16")
    kv = parser.parse_args().kv
    errors: dict[str, list[float]] = {"throughput": [], "TPOT": [], "TTFT": []}
    for row in (r for r in score.load_rows() if r.quantity == "serving" and r.engine == "nim"):
        concurrency = int(row.concurrency)
        run = simulate(row.model, score.row_hardware(row), weights=score.row_weights(row), tp=row.tp,
                       engine="tensorrt-llm", kv=kv, concurrency=concurrency,
                       requests=row.requests or score.SIMULATED_ROUNDS * concurrency, prompt_tokens=row.prompt_tokens,
                       output_tokens=row.output_tokens).summary
        errors["throughput"].append(score.ape(run.output_tok_s, row.throughput_tok_s))
        errors["TPOT"].append(score.ape(run.tpot_s.mean * 1e3, row.tpot_ms))
        errors["TTFT"].append(score.ape(run.ttft_s.mean * 1e3, row.ttft_ms))
    print(f"NIM rows ({len(errors['TPOT'])}), simulated with --kv {kv} (a what-if, not a score):")
    for name, values in errors.items():
        print(f"  {name:<10} median {np.median(values):5.1f}%   mean {np.mean(values):5.1f}%")


if __name__ == "__main__":
    main()
