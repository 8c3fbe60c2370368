"""Score speedlimit's estimate against published measurements (issues 6 and 13).

Reads ``measurements.csv`` beside this file. Every row is one published measurement with its source,
its ``quantity`` (``decode``: single-stream decode tok/s; ``prefill``: prompt tok/s of one prompt;
``serving``: concurrency > 1 with output throughput / mean TTFT / mean TPOT), its ``fold`` and run
lengths; every row is predicted at its own prompt/output lengths. Decode rows are predicted with:

- ``ideal``    speedlimit ``--ideal``: the seed's peak-bandwidth formula (weights / peak bandwidth);
- ``default``  speedlimit's default mode with the efficiencies in ``catalog/efficiency.toml``;
- ``llm-analysis``  the PyPI package llm-analysis (if installed), with its own default efficiencies
  (1.0) and the same peak numbers speedlimit's catalog holds;
- ``fixed-2ms`` (the earlier design, for comparison): the default mode with the per-layer step
  overhead replaced by a fixed 2.0 ms per step, whatever the model's depth.

Prefill rows: measured prompt tok/s vs ``prompt / estimate(prompt=P, output=1).ttft_s`` (default,
``--ideal``, llm-analysis). Serving rows: ``estimate(batch=concurrency, tp=...)``'s aggregate
throughput and ITL (as TPOT); TTFT under load needs the simulator (``speedlimit.simulate``, issue 12)
and is printed as n/a until it exists. Every quantity is broken down by fold, device kind and engine.
Decode rows whose ``metric`` is end-to-end (llmfit "Avg TPS": output / request wall time) are scored
separately as ``output / (TTFT + output x ITL)`` and kept out of the decode median.

It then runs the held-out check on the decode rows: the rows are split by source into the CSV's
``fold`` column (fold A = the XiongjieDai/GPU-Benchmarks-on-LLM-Inference repository; fold B = every
other source, held out), the per-kernel cost is fitted per kind on one fold and the error is reported
on the other, both ways, next to the cited defaults' error on the same rows. It exits 1 when the
catalog's fitted value (apple's per-kernel cost) is not the fold-A fit.

The second fitted value is llama.cpp's GEMM efficiency on NVIDIA GPUs and on Apple chips (the CUDA and Metal
backend profiles' ``gemm_efficiency`` in ``catalog/engines.toml``): the fraction of the catalog's dense peak FLOP/s
at the weights' compute dtype that llama.cpp's prefill matmuls (CUDA: MMQ for quantized weights, cuBLAS for f16)
reach. No public per-device figure for it was found, so each is fitted on the fold-A llama.cpp prefill rows on its
devices (`fit_gemm_efficiency`: a grid minimising mean |log(predicted / measured)|, every row priced by the
real estimator) and scored on fold B's such rows. It exits 1 when a shipped value is not its fit.

The third is llama.cpp's CPU matmul kernel rate per tensor type (the CPU backend profile's ``kernel_rates``):
multiply-accumulates per cycle per thread, which bind decode at a few threads and prefill at any. No public figure
exists, so it is fitted on fold C, ``cpu_kernels.csv``: the project's own llama-bench runs on a synthetic model
(``benchmarks/cpu_kernel_rates.py``), never a published row. It exits 1 when the shipped rates are not that fit.

Run: ``python benchmarks/accuracy/score.py`` (``--csv PATH`` to score another file, ``--quiet`` for
the summary only).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from speedlimit.catalog import (
    catalog_engine,
    default_efficiency,
    engine_for_device,
    model_entries,
    resolve_engine,
    resolve_hardware,
    resolve_model,
)
from speedlimit.architecture import Architecture, WeightBytes
from speedlimit.engine_profile import EngineProfile, Sourced
from speedlimit.estimator.api import estimate
from speedlimit.hardware import Hardware
from speedlimit.precision import WeightFormats, parse_precision, parse_weights

CSV_PATH = Path(__file__).with_name("measurements.csv")
# Fold A: the one repository that supplies most rows; everything else is fold B.
FOLD_A_SOURCE = "github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference"
# The earlier fixed overhead (21 kernels x 3 us x 32 layers), kept as a comparison column: the default
# now charges 3 us per kernel the model's decode graph launches (see catalog/efficiency.toml).
FIXED_OVERHEAD_S = 2.0e-3
# Grid for the held-out fit of the per-kernel cost (closed form: step = t_peak / bw_eff + cost x kernels).
FIT_KERNEL_COST_S = np.round(np.arange(0.0, 15.0001e-6, 0.1e-6), 8)
# The kinds whose per-kernel cost the catalog takes from the fold-A fit (the rest cite a microbenchmark).
FITTED_KINDS = ("apple",)
# The engine profiles whose GEMM efficiency the catalog takes from a fold-A fit: llama.cpp's CUDA and Metal backends,
# what the default engine runs as on an NVIDIA GPU and an Apple chip (catalog.engine_for_device), -> the devices their
# rows run on; and the grid each fit searches. GEMM_FIT_PROFILE is the default of the functions below.
GEMM_FIT_PROFILE = "llama-cpp-cuda"
GEMM_FIT_PROFILES = {GEMM_FIT_PROFILE: "NVIDIA GPUs", "llama-cpp-metal": "Apple GPUs"}
FIT_GEMM_EFFICIENCY = np.round(np.arange(0.05, 0.80001, 0.005), 3)
# The curve's one anchor (tokens in the step): one point is a flat rate at every step size.
GEMM_FIT_TOKENS = 512


@dataclass(frozen=True)
class Row:
    """One published measurement, as read from the CSV."""

    index: int
    device: str
    model: str
    weights: str
    engine: str
    prompt_tokens: int  # blank in the CSV -> 0 (short or unstated prompt)
    output_tokens: int
    decode_tok_s: float | None
    model_file_bytes: int | None
    source: str
    notes: str
    device_share: float  # fraction of the catalog device the run used (0.5 = one GCD of an MI250X)
    quantity: str = "decode"  # decode | prefill | serving
    fold: str = "B"  # A (fit fold) | B (held out), by source: see SOURCES.md
    metric: str = ""
    concurrency: int = 1
    tp: int = 1
    prefill_tok_s: float | None = None
    throughput_tok_s: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    threads: int | None = None  # CPU runs: the thread count the source ran (blank: llama.cpp's default, every core)
    # serving rows: the engine settings the source's own command line sets (SOURCES.md, `engine_args`)
    engine_args: tuple[tuple[str, Any], ...] = ()
    requests: int | None = None  # serving rows: the requests the benchmark sent (its --num-prompts; blank: not stated)

    @property
    def e2e(self) -> bool:
        """The published figure is output tokens / whole request time (llmfit "Avg TPS"), not a decode rate."""
        return self.metric.startswith("e2e")


QUANTITIES = ("decode", "prefill", "serving")


def fold_of_source(source: str) -> str:
    """The fold rule of SOURCES.md: fold A is the one repository the fitted value comes from."""
    return "A" if FOLD_A_SOURCE in source else "B"


def _float(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


#: The engine settings a serving row may carry (`engine_args`), as simulate's keyword arguments, and their types.
ENGINE_ARG_TYPES: dict[str, type] = {"max_seqs": int, "max_batched_tokens": int, "chunked_prefill": bool, "kv": str,
                                     "dp_attention": bool}
#: engine_args that set the deployment's layout rather than a simulate keyword (SOURCES.md, Fold D amendment 2)
LAYOUT_ARGS = ("dp_attention",)


def layout(tp: int, engine_args: tuple[tuple[str, Any], ...]) -> dict[str, int]:
    """The devices' layout a row or fold-D line ran: tensor-parallel over ``tp`` GPUs, or with ``dp_attention``
    (SGLang's --enable-dp-attention, dp-size = tp-size) attention data-parallel over them (tp 1, dp = tp) with the
    routed experts over all of them (ep = tp)."""
    if dict(engine_args).get("dp_attention") and tp > 1:
        return {"tp": 1, "dp": tp, "ep": tp}
    return {"tp": tp}


def simulate_args(engine_args: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """A row's engine_args as simulate's scheduler keywords (the layout ones go through `layout`)."""
    return {key: value for key, value in engine_args if key not in LAYOUT_ARGS}


def parse_engine_args(text: str, index: int = 0) -> tuple[tuple[str, Any], ...]:
    """``"max_seqs=1024;max_batched_tokens=32768"`` -> (("max_seqs", 1024), ("max_batched_tokens", 32768))."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, _, value = item.partition("=")
        kind = ENGINE_ARG_TYPES.get(key.strip())
        if kind is None or not value.strip():
            raise ValueError(f"row {index}: engine_args {item!r}: give key=value with a key of {', '.join(ENGINE_ARG_TYPES)}")
        value = value.strip()
        if kind is bool:
            if value not in ("true", "false"):
                raise ValueError(f"row {index}: engine_args {item!r}: true or false")
            pairs.append((key.strip(), value == "true"))
        else:
            pairs.append((key.strip(), kind(value)))
    return tuple(pairs)


def load_rows(path: Path = CSV_PATH) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        records = list(csv.DictReader(handle))
    rows = []
    for index, record in enumerate(records, start=1):
        rows.append(
            Row(
                index=index,
                device=record["device"],
                model=record["model"],
                weights=record["weights"],
                engine=record["engine"],
                prompt_tokens=int(record["prompt_tokens"] or 0),
                output_tokens=int(record["output_tokens"]),
                decode_tok_s=_float(record["decode_tok_s"]),
                model_file_bytes=int(record["model_file_bytes"]) if record["model_file_bytes"] else None,
                source=record["source"],
                notes=record["notes"],
                device_share=float(record.get("device_share") or 1.0),
                quantity=record.get("quantity") or "decode",
                fold=record.get("fold") or fold_of_source(record["source"]),
                metric=record.get("metric") or "",
                concurrency=int(record.get("concurrency") or 1),
                tp=int(record.get("tp") or 1),
                prefill_tok_s=_float(record.get("prefill_tok_s")),
                throughput_tok_s=_float(record.get("throughput_tok_s")),
                ttft_ms=_float(record.get("ttft_ms")),
                tpot_ms=_float(record.get("tpot_ms")),
                threads=int(record["threads"]) if record.get("threads") else None,
                engine_args=parse_engine_args(record.get("engine_args") or "", index),
                requests=int(record["requests"]) if record.get("requests") else None,
            )
        )
    return rows


def decode_rows(rows: list[Row]) -> list[Row]:
    """The rows whose figure is a single-stream decode rate (what the per-kernel fit and the decode median use)."""
    return [row for row in rows if row.quantity == "decode" and not row.e2e]


def row_hardware(row: Row) -> Hardware:
    """The catalog device, scaled to the share of it the run used (one GCD = half of everything)."""
    device = resolve_hardware(row.device)
    if row.device_share == 1.0:
        return device
    share = row.device_share
    return device.model_copy(
        update={
            "name": f"{device.name} x{share:g}",
            "memory_bandwidth_Bps": device.memory_bandwidth_Bps * share,
            "memory_bytes": device.memory_bytes * share if device.memory_bytes else None,
            "flops": {dtype: rate * share for dtype, rate in device.flops.items()},
        }
    )


def _file_on_cpu(row: Row) -> bool:
    """A CPU row that gives its file size: priced as its .gguf would be, bytes and tensor type together (`row_model`):
    llama.cpp's CPU kernel rate is per tensor type (engines.toml [llama-cpp-cpu] kernel_rates), which a size in bits
    does not name. Not a per-group file type (mxfp4_moe): its groups' formats say where the bytes are, as on a GPU
    (SOURCES.md, "Scoring fix: a CPU row of a per-group file type is priced from its groups' formats")."""
    return bool(row.model_file_bytes) and row_hardware(row).kind == "cpu" and not _per_group(row)


def _per_group(row: Row) -> bool:
    """Whether the row's weights name per-group formats (a group=format spelling, or a file type such as mxfp4_moe)."""
    return isinstance(parse_weights(row.weights), WeightFormats)


def row_weights(row: Row) -> str | float | None:
    """The weight format as a user would pass it, or the real bits per parameter when the row gives the file size;
    None for a CPU row with a file size, whose bytes and type travel in its model instead (`row_model`)."""
    if _file_on_cpu(row):
        return None
    if row.model_file_bytes and not _per_group(row):  # per-group formats say where the file's bytes are
        return 8.0 * row.model_file_bytes / resolve_model(row.model).total_params
    return row.weights


def row_model(row: Row) -> str | Architecture:
    """The row's model name, or, for a CPU row with a file size, its architecture carrying that file's bytes and
    type as a .gguf file would (`Architecture.weight_bytes`)."""
    if not _file_on_cpu(row):
        return row.model
    arch = resolve_model(row.model)
    bytes_per_param = row.model_file_bytes / arch.total_params
    return dataclasses.replace(arch, weight_bytes=WeightBytes(
        embedding=arch.embedding_params * bytes_per_param, lm_head=arch.lm_head_params * bytes_per_param,
        dense=arch.dense_params * bytes_per_param, expert=arch.expert_params * bytes_per_param,
        file_type=row.weights))


# The engine profile (catalog/engines.toml) each row's engine runs as; rows of other engines (gpt-fast, MLC,
# ExLlamaV2, LMDeploy) have none and are scored in the "profiles" mode exactly as in the default mode. Ollama runs
# llama.cpp; NVIDIA NIM's H100 FP8 profiles for Llama 3.3 70B run TensorRT-LLM.
ENGINE_PROFILES = {"llama.cpp": "llama-cpp", "llama.cpp-vulkan": "llama-cpp-vulkan", "ollama": "llama-cpp",
                   "sglang": "sglang", "vllm": "vllm", "nim": "tensorrt-llm", "tensorrt-llm": "tensorrt-llm",
                   # Rapid-MLX runs mlx-lm's model code (its pyproject.toml requires mlx-lm): MLX's kernels
                   "mlx": "mlx", "rapid-mlx": "mlx"}


# Engine versions the catalog has a profile of: (the profile a row's engine runs as on its device, what its notes
# quote of the version it ran) -> that version's profile. A row that names no version, or one without a profile, is
# priced with the current one (SOURCES.md: fold C amendment, fold D).
VERSION_PROFILES = (
    # llama-bench's "build: <commit> (<number>)" line, mainline build 3441
    ("llama-cpp-cpu", re.compile(r"build:? [0-9a-f]{7,40} \(3441\)"), "llama-cpp-cpu-b3441"),
    # the sglang release a setup names (dstack: "sglang 0.4.3.post2", "sglang 0.4.2.post4")
    ("sglang", re.compile(r"\bsglang 0\.4\.[1-3]\b", re.IGNORECASE), "sglang-0.4"),
    # the vLLM build a setup names (dstack: "vLLM 0.7.3.dev138+g21f6ca217", "vLLM nightly 0.7.4.dev181+gf35f8e22")
    ("vllm", re.compile(r"\bvLLM (nightly )?0\.7\.\d"), "vllm-0.7"),
    # llama.cpp's CUDA builds between PR #3776 and PR #8075 (fp16 cuBLAS for quantized prefill): a run the notes date
    # from November 2023 to 2024-06-23 (SOURCES.md, "llama.cpp's CUDA prefill before MMQ became the default")
    ("llama-cpp-cuda", re.compile(r"\b(Nov|Dec)\w* 2023\b|\b2023-1[12]-\d\d\b|\b(Jan|Feb|Mar|Apr|May|Jun)\w* 2024\b"
                                  r"|\b2024-0[1-5]-\d\d\b|\b2024-06-([01]\d|2[0-3])\b"), "llama-cpp-cuda-2024"),
)


def row_engine(row: Row) -> str | None:
    """The engine profile a row is priced with in the 'profiles' modes: its engine's, at the row's version where the
    catalog has that version's profile (that version's build for the row's platform)."""
    profile = ENGINE_PROFILES.get(row.engine)
    if profile is None:
        return None
    hardware = row_hardware(row)
    backend = engine_for_device(resolve_engine(profile), hardware).key
    versioned = next((versioned for base, named, versioned in VERSION_PROFILES if base == backend and named.search(row.notes)),
                     None)
    if versioned is None:
        return profile
    # that version's build for the row's platform (vllm-0.7 on an AMD GPU: vllm-0.7-rocm), as the estimate picks it
    return engine_for_device(resolve_engine(versioned), hardware).key


def predict_tok_s(row: Row, *, ideal: bool = False, bw_efficiency: float | None = None, step_overhead_s: float | None = None,
                  engine: str | None = None) -> float:
    """speedlimit's predicted decode tokens/s for one row."""
    result = estimate(
        row_model(row),
        row_hardware(row),
        weights=row_weights(row),
        prompt=row.prompt_tokens,
        output=row.output_tokens,
        ideal=ideal,
        bw_efficiency=bw_efficiency,
        step_overhead_s=step_overhead_s,
        engine=engine,
        threads=None if ideal else row.threads,  # --ideal prices the peak, whatever the threads
    )
    return result.decode_tok_s


def predict_prefill_tok_s(row: Row, *, ideal: bool = False, engine: str | EngineProfile | None = None) -> float | None:
    """Predicted prompt tokens/s of one prompt of the row's length: prompt / TTFT (None: no FLOPs figure)."""
    result = estimate(row_model(row), row_hardware(row), weights=row_weights(row), prompt=row.prompt_tokens, output=1, tp=row.tp,
                      ideal=ideal, engine=engine, threads=None if ideal else row.threads)
    return row.prompt_tokens / result.ttft_s if result.ttft_s else None


def predict_e2e_tok_s(row: Row, *, ideal: bool = False) -> float | None:
    """Predicted output tokens / whole request time (TTFT + output x ITL), for end-to-end rows."""
    result = estimate(row_model(row), row_hardware(row), weights=row_weights(row), prompt=row.prompt_tokens, output=row.output_tokens, ideal=ideal,
                      threads=None if ideal else row.threads)
    if result.ttft_s is None:
        return None
    return row.output_tokens / (result.ttft_s + row.output_tokens * result.itl_s)


def predict_serving(row: Row, *, ideal: bool = False, engine: str | None = None) -> dict[str, float | None]:
    """Predicted aggregate output tok/s and TPOT (ms) at the row's concurrency (estimate's steady batch), TTFT n/a."""
    # the row's own KV format, where its command line sets one, with its engine's profile
    kv = dict(row.engine_args).get("kv") if engine is not None else None
    parallel = layout(row.tp, row.engine_args if engine is not None else ())
    result = estimate(row_model(row), row_hardware(row), weights=row_weights(row), prompt=row.prompt_tokens, output=row.output_tokens,
                      batch=row.concurrency, ideal=ideal, engine=engine, kv=kv, **parallel)  # fmt: skip
    return {"throughput_tok_s": result.throughput_tok_s, "tpot_ms": result.itl_s * 1e3, "ttft_ms": None}


def simulator_status() -> str | None:
    """None when the serving simulator (issue 12) can be imported, else why TTFT under load is not scored."""
    try:
        import speedlimit.simulator.api  # noqa: F401
    except ImportError:
        return "speedlimit.simulator (issue 12) is not on this branch: TTFT under load not scored"
    return None


#: Simulated rows the simulator could not run, and why (printed after the report).
SIMULATION_FAILURES: list[str] = []


@dataclass(frozen=True)
class LoggedKvCapacity:
    """A KV-cache capacity an engine printed for one configuration (rule K1, SOURCES.md): a run condition of the
    serving rows that ran that configuration with no memory, length, chunked-prefill or block option of their own."""

    profile: str  # the engine profile that prices the rows (score.py's row_engine)
    device: str
    model: str
    tp: int
    kv_tokens: int
    block_size: int
    source: str

    def applies(self, row: Row, profile: str | None) -> bool:
        return (profile == self.profile and row.device == self.device and row.model == self.model
                and (row.tp or 1) == self.tp and not row.engine_args)


LOGGED_KV_CAPACITIES = (
    LoggedKvCapacity("vllm-0.7", "h200", "deepseek-r1", 8, kv_tokens=4739 * 64, block_size=64,
                     source="vllm-project/vllm PR #14842 (2025-03-14): V0, DeepSeek-R1, --tensor-parallel-size 8, "
                            "defaults, MLA rows padded to 640: '# cuda blocks: 4739', 'Maximum concurrency for 163840 "
                            "tokens per request: 1.85x' (64-token FlashMLA blocks); GPU not named, ASSUMED H200"),
)
#: Rows rule K1 gave a logged capacity: {row index: that capacity} (printed in the report's header).
LOGGED_KV_ROWS: dict[int, LoggedKvCapacity] = {}


def logged_kv_capacity(row: Row, profile: str | None) -> dict[str, int]:
    """simulate's kv_tokens and block_size for a row whose configuration's capacity an engine logged (rule K1),
    else nothing."""
    for logged in LOGGED_KV_CAPACITIES:
        if logged.applies(row, profile):
            LOGGED_KV_ROWS[row.index] = logged
            return {"kv_tokens": logged.kv_tokens, "block_size": logged.block_size}
    return {}


#: Requests per simulated serving row whose source does not state how many it sent: this many rounds of the row's
#: concurrency (closed loop, bench's workload). A row that states it (`requests`) is simulated with that many.
SIMULATED_ROUNDS = 4


def predict_serving_simulated(row: Row, *, engine: str | None = None) -> dict[str, float | None]:
    """The row's closed-loop load simulated (`speedlimit.simulator.api.simulate`): mean output tok/s, TPOT and TTFT (ms).

    ``engine=None`` is the default engine (llama.cpp's scheduler: 4 slots, 2,048 tokens per step); a profile name
    runs that engine's scheduler and step costs, with the settings the row's command line gives (`engine_args`)."""
    from speedlimit.errors import SpeedlimitError
    from speedlimit.simulator.api import simulate

    concurrency = int(row.concurrency or 1)
    try:
        settings = {**simulate_args(row.engine_args), **logged_kv_capacity(row, engine)} if engine is not None else {}
        parallel = layout(row.tp, row.engine_args if engine is not None else ())
        run = simulate(row_model(row), row_hardware(row), weights=row_weights(row), engine=engine, **parallel, **settings,
                       concurrency=concurrency, requests=row.requests or SIMULATED_ROUNDS * concurrency,
                       prompt_tokens=row.prompt_tokens,
                       output_tokens=row.output_tokens).summary
    except SpeedlimitError as error:  # e.g. the prefill-first scheduler's stall (see benchmarks/README.md)
        SIMULATION_FAILURES.append(f"row {row.index} ({row.engine}, concurrency {concurrency}, engine {engine or 'default'}): {error}")
        return {"throughput_tok_s": None, "tpot_ms": None, "ttft_ms": None}
    return {"throughput_tok_s": run.output_tok_s, "tpot_ms": run.tpot_s.mean * 1e3 if run.tpot_s.mean else None,
            "ttft_ms": run.ttft_s.mean * 1e3 if run.ttft_s.mean else None}


def ape(predicted: float, measured: float) -> float:
    """Absolute percentage error of a prediction."""
    return abs(predicted - measured) / measured * 100.0


def summary(errors: list[float]) -> tuple[float, float]:
    """(median, mean) absolute percentage error."""
    return statistics.median(errors), statistics.fmean(errors)


# ------------------------------------------------------------------------------------------------
# llm-analysis (PyPI), where it installs and can model the row


def llm_analysis_status() -> str | None:
    """None when llm-analysis can be used, else why not."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # llm-analysis imports transformers (no torch needed)
    try:
        import llm_analysis.analysis  # noqa: F401
    except Exception as error:  # not installed, or its transformers import breaks
        return f"llm-analysis not usable here ({type(error).__name__}: {error}); pip install llm-analysis"
    return None


def llm_analysis_tok_s(row: Row) -> tuple[float | None, str]:
    """llm-analysis 0.2.2's decode tokens/s for one row with its default efficiencies, or (None, why)."""
    from llm_analysis.analysis import LLMAnalysis
    from llm_analysis.config import DtypeConfig, GPUConfig, ModelConfig, ParallelismConfig

    config = model_entries()[resolve_model(row.model).name]["config"]
    n_experts = int(config.get("num_local_experts") or config.get("num_experts") or 1)
    top_k = int(config.get("num_experts_per_tok") or config.get("experts_per_token") or 1)
    ffn = int(config.get("moe_intermediate_size") or config["intermediate_size"]) if n_experts > 1 else int(config["intermediate_size"])
    hidden = int(config["hidden_size"])
    # llm-analysis models a 2-matrix MLP; these models' gated MLPs have 3 matrices, so 1.5x the width
    # gives the right parameter count (its own bundled Llama-2 config uses 4 x hidden for the same reason).
    ffn_equivalent = 1.5 * ffn
    model = ModelConfig(
        name=row.model,
        num_layers=int(config["num_hidden_layers"]),
        n_head=int(config["num_attention_heads"]),
        hidden_dim=hidden,
        vocab_size=int(config["vocab_size"]),
        num_key_value_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        ffn_embed_dim=ffn_equivalent,
        expansion_ratio=ffn_equivalent / hidden,
        moe_num_experts=n_experts,
        moe_top_k=top_k,
    )
    device = row_hardware(row)
    if not device.memory_bytes:
        return None, "no memory size"
    gpu = GPUConfig(
        name=row.device,
        mem_per_GPU_in_GB=device.memory_bytes / 1e9,
        hbm_bandwidth_in_GB_per_sec=device.memory_bandwidth_Bps / 1e9,
        intra_node_bandwidth_in_GB_per_sec=(device.interconnect_Bps or 32e9) / 1e9,
        intra_node_min_message_latency=8e-6,
        peak_fp16_TFLOPS=device.peak_flops("fp16") / 1e12,
    )
    bits = 8.0 * row.model_file_bytes / resolve_model(row.model).total_params if row.model_file_bytes else _nominal_bits(row)
    weight_bits = min((4, 8, 16), key=lambda b: abs(b - bits))  # its dtype configs: w4 / w8 / w16
    dtype = DtypeConfig(name=f"w{weight_bits}a16e16", weight_bits=weight_bits, activation_bits=16, embedding_bits=16)
    logging.getLogger("__name__").setLevel(logging.ERROR)  # llm-analysis 0.2.2 logs under this literal name
    analysis = LLMAnalysis(model, gpu, dtype, ParallelismConfig())
    try:
        result = analysis.inference(batch_size_per_gpu=1, seq_len=max(row.prompt_tokens, 1), num_tokens_to_generate=row.output_tokens)
    except AssertionError as error:  # e.g. "model is too large to fit in total GPU memory"
        _LAST_LLM_ANALYSIS["result"] = None
        return None, str(error).split("(")[0].strip()
    _LAST_LLM_ANALYSIS["result"] = result
    return float(result["decode_tokens_per_sec"]), ""


def llm_analysis_prefill_tok_s(row: Row) -> tuple[float | None, str]:
    """llm-analysis's prompt tokens/s for one prompt of the row's length (prompt / its prefill latency), or (None, why)."""
    value, why = llm_analysis_tok_s(dataclasses.replace(row, output_tokens=1))
    result = _LAST_LLM_ANALYSIS.get("result")
    if value is None or not result:
        return None, why
    latency = result.get("prefill_latency")
    return (row.prompt_tokens / float(latency), "") if latency else (None, "no prefill_latency in its result")


_LAST_LLM_ANALYSIS: dict[str, dict] = {}


def _nominal_bits(row: Row) -> float:
    """Bits per parameter of the row's weights; a per-group spelling averages its groups over the model's bytes."""
    if _per_group(row):
        return 8.0 * estimate(row.model, row_hardware(row), weights=row.weights).weights_bytes / resolve_model(row.model).total_params
    return parse_precision(row.weights).bits


# ------------------------------------------------------------------------------------------------
# held-out fit


def memory_time_at_peak_s(rows: list[Row]) -> np.ndarray:
    """Per row: the default model's decode step time at 100% bandwidth and zero overhead; NaN for a row that is
    not memory-bound there (a CPU row at a few threads, bound by llama.cpp's kernels).

    For a memory-bound row the step time for any bw_eff and per-kernel cost is exactly ``t / bw_eff + kernel_cost
    * kernels``; that closed form makes the grid fit cheap, and the rows it does not describe are left out of it.
    """
    times = []
    for row in rows:
        result = estimate(row_model(row), row_hardware(row), weights=row_weights(row), prompt=row.prompt_tokens, output=row.output_tokens, bw_efficiency=1.0, step_overhead_s=0.0)
        times.append(result.itl_s if result.regime == "memory" else math.nan)
    return np.array(times)


@dataclass(frozen=True)
class FitInputs:
    """What the per-kernel fit needs, one entry per row."""

    t_peak_s: np.ndarray  # memory time at 100% bandwidth
    kernels: np.ndarray  # kernels one decode step launches (Architecture.decode_kernels)
    bw_efficiency: np.ndarray  # the catalog's (cited) bandwidth efficiency for the row's device
    measured_tok_s: np.ndarray
    kinds: np.ndarray
    folds: np.ndarray

    def predict_tok_s(self, kernel_cost_s: dict[str, float]) -> np.ndarray:
        cost = np.array([kernel_cost_s[kind] for kind in self.kinds])
        return 1.0 / (self.t_peak_s / self.bw_efficiency + cost * self.kernels)


def fit_inputs(rows: list[Row], kinds: list[str]) -> FitInputs:
    """The memory-bound rows' fit inputs (`memory_time_at_peak_s`: the closed form describes only those)."""
    t_peak_s = memory_time_at_peak_s(rows)
    keep = np.isfinite(t_peak_s)
    return FitInputs(
        t_peak_s=t_peak_s[keep],
        kernels=np.array([resolve_model(row.model).decode_kernels for row in rows])[keep],
        bw_efficiency=np.array([default_efficiency(row_hardware(row)).bw_efficiency for row in rows])[keep],
        measured_tok_s=np.array([row.decode_tok_s for row in rows])[keep],
        kinds=np.array(kinds)[keep],
        folds=np.array([row.fold for row in rows])[keep],
    )


def fit_kernel_cost_s(inputs: FitInputs, mask: np.ndarray) -> float:
    """The per-kernel cost on the grid minimising the mean |log(predicted / measured)| over ``mask``."""
    step = inputs.t_peak_s[mask][None, :] / inputs.bw_efficiency[mask][None, :] + FIT_KERNEL_COST_S[:, None] * inputs.kernels[mask][None, :]
    loss = np.mean(np.abs(np.log(inputs.measured_tok_s[mask][None, :] * step)), axis=-1)
    return float(FIT_KERNEL_COST_S[int(np.argmin(loss))])


def fold_fits(inputs: FitInputs) -> dict[str, dict[str, float]]:
    """Per fold, per kind: the per-kernel cost fitted on that fold's rows alone (NaN: the fold has no rows of that kind,
    e.g. the CPU rows, all in fold B)."""
    def fit(fold: str, kind: str) -> float:
        mask = (inputs.folds == fold) & (inputs.kinds == kind)
        return fit_kernel_cost_s(inputs, mask) if mask.any() else math.nan

    return {fold: {kind: fit(fold, kind) for kind in sorted(set(inputs.kinds))} for fold in ("A", "B")}


# ------------------------------------------------------------------------------------------------
# held-out fits of llama.cpp's GEMM efficiency on NVIDIA GPUs and Apple chips (prefill)


def gemm_fit_rows(rows: list[Row], profile: str = GEMM_FIT_PROFILE) -> list[Row]:
    """The prefill rows a llama.cpp backend profile prices: llama.cpp (or Ollama) prompt rates on a device where the
    default engine runs as ``profile`` (an NVIDIA GPU for CUDA, an Apple chip for Metal), both folds."""
    return [row for row in rows if row.quantity == "prefill" and row.prefill_tok_s and ENGINE_PROFILES.get(row.engine) == "llama-cpp"
            and engine_for_device(resolve_engine("llama-cpp"), row_hardware(row)).key == profile]


def gemm_profile(efficiency: float, profile: str = GEMM_FIT_PROFILE) -> EngineProfile:
    """The llama.cpp backend profile with its GEMMs at ``efficiency`` of peak at every step size (what the fit prices)."""
    curve = Sourced(value=[[GEMM_FIT_TOKENS, float(efficiency)]], fitted="A")
    return catalog_engine(profile).model_copy(update={"gemm_efficiency": curve})


def predict_prefill_at_gemm(rows: list[Row], efficiency: float, profile: str = GEMM_FIT_PROFILE) -> np.ndarray:
    """Predicted prompt tok/s of each row with the backend's GEMMs at ``efficiency`` (the real estimator), each row
    priced as its own build of the backend where the catalog has one (`row_engine`: llama.cpp CUDA of early 2024
    converts quantized weights to fp16 first); every build inherits the backend's GEMM efficiency."""
    engines: dict[str, EngineProfile] = {}

    def engine_of(row: Row) -> EngineProfile:
        versioned = row_engine(row)
        key = profile if versioned in (None, "llama-cpp") else versioned
        if key not in engines:
            engines[key] = gemm_profile(efficiency, key)
        return engines[key]

    return np.array([predict_prefill_tok_s(row, engine=engine_of(row)) for row in rows])


def fit_gemm_efficiency(rows: list[Row], profile: str = GEMM_FIT_PROFILE) -> float:
    """The GEMM efficiency on `FIT_GEMM_EFFICIENCY` minimising the mean |log(predicted / measured)| over ``rows``."""
    measured = np.array([row.prefill_tok_s for row in rows])
    loss = [np.mean(np.abs(np.log(predict_prefill_at_gemm(rows, e, profile) / measured))) for e in FIT_GEMM_EFFICIENCY]
    return float(FIT_GEMM_EFFICIENCY[int(np.argmin(loss))])


def shipped_gemm_efficiency(profile: str = GEMM_FIT_PROFILE) -> float | None:
    """The catalog's GEMM efficiency of a llama.cpp backend when it is one flat point (None: none, or a curve)."""
    engine = catalog_engine(profile)
    if engine.gemm_efficiency is None:
        return None
    points = engine.gemm_points
    return points[0][1] if len(points) == 1 else None


def print_gemm_fit(all_rows: list[Row]) -> int:
    """Fit each llama.cpp backend's GEMM efficiency on fold A, score it on fold B; 1 when the catalog does not ship
    the fit."""
    status = 0
    step = FIT_GEMM_EFFICIENCY[1] - FIT_GEMM_EFFICIENCY[0]
    for profile, devices in GEMM_FIT_PROFILES.items():
        rows = gemm_fit_rows(all_rows, profile)
        fold_a, fold_b = [r for r in rows if r.fold == "A"], [r for r in rows if r.fold == "B"]
        print(f"llama.cpp's GEMM efficiency on {devices} (catalog/engines.toml [{profile}] gemm_efficiency): the fraction "
              "of dense peak FLOP/s at the weights' compute dtype its prefill matmuls reach, fitted on fold A")
        print(f"  rows: llama.cpp prefill on {devices}, fold A {len(fold_a)}, fold B {len(fold_b)}; grid "
              f"{FIT_GEMM_EFFICIENCY[0]:.3f}..{FIT_GEMM_EFFICIENCY[-1]:.3f} step {step:.3f}, minimising mean |log(predicted / measured)|")
        if not fold_a:
            print("  no fold-A rows: nothing to fit")
            status = 1
            continue
        fitted = fit_gemm_efficiency(fold_a, profile)

        def errors(fold_rows: list[Row]) -> str:
            if not fold_rows:
                return "no rows (n=0)"
            predicted = predict_prefill_at_gemm(fold_rows, fitted, profile)
            median, mean = summary([ape(p, r.prefill_tok_s) for p, r in zip(predicted, fold_rows)])
            return f"median {median:.1f}% / mean {mean:.1f}% ({len(fold_rows)} rows)"

        print(f"  fit on A -> {fitted:.3f}; in-sample fold A: {errors(fold_a)}; held-out fold B: {errors(fold_b)}")
        shipped = shipped_gemm_efficiency(profile)
        same = shipped is not None and abs(shipped - fitted) < step / 2
        shown = "not one flat point" if shipped is None else f"{shipped:.3f}"
        print(f"  shipped {profile}: {shown} {'=' if same else '!='} the fold-A fit ({fitted:.3f})"
              f"{'' if same else '  <-- MISMATCH: update catalog/engines.toml'}")
        status |= 0 if same else 1
    return status


KERNELS_CSV = Path(__file__).with_name("cpu_kernels.csv")
# each measured llama.cpp version's fold-C file -> the engine profile that ships its rates
# (its main file, then files that add types the main one lacks: SOURCES.md, "Fold C amendment 7")
KERNEL_FILES = {"llama-cpp-cpu": (KERNELS_CSV, Path(__file__).with_name("cpu_kernels_mxfp4.csv")),
                "llama-cpp-cpu-b3441": (Path(__file__).with_name("cpu_kernels_b3441.csv"),),
                "llama-cpp-cpu-avx2": (Path(__file__).with_name("cpu_kernels_portable.csv"),
                                       Path(__file__).with_name("cpu_kernels_mxfp4_portable.csv")),
                # the portable build on an Intel core (SOURCES.md, "Fold C amendment 8")
                "llama-cpp-cpu-intel": (Path(__file__).with_name("cpu_kernels_portable_intel.csv"),)}


def kernel_rates_from(path: Path = KERNELS_CSV) -> dict[str, list[float]]:
    """Fold C's fit: each tensor type's [decode, prefill] MACs per cycle per thread, to 3 significant digits.

    Decode: the two in-cache models at one thread, differenced: (MACs per token wide - narrow) / (seconds per token
    wide - narrow) / clock, so the per-token costs both share (dispatch, attention, the head), which the estimate
    prices apart, cancel; but never below the 8B matrices' decode rate at one thread from DRAM (tg, where the run has
    it): that run does the same kernel's work plus memory stalls and per-token costs, so its rate bounds the kernel's
    from below, and a difference under it is noise of two short timings (SOURCES.md, "Fold C amendment 2").
    Prefill: pp on the 8B matrices at the most threads the run used (all cores, as the published prompt rates run),
    as its row gives it."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    rates: dict[str, list[float]] = {}
    for kind in dict.fromkeys(row["type"] for row in rows):
        mine = [row for row in rows if row["type"] == kind]
        narrow, wide = (next(r for r in mine if r["model"] == name and r["test"].startswith("tg") and int(r["threads"]) == 1)
                        for name in ("in-cache-narrow", "in-cache-wide"))
        seconds = 1.0 / float(wide["tok_s"]) - 1.0 / float(narrow["tok_s"])
        decode = (int(wide["macs_per_token"]) - int(narrow["macs_per_token"])) / seconds / float(wide["clock_hz"])
        from_dram = [float(r["macs_per_cycle_per_thread"]) for r in mine
                     if r["model"] == "8b-matrices" and r["test"].startswith("tg") and int(r["threads"]) == 1]
        decode = max([decode, *from_dram])
        gemm = [r for r in mine if r["model"] == "8b-matrices" and r["test"].startswith("pp")]
        most = max(int(r["threads"]) for r in gemm)
        prefill = next(float(r["macs_per_cycle_per_thread"]) for r in gemm if int(r["threads"]) == most)
        rates[kind] = [float(f"{decode:.3g}"), float(f"{prefill:.3g}")]
    return rates


def profile_kernel_rates(paths: tuple[Path, ...]) -> dict[str, list[float]]:
    """A profile's fold-C rates: its main file's (the first), plus each type only a later file measured; a later
    file's anchor run of a type the main file has is on record, never in a price (SOURCES.md, "Fold C amendment 7")."""
    rates: dict[str, list[float]] = {}
    for path in paths:
        for kind, pair in kernel_rates_from(path).items():
            rates.setdefault(kind, pair)
    return rates


# each measured llama.cpp version's fold-C thread sweep -> the engine profile that ships its prefill thread scaling
THREAD_FILES = {"llama-cpp-cpu": Path(__file__).with_name("cpu_threads.csv"),
                "llama-cpp-cpu-b3441": Path(__file__).with_name("cpu_threads_b3441.csv")}


def thread_scaling_from(path: Path) -> list[list[float]]:
    """Fold C's prefill thread scaling (SOURCES.md, "Fold C amendment 3"): at each thread count from 2 up, the median
    over the types swept of pp512's MACs per cycle per thread there / at 2 threads, to 3 significant digits."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    rate = {(row["type"], int(row["threads"])): float(row["macs_per_cycle_per_thread"]) for row in rows}
    kinds = list(dict.fromkeys(row["type"] for row in rows))
    counts = sorted({n for _, n in rate if n >= 2})
    return [[n, float(f"{float(np.median([rate[kind, n] / rate[kind, 2] for kind in kinds])):.3g}")] for n in counts]


# each measured build's fold-C graph-overhead run -> (the profile that ships its per-node and per-step costs, the
# kernel-rate file whose in-cache f16 decode rate prices the tiny models' multiply-accumulates)
GRAPH_FILES = {"llama-cpp-cpu": (Path(__file__).with_name("cpu_graph_overhead.csv"), KERNELS_CSV),
               "llama-cpp-cpu-avx2": (Path(__file__).with_name("cpu_graph_overhead_portable.csv"),
                                          Path(__file__).with_name("cpu_kernels_portable.csv"))}


def graph_overhead_from(path: Path, kernels_path: Path) -> dict[int, tuple[float, float]]:
    """Fold C's per-node and per-step CPU costs (SOURCES.md, "Fold C amendment 5"), at each thread count run:
    threads -> (seconds per graph node, seconds per step), to 3 significant digits.

    Per node: the 33-layer model's seconds per token less the 1-layer model's, less the 32 extra layers'
    multiply-accumulates at the build's in-cache f16 decode rate (kernel_rates_from's, per cycle per thread, at the
    row's clock and threads), over 32 x `DENSE_LAYER_KERNELS` nodes. Per step: the 1-layer model's seconds per token
    less its (DENSE_LAYER_KERNELS + STEP_KERNELS) nodes at that cost and its multiply-accumulates at that rate."""
    from speedlimit.architecture import DENSE_LAYER_KERNELS, STEP_KERNELS

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    f16_rate = kernel_rates_from(kernels_path)["f16"][0]
    out: dict[int, tuple[float, float]] = {}
    for threads in sorted({int(row["threads"]) for row in rows}):
        shallow, deep = (next(r for r in rows if int(r["threads"]) == threads and int(r["layers"]) == layers) for layers in (1, 33))

        def mac_s(row: dict[str, str], macs: float) -> float:
            return macs / (f16_rate * float(row["clock_hz"]) * threads)

        extra = int(deep["layers"]) - int(shallow["layers"])
        layer_macs = (int(deep["macs_per_token"]) - int(shallow["macs_per_token"])) / extra
        per_node = (1.0 / float(deep["tok_s"]) - 1.0 / float(shallow["tok_s"]) - extra * mac_s(deep, layer_macs)) / (extra * DENSE_LAYER_KERNELS)
        per_step = 1.0 / float(shallow["tok_s"]) - (DENSE_LAYER_KERNELS + STEP_KERNELS) * per_node - mac_s(shallow, int(shallow["macs_per_token"]))
        out[threads] = (float(f"{per_node:.3g}"), float(f"{max(per_step, 0.0):.3g}"))
    return out


# each measured build's fold-C attention run -> the profile that ships its attention_rates (SOURCES.md, "Fold C
# amendment 9"; [llama-cpp-cpu-intel] inherits [llama-cpp-cpu-avx2]'s)
ATTENTION_FILES = {"llama-cpp-cpu": Path(__file__).with_name("cpu_attention.csv"),
                   "llama-cpp-cpu-avx2": Path(__file__).with_name("cpu_attention_portable.csv")}


def attention_rates_from(path: Path) -> list[float]:
    """Fold C's CPU attention rates (SOURCES.md, "Fold C amendment 9"): [decode, prefill] multiply-accumulates per
    cycle per thread, to 3 significant digits.

    At the most threads the run used, per model: the extra seconds of a decode token between its two depths (1/tok_s),
    and of a prefill between its two (tokens/tok_s), over the extra (query, key) pairs' multiply-accumulates (pairs x
    layers x query heads x (key + value width); a prefill of n tokens at depth d attends n x d more pairs than at 0),
    per cycle per thread at the row's clock; the mean over the models (head widths)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    most = max(int(row["threads"]) for row in rows)
    rates = []
    for phase in ("decode", "prefill"):
        per_model = []
        for model in dict.fromkeys(row["model"] for row in rows):
            mine = sorted((r for r in rows if r["model"] == model and r["phase"] == phase and int(r["threads"]) == most),
                          key=lambda r: int(r["depth"]))
            shallow, deep = mine[0], mine[-1]
            tokens = int(deep["tokens"])
            seconds = (1.0 if phase == "decode" else tokens) * (1.0 / float(deep["tok_s"]) - 1.0 / float(shallow["tok_s"]))
            pairs = (int(deep["depth"]) - int(shallow["depth"])) * (1 if phase == "decode" else tokens)
            macs = pairs * int(deep["layers"]) * int(deep["heads"]) * 2 * int(deep["head_dim"])
            per_model.append(macs / seconds / (float(deep["clock_hz"]) * most))
        rates.append(float(f"{sum(per_model) / len(per_model):.3g}"))
    return rates


