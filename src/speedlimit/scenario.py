"""The scenario: everything one estimate is asked about (model, hardware, precision, parallelism, workload), validated once.

`Scenario` owns the inputs' names, descriptions, defaults, bounds and conflicts. The CLI options of `estimate`
(and the ones `sweep` shares), the web API's request body and `estimate()`'s keyword arguments are all derived
from its fields, so each input is described in exactly one place. `scenario_from` turns bad input into one
`SpeedlimitError` that names the flag. Turning a scenario into an architecture, a cost model and a machine is the
estimator's job (`speedlimit.estimator.api.resolve`), so that anything else that prices steps (the simulator)
starts from the same validated inputs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, InstanceOf, ValidationError, field_validator, model_validator

from speedlimit.architecture import Architecture
from speedlimit.catalog import MAX_NAME_CHARS
from speedlimit.engine_profile import EngineProfile
from speedlimit.errors import SpeedlimitError, pydantic_message
from speedlimit.hardware import NUMA_POLICIES, Hardware, check_bandwidth, check_flops, check_memory
from speedlimit.precision import MAX_WEIGHTS_CHARS
from speedlimit.units import parse_quantity

# Safety bounds that turn absurd input into an error rather than a silly number.
MAX_BATCH = 10_000_000
MAX_TOKENS = 100_000_000
MAX_TP = 4096
# Devices one deployment may span (tp · pp · dp): the largest published clusters serve on far fewer.
MAX_DEVICES = 65_536
MAX_USD_PER_HOUR = 1e6
# llama.cpp's thread pool holds at most GGML_MAX_N_THREADS = 512 threads (ggml/include/ggml.h).
MAX_THREADS = 512
# The peak-FLOPs columns a matmul can run at (hardware.toml `flops` keys).
COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4", "int4")


class Flag(NamedTuple):
    """How a `Scenario` field is spelled on the command line (read by `speedlimit.cli`).

    ``text``: the option takes text (a quantity like ``3.35TB`` or a name) that the field parses.
    """

    names: tuple[str, ...]
    text: bool = False


def flag_name(field: str) -> str:
    """The long CLI option of a field (``bw_efficiency`` → ``--bw-efficiency``)."""
    info = Scenario.model_fields.get(field)
    flag = next((m for m in info.metadata if isinstance(m, Flag)), None) if info else None
    return flag.names[0] if flag else "--" + field.replace("_", "-")


def check_layout(tp: int, pp: int, dp: int, ep: int) -> None:
    """Raise ValueError where the devices' layout cannot be: more than `MAX_DEVICES` devices, or experts split over
    other than every device of a pipeline stage."""
    if tp * pp * dp > MAX_DEVICES:
        raise ValueError(f"--tp × --pp × --dp is {tp * pp * dp:,} devices, more than {MAX_DEVICES:,}")
    if ep > 1 and ep != tp * dp:
        raise ValueError(f"--ep {ep} must be 1 or --tp × --dp = {tp * dp}: the experts are split over every device of "
                         "a pipeline stage (vLLM's expert-parallel group is its TP × DP group)")


class Scenario(BaseModel):
    """One configuration to estimate. Conflicting inputs are an error that names both.

    Hardware is exactly one of: ``hardware`` (a catalog name, a calibrated profile or a `Hardware`), ``profile``
    (a calibrated profile name), or ``bandwidth`` [+ ``flops``, ``memory``] (custom hardware).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False)

    model: Annotated[str | InstanceOf[Architecture], Flag(("--model", "-m"), text=True)] = Field(
        description="Catalog name, path to config.json or .gguf, or a size like 7B.")
    hardware: Annotated[str | InstanceOf[Hardware] | None, Flag(("--hardware", "-H"), text=True)] = Field(
        None, description="Catalog hardware name or calibrated profile (e.g. local).")
    profile: Annotated[str | None, Flag(("--profile",), text=True)] = Field(
        None, description="Calibrated profile name (from `speedlimit calibrate`).")
    bandwidth: Annotated[float | None, Flag(("--bandwidth",), text=True)] = Field(
        None, description="Custom hardware: peak memory bandwidth, bytes/s (3.35e12, 3.35TB).")
    flops: Annotated[float | None, Flag(("--flops",), text=True)] = Field(
        None, description="Custom hardware: peak FLOP/s (989e12, 989T).")
    memory: Annotated[float | None, Flag(("--memory",), text=True)] = Field(
        None, description="Custom hardware: memory capacity, bytes (80e9, 80GB).")
    weights: Annotated[str | float | None, Flag(("--weights",), text=True)] = Field(
        None, description="Weight format: bits (16, 8, 4) or fp16/bf16/fp8/int8/int4/nf4/mxfp4/nvfp4/q4_0/q8_0/q4_k_m… "
                          "(fp8 as the engines run it: the embedding table and LM head stay 16-bit), "
                          "or one per tensor group: experts=mxfp4,attention=bf16,default=q4_k (groups: attention, dense, "
                          "experts, embeddings, lm_head, default); mxfp4_moe is llama.cpp's MXFP4 MoE file type (default: "
                          "a .gguf file's exact bytes, else the format the checkpoint ships in per its config's "
                          "quantization_config, e.g. fp8 for DeepSeek-V3/R1, else bf16; `shipped` asks for it by name).")
    kv: Annotated[str | float | None, Flag(("--kv",), text=True)] = Field(
        None, description="KV-cache format: fp16, bf16, fp8, int8, int4, q8_0… (default: the engine's; llama.cpp: fp16).")
    engine: Annotated[str | InstanceOf[EngineProfile] | None, Flag(("--engine",), text=True)] = Field(
        None, description="Serving engine profile (catalog/engines.toml): llama.cpp (default; its backend from the "
                          "device), llama.cpp-cpu/-cuda/-metal/-vulkan/-rocm, llama-cpp-python, mlx, vllm, sglang, tensorrt-llm.")
    compute: Annotated[Literal[COMPUTE_DTYPES] | None, Flag(("--compute",), text=True)] = Field(  # type: ignore[valid-type]
        None, description="Compute dtype of the matmuls: " + ", ".join(COMPUTE_DTYPES) + " (default: from the weights).")
    batch: Annotated[int, Flag(("--batch", "-b"))] = Field(1, ge=1, le=MAX_BATCH, description="Concurrent sequences.")
    prompt: Annotated[int, Flag(("--prompt", "-p"))] = Field(512, ge=0, le=MAX_TOKENS, description="Prompt tokens per sequence.")
    output: Annotated[int, Flag(("--output", "-o"))] = Field(256, ge=1, le=MAX_TOKENS, description="Generated tokens per sequence.")
    tp: Annotated[int, Flag(("--tp",))] = Field(1, ge=1, le=MAX_TP, description="Tensor-parallel devices.")
    pp: Annotated[int, Flag(("--pp",))] = Field(
        1, ge=1, le=MAX_TP, description="Pipeline-parallel stages (--tp devices each); the layers split over them.")
    dp: Annotated[int, Flag(("--dp",))] = Field(
        1, ge=1, le=MAX_TP, description="Data-parallel replicas, each with its share of the batch and its own KV cache "
                                        "(devices: tp × pp × dp).")
    ep: Annotated[int, Flag(("--ep",))] = Field(
        1, ge=1, le=MAX_DEVICES, description="Expert-parallel devices for an MoE model's routed experts: 1, or "
                                             "tp × dp (vLLM's EP group; with --dp, the MoE layers see every replica's tokens).")
    threads: Annotated[int | None, Flag(("--threads", "-t"))] = Field(
        None, ge=1, le=MAX_THREADS, description="CPU: threads of the llama.cpp run (default: every physical core of every "
                                                "socket, as llama.cpp picks); hyperthreads add no bandwidth.")
    numa: Annotated[Literal[NUMA_POLICIES] | None, Flag(("--numa",), text=True)] = Field(  # type: ignore[valid-type]
        None, description="CPU: llama.cpp's --numa policy: none (default: the weights sit on one NUMA node), distribute "
                          "(threads and weights spread over all nodes), isolate (one node's cores and memory).")
    ideal: Annotated[bool, Flag(("--ideal",))] = Field(
        False, description="The seed formula: peak bandwidth ÷ weight bytes, nothing else.")
    bw_efficiency: Annotated[float | None, Flag(("--bw-efficiency",))] = Field(
        None, description="Achievable fraction of peak bandwidth (0-1].")
    flops_efficiency: Annotated[float | None, Flag(("--flops-efficiency",))] = Field(
        None, description="Achievable fraction of peak FLOP/s (0-1].")
    step_overhead_s: Annotated[float | None, Flag(("--step-overhead",))] = Field(
        None, description="Fixed cost of one forward step in seconds (replaces the per-kernel default).")
    usd_per_hour: Annotated[float | None, Flag(("--usd-per-hour",))] = Field(
        None, ge=0, le=MAX_USD_PER_HOUR, description="Price per device-hour, for cost per million tokens.")

    @field_validator("model", "hardware", "profile", "engine", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if len(value) > MAX_NAME_CHARS:
                raise ValueError(f"is {len(value):,} characters long; give a catalog name, a path or a size")
            if "\x00" in value:
                raise ValueError("contains a NUL character")
        return value

    @field_validator("model")
    @classmethod
    def _model_given(cls, value: Any) -> Any:
        if isinstance(value, str) and not value:
            raise ValueError("is empty: pass a catalog name (see `speedlimit models`), a config.json, a .gguf, or a size like 7B")
        return value

    @field_validator("batch", "prompt", "output", "tp", "pp", "dp", "ep", "threads", "bandwidth", "flops", "memory",
                     "bw_efficiency", "flops_efficiency", "step_overhead_s", "usd_per_hour", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # True is an int to Python, not a count or a rate to a user
            raise ValueError(f"must be a number, got {value}")
        return value

    @field_validator("bandwidth", "flops", "memory", mode="before")
    @classmethod
    def _quantity(cls, value: Any, info: Any) -> Any:
        if isinstance(value, str):
            return parse_quantity(value, info.field_name)
        return value

    @field_validator("bandwidth")
    @classmethod
    def _bandwidth(cls, value: float | None) -> float | None:
        return None if value is None else check_bandwidth(value)

    @field_validator("flops")
    @classmethod
    def _flops(cls, value: float | None) -> float | None:
        return None if value is None else check_flops(value)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: float | None) -> float | None:
        return None if value is None else check_memory(value)

    @field_validator("weights", "kv", mode="before")
    @classmethod
    def _format(cls, value: Any, info: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be bits or a format name, not true/false")
        if isinstance(value, str) and len(value) > (MAX_WEIGHTS_CHARS if info.field_name == "weights" else 64):
            raise ValueError(f"is {len(value):,} characters long; give bits or a format name like bf16 or q4_k_m")
        return value

    @field_validator("compute", "numa", mode="before")
    @classmethod
    def _compute(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("bw_efficiency", "flops_efficiency")
    @classmethod
    def _fraction(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= 1:
            raise ValueError(f"must be a fraction in (0, 1], got {value:g}")
        return value

    @field_validator("step_overhead_s")
    @classmethod
    def _overhead(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= 1:
            raise ValueError(f"must be between 0 and 1 second, got {value:g}")
        return value

    @model_validator(mode="after")
    def _one_hardware(self) -> Scenario:
        given = [field for field in ("hardware", "profile", "bandwidth") if getattr(self, field) is not None]
        if len(given) > 1:
            first, second = (flag_name(field) for field in given[:2])
            raise ValueError(f"{first} and {second} both name the hardware: give one of them")
        if self.bandwidth is None and (self.flops is not None or self.memory is not None):
            which = flag_name("flops" if self.flops is not None else "memory")
            raise ValueError(f"{which} describes custom hardware: give --bandwidth BYTES_PER_S too (and no --hardware)")
        if not given:
            raise ValueError("give --hardware NAME (see `speedlimit hardware`), --profile NAME or --bandwidth BYTES_PER_S")
        if self.ideal:
            for field in ("bw_efficiency", "flops_efficiency", "step_overhead_s"):
                if getattr(self, field) is not None:
                    raise ValueError(f"--ideal and {flag_name(field)} conflict: --ideal assumes 100% of peak and no overhead")
            for field in ("threads", "numa"):
                if getattr(self, field) is not None:
                    raise ValueError(f"--ideal and {flag_name(field)} conflict: --ideal prices the peak bandwidth, whatever "
                                     "the threads")
        return self

    @model_validator(mode="after")
    def _parallelism(self) -> Scenario:
        check_layout(self.tp, self.pp, self.dp, self.ep)
        if self.ideal:
            for field in ("pp", "dp", "ep"):
                if getattr(self, field) > 1:
                    raise ValueError(f"--ideal and {flag_name(field)} conflict: the seed formula prices one copy of "
                                     "the weights on --tp devices")
        return self

    @property
    def devices(self) -> int:
        """Devices the deployment spans: tp per pipeline stage, pp stages per replica, dp replicas."""
        return self.tp * self.pp * self.dp

    @property
    def hardware_input(self) -> str | Hardware:
        """What names the hardware: a `Hardware`, a catalog/profile name (the ``local`` profile included)."""
        return self.hardware if self.hardware is not None else self.profile  # type: ignore[return-value]


#: The inputs `Scenario` accepts (estimate()'s keyword arguments, the CLI options, the web fields).
SCENARIO_FIELDS = tuple(Scenario.model_fields)


def scenario_from(**inputs: Any) -> Scenario:
    """A validated `Scenario`, or one `SpeedlimitError` naming the flag (``--batch: ...``) and the problem."""
    try:
        return Scenario(**inputs)
    except ValidationError as error:
        raise SpeedlimitError(pydantic_message(error, location=_flag_location)) from None


def _flag_location(loc: tuple[Any, ...]) -> str:
    return flag_name(str(loc[0])) if loc else ""

