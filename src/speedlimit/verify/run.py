"""Orchestration of `speedlimit verify`: measure the machine, time the real engine, predict, compare.

`run_verify` returns (and, with ``out``, keeps writing after every stage) one JSON-ready dict: the machine's
measured bandwidth and FLOP/s, its CPU layout (sockets, NUMA nodes, cores, threads per core:
`speedlimit.verify.topology.detect_layout`), the engine/model details, every timed prefill and decode point (and
the batched series: decode steps of 1, 2, 4... sequences together, whose growth `calibrate` fits as the per-sequence
cost), and for each point the estimator's prediction on the *measured* hardware twice: with the default efficiencies for a CPU
(what ``speedlimit estimate`` would say) and at the roofline limit (100 % of measured bandwidth/FLOPs, no
per-step overhead). ``efficiency`` = measured ÷ roofline limit. Headline keys sit at the top level
(``measured_bandwidth_Bps``, ``decode_tok_s_measured``, ...); `speedlimit calibrate` reads the points.

Interruption: SIGINT/SIGTERM inside `StopFlag.on_signals` only raise a flag, checked between measurements (a
llama.cpp eval cannot be interrupted, and an exception raised inside one of its log callbacks would be swallowed
with an "Exception ignored" message). At the next check `run_verify` marks the result ``interrupted`` (still not
``complete``), writes it to ``out`` and raises `VerifyInterrupted`; a second signal exits at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from speedlimit.architecture import Architecture
from speedlimit.artifacts import Artifact
from speedlimit.bundled import display_name
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.estimator.api import Estimate, cost_model, estimate, step_model
from speedlimit.hardware import Hardware
from speedlimit.precision import parse_precision
from speedlimit.verify import clock, membench
from speedlimit.verify.topology import CpuLayout, detect_layout

MIB = 1024 * 1024
NOISY_SPREAD = 1.5  # fastest run more than 1.5x the slowest: other load disturbed the measurement
KV_TYPE = "f16"  # llama.cpp's default KV-cache type, which verify does not change
MAX_BATCH_SEQUENCES = 64  # sequences decoded together in one step, at most


class VerifySettings(BaseModel):
    """What to measure; `quick()` is the under-a-minute preset."""

    model_path: Path
    threads: int = Field(default_factory=membench.cpu_count, ge=1, le=1024)
    prompt_tokens: int = Field(512, ge=1, le=131072)
    decode_tokens: int = Field(64, ge=2, le=8192)
    runs: int = Field(5, ge=1, le=100)
    contexts: list[int] = Field(default_factory=lambda: [128, 512, 1024, 2048, 4096])
    single_thread: bool = True
    array_mib: int = Field(256, ge=8, le=65536)
    bandwidth_repeats: int = Field(5, ge=1, le=100)
    matmul_n: int = Field(2048, ge=64, le=16384)
    # decode steps of several sequences at once (llama-server's slots), at the first context of the sweep: what each
    # further sequence adds to a step, which `calibrate` fits as the per-sequence cost (empty: not measured)
    batch_sequences: list[int] = Field(default_factory=lambda: [1, 2, 4])
    quick: bool = False

    @field_validator("contexts")
    @classmethod
    def _contexts(cls, value: list[int]) -> list[int]:
        if any(c < 1 for c in value):
            raise ValueError("context lengths must be positive token counts")
        return sorted(set(value))

    @field_validator("batch_sequences")
    @classmethod
    def _batch_sequences(cls, value: list[int]) -> list[int]:
        if any(not 1 <= n <= MAX_BATCH_SEQUENCES for n in value):
            raise ValueError(f"sequences decoded together must be between 1 and {MAX_BATCH_SEQUENCES}")
        return sorted(set(value))

    @property
    def batch_context(self) -> int:
        """The context each sequence of a batched decode holds: the sweep's first, else the prompt length."""
        return min(self.contexts) if self.contexts else self.prompt_tokens

    @classmethod
    def quick_preset(cls, **overrides: Any) -> VerifySettings:
        values: dict[str, Any] = dict(prompt_tokens=128, decode_tokens=32, runs=3, contexts=[128, 512, 1024],
                                      bandwidth_repeats=3, quick=True)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


# --- interruption ------------------------------------------------------------------------------------