def print_cpu_kernel_fit() -> int:
    """Check that the catalog ships fold C's CPU kernel rates, for each llama.cpp version measured; 1 when not."""
    status = 0
    for profile, paths in KERNEL_FILES.items():
        print(f"llama.cpp's CPU matmul kernel rates (catalog/engines.toml [{profile}] kernel_rates): multiply-accumulates "
              "per cycle per thread per tensor type, fitted on fold C")
        missing = [path.name for path in paths if not path.exists()]
        if missing:
            print(f"  {', '.join(missing)} missing: nothing to check")
            status = 1
            continue
        fitted = profile_kernel_rates(paths)
        shipped = (catalog_engine(profile).kernel_rates or Sourced(value={}, fitted="C")).value
        names = " + ".join(path.name for path in paths)
        print(f"  fold C = {names} (benchmarks/cpu_kernel_rates.py, the project's own runs; no published row): "
              f"{len(fitted)} types")
        wrong = sorted(k for k in set(fitted) | set(shipped) if fitted.get(k) != shipped.get(k))
        for kind in wrong:
            print(f"  {kind}: shipped {shipped.get(kind)} != fold C {fitted.get(kind)}  <-- MISMATCH: update catalog/engines.toml")
        if not wrong:
            print("  shipped = the fold-C fit for every type")
        status |= 1 if wrong else 0
    for profile, (path, kernels_path) in GRAPH_FILES.items():
        measured = graph_overhead_from(path, kernels_path)
        most = max(measured)
        fitted = measured[most]
        engine = catalog_engine(profile)
        shipped = (engine.kernel_overhead_s.value if engine.kernel_overhead_s else None,
                   engine.step_overhead_s.value if engine.step_overhead_s else None)
        same = shipped == fitted
        listed = ", ".join(f"{n} thread{'s' if n > 1 else ''}: {node * 1e6:.3g} us/node, {step * 1e6:.3g} us/step"
                           for n, (node, step) in measured.items())
        print(f"  [{profile}] kernel_overhead_s, step_overhead_s {shipped} {'=' if same else '!='} fold C {path.name} at "
              f"{most} threads {fitted} ({listed}){'' if same else '  <-- MISMATCH: update catalog/engines.toml'}")
        status |= 0 if same else 1
    for profile, path in ATTENTION_FILES.items():
        fitted = attention_rates_from(path)
        shipped = (catalog_engine(profile).attention_rates or Sourced(value=None, fitted="C")).value
        same = fitted == shipped
        print(f"  [{profile}] attention_rates {shipped} {'=' if same else '!='} fold C {path.name} ({fitted}: "
              f"decode, prefill){'' if same else '  <-- MISMATCH: update catalog/engines.toml'}")
        status |= 0 if same else 1
    for profile, path in THREAD_FILES.items():
        fitted = thread_scaling_from(path)
        shipped = (catalog_engine(profile).prefill_thread_scaling or Sourced(value=[], fitted="C")).value
        same = fitted == shipped
        print(f"  [{profile}] prefill_thread_scaling {shipped} {'=' if same else '!='} fold C {path.name} ({fitted})"
              f"{'' if same else '  <-- MISMATCH: update catalog/engines.toml'}")
        status |= 0 if same else 1
    return status


