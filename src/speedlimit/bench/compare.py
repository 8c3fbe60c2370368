"""`--compare-estimate`: put a measured run next to the prediction for the same model, hardware and workload, with
measured/predicted ratios (> 1 means slower than predicted for latencies, faster for throughputs).

`replay_for` (what bench uses): the serving simulator runs exactly the workload bench sent (each request's prompt and
output tokens; the concurrency, or the measured send times) and every metric and percentile is compared. Where the
server said how large a KV cache it allocated (vLLM's /metrics, SGLang's), the simulated engine gets that cache;
llama-server's slots (its /props) and SGLang's running-request cap bound the simulated batch and SGLang's
chunked-prefill size its steps (`with_server_engine`); the deployment (engine profile, layout, weights) is the
caller's, else the profile of the engine the metrics name (`server_profile`) and the layout the server reported
(`server_layout`).

`estimate_for` (the static estimate, kept for the API): the workload maps onto `estimate()` as: batch = the concurrency (closed loop) or the measured mean number of requests
in flight (open loop, Little's law), prompt = mean prompt tokens, output = mean output tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from speedlimit.artifacts import Comparison, PredictionBlock, RunSummary, ServerMetrics
from speedlimit.errors import SpeedlimitError

#: (label, the measured figure of a run summary, the predicted `Estimate` field)
COMPARED = (
    ("ttft_s", lambda s: s.ttft_s.p50, "ttft_s"),
    # per token, never per chunk: a server that packs 4 tokens into one event is not 4x slower than predicted
    ("itl_token_s", lambda s: s.itl_token_s.mean, "itl_s"),
    ("tpot_s", lambda s: s.tpot_s.mean, "itl_s"),
    ("e2e_s", lambda s: s.e2e_s.p50, "e2e_s"),
    ("output_tok_s", lambda s: s.output_tok_s, "throughput_tok_s"),
    ("decode_tok_s_per_user", lambda s: s.decode_tok_s_per_user, "decode_tok_s"),
)


def estimate_inputs(summary: RunSummary) -> dict[str, int]:
    """batch/prompt/output for `estimate()` from a run summary (pure)."""
    completed = max(1, summary.completed)
    batch = (summary.offered_load.concurrency if summary.offered_load else None) or summary.mean_in_flight or 1
    return {
        "batch": max(1, int(round(batch))),
        "prompt": max(0, int(round(summary.prompt_tokens / completed))),
        "output": max(1, int(round(summary.output_tokens / completed))),
    }


def compare(summary: RunSummary, predicted: dict[str, Any]) -> dict[str, Comparison]:
    """measured, predicted and measured/predicted for each compared metric (pure)."""
    rows = {}
    for label, measured_of, key in COMPARED:
        measured = measured_of(summary)
        expected = predicted.get(key)
        expected = float(expected) if isinstance(expected, (int, float)) else None
        ratio = measured / expected if measured is not None and expected else None
        rows[label] = Comparison(measured=measured, predicted=expected, ratio=ratio)
    return rows


#: Metrics compared by the replay: every latency at every statistic, then the throughputs.
REPLAY_LATENCIES = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
REPLAY_STATS = ("mean", "p50", "p90", "p95", "p99")
REPLAY_RATES = ("request_s", "output_tok_s", "total_tok_s", "decode_tok_s_per_user")


def replay_figures(summary: RunSummary) -> dict[str, float | None]:
    """Every compared figure of a run summary, measured or simulated (pure)."""
    figures: dict[str, float | None] = {}
    for metric in REPLAY_LATENCIES:
        for stat in REPLAY_STATS:
            figures[f"{metric}.{stat}"] = getattr(getattr(summary, metric), stat)
    for rate in REPLAY_RATES:
        figures[rate] = getattr(summary, rate)
    # the prefix cache's hit rate: what the server's /metrics counted, or what the simulated engine found cached
    simulated = (summary.simulation or {}).get("prefix_cache_hit_rate")
    hits = summary.server.prefix_cache_hit_rate if summary.server is not None else simulated
    if hits is not None:
        figures["prefix_cache_hit_rate"] = hits
    return figures


def replay_for(summary: RunSummary, records, *, hardware: str, served_model: str | None, estimate_model: str | None,
               engine: str | None = None, profile: str | None = None, tp: int | None = None,
               weights: str | None = None, dp: int | None = None, ep: int | None = None) -> PredictionBlock:
    """Simulate the workload this run sent and return the summary's prediction block (``method="simulate"``).
    ``engine``: the replay's scheduler spec (`parse_engine_spec`); ``profile``, ``tp``, ``dp``, ``ep``, ``weights``:
    the deployment the server ran (an engines.toml profile: its step costs and scheduler defaults; the devices'
    layout), as `simulate` takes them; without a profile, the one of the engine the server's /metrics came from
    (`server_profile`); without any of ``tp``, ``dp`` and ``ep``, the layout the server reported (`server_layout`),
    else one device."""
    from speedlimit.simulator import replay
    from speedlimit.simulator.api import replay_conversations

    architecture = _architecture(served_model, estimate_model)
    mismatch = served_file_mismatch(served_model, estimate_model, architecture, weights)
    if mismatch is not None and mismatch not in summary.warnings:
        summary.warnings.append(mismatch)
    # the shared prefixes it sent (bench's endpoint block; a simulated run's engine block)
    sent = ((summary.endpoint or {}).get("workload") or (summary.engine or {}).get("workload") or {})
    for note in (slot_streams_note(engine, summary.server), busy_slots_note(summary.server)):
        if note is not None and note not in summary.notes:
            summary.notes.append(note)
    engine, taken = with_server_engine(engine, summary.server)
    given = {k: v for k, v in (("tp", tp), ("dp", dp), ("ep", ep)) if v is not None}
    reported = server_layout(summary.server) if not given else None
    layout = {"tp": 1, "dp": 1, "ep": 1, **(reported or given)}
    detected = False
    if profile is None:  # the engine the server's /metrics name, at the version it reported
        profile = server_profile(summary.server, hardware)
        detected = profile is not None
    conversations = replay_conversations(sent)
    if sent.get("dataset") and conversations is None and not Path(str(sent["dataset"])).is_file():
        note = (f"the run's dataset {sent['dataset']} is not there: if its rows were conversations, the replay does "
                "not know which turns repeat the turns before them")
        if note not in summary.notes:
            summary.notes.append(note)
    simulated = replay(records, summary.offered_load, architecture, hardware, engine, summary.slo,
                       prefix_tokens=int(sent.get("prefix_tokens") or 0),
                       prefix_groups=int(sent.get("prefix_groups") or 1),
                       profile=profile, weights=weights, conversations=conversations, **layout).summary
    measured, predicted = replay_figures(summary), replay_figures(simulated)
    rows = {}
    for label, value in measured.items():
        expected = predicted.get(label)
        rows[label] = Comparison(measured=value, predicted=expected,
                                 ratio=value / expected if value is not None and expected else None)
    load = summary.offered_load
    inputs = {"requests": float(simulated.requests)}
    if load is not None and load.concurrency:
        inputs["concurrency"] = float(load.concurrency)
    elif load is not None and load.rate is not None:
        inputs["rate"] = float(load.rate)
    if simulated.completed:
        inputs["prompt"] = simulated.prompt_tokens / simulated.completed
        inputs["output"] = simulated.output_tokens / simulated.completed
    inputs.update(taken)
    inputs.update({k: float(v) for k, v in layout.items() if v != 1})
    if reported is not None:
        inputs["layout_from_server"] = 1.0
    if detected:
        inputs["engine_from_server"] = 1.0
    from speedlimit.estimator import estimate

    # the static estimate's fields stay in the block (calibrate fits decode points from them)
    deployment = {**layout, **({"engine": profile} if profile else {}), **({"weights": weights} if weights else {})}
    static = estimate(architecture, hardware, **estimate_inputs(summary), **deployment).to_dict()
    return PredictionBlock(model=estimate_model or served_model or "?", hardware=hardware, method="simulate",
                           inputs=inputs, predicted={**static, **predicted, "engine": simulated.engine,
                                                     "simulation": {k: v for k, v in (simulated.simulation or {}).items()
                                                                    if k != "timeline"}},
                           comparison=rows)


def server_layout(server: ServerMetrics | None) -> dict[str, int] | None:
    """The devices' layout the server reported, in simulate's terms (tp, dp, ep), or None where it said none.

    Plain tensor parallelism is tp GPUs (with ep = tp where the MoE is expert-parallel across them); data-parallel
    replicas without data-parallel attention are dp copies of tp GPUs each; data-parallel attention over dp ranks of a
    tp-GPU server is tp / dp GPUs of attention per rank, the ranks stepping together because the MoE spans all tp GPUs
    (ep = tp), as score.py lays out a data-parallel-attention row (benchmarks/accuracy/SOURCES.md, fold D amendment
    2). A layout the replay does not take (pipeline stages among them) is an error naming the flags that describe
    one it does."""
    if server is None or server.tp is None:
        return None
    tp, dp, ep, pp = server.tp, server.dp or 1, server.ep or 1, server.pp or 1
    if pp == 1 and server.dp_attention and dp > 1:
        if tp % dp == 0 and ep in (1, tp):
            return {"tp": tp // dp, "dp": dp, "ep": tp}
    elif pp == 1 and ep in (1, tp * dp):
        return {"tp": tp, "dp": dp, "ep": ep}
    attention = ", data-parallel attention" if server.dp_attention else ""
    stages = f", pp_size {pp}" if pp > 1 else ""  # the replay takes no pipeline stages (simulate --pp does)
    raise SpeedlimitError(f"the server reports tp_size {tp}, dp_size {dp}, ep_size {ep}{stages}{attention}: a layout "
                          "the replay does not take from it; describe the deployment with --tp, --dp and --ep (ep 1 "
                          "or tp × dp)")


#: What the replay takes from the server's own account of its scheduler, unless the spec sets it: (spec key, the
#: ServerMetrics field, the key recording it in the comparison's inputs).
SERVER_SCHEDULER = (("kv_tokens", "kv_capacity_tokens", "kv_tokens_from_server"),
                    ("max_seqs", "slots", "max_seqs_from_server"),
                    ("max_seqs", "max_running", "max_seqs_from_server"),
                    ("max_batched_tokens", "batched_tokens", "max_batched_tokens_from_server"))


def with_server_engine(engine: str | None, server: ServerMetrics | None) -> tuple[str | None, dict[str, float]]:
    """The replay's engine spec given what the server said of its own scheduler, unless the spec sets it: the KV
    cache it allocated (vLLM's /metrics, SGLang's server info or /metrics), the sequences it runs at once
    (llama-server's slots, its /props; SGLang's running-request cap), the tokens a step prefills (SGLang's
    chunked-prefill size). Each is a fact of the run, as a command line's flag is. A spec without a mode stays
    without one (the engine's own scheduler); a serial spec takes no cap on sequences. Returns (spec, what was taken,
    keyed as the comparison's inputs record it)."""
    from speedlimit.simulator import parse_engine_spec
    from speedlimit.simulator.api import slot_history_option

    given = parse_engine_spec(engine)
    options: list[str] = []
    taken: dict[str, float] = {}
    for key, field_name, label in SERVER_SCHEDULER if server is not None else ():
        value = getattr(server, field_name)
        if value is None or not math.isfinite(value) or value < 1 or key in given \
                or any(option.startswith(key + "=") for option in options) \
                or (key == "max_seqs" and given["mode"] == "serial"):
            continue
        taken[label] = float(int(value))
        options.append(f"{key}={int(value)}")
        if key == "kv_tokens" and server.kv_block_size and "block_size" not in given:
            options.append(f"block_size={server.kv_block_size}")
    history = server.slot_history if server is not None and server.engine == "llamacpp" else None
    if history and given.get("slot_streams") and "slots_used" not in given and "slot_history" not in given \
            and given.get("max_seqs", server.slots) == server.slots:
        # which slots the run's requests get, and so how a step splits into passes (`EngineConfig.slot_history`)
        options.append(slot_history_option(history))
        taken["slots_used_from_server"] = float(len(history))
    if not options:
        return engine, {}
    return ",".join([engine, *options] if engine else options), taken


def slot_streams_note(engine: str | None, server: ServerMetrics | None) -> str | None:
    """A note where a llama-server with several slots is replayed without saying how its KV cache was laid out: its
    /props does not tell a cache per slot (``--parallel N``, the replay's ``slot_streams=1``) from one pool
    (``--kv-unified``, and its default when --parallel is not given), and the two step differently."""
    from speedlimit.simulator import parse_engine_spec

    if server is None or server.engine != "llamacpp" or not server.slots or server.slots < 2 \
            or "slot_streams" in parse_engine_spec(engine):
        return None
    return (f"llama-server ran {int(server.slots)} slots: if it was started with --parallel {int(server.slots)} and no "
            "--kv-unified, each slot has a KV cache of its own and a step runs one forward pass per run of consecutive "
            "busy slots; add slot_streams=1 to --replay-engine to replay that (simulate --slot-streams)")


def busy_slots_note(server: ServerMetrics | None) -> str | None:
    """A note where llama-server's /slots showed requests running as the run began: not bench's (its warm-up had
    ended), so another client's, whose work the replay cannot see."""
    if server is None or not server.slots_busy:
        return None
    return (f"llama-server was serving {server.slots_busy} request{'s' if server.slots_busy > 1 else ''} of another "
            "client as the run began (its /slots): the replay does not see that work")


#: The engine profile each engine that /metrics names runs as: its latest profile, or the versioned one whose
#: ``server_versions`` match the version its server reported (engines.toml).
SERVER_PROFILES = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama-cpp", "trtllm": "tensorrt-llm"}


def server_profile(server: ServerMetrics | None, hardware: str) -> str | None:
    """The engine profile a replay runs when none is named: the one of the engine the server's /metrics came from
    (at the version it reported, `engine_for_server`), where that engine runs on the hardware's kind and the hardware
    is no calibrated profile with an engine of its own; else None (a generic continuous scheduler on the default
    engine's step costs)."""
    from speedlimit.catalog import catalog_engine, engine_for_server, resolve_hardware

    key = SERVER_PROFILES.get(server.engine) if server is not None else None
    if key is None:
        return None
    key = engine_for_server(key, server.version)
    device = resolve_hardware(hardware)
    if getattr(device, "engine", None) or device.kind not in catalog_engine(key).devices:
        return None
    return key


def served_file_mismatch(served_model: str | None, estimate_model: str | None, architecture: Any,
                         weights: str | None) -> str | None:
    """A warning where the server serves a GGUF file on this machine (llama-server names its model by the path it
    loaded) in another format than the one ``estimate_model`` is priced at (a catalog name without --weights: its
    shipped weights, bf16 unless the checkpoint says otherwise), else None."""
    if not estimate_model or weights is not None or architecture.weight_bytes is not None \
            or not served_model or not served_model.lower().endswith(".gguf"):
        return None
    from pathlib import Path

    from speedlimit.catalog import resolve_model

    path = Path(served_model)
    try:
        served = resolve_model(served_model) if path.is_file() else None
    except (SpeedlimitError, OSError):
        return None
    file_type = served.weight_bytes.file_type if served is not None and served.weight_bytes else ""
    priced = architecture.shipped_weights or "bf16"
    if not file_type or file_type.lower() == priced.lower():
        return None
    return (f"the server serves {path.name} ({file_type}), but the replay prices --estimate-model {estimate_model} at "
            f"{priced}: pass --weights {file_type.lower()}, or --estimate-model with that file's path")


def _architecture(served_model: str | None, estimate_model: str | None):
    from speedlimit.catalog import resolve_model

    model = estimate_model or served_model
    if not model:
        raise SpeedlimitError("--compare-estimate needs --estimate-model NAME_OR_PATH (the served model is unknown)")
    try:
        return resolve_model(model)
    except SpeedlimitError as error:
        if estimate_model:
            raise
        raise SpeedlimitError(f"the served model {model!r} is not something the estimator knows ({error}); "
                              "pass --estimate-model CATALOG_NAME_OR_PATH") from None


def estimate_for(summary: RunSummary, *, hardware: str, served_model: str | None,
                 estimate_model: str | None) -> PredictionBlock:
    """Run the estimator for this run and return the summary's `estimate` block."""
    from speedlimit.estimator import estimate

    inputs = estimate_inputs(summary)
    model = estimate_model or served_model
    architecture = _architecture(served_model, estimate_model)
    predicted = estimate(architecture, hardware, **inputs).to_dict()
    return PredictionBlock(model=model, hardware=hardware, inputs=inputs, predicted=predicted,
                           comparison=compare(summary, predicted))