class StopFlag:
    """Set by the first SIGINT/SIGTERM (its name in `signal`), read between measurements."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def set(self, name: str) -> None:
        self.signal = self.signal or name

    @contextlib.contextmanager
    def on_signals(self, message: str = "") -> Iterator[StopFlag]:
        """While inside: the first SIGINT/SIGTERM sets the flag (and writes ``message`` to stderr); a second one
        writes ``interrupted`` and exits 130 at once (what was measured is already on disk, written per stage)."""
        def on_signal(signum: int, _frame: object) -> None:
            if self.signal is not None:
                os.write(2, b"interrupted\n")  # the command line's words and exit code for a Ctrl-C
                os._exit(130)
            self.set(signal.Signals(signum).name)
            if message:
                os.write(2, f"{message}\n".encode())

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[sig] = signal.signal(sig, on_signal)
            except ValueError:  # not the main thread: no signal handling here
                pass
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class VerifyInterrupted(Exception):
    """verify stopped at a signal; ``result`` holds what was measured (None when nothing was yet)."""

    def __init__(self, signal_name: str, result: VerifyResult | None, steps_done: int, steps_total: int) -> None:
        super().__init__(f"interrupted by {signal_name}")
        self.signal_name = signal_name
        self.result = result
        self.steps_done = steps_done
        self.steps_total = steps_total


class _Stop(Exception):
    """Raised at a check when the flag is set; `run_verify` turns it into `VerifyInterrupted`."""


# --- the result artifact ----------------------------------------------------------------------------


class ClockInfo(BaseModel):
    """The core clock measured with one core and with the run's threads busy (`speedlimit.verify.clock`)."""

    hz_one_core: float | None = None
    hz_all_busy: float | None = None
    busy_cores: int = 1
    basis: str = ""


class MachineInfo(BaseModel):
    cpu: str = ""
    cpu_vendor: str = ""  # /proc/cpuinfo vendor_id (GenuineIntel, AuthenticAMD; '' where none)
    cores: int = 1  # logical CPUs this process may run on
    memory_bytes: float | None = None
    layout: CpuLayout | None = None  # sockets, NUMA nodes, cores, threads per core (None: verify before detection)
    clock: ClockInfo | None = None  # None: a result written before verify measured clocks
    load_average_start: list[float] | None = None
    load_average_end: list[float] | None = None


class ModelInfo(BaseModel):
    path: str
    name: str
    file_type: str = ""
    # its layers' matmul weights by tensor type: parameters (`WeightBytes.matmul_types`)
    matmul_types: dict[str, float] = Field(default_factory=dict)
    file_bytes: int = 0
    weights_bytes: float = 0.0
    total_params: float = 0.0
    context_length: int | None = None
    kv_bytes_per_token: float = 0.0
    kernels_per_step: float = 0.0  # kernels one step launches as llama.cpp runs this architecture


class BandwidthInfo(BaseModel):
    kernels: list[membench.KernelResult] = Field(default_factory=list)
    counting: str = ""
    array_bytes: int = 0
    basis: str = ""
    single_thread_Bps: float | None = None


class MatmulInfo(BaseModel):
    n: int = 0
    dtype: str = ""
    best_flops: float
    runs_flops: list[float] = Field(default_factory=list)
    threads: int | str | None = None
    basis: str = ""


class EngineInfo(BaseModel):
    name: str
    version: str = ""
    system_info: str = ""
    threads: int
    thread_counts: list[int] = Field(default_factory=list)
    n_ctx: int = 0
    n_batch: int = 512
    kv_type: str = KV_TYPE
    sampling: str = ""
    preflight: dict[str, float] = Field(default_factory=dict)
    # the engine profile whose measured kernel rates price the prediction (None: bandwidth and BLAS FLOP/s only)
    kernel_profile: str | None = None
    kernel_profile_basis: str = ""


class PrefillPoint(BaseModel):
    """One timed prefill: its work as the estimator counts it, measured and predicted times."""

    threads: int
    prompt_tokens: int
    runs_s: list[float] = Field(default_factory=list)
    median_s: float = Field(gt=0)
    tok_s: float | None = None
    runs_spread: float = 1.0
    ttft_s_predicted: float | None = None
    ttft_s_limit: float | None = None
    efficiency: float | None = None
    step_bytes: float = Field(gt=0)
    step_flops: float = Field(gt=0)
    bandwidth_Bps: float | None = None
    flops: float | None = None
    # of step_flops and step_bytes: the attention's FLOPs and the KV cache's bytes, and the FLOP/s of the build's
    # attention kernel where the prediction priced it as a kernel of its own (fold C; None: inside the roofline)
    attention_flops: float = Field(default=0.0, ge=0)
    kv_bytes: float = Field(default=0.0, ge=0)
    attention_flops_per_s: float | None = Field(default=None, gt=0)