# ------------------------------------------------------------------------------------------------
# fold D: per-version step costs of serving engines (engine_steps.csv; rule in SOURCES.md)

ENGINE_STEPS_CSV = Path(__file__).with_name("engine_steps.csv")
# the cost per decode kernel searched, seconds (0-100 us by 0.5 us)
FIT_KERNEL_OVERHEAD_S = np.round(np.arange(0.0, 100.0001, 0.5), 1) * 1e-6
# the cost per running sequence per step searched, seconds (0-2,000 us by 5 us)
FIT_SEQUENCE_OVERHEAD_S = np.round(np.arange(0.0, 2000.0001, 5.0), 1) * 1e-6
# what a fold-D figure is (SOURCES.md): a decode rate at a fixed batch, an offline run's output rate, one batch's latency
ENGINE_STEP_METRICS = ("decode_tok_s", "offline_output_tok_s", "batch_latency_s")


@dataclass(frozen=True)
class EngineStep:
    """One fold-D line: a named engine version's published figure at a fixed batch and fixed lengths."""

    profile: str
    device: str
    model: str
    weights: str
    tp: int
    batch: int
    prompt_tokens: int
    output_tokens: int
    metric: str
    value: float
    source: str
    engine_args: tuple[tuple[str, Any], ...] = ()  # the layout the line ran (`layout`)

    @property
    def measured_s(self) -> float:
        """The figure as seconds: one decode step (batch / tok/s), the whole offline run (batch x output / tok/s),
        or the batch's latency as published."""
        if self.metric == "decode_tok_s":
            return self.batch / self.value
        if self.metric == "offline_output_tok_s":
            return self.batch * self.output_tokens / self.value
        return self.value