class DecodePoint(BaseModel):
    """Decode timed from a context: per-token work as the estimator counts it, measured and predicted speed."""

    kind: Literal["base", "context"]
    threads: int
    context_start: int
    tokens: int = 0
    runs_tok_s: list[float] = Field(default_factory=list)
    runs_spread: float = 1.0
    tok_s: float = Field(gt=0)
    tok_s_predicted: float | None = None
    tok_s_limit: float | None = None
    efficiency: float | None = None
    bytes_per_token: float = Field(gt=0)
    flops_per_token: float = Field(ge=0)
    regime: str = "memory"
    bandwidth_Bps: float | None = None
    flops: float | None = None
    attention_flops: float = Field(default=0.0, ge=0)  # per token, as PrefillPoint's
    kv_bytes: float = Field(default=0.0, ge=0)
    attention_flops_per_s: float | None = Field(default=None, gt=0)


class BatchedDecodePoint(BaseModel):
    """Decode steps of several sequences at once (each with its own ``context`` tokens cached): the step's work as the
    estimator counts it, measured and predicted step times."""

    threads: int
    sequences: int = Field(ge=1)
    context: int = Field(ge=1)
    steps_s: list[float] = Field(default_factory=list)
    step_s: float = Field(gt=0)  # median of the timed steps
    steps_spread: float = 1.0  # the slowest tenth of the steps over the fastest tenth (90th / 10th percentile)
    step_s_predicted: float | None = None
    step_s_limit: float | None = None
    step_bytes: float = Field(gt=0)
    step_flops: float = Field(ge=0)
    attention_flops: float = Field(default=0.0, ge=0)  # of the step, as PrefillPoint's
    kv_bytes: float = Field(default=0.0, ge=0)
    attention_flops_per_s: float | None = Field(default=None, gt=0)

    @property
    def tok_s(self) -> float:
        """Tokens per second over all the sequences."""
        return self.sequences / self.step_s


class DefaultEfficiency(BaseModel):
    bw_efficiency: float
    flops_efficiency: float
    step_overhead_s: float
    basis: str = ""


class VerifyResult(Artifact):
    """What `speedlimit verify` measured and predicted; written after every stage, ``complete`` at the end."""

    KIND: ClassVar[str] = "verify"

    complete: bool = False
    interrupted: str | None = None  # the signal (SIGINT, SIGTERM) that stopped the run; what it holds is partial
    started_at: str = ""
    finished_at: str | None = None
    settings: VerifySettings | None = None
    machine: MachineInfo = Field(default_factory=MachineInfo)
    model: ModelInfo | None = None
    bandwidth: BandwidthInfo | None = None
    measured_bandwidth_Bps: float | None = None
    matmul: MatmulInfo | None = None
    matmul_single_thread: MatmulInfo | None = None
    measured_flops: float | None = None
    engine: EngineInfo | None = None
    prefill: list[PrefillPoint] = Field(default_factory=list)
    decode: list[DecodePoint] = Field(default_factory=list)
    batched_decode: list[BatchedDecodePoint] = Field(default_factory=list)
    batched_decode_error: str | None = None  # why the batched series stopped short (the rest of the run goes on)
    # the headline, at the run's thread count
    threads: int | None = None
    decode_tok_s_measured: float | None = None
    decode_tok_s_predicted: float | None = None
    decode_tok_s_limit: float | None = None
    efficiency: float | None = None
    prefill_tok_s_measured: float | None = None
    ttft_s_measured: float | None = None
    ttft_s_predicted: float | None = None
    ttft_s_limit: float | None = None
    prefill_efficiency: float | None = None
    bytes_per_token: float | None = None
    flops_per_token: float | None = None
    regime: str | None = None
    default_efficiency: DefaultEfficiency | None = None


# --- predictions ------------------------------------------------------------------------------------


def measured_hardware(bandwidth_Bps: float, flops: float, memory_bytes: float | None, label: str,
                      threads: int | None = None, clock_hz: tuple[float, float] | None = None) -> Hardware:
    """This machine as the estimator sees it: measured bandwidth and fp32 FLOP/s, kind ``cpu``.

    With ``threads`` and ``clock_hz`` (the measured clock with one core and with ``threads`` cores busy) it is a
    ``threads``-core CPU at those clocks, so an engine profile's per-cycle kernel rates can price its matmuls; the
    bandwidth stays the one measured at that thread count (no per-core or NUMA limit is applied to it)."""
    layout: dict[str, Any] = {}
    if threads is not None and clock_hz is not None:
        one, busy = clock_hz
        layout = dict(sockets=1, cores_per_socket=threads, threads_per_core=1,
                      base_clock_hz=min(one, busy) if threads > 1 else one, boost_clock_hz=max(one, busy) if threads > 1 else one)
    try:
        return Hardware(key="this-machine", name=f"this machine ({label})", vendor="measured", kind="cpu",
                        memory_bandwidth_Bps=bandwidth_Bps, memory_bytes=memory_bytes, flops={"fp32": flops},
                        source="speedlimit verify", **layout)
    except ValueError as error:
        raise SpeedlimitError(f"measured figures are unusable ({error})") from None


def kernel_profile_for(system_info: str, cpu_vendor: str = "") -> tuple[str | None, str]:
    """(engine profile, why) whose measured CPU kernel rates match the build llama.cpp reports in its system info,
    on this vendor's cores (``cpu_vendor``: /proc/cpuinfo's vendor_id).

    The rates are per build: `[llama-cpp-cpu]` was measured with AVX-512 kernels, `[llama-cpp-cpu-avx2]` as
    README's install line builds llama-cpp-python (GGML_NATIVE=OFF: AVX2, no AVX-512) on a Zen 4 core, and
    `[llama-cpp-cpu-intel]` that build on an Intel core (fold C amendment 8). Other builds (ARM, AVX only)
    have no measured rates: None, and the prediction prices bandwidth and BLAS FLOP/s only."""
    # "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | ... |" (one line per backend in newer builds)
    features = {name.split(":")[-1].strip().upper(): value.strip()
                for name, sep, value in (item.partition("=") for item in re.split(r"[|\n]", system_info)) if sep}
    if features.get("AVX512") == "1":
        return "llama-cpp-cpu", "the build reports AVX512 = 1: the AVX-512 kernels fold C measured"
    if features.get("AVX2") == "1" and cpu_vendor == "GenuineIntel":
        return ("llama-cpp-cpu-intel", "the build reports AVX2 = 1 without AVX512 on an Intel CPU: the "
                "GGML_NATIVE=OFF kernels fold C measured on an Intel core")
    if features.get("AVX2") == "1":
        return "llama-cpp-cpu-avx2", "the build reports AVX2 = 1 without AVX512: the GGML_NATIVE=OFF kernels fold C measured"
    return None, "no measured kernel rates for this build (neither AVX512 nor AVX2 in its system info)"


def predict(arch: Architecture, hardware: Hardware, prompt: int, output: int,
            engine: str | None = None, batch: int = 1) -> tuple[Estimate, Estimate]:
    """(default-efficiency estimate, roofline-limit estimate at 100 % efficiency and no overhead), of ``batch``
    sequences decoding together.

    ``engine``: the profile whose kernel rates price the default estimate's matmuls (where ``hardware`` has clocks);
    the limit is always the measured bandwidth and BLAS FLOP/s at 100 %."""
    default = estimate(arch, hardware, prompt=prompt, output=output, kv="fp16", batch=batch,
                       **({"engine": engine} if engine else {}))
    limit = estimate(arch, hardware, prompt=prompt, output=output, kv="fp16", batch=batch,
                     bw_efficiency=1.0, flops_efficiency=1.0, step_overhead_s=0.0)
    return default, limit


def step_work(arch: Architecture, kind: str, prompt: int, output: int = 1, sequences: int = 1) -> tuple[float, float]:
    """(bytes, FLOPs) of a step as the estimator counts them: a prefill of ``prompt`` tokens, or the mean decode
    step of ``sequences`` sequences while each one's context grows from ``prompt`` to ``prompt + output`` (bytes and
    FLOPs are linear in context)."""
    step, cost = _step(arch, kind, prompt, output, sequences)
    return float(core.step_bytes(cost, step)), float(core.step_flops(cost, step))


def step_attention(arch: Architecture, kind: str, prompt: int, output: int = 1, sequences: int = 1) -> tuple[float, float]:
    """(attention FLOPs, KV-cache bytes) of the step `step_work` counts: the part of its work a CPU attention kernel
    of its own does (`core.attention_kernel_seconds`)."""
    step, cost = _step(arch, kind, prompt, output, sequences)
    return float(core.step_attention_flops(cost, step)), float(core.step_kv_bytes(cost, step))