def load_engine_steps(path: Path = ENGINE_STEPS_CSV) -> list[EngineStep]:
    with open(path, newline="", encoding="utf-8") as f:
        lines = [EngineStep(r["profile"], r["device"], r["model"], r["weights"], int(r["tp"]), int(r["batch"]),
                            int(r["prompt_tokens"]), int(r["output_tokens"]), r["metric"], float(r["value"]), r["source"],
                            parse_engine_args(r.get("engine_args") or ""))
                 for r in csv.DictReader(f)]
    unknown = {line.metric for line in lines} - set(ENGINE_STEP_METRICS)
    if unknown:
        raise ValueError(f"{path.name}: unknown metric {sorted(unknown)} (known: {', '.join(ENGINE_STEP_METRICS)})")
    return lines


def predict_line_s(line: EngineStep, kernel_overhead_s: float | None = None, sequence_overhead_s: float | None = None) -> float:
    """The real estimator's figure for a fold-D line, as seconds (`EngineStep.measured_s`), with its profile's per-kernel
    and per-sequence costs replaced where given: the ITL for a decode rate, else TTFT + (output - 1) x ITL."""
    profile = catalog_engine(line.profile)
    update = {name: Sourced(value=float(value), fitted="D") for name, value in
              (("kernel_overhead_s", kernel_overhead_s), ("sequence_overhead_s", sequence_overhead_s)) if value is not None}
    profile = profile.model_copy(update=update)
    result = estimate(line.model, line.device, weights=line.weights, batch=line.batch, prompt=line.prompt_tokens,
                      output=line.output_tokens, engine=profile, **layout(line.tp, line.engine_args))
    if line.metric == "decode_tok_s":
        return result.itl_s
    return result.ttft_s + (line.output_tokens - 1) * result.itl_s