def _step(arch: Architecture, kind: str, prompt: int, output: int, sequences: int) -> tuple[core.StepBatch, core.CostModel]:
    cost, _ = cost_model(arch, None, parse_precision("fp16"))
    if kind == "prefill":
        return core.prefill_batch(cost, 1, prompt), cost
    return core.decode_batch(cost, sequences, prompt + output / 2), cost


def attention_kernel_flops(arch: Architecture, hardware: Hardware, engine: str | None) -> tuple[float | None, float | None]:
    """(decode, prefill) FLOP/s of the build's attention kernel as the prediction prices it on ``hardware`` with
    ``engine``'s profile, or (None, None) where attention rides the roofline."""
    if engine is None:
        return None, None
    machine = step_model(arch, hardware, kv="fp16", engine=engine).machine
    if not core.attention_apart(machine):
        return None, None
    return float(machine.attention_decode_flops), float(machine.attention_prefill_flops)


# --- checks -----------------------------------------------------------------------------------------


def load_model_info(path: Path) -> tuple[Architecture, ModelInfo]:
    """Architecture and file details of a GGUF, with clear errors for a missing or unreadable file."""
    from speedlimit.gguf_model import architecture_from_gguf

    path = Path(path).expanduser()
    if not path.exists():
        raise SpeedlimitError(f"no such model file: {path}; pass --model PATH.gguf (or omit it for the bundled SmolLM2-135M)")
    if not os.access(path, os.R_OK) or not path.is_file():
        raise SpeedlimitError(f"cannot read model file {path}; pass a readable --model PATH.gguf")
    arch = architecture_from_gguf(path)
    info = ModelInfo(
        path=str(path.resolve()),
        name=display_name(path, arch.name),
        file_type=arch.weight_bytes.file_type if arch.weight_bytes else "",
        matmul_types=dict(arch.weight_bytes.matmul_types) if arch.weight_bytes else {},
        file_bytes=path.stat().st_size,
        weights_bytes=cost_model(arch, None, parse_precision("fp16"))[0].total_weight_bytes,
        total_params=arch.total_params,
        context_length=arch.max_context or None,
        kv_bytes_per_token=arch.kv_elements_per_token_global * 2 + arch.kv_elements_per_token_local * 2,
        kernels_per_step=arch.decode_kernels,
    )
    return arch, info


def check_fits(model: ModelInfo, n_ctx: int, memory_bytes: float | None) -> float:
    """Bytes the engine needs (file + KV cache at n_ctx); error when that exceeds this machine's RAM."""
    need = model.file_bytes + model.kv_bytes_per_token * n_ctx + 64 * MIB
    if memory_bytes is not None and need > memory_bytes:
        raise SpeedlimitError(
            f"{Path(model.path).name} needs {need / 2**30:.1f} GiB (weights + KV cache at {n_ctx} tokens) but this "
            f"machine has {memory_bytes / 2**30:.1f} GiB of RAM; pass a smaller --model or shorter --contexts"
        )
    return need


# --- the run ----------------------------------------------------------------------------------------


def total_steps(settings: VerifySettings) -> int:
    thread_configs = 2 if settings.single_thread and settings.threads > 1 else 1
    bandwidth = 4 * thread_configs + 1  # 3 kernels and a matmul per thread count, and the clock
    # preflight, warm-up + runs, contexts, batched decodes
    engine = 1 + thread_configs * (1 + settings.runs) + len(settings.contexts) + len(settings.batch_sequences)
    return bandwidth + engine + 1  # + predictions


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _spread(values: list[float]) -> float:
    """The 90th percentile over the 10th (1 for fewer than two values)."""
    if len(values) < 2:
        return 1.0
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return deciles[-1] / deciles[0] if deciles[0] > 0 else 1.0


def run_verify(settings: VerifySettings, out: Path | None = None,
               on_step: Callable[[str], None] | None = None, stop: StopFlag | None = None) -> VerifyResult:
    """Measure, run, predict; the full result (also written to ``out`` after every stage).

    With ``stop``: once its flag is set, the next step ends the run with `VerifyInterrupted`, after writing the
    partial result (``interrupted`` set, ``complete`` false) to ``out``."""
    started: list[VerifyResult] = []  # the result, once there is one
    done = [0]

    def step(label: str) -> None:
        if stop is not None and stop.signal is not None:
            raise _Stop
        done[0] += 1
        if on_step is not None:
            on_step(label)

    try:
        return _run_verify(settings, out, step, lambda: stop is not None and stop.signal is not None, started)
    except _Stop:
        assert stop is not None and stop.signal is not None
        result = started[0] if started else None
        if result is not None:
            result.interrupted = stop.signal
            result.finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
            result.machine.load_average_end = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
            if out is not None:
                result.save(out)
        raise VerifyInterrupted(stop.signal, result, done[0], total_steps(settings)) from None