def step_cost_terms(line: EngineStep) -> tuple[float, float, float]:
    """(seconds at no per-kernel or per-sequence cost, seconds per second of per-kernel cost, per second of
    per-sequence cost): both costs are additive terms of every step, so a line is linear in them."""
    base = predict_line_s(line, 0.0, 0.0)
    per_kernel = (predict_line_s(line, 1e-5, 0.0) - base) / 1e-5
    per_sequence = (predict_line_s(line, 0.0, 1e-4) - base) / 1e-4
    return base, per_kernel, per_sequence


def inherited_sequence_overhead_s(lines: list[EngineStep]) -> float | None:
    """The per-sequence cost a profile's fit holds fixed, or None when its lines can fit it: lines that all run one
    batch size cannot tell a per-kernel from a per-sequence cost (both add the same multiple to every step), so
    only the per-kernel cost is fitted and the per-sequence cost is the profile's parent's (fold D amendment 4), or,
    for a profile that inherits none, its own cited value (amendment 5)."""
    if len({line.batch for line in lines}) > 1:
        return None
    profile = catalog_engine(lines[0].profile)
    if profile.inherits is None:  # a root profile keeps its own cited per-sequence cost (fold D amendment 5)
        value = profile.sequence_overhead_s
    else:
        value = catalog_engine(profile.inherits).sequence_overhead_s
    return float(value.value) if value is not None else 0.0


def fit_step_costs(lines: list[EngineStep]) -> tuple[float, float]:
    """(kernel_overhead_s, sequence_overhead_s) on the fold-D grid minimising the mean |log(predicted / measured)|;
    ties go to the smaller per-kernel, then per-sequence, cost. Checked against a direct estimate at the optimum.
    Lines of one batch size fit the per-kernel cost only (`inherited_sequence_overhead_s`)."""
    terms = np.array([step_cost_terms(line) for line in lines])
    measured = np.array([line.measured_s for line in lines])
    held = inherited_sequence_overhead_s(lines)
    sequences = FIT_SEQUENCE_OVERHEAD_S if held is None else np.array([held])
    kernel, sequence = np.meshgrid(FIT_KERNEL_OVERHEAD_S, sequences, indexing="ij")
    predicted = terms[:, 0, None, None] + terms[:, 1, None, None] * kernel + terms[:, 2, None, None] * sequence
    loss = np.mean(np.abs(np.log(predicted / measured[:, None, None])), axis=0)
    i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
    fitted = float(FIT_KERNEL_OVERHEAD_S[i]), float(sequences[j])
    for line, (base, per_kernel, per_sequence) in zip(lines, terms):
        direct = predict_line_s(line, *fitted)
        if not math.isclose(direct, base + per_kernel * fitted[0] + per_sequence * fitted[1], rel_tol=1e-6):
            raise AssertionError(f"fold-D line {line.source} is not linear in the step costs: {direct}")
    return fitted


#: Profiles that ship another profile's fold-D per-kernel fit (SOURCES.md, fold D amendment 5: the late-2025 engines'
#: floor per CUDA-graph node, fitted on SGLang's lines, ASSUMED the same for vLLM V1 and TensorRT-LLM).
SHARED_KERNEL_FIT = {"sglang": ("vllm", "tensorrt-llm")}


def _shipped_fold_d(profile: str, field: str, held: bool = False) -> float | None:
    """The catalog's value of a fold-D field: None where it is not fitted on fold D, unless ``held`` (a value the fit
    keeps, `inherited_sequence_overhead_s`'s, whatever its basis; 0 where none is set)."""
    value = getattr(catalog_engine(profile), field)
    if held:
        return 0.0 if value is None else float(value.value)
    return None if value is None or value.fitted != "D" else float(value.value)