def _run_verify(settings: VerifySettings, out: Path | None, step: Callable[[str], None], stopped: Callable[[], bool],
                started: list[VerifyResult]) -> VerifyResult:
    from speedlimit.verify import engine

    engine.import_llama_cpp()  # fail before spending a minute on bandwidth
    arch, model = load_model_info(settings.model_path)
    max_context = max(settings.contexts) if settings.contexts else 0
    n_ctx = max(settings.prompt_tokens + 2 * settings.decode_tokens, max_context + settings.runs * settings.decode_tokens) + 16
    if model.context_length and n_ctx > model.context_length:
        raise SpeedlimitError(
            f"{Path(model.path).name} supports {model.context_length} tokens of context but this run needs {n_ctx}; "
            "use smaller --contexts/--prompt-tokens/--decode-tokens"
        )
    memory_bytes = membench.machine_memory_bytes()
    # a batched decode's context lives beside the runner's: its sequences' KV cache counts too
    batch_cells = max(settings.batch_sequences, default=0) * (settings.batch_context + settings.decode_tokens + 16)
    check_fits(model, n_ctx + batch_cells, memory_bytes)

    cores = membench.cpu_count()
    thread_counts = [settings.threads] + ([1] if settings.single_thread and settings.threads > 1 else [])
    result = VerifyResult(
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        settings=settings,
        machine=MachineInfo(cpu=membench.cpu_model_name(), cpu_vendor=membench.cpu_vendor_id(), cores=cores,
                            memory_bytes=memory_bytes,
                            layout=detect_layout(allowed=membench.allowed_cpus()),
                            load_average_start=list(os.getloadavg()) if hasattr(os, "getloadavg") else None),
        model=model,
    )
    started.append(result)

    def save() -> None:
        if out is not None:
            result.save(out)

    save()
    # 1. the machine ---------------------------------------------------------------------------------
    kernels = []
    for threads in thread_counts:
        kernels += membench.measure_bandwidth(settings.array_mib * MIB, threads=threads,
                                              repeats=settings.bandwidth_repeats, on_step=step)
    best_all = max((k for k in kernels if k.threads == settings.threads), key=lambda k: k.best_Bps)
    best_one = max((k for k in kernels if k.threads == 1), key=lambda k: k.best_Bps, default=None)
    result.bandwidth = BandwidthInfo(
        kernels=kernels,
        counting="STREAM convention: copy 2 arrays, triad 3, read 1; write-allocate traffic not counted",
        array_bytes=settings.array_mib * MIB,
        basis=f"best kernel ({best_all.kernel}) at {settings.threads} threads",
        single_thread_Bps=best_one.best_Bps if best_one else None,
    )
    result.measured_bandwidth_Bps = best_all.best_Bps
    save()
    pinned = None if settings.threads == cores else settings.threads  # BLAS at the engine's thread count
    matmul = (pinned and membench.measure_matmul_flops(settings.matmul_n, repeats=3, threads=pinned, on_step=step)) or \
        membench.measure_matmul_flops(settings.matmul_n, repeats=3, on_step=step)
    result.matmul = MatmulInfo(**matmul.to_dict(), threads=pinned or "numpy BLAS default (all cores)")
    result.measured_flops = matmul.best_flops
    measured = {settings.threads: (best_all.best_Bps, matmul.best_flops)}  # threads -> (bandwidth, FLOP/s)
    if best_one is not None:
        single = membench.measure_matmul_flops(settings.matmul_n, repeats=3, threads=1, on_step=step)
        # Where BLAS threads cannot be pinned, 1 thread's FLOP/s is taken as the all-core figure ÷ cores.
        single_flops = single.best_flops if single else matmul.best_flops / max(cores, 1)
        result.matmul_single_thread = MatmulInfo(**single.to_dict(), threads=1) if single else MatmulInfo(
            best_flops=single_flops, threads=1, basis="all-core BLAS figure ÷ cores (BLAS threads not settable)")
        measured[1] = (best_one.best_Bps, single_flops)
    save()
    busy = min(settings.threads, cores)  # more chains than cores would time the scheduler, not the clock
    step(f"clock: dependent adds at 1 and {busy} busy cores")
    clocks = clock.measure_clock(busy)
    result.machine.clock = ClockInfo(hz_one_core=clocks.hz_one_core, hz_all_busy=clocks.hz_all_busy,
                                     busy_cores=clocks.busy_cores, basis=clocks.basis)
    save()

    # 2. the engine ----------------------------------------------------------------------------------
    step("engine: preflight (child process)")
    check = engine.preflight(Path(model.path), settings.threads, stopped=stopped)
    if check is None:  # stopped while the child ran
        raise _Stop
    result.engine = EngineInfo(
        name="llama-cpp-python", version=engine.engine_version(), system_info=engine.engine_system_info(),
        threads=settings.threads, thread_counts=thread_counts, n_ctx=n_ctx, n_batch=512, kv_type=KV_TYPE,
        sampling="greedy argmax over the last logits; exactly decode_tokens tokens per run (EOS is not a stop)",
        preflight={k: check[k] for k in ("tokens", "prefill_s", "decode_s")},
    )
    profile, why = kernel_profile_for(result.engine.system_info, result.machine.cpu_vendor)
    if profile is not None and clocks.hz_one_core is None:
        profile, why = None, f"{why}, but {clocks.basis}: bandwidth and BLAS FLOP/s only"
    result.engine.kernel_profile, result.engine.kernel_profile_basis = profile, why
    save()

    def machine_at(threads: int) -> Hardware:
        bandwidth, flops = measured[threads]
        label = f"{threads} thread{'s' if threads > 1 else ''}"
        if profile is None or clocks.hz_one_core is None or clocks.hz_all_busy is None:
            return measured_hardware(bandwidth, flops, memory_bytes, label)
        busy = clocks.hz_all_busy if threads > 1 else clocks.hz_one_core
        return measured_hardware(bandwidth, flops, memory_bytes, label, threads=threads, clock_hz=(clocks.hz_one_core, busy))

    hardware = {threads: machine_at(threads) for threads in measured}
    attention_rates = {threads: attention_kernel_flops(arch, hw, profile) for threads, hw in hardware.items()}

    def add_points(threads: int, prefill_s: list[float], decode_s: list[float]) -> None:
        hw = hardware[threads]
        prompt, count = settings.prompt_tokens, settings.decode_tokens
        default, limit = predict(arch, hw, prompt, count, profile)
        ttft = _median(prefill_s)
        p_bytes, p_flops = step_work(arch, "prefill", prompt)
        p_attention, p_kv = step_attention(arch, "prefill", prompt)
        result.prefill.append(PrefillPoint(
            threads=threads, prompt_tokens=prompt, runs_s=prefill_s, median_s=ttft,
            tok_s=prompt / ttft, runs_spread=max(prefill_s) / min(prefill_s), ttft_s_predicted=default.ttft_s,
            ttft_s_limit=limit.ttft_s, efficiency=(limit.ttft_s / ttft) if limit.ttft_s else None,
            step_bytes=p_bytes, step_flops=p_flops, bandwidth_Bps=hw.memory_bandwidth_Bps, flops=hw.peak_flops("fp32"),
            attention_flops=p_attention, kv_bytes=p_kv, attention_flops_per_s=attention_rates[threads][1],
        ))
        result.decode.append(decode_point("base", threads, prompt, count, [count / s for s in decode_s], default, limit, hw))

    def decode_point(kind: str, threads: int, context: int, tokens: int, rates: list[float],
                     default: Estimate, limit: Estimate, hw: Hardware) -> DecodePoint:
        measured = _median(rates)
        d_bytes, d_flops = step_work(arch, "decode", context, tokens)
        d_attention, d_kv = step_attention(arch, "decode", context, tokens)
        return DecodePoint(
            kind=kind, threads=threads, context_start=context, tokens=tokens, runs_tok_s=rates,
            runs_spread=max(rates) / min(rates),  # fastest ÷ slowest run: > NOISY_SPREAD flags disturbed runs
            tok_s=measured, tok_s_predicted=default.decode_tok_s, tok_s_limit=limit.decode_tok_s,
            efficiency=measured / limit.decode_tok_s, bytes_per_token=d_bytes, flops_per_token=d_flops,
            regime=limit.regime, bandwidth_Bps=hw.memory_bandwidth_Bps, flops=hw.peak_flops("fp32"),
            attention_flops=d_attention, kv_bytes=d_kv, attention_flops_per_s=attention_rates[threads][0],
        )

    for threads in thread_counts:
        n_ctx_here = n_ctx if threads == settings.threads else settings.prompt_tokens + 2 * settings.decode_tokens + 16
        runner = engine.LlamaRunner(Path(model.path), n_ctx=n_ctx_here, n_threads=threads)
        try:
            step(f"engine: warm-up, {threads} thread{'s' if threads > 1 else ''}")
            runner.prefill(min(32, settings.prompt_tokens))
            runner.decode(min(8, settings.decode_tokens))
            prefill_s: list[float] = []
            decode_s: list[float] = []
            try:
                for index in range(settings.runs):
                    step(f"engine: prefill {settings.prompt_tokens} + decode {settings.decode_tokens}, "
                         f"{threads} thread{'s' if threads > 1 else ''} (run {index + 1}/{settings.runs})")
                    prefill_s.append(runner.prefill(settings.prompt_tokens))
                    decode_s.append(runner.decode(settings.decode_tokens)[0])
            except _Stop:  # keep the runs that finished (fewer than --runs: their lists say how many)
                if prefill_s:
                    add_points(threads, prefill_s, decode_s)
                raise
            add_points(threads, prefill_s, decode_s)
            save()
            if threads == settings.threads and settings.contexts:
                runner.reset()
                for context in settings.contexts:
                    step(f"engine: decode at context {context}")
                    runner.extend_to(context)
                    start = runner.n_tokens
                    rates = [settings.decode_tokens / runner.decode(settings.decode_tokens)[0] for _ in range(settings.runs)]
                    span = settings.runs * settings.decode_tokens
                    default, limit = predict(arch, hardware[threads], start, span, profile)
                    result.decode.append(decode_point("context", threads, start, span, rates, default, limit, hardware[threads]))
                    save()
            if threads == settings.threads:
                context = settings.batch_context
                for sequences in settings.batch_sequences:
                    step(f"engine: decode of {sequences} sequence{'s' if sequences > 1 else ''} together at context "
                         f"{context}")
                    try:
                        steps_s = runner.batched_decode(sequences, context, settings.decode_tokens)
                    except SpeedlimitError as error:  # e.g. no memory for the sequences' context: the rest stands
                        result.batched_decode_error = str(error)
                        save()
                        break
                    default, limit = predict(arch, hardware[threads], context, settings.decode_tokens, profile,
                                             batch=sequences)
                    s_bytes, s_flops = step_work(arch, "decode", context, settings.decode_tokens, sequences)
                    s_attention, s_kv = step_attention(arch, "decode", context, settings.decode_tokens, sequences)
                    result.batched_decode.append(BatchedDecodePoint(
                        threads=threads, sequences=sequences, context=context, steps_s=steps_s,
                        step_s=_median(steps_s), steps_spread=_spread(steps_s),
                        step_s_predicted=default.itl_s, step_s_limit=limit.itl_s, step_bytes=s_bytes,
                        step_flops=s_flops, attention_flops=s_attention, kv_bytes=s_kv,
                        attention_flops_per_s=attention_rates[threads][0],
                    ))
                    save()
        finally:
            runner.close()

    # 3. the headline ---------------------------------------------------------------------------------
    step("predictions")
    base = next(p for p in result.decode if p.kind == "base" and p.threads == settings.threads)
    prefill = next(p for p in result.prefill if p.threads == settings.threads)
    default, limit = predict(arch, hardware[settings.threads], settings.prompt_tokens, settings.decode_tokens, profile)
    result.threads = settings.threads
    result.decode_tok_s_measured = base.tok_s
    result.decode_tok_s_predicted = base.tok_s_predicted
    result.decode_tok_s_limit = base.tok_s_limit
    result.efficiency = base.efficiency
    result.prefill_tok_s_measured = prefill.tok_s
    result.ttft_s_measured = prefill.median_s
    result.ttft_s_predicted = prefill.ttft_s_predicted
    result.ttft_s_limit = prefill.ttft_s_limit
    result.prefill_efficiency = prefill.efficiency
    result.bytes_per_token = default.bytes_per_token
    result.flops_per_token = default.flops_per_token
    result.regime = limit.regime
    result.default_efficiency = DefaultEfficiency(bw_efficiency=default.bw_efficiency,
                                                  flops_efficiency=default.flops_efficiency,
                                                  step_overhead_s=default.step_overhead_s, basis=default.efficiency_basis)
    result.machine.load_average_end = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result.finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result.complete = True
    save()
    return result