def print_engine_step_fit() -> int:
    """Fit each fold-D profile's per-kernel and per-sequence costs; 1 when the catalog does not ship the fit."""
    lines = load_engine_steps()
    status = 0
    for profile in dict.fromkeys(line.profile for line in lines):
        mine = [line for line in lines if line.profile == profile]
        print(f"{profile}'s cost per decode kernel and per running sequence (catalog/engines.toml [{profile}] "
              f"kernel_overhead_s, sequence_overhead_s), fitted on fold D ({ENGINE_STEPS_CSV.name}: {len(mine)} published "
              "lines outside fold B; grid 0-100 us by 0.5 us x 0-2,000 us by 5 us, minimising mean |log(predicted / measured)|)")
        fitted = fit_step_costs(mine)
        for line in mine:
            predicted = predict_line_s(line, *fitted)
            what = {"decode_tok_s": "per step", "offline_output_tok_s": "for the offline run",
                    "batch_latency_s": "batch latency"}[line.metric]
            print(f"  {line.model} on {line.tp} x {line.device}, batch {line.batch}, {line.prompt_tokens} in / "
                  f"{line.output_tokens} out: measured {line.measured_s * 1e3:,.1f} ms {what}, fitted "
                  f"{predicted * 1e3:,.1f} ms ({100 * (predicted / line.measured_s - 1):+.1f}%)")
        held = inherited_sequence_overhead_s(mine)
        shipped = (_shipped_fold_d(profile, "kernel_overhead_s"),
                   _shipped_fold_d(profile, "sequence_overhead_s", held=held is not None))
        same = all(s is not None and abs(s - f) < 0.25e-6 for s, f in zip(shipped, fitted))
        shown = ", ".join("not fitted on fold D" if s is None else f"{s * 1e6:.1f} us" for s in shipped)
        whose = "its parent's" if catalog_engine(profile).inherits else "its own cited value"
        per_sequence = (f"{fitted[1] * 1e6:.1f} us per sequence" if held is None else
                        f"{fitted[1] * 1e6:.1f} us per sequence held at {whose} (its lines run one batch size)")
        print(f"  fit -> {fitted[0] * 1e6:.1f} us per kernel, {per_sequence}; shipped {profile}: "
              f"{shown}{'' if same else '  <-- MISMATCH: update catalog/engines.toml'}")
        status |= 0 if same else 1
        for sharer in SHARED_KERNEL_FIT.get(profile, ()):
            theirs = _shipped_fold_d(sharer, "kernel_overhead_s")
            agrees = theirs is not None and abs(theirs - fitted[0]) < 0.25e-6
            print(f"  shared per-kernel fit, shipped {sharer}: "
                  f"{'not fitted on fold D' if theirs is None else f'{theirs * 1e6:.1f} us'}"
                  f"{'' if agrees else '  <-- MISMATCH: update catalog/engines.toml'}")
            status |= 0 if agrees else 1
    return status


# ------------------------------------------------------------------------------------------------
# report


def score_rows(rows: list[Row], *, with_llm_analysis: bool = True) -> dict[str, list[float | None]]:
    """Predicted tok/s per mode, aligned with ``rows`` (None where a mode cannot model a row)."""
    predictions: dict[str, list[float | None]] = {"ideal": [], "default": [], "profiles": [], "fixed-2ms": [], "llm-analysis": []}
    reasons: list[str] = []
    use_llm_analysis = with_llm_analysis and llm_analysis_status() is None
    for row in rows:
        predictions["ideal"].append(predict_tok_s(row, ideal=True))
        predictions["default"].append(predict_tok_s(row))
        predictions["profiles"].append(predict_tok_s(row, engine=row_engine(row)))
        predictions["fixed-2ms"].append(predict_tok_s(row, step_overhead_s=FIXED_OVERHEAD_S))
        if use_llm_analysis:
            value, why = llm_analysis_tok_s(row)
            predictions["llm-analysis"].append(value)
            reasons.append(why)
        else:
            predictions["llm-analysis"].append(None)
    return predictions


def _signed(predicted: float | None, measured: float) -> str:
    """The signed percentage error, predicted against measured (+: predicted above the measurement), or n/a."""
    if predicted is None or not measured or not math.isfinite(predicted):
        return f"{'n/a':>7}"
    return f"{100.0 * (predicted - measured) / measured:+7.1f}"


def _fmt(value: float | None, width: int = 8) -> str:
    return f"{value:{width}.1f}" if value is not None else f"{'n/a':>{width}}"


def score_other_quantities(rows: list[Row], *, with_llm_analysis: bool = True) -> list[dict]:
    """One record per (row, measured figure) of the prefill, serving and end-to-end rows: measured and predicted per mode."""
    use_llm_analysis = with_llm_analysis and llm_analysis_status() is None
    records = []
    for row in rows:
        kind = resolve_hardware(row.device).kind
        base = {"row": row, "kind": kind, "engine": row.engine, "fold": row.fold, "model": row.model,
                "profile": row_engine(row)}
        if row.quantity == "prefill":
            llm = llm_analysis_prefill_tok_s(row)[0] if use_llm_analysis else None
            records.append(base | {"what": "prefill", "measured": row.prefill_tok_s, "default": predict_prefill_tok_s(row),
                                   "profiles": predict_prefill_tok_s(row, engine=row_engine(row)),
                                   "ideal": predict_prefill_tok_s(row, ideal=True), "llm-analysis": llm})  # fmt: skip
        elif row.quantity == "decode" and row.e2e:
            records.append(base | {"what": "decode, E2E-derived", "measured": row.decode_tok_s, "default": predict_e2e_tok_s(row),
                                   "profiles": predict_e2e_tok_s(row), "ideal": predict_e2e_tok_s(row, ideal=True),
                                   "llm-analysis": None})  # fmt: skip
        elif row.quantity == "serving":
            default, ideal = predict_serving(row), predict_serving(row, ideal=True)
            profiles = predict_serving(row, engine=row_engine(row))
            simulated = predict_serving_simulated(row) if simulator_status() is None else {}
            simulated_profiles = predict_serving_simulated(row, engine=row_engine(row)) if simulator_status() is None else {}
            for what, key in (("serving throughput", "throughput_tok_s"), ("TPOT under load", "tpot_ms"), ("TTFT under load", "ttft_ms")):
                measured = getattr(row, key)
                if measured is not None:
                    records.append(base | {"what": what, "measured": measured, "default": default[key], "profiles": profiles[key],
                                           "simulate": simulated.get(key), "simulate+profiles": simulated_profiles.get(key),
                                           "ideal": ideal[key], "llm-analysis": None})
    return records


# The order and the issue-13 targets (median absolute % error on the held-out fold) of each quantity.
TARGETS = {"decode": 8.0, "prefill": 15.0, "serving throughput": 10.0, "TPOT under load": 15.0, "TTFT under load": 25.0, "decode, E2E-derived": None}
MODES = ("default", "profiles", "simulate", "simulate+profiles", "ideal", "llm-analysis")
SERVING_QUANTITIES = ("serving throughput", "TPOT under load", "TTFT under load")


def _summary_line(label: str, pairs: list[tuple[float, float]], width: int = 44) -> str:
    if not pairs:
        return f"{label:{width}} {0:4d} {'n/a':>9} {'n/a':>8}"
    median, mean = summary([ape(p, m) for p, m in pairs])
    return f"{label:{width}} {len(pairs):4d} {median:9.1f} {mean:8.1f}"


def print_quantity_report(records: list[dict], why_none: dict[str, str]) -> None:
    """Median / mean absolute % error per quantity and mode: all rows, per fold, per device kind, per engine (and, for
    the serving quantities, whose rows are few models each run many ways, per model and per engine profile the
    `profiles` modes price a row with: one engine's rows span versions)."""
    for what, target in TARGETS.items():
        chosen = [r for r in records if r["what"] == what]
        goal = f"target: held-out median <= {target:g}%" if target is not None else "not in the decode median (see SOURCES.md)"
        print(f"{what}: {len(chosen)} measured figures ({goal})")
        if not chosen:
            print(f"  no rows{' (' + why_none[what] + ')' if what in why_none else ''}")
            print()
            continue
        print(f"  {'group':47} {'rows':>4} {'median %':>9} {'mean %':>8}")
        for mode in MODES:
            pairs = [(r.get(mode), r["measured"]) for r in chosen if r.get(mode) is not None]
            if not pairs:
                if mode == "llm-analysis" and why_none.get(mode):
                    why = why_none[mode]
                elif mode == "llm-analysis" and what not in ("decode", "prefill"):
                    why = "llm-analysis is used for decode and prefill rows only"
                else:
                    why = why_none.get(what) or "this mode does not model these rows"
                print(f"  {mode + ': n/a':47}  ({why})")
                continue
            groups = [("all", chosen)] + [(f"fold {f}{' (held out)' if f == 'B' else ' (fit fold)'}", [r for r in chosen if r["fold"] == f]) for f in ("A", "B")]
            groups += [(f"kind {k}", [r for r in chosen if r["kind"] == k]) for k in sorted({r["kind"] for r in chosen})]
            groups += [(f"engine {e}", [r for r in chosen if r["engine"] == e]) for e in sorted({r["engine"] for r in chosen})]
            if what in SERVING_QUANTITIES:
                groups += [(f"model {m}", [r for r in chosen if r["model"] == m]) for m in sorted({r["model"] for r in chosen})]
                groups += [(f"profile {p}", [r for r in chosen if r["profile"] == p])
                           for p in sorted({r["profile"] for r in chosen if r["profile"]})]
            for i, (label, group) in enumerate(groups):
                pairs = [(r.get(mode), r["measured"]) for r in group if r.get(mode) is not None]
                if pairs:
                    print("  " + _summary_line(f"{mode if i == 0 else '':18}{label}", pairs, 47))
        print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV_PATH, help="measurements file (default: the one beside this script)")
    parser.add_argument("--quiet", action="store_true", help="print the summary only, not the per-row table")
    args = parser.parse_args(argv)
    logging.getLogger("__name__").setLevel(logging.ERROR)  # llm-analysis 0.2.2 logs under this literal name

    all_rows = load_rows(args.csv)
    rows = decode_rows(all_rows)
    kinds = [resolve_hardware(row.device).kind for row in rows]
    predictions = score_rows(rows)
    llm_status = llm_analysis_status()
    others = score_other_quantities(all_rows)

    if not args.quiet:
        print(f"{'#':>3} {'fold':4} {'device':15} {'model':14} {'weights':7} {'engine':10} {'measured':>8} {'ideal':>8} {'default':>8} {'fixed-2ms':>9} {'llm-an.':>8} {'profiles':>8}  err% ideal/default  (pred-meas)/meas %: profiles")
        for i, row in enumerate(rows):
            ideal, default, profiles = predictions["ideal"][i], predictions["default"][i], predictions["profiles"][i]
            print(
                f"{row.index:3d} {row.fold:4} {row.device:15} {row.model:14} {row.weights:7} {row.engine:10} {row.decode_tok_s:8.1f} "
                f"{_fmt(ideal)} {_fmt(default)} {_fmt(predictions['fixed-2ms'][i], 9)} {_fmt(predictions['llm-analysis'][i])} {_fmt(profiles)}  "
                f"{ape(ideal, row.decode_tok_s):5.0f} / {ape(default, row.decode_tok_s):4.0f}  {_signed(profiles, row.decode_tok_s)}"
            )
        print()
        # the signed error of the mode each target is judged in: prefill in 'profiles', serving in 'simulate+profiles'
        print(f"{'#':>3} {'fold':4} {'device':15} {'model':14} {'weights':7} {'engine':10} {'what':20} {'in/out/conc':>14} {'measured':>9} {'ideal':>9} {'default':>9} {'llm-an.':>9} {'profiles':>9} {'sim+prof':>9}  err% default  (pred-meas)/meas %: profiles / sim+prof")
        for r in others:
            row = r["row"]
            print(f"{row.index:3d} {row.fold:4} {row.device:15} {row.model:14} {row.weights:7} {row.engine:10} {r['what'][:20]:20} "
                  f"{f'{row.prompt_tokens}/{row.output_tokens}/{row.concurrency}':>14} {r['measured']:9.1f} {_fmt(r['ideal'], 9)} {_fmt(r['default'], 9)} "
                  f"{_fmt(r['llm-analysis'], 9)} {_fmt(r.get('profiles'), 9)} {_fmt(r.get('simulate+profiles'), 9)}  "
                  f"{ape(r['default'], r['measured']) if r['default'] else float('nan'):5.0f}  "
                  f"{_signed(r.get('profiles'), r['measured'])} / {_signed(r.get('simulate+profiles'), r['measured'])}")  # fmt: skip
        print()

    print(f"Absolute percentage error against published measurements ({args.csv.name}: {len(all_rows)} rows; "
          + ", ".join(f"{q} {sum(r.quantity == q for r in all_rows)}" for q in QUANTITIES) + ")")
    print()
    decode_records = [{"row": row, "kind": kind, "engine": row.engine, "fold": row.fold, "what": "decode", "measured": row.decode_tok_s,
                       "default": predictions["default"][i], "profiles": predictions["profiles"][i], "ideal": predictions["ideal"][i],
                       "llm-analysis": predictions["llm-analysis"][i]}
                      for i, (row, kind) in enumerate(zip(rows, kinds))]  # fmt: skip
    why_none = {"llm-analysis": llm_status or "", "TTFT under load": simulator_status() or ""}
    print_quantity_report(decode_records + others, why_none)
    print("Mode 'profiles': each row priced with its engine's profile (catalog/engines.toml; ENGINE_PROFILES maps the CSV's")
    print("engine column: " + ", ".join(f"{k} -> {v}" for k, v in ENGINE_PROFILES.items()) + "); rows of other engines as in 'default'.")
    print("A row whose notes name an engine version the catalog has a profile of runs that version's (VERSION_PROFILES: "
          + ", ".join(f"{base} + /{named.pattern}/ -> {versioned}" for base, named, versioned in VERSION_PROFILES) + "), on an AMD GPU")
    print("as that version's ROCm build where the catalog has one (" + ", ".join(
        f"{key} -> {catalog_engine(key).rocm_profile}" for _, _, key in VERSION_PROFILES if catalog_engine(key).rocm_profile) + ").")
    print("Serving rows are scored with estimate(batch=concurrency) (default, profiles: a steady batch at the mid-reply")
    print(f"context, no queueing, no prefill interleaving) and with the simulator (simulate, simulate+profiles: the row's")
    print(f"closed loop, the requests the source sent or else {SIMULATED_ROUNDS} x concurrency, the engine's scheduler).")
    for failure in SIMULATION_FAILURES:
        print(f"  not simulated: {failure}")
    for logged in LOGGED_KV_CAPACITIES:
        rows_set = sorted(index for index, used in LOGGED_KV_ROWS.items() if used is logged)
        print(f"  rule K1: rows {', '.join(map(str, rows_set)) or 'none'} simulated (simulate+profiles) with the KV cache "
              f"{logged.profile} logged for {logged.model} at TP {logged.tp} on {logged.device}: {logged.kv_tokens:,} tokens "
              f"in blocks of {logged.block_size} ({logged.source})")
    print()

    print(f"Single-stream decode, {len(rows)} rows (E2E-derived rows excluded), with the earlier fixed-overhead design for comparison:")
    print(f"{'mode':58} {'rows':>4} {'median %':>9} {'mean %':>8}")
    labels = {
        "ideal": "speedlimit --ideal (= peak-bandwidth formula)",
        "default": "speedlimit default (catalog/efficiency.toml)",
        "fixed-2ms": "earlier design: fixed 2.0 ms per step (not the default)",
        "llm-analysis": "llm-analysis 0.2.2, its default efficiencies",
    }
    for mode, label in labels.items():
        pairs = [(p, row.decode_tok_s) for p, row in zip(predictions[mode], rows) if p is not None]
        if not pairs:
            print(f"{label:58} {0:4d} {'n/a':>9} {'n/a':>8}   ({llm_status or 'cannot model these rows'})")
            continue
        median, mean = summary([ape(p, m) for p, m in pairs])
        print(f"{label:58} {len(pairs):4d} {median:9.1f} {mean:8.1f}")
        if mode == "default":
            for fold, what in (("B", "held out: nothing in the defaults was fitted on it"), ("A", f"{'/'.join(FITTED_KINDS)} per-kernel cost fitted on it")):
                fold_rows = [i for i, row in enumerate(rows) if row.fold == fold]
                median, mean = summary([ape(predictions["default"][i], rows[i].decode_tok_s) for i in fold_rows])
                print(f"{'  fold ' + fold + ' (' + what + ')':58} {len(fold_rows):4d} {median:9.1f} {mean:8.1f}")

    print()
    inputs = fit_inputs(rows, kinds)
    fits = fold_fits(inputs)
    defaults = {kind: default_efficiency(resolve_hardware(next(r.device for r, k in zip(rows, kinds) if k == kind))) for kind in sorted(set(kinds))}
    print("Fit on one half, score on the other: bandwidth efficiencies stay as cited "
          f"({', '.join(f'{kind} {e.bw_efficiency:.2f}' for kind, e in defaults.items())}); the per-kernel cost is fitted per kind")
    print(f"  fold A = {FOLD_A_SOURCE} ({sum(inputs.folds == 'A')} decode rows); fold B = all other sources ({sum(inputs.folds == 'B')} decode rows)"
          + (f"; {len(rows) - len(inputs.folds)} rows bound by llama.cpp's CPU kernels left out (the closed form prices memory-bound rows only)"
             if len(inputs.folds) < len(rows) else ""))
    cited = {kind: e.kernel_overhead_s for kind, e in defaults.items()}

    def scheme(fit_fold: str, fitted_kinds: tuple[str, ...]) -> dict[str, float]:
        return {kind: fits[fit_fold][kind] if kind in fitted_kinds and not math.isnan(fits[fit_fold][kind]) else cited[kind]
                for kind in defaults}

    for label, fitted_kinds in ((f"{'/'.join(FITTED_KINDS)} fitted, the rest cited (the shipped design)", FITTED_KINDS),
                                ("every kind fitted (not shipped)", tuple(defaults))):  # fmt: skip
        print(f"  {label}:")
        cross = np.zeros(len(inputs.folds))
        for fit_fold, test_fold in (("A", "B"), ("B", "A")):
            costs = scheme(fit_fold, fitted_kinds)
            errors = np.abs(inputs.predict_tok_s(costs) - inputs.measured_tok_s) / inputs.measured_tok_s * 100.0
            held = inputs.folds == test_fold
            cross[held] = errors[held]
            used = ", ".join(f"{kind} {cost * 1e6:.1f} us" + ("" if kind in fitted_kinds and not math.isnan(fits[fit_fold][kind])
                                                              else " (cited)" if kind not in fitted_kinds
                                                              else f" (cited: no fold-{fit_fold} rows)")
                             for kind, cost in costs.items())
            print(f"    fit on {fit_fold} -> {used}; held-out fold {test_fold}: median {np.median(errors[held]):.1f}% / mean {errors[held].mean():.1f}%")
        print(f"    2-fold cross-fit (every row predicted from the other fold's fit): {len(inputs.folds)} rows, median {np.median(cross):.1f}% / mean {cross.mean():.1f}%")
    status = 0
    for kind, e in defaults.items():
        if kind in FITTED_KINDS:
            fitted = fits["A"][kind]
            same = abs(e.kernel_overhead_s - fitted) < 0.05e-6
            print(f"  shipped {kind}: {e.kernel_overhead_s * 1e6:.1f} us/kernel = the fold-A fit ({fitted * 1e6:.1f} us){'' if same else '  <-- MISMATCH: update catalog/efficiency.toml'}")
            status |= 0 if same else 1
        else:
            shown = [("no rows" if math.isnan(fits[fold][kind]) else f"{fits[fold][kind] * 1e6:.1f} us") for fold in ("A", "B")]
            print(f"  shipped {kind}: {e.kernel_overhead_s * 1e6:.1f} us/kernel, cited (the fold fits: A {shown[0]}, B {shown[1]})")
    print()
    status |= print_gemm_fit(all_rows)
    print()
    status |= print_cpu_kernel_fit()
    print()
    status |= print_engine_step_fit()
    return status


if __name__ == "__main__":
    sys.exit(main())
