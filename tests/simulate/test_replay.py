"""bench --compare-estimate is a replay: the simulator runs exactly the workload bench sent."""

from __future__ import annotations

import pytest

from speedlimit import estimate, simulate
from speedlimit.bench.compare import REPLAY_LATENCIES, REPLAY_STATS, replay_for
from speedlimit.errors import SpeedlimitError
from speedlimit.simulator import parse_engine_spec
from speedlimit.simulator.api import replay_workload


@pytest.mark.parametrize("load", [{"concurrency": 6}, {"rate": 4.0}])
def test_replaying_a_simulated_run_predicts_it_exactly(load):
    """Round trip: a run 'measured' by the simulator, replayed on the same engine, gives ratio 1 everywhere."""
    run = simulate("llama-3.1-8b", "l40s", requests=60, prompt_tokens="uniform:50:900", output_tokens="uniform:5:120",
                   seed=4, engine="continuous", max_seqs=4, max_batched_tokens=1024, kv_tokens=3000, **load)
    block = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                       engine="continuous,max_seqs=4,max_batched_tokens=1024,kv_tokens=3000")
    assert block.method == "simulate"
    assert {f"{m}.{s}" for m in REPLAY_LATENCIES for s in REPLAY_STATS} <= set(block.comparison)
    for label, row in block.comparison.items():
        assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    assert block.inputs["requests"] == 60


@pytest.mark.parametrize("load", [{"concurrency": 6}, {"rate": 20.0}])
def test_replaying_a_run_with_shared_prefixes_caches_them_as_the_run_did(load):
    engine = "continuous,max_seqs=4,max_batched_tokens=1024,kv_tokens=3000,prefix_caching=1"
    run = simulate("llama-3.1-8b", "l40s", requests=40, prompt_tokens="uniform:50:300", output_tokens=16, seed=2,
                   engine="continuous", max_seqs=4, max_batched_tokens=1024, kv_tokens=3000, prefix_tokens=400,
                   prefix_groups=3, prefix_caching=True, **load)
    assert run.summary.simulation["prefix_cache_hit_rate"] > 0.5
    block = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                       engine=engine)
    for label, row in block.comparison.items():
        assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    assert block.comparison["prefix_cache_hit_rate"].measured == run.summary.simulation["prefix_cache_hit_rate"]
    uncached = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                          engine=engine.removesuffix(",prefix_caching=1"))
    assert uncached.comparison["ttft_s.mean"].ratio < 1  # without the cache the replay predicts slower first tokens


def test_replay_uses_each_requests_lengths_and_the_measured_send_times():
    run = simulate("llama-3.1-8b", "h100-sxm", rate=2.0, requests=20, prompt_tokens="uniform:10:99", seed=1)
    records = list(reversed(run.records))  # completion order differs from send order
    records[3] = records[3].model_copy(update={"error_kind": "disconnect", "output_tokens": None})
    workload = replay_workload(records, run.summary.offered_load)
    kept = sorted((r for r in records if r.ok), key=lambda r: r.start_ns)
    assert workload.prompts == [r.prompt_tokens for r in kept] and workload.outputs == [r.output_tokens for r in kept]
    assert workload.arrivals[0] == 0.0
    assert workload.arrivals == pytest.approx([(r.start_ns - kept[0].start_ns) / 1e9 for r in kept])


def test_engine_spec():
    assert parse_engine_spec("serial") == {"mode": "serial"}
    assert parse_engine_spec("continuous,max_seqs=8,kv_tokens=8192,chunked_prefill=0") == {
        "mode": "continuous", "max_seqs": 8, "kv_tokens": 8192, "chunked_prefill": False}
    assert parse_engine_spec("continuous,prefix_caching=on")["prefix_caching"] is True
    # options alone keep the engine's own scheduler (its profile's, else continuous)
    assert parse_engine_spec("max_seqs=4,kv_tokens=100") == {"mode": None, "max_seqs": 4, "kv_tokens": 100}
    assert parse_engine_spec(None) == parse_engine_spec("") == {"mode": None}
    for bad in ("warp", "continuous,max_seqs", "continuous,colour=3", "continuous,max_seqs=x"):
        with pytest.raises(SpeedlimitError):
            parse_engine_spec(bad)


def test_replay_block_still_feeds_calibrate():
    from speedlimit.verify.fit import points_from_bench

    run = simulate("llama-3.1-8b", "l40s", concurrency=2, requests=8, prompt_tokens=100, output_tokens=20)
    block = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b")
    summary = run.summary.model_copy(update={"estimate": block})
    points, hardware, notes = points_from_bench(summary, "run")
    assert hardware == "l40s" and len(points) == 1 and points[0].measured_s == pytest.approx(run.summary.tpot_s.mean)
    assert notes == []
    # a run replayed on data-parallel replicas is one replica's share of the batch a step: left out, and said so
    replicas = simulate("llama-3.1-8b", "l40s", dp=2, concurrency=4, requests=8, prompt_tokens=100, output_tokens=20)
    block = replay_for(replicas.summary, replicas.records, hardware="l40s", served_model=None,
                       estimate_model="llama-3.1-8b", dp=2)
    points, _, notes = points_from_bench(replicas.summary.model_copy(update={"estimate": block}), "run")
    assert points == [] and "data-parallel replicas" in notes[0]


def test_the_replay_takes_the_kv_cache_the_server_reported_unless_the_spec_sets_one():
    """A capacity the server's /metrics reported (vLLM's cache_config_info) is a fact of the run: the replay's engine
    gets it, so a run that queued for KV is replayed queueing, as rule K1 scores the published rows."""
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import with_server_engine

    # a vLLM server (its /metrics say so: the replay runs vLLM's step costs) on a generic scheduler with a small cache
    run = simulate("llama-3.1-8b", "l40s", concurrency=8, requests=40, prompt_tokens="uniform:200:900", output_tokens=64,
                   seed=3, engine="vllm", scheduler="continuous", max_seqs=8, max_batched_tokens=1024, kv_tokens=2048,
                   block_size=32)
    assert run.raw.preemptions and max(run.raw.preemptions) > 0  # the small cache made it preempt
    server = ServerMetrics(engine="vllm", kv_capacity_tokens=2048.0, kv_block_size=32)
    measured = run.summary.model_copy(update={"server": server})
    spec = "continuous,max_seqs=8,max_batched_tokens=1024"
    block = replay_for(measured, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                       engine=spec)
    assert block.inputs["kv_tokens_from_server"] == 2048
    for label, row in block.comparison.items():
        assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    # without the server's figure the replay sizes the cache from memory and no longer queues the same way
    blind = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                       engine=spec)
    assert "kv_tokens_from_server" not in blind.inputs
    assert blind.comparison["ttft_s.mean"].ratio != pytest.approx(1.0, rel=1e-3)
    # the user's own kv_tokens wins; no figure, no change
    assert with_server_engine(spec + ",kv_tokens=999", server) == (spec + ",kv_tokens=999", {})
    assert with_server_engine(spec, None) == (spec, {})
    assert with_server_engine(None, server) == ("kv_tokens=2048,block_size=32",  # the engine's own scheduler
                                                {"kv_tokens_from_server": 2048.0})


def test_the_replay_runs_as_many_sequences_as_the_server_has_slots_unless_the_spec_says():
    """llama-server's slots (its /props total_slots, --parallel) cap the sequences it runs at once: concurrency 8
    against 4 slots queues half the requests, and a replay on the default engine (256 sequences) would not."""
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import with_server_engine

    run = simulate("llama-3.1-8b", "l40s", concurrency=8, requests=24, prompt_tokens=256, output_tokens=32, seed=5,
                   engine="continuous", max_seqs=4)
    server = ServerMetrics(engine="llamacpp", slots=4, slot_context_tokens=1024)
    measured = run.summary.model_copy(update={"server": server})
    block = replay_for(measured, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b")
    assert block.inputs["max_seqs_from_server"] == 4
    assert block.predicted["engine"]["max_seqs"] == 4
    for label in ("ttft_s.mean", "tpot_s.mean", "e2e_s.mean", "output_tok_s"):
        assert block.comparison[label].ratio == pytest.approx(1.0, rel=1e-6), label
    blind = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b")
    assert "max_seqs_from_server" not in blind.inputs
    assert blind.comparison["ttft_s.mean"].ratio > 1.5  # 8 at once: no queue, so the measured TTFT looks slow
    # the user's own max_seqs wins; a serial engine runs one sequence whatever the slots; both facts go together
    assert with_server_engine("continuous,max_seqs=2", server) == ("continuous,max_seqs=2", {})
    assert with_server_engine("serial", server) == ("serial", {})
    both = ServerMetrics(engine="vllm", kv_capacity_tokens=4096.0, kv_block_size=16, slots=3)
    assert with_server_engine(None, both) == ("kv_tokens=4096,block_size=16,max_seqs=3",
                                              {"kv_tokens_from_server": 4096.0, "max_seqs_from_server": 3.0})
    assert with_server_engine("continuous", both)[0] == "continuous,kv_tokens=4096,block_size=16,max_seqs=3"
    # how its KV cache was laid out is not in /props: the replay says so, once, until the spec names it
    assert any("slot_streams=1" in note for note in measured.notes)
    assert len([note for note in measured.notes if "slot_streams=1" in note]) == 1


def test_a_llama_server_replay_with_slot_streams_prices_its_passes():
    """``slot_streams=1`` in the replay's spec replays llama-server --parallel N: no note, and the replay is the
    simulation of that engine."""
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import slot_streams_note

    run = simulate("llama-3.1-8b", "l40s", concurrency=4, requests=16, prompt_tokens="uniform:32:512", output_tokens=48,
                   seed=7, engine="continuous", max_seqs=4, slot_streams=True)
    server = ServerMetrics(engine="llamacpp", slots=4, slot_context_tokens=1024)
    measured = run.summary.model_copy(update={"server": server, "notes": []})
    block = replay_for(measured, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                       engine="continuous,slot_streams=1")
    assert block.predicted["engine"]["slot_streams"] is True
    assert block.comparison["e2e_s.mean"].ratio == pytest.approx(1.0, rel=1e-6)
    assert not measured.notes and slot_streams_note("slot_streams=0", server) is None
    assert slot_streams_note(None, ServerMetrics(engine="vllm", slots=4)) is None
    assert slot_streams_note(None, ServerMetrics(engine="llamacpp", slots=1)) is None


def test_a_llama_server_replay_starts_from_the_slots_its_server_said_were_used():
    """bench records which slots llama-server's /slots showed used as the run began; a replay with slot streams takes
    them (so the run's requests get the slots the server gave them), unless the spec says which slots were used, and
    says where another client's requests were running."""
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import with_server_engine

    run = simulate("llama-3.1-8b", "l40s", concurrency=2, requests=12, prompt_tokens=256, output_tokens=48, seed=3,
                   engine="continuous", max_seqs=4, slot_streams=True)
    fresh = ServerMetrics(engine="llamacpp", slots=4, slot_context_tokens=1024)
    warmed = fresh.model_copy(update={"slot_history": [3]})
    spec = "continuous,max_seqs=4,slot_streams=1"

    def replayed(server, engine=spec):
        measured = run.summary.model_copy(update={"server": server, "notes": []})
        return replay_for(measured, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                          engine=engine), measured.notes

    told, notes = replayed(warmed)
    assert told.inputs["slots_used_from_server"] == 1 and told.predicted["engine"]["slot_history"] == [3]
    assert not notes
    by_hand, _ = replayed(fresh, spec + ",slot_history=3")
    assert by_hand.predicted["e2e_s"] == told.predicted["e2e_s"]
    # the run was simulated on a fresh server: replayed as one it is exact, replayed from slot 3's warm-up it is not
    # (its second pair of requests gets slots 0 and 3: two passes a step)
    assert replayed(fresh)[0].comparison["e2e_s.mean"].ratio == pytest.approx(1.0, rel=1e-9)
    assert told.comparison["e2e_s.mean"].ratio < 0.999
    # the spec's own account wins; without slot streams, or on fewer slots, the history is not taken
    assert with_server_engine(spec + ",slots_used=2", warmed)[0] == spec + ",slots_used=2"
    assert with_server_engine("continuous,max_seqs=4", warmed)[0] == "continuous,max_seqs=4"
    assert "slot_history" not in with_server_engine("continuous,max_seqs=2,slot_streams=1", warmed)[0]
    _, notes = replayed(warmed.model_copy(update={"slots_busy": 2}))
    assert notes == ["llama-server was serving 2 requests of another client as the run began (its /slots): the replay "
                     "does not see that work"]


def test_the_replay_runs_the_deployment_the_server_ran():
    """A run on vLLM's profile at TP 2 replayed with the same profile and TP is predicted exactly; replayed as one
    device on the generic scheduler (the default), it is not. A generic mode in the spec keeps the profile's step
    costs but swaps in that scheduler."""
    run = simulate("llama-3.1-70b", "h100-sxm", engine="vllm", tp=2, concurrency=16, requests=48,
                   prompt_tokens="uniform:200:600", output_tokens=48, seed=7)
    block = replay_for(run.summary, run.records, hardware="h100-sxm", served_model=None,
                       estimate_model="llama-3.1-70b", profile="vllm", tp=2)
    replayed = block.predicted["engine"]
    assert block.inputs["tp"] == 2 and (replayed["engine"], replayed["tp"]) == ("vllm", 2)
    assert {k: v for k, v in replayed.items() if k != "workload"} == \
        {k: v for k, v in run.summary.engine.items() if k != "workload"}
    for label, row in block.comparison.items():
        if row.ratio is not None:
            assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    assert block.predicted["itl_s"] == pytest.approx(estimate("llama-3.1-70b", "h100-sxm", engine="vllm", tp=2,
                                                              batch=16, prompt=400, output=48).itl_s, rel=0.05)
    with pytest.raises(SpeedlimitError, match="try --tp"):  # replayed on one H100 the 70B model does not fit
        replay_for(run.summary, run.records, hardware="h100-sxm", served_model=None, estimate_model="llama-3.1-70b")
    fp8 = replay_for(run.summary, run.records, hardware="h100-sxm", served_model=None, estimate_model="llama-3.1-70b",
                     profile="vllm", tp=2, weights="fp8")
    assert fp8.predicted["engine"]["weights"] == "fp8"
    assert fp8.comparison["tpot_s.mean"].ratio > 1.3  # the bf16 run read about twice the bytes the fp8 replay does
    generic = replay_for(run.summary, run.records, hardware="h100-sxm", served_model=None,
                         estimate_model="llama-3.1-70b", profile="vllm", tp=2, engine="continuous,max_seqs=1")
    assert generic.predicted["engine"]["max_seqs"] == 1 and generic.comparison["ttft_s.mean"].ratio < 0.5


def test_without_an_engine_the_replay_runs_the_one_the_server_metrics_name():
    """A vLLM server (its /metrics) is replayed on vLLM's profile unless --engine names one; an engine that does not
    run on the hardware, or a server whose metrics name none, gets the generic scheduler."""
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import server_profile

    run = simulate("llama-3.1-8b", "h100-sxm", engine="vllm", concurrency=8, requests=24, prompt_tokens=300,
                   output_tokens=32, seed=2)
    measured = run.summary.model_copy(update={"server": ServerMetrics(engine="vllm")})
    block = replay_for(measured, run.records, hardware="h100-sxm", served_model=None, estimate_model="llama-3.1-8b")
    assert block.inputs["engine_from_server"] == 1 and block.predicted["engine"]["engine"] == "vllm"
    for label, row in block.comparison.items():
        if row.ratio is not None:
            assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    named = replay_for(measured, run.records, hardware="h100-sxm", served_model=None, estimate_model="llama-3.1-8b",
                       profile="sglang")
    assert "engine_from_server" not in named.inputs and named.predicted["engine"]["engine"] == "sglang"
    assert server_profile(ServerMetrics(engine="vllm"), "amd-ryzen-9-7950x") is None  # vLLM's profile: GPUs only
    assert server_profile(ServerMetrics(engine="llamacpp"), "amd-ryzen-9-7950x") == "llama-cpp"
    assert server_profile(ServerMetrics(engine="tgi"), "h100-sxm") is None and server_profile(None, "h100-sxm") is None


def test_without_tp_the_replay_runs_the_tensor_parallel_size_the_server_reported():
    """SGLang's server info says its tp_size: a replay without tp runs it (and says so); a tp given wins."""
    from speedlimit.artifacts import ServerMetrics

    run = simulate("llama-3.1-70b", "h100-sxm", engine="sglang", tp=2, concurrency=8, requests=16, prompt_tokens=300,
                   output_tokens=24, seed=4)
    measured = run.summary.model_copy(update={"server": ServerMetrics(engine="sglang", version="0.5.3", tp=2)})
    block = replay_for(measured, run.records, hardware="h100-sxm", served_model=None, estimate_model="llama-3.1-70b")
    assert block.inputs["tp"] == 2 and block.inputs["layout_from_server"] == 1 and "dp" not in block.inputs
    assert block.predicted["engine"]["engine"] == "sglang" and block.predicted["engine"]["tp"] == 2
    for label, row in block.comparison.items():
        if row.ratio is not None:
            assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    given = replay_for(measured, run.records, hardware="h100-sxm", served_model=None, estimate_model="llama-3.1-70b",
                       tp=4)
    assert given.inputs["tp"] == 4 and "layout_from_server" not in given.inputs


def test_the_replay_runs_sglangs_data_parallel_attention_as_the_server_reported_it():
    """SGLang's server info (tp_size 8, dp_size 8, enable_dp_attention, its chunked-prefill size and one scheduler's
    KV pool) describes a layout of 8 attention ranks stepping together over one MoE: a run simulated that way replays
    with every ratio 1.0, and the comparison says the layout and scheduler came from the server."""
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import server_layout

    run = simulate("deepseek-v3", "h200", engine="sglang-0.4", tp=1, dp=8, ep=8, concurrency=16, requests=32,
                   prompt_tokens=800, output_tokens=16, seed=6, max_batched_tokens=2048, kv_tokens=60000)
    server = ServerMetrics(engine="sglang", version="0.4.3.post2", tp=8, dp=8, dp_attention=True, batched_tokens=2048,
                           kv_capacity_tokens=60000.0)
    assert server_layout(server) == {"tp": 1, "dp": 8, "ep": 8}
    measured = run.summary.model_copy(update={"server": server})
    block = replay_for(measured, run.records, hardware="h200", served_model=None, estimate_model="deepseek-v3")
    assert block.inputs["dp"] == 8 and block.inputs["ep"] == 8 and "tp" not in block.inputs  # tp 1
    assert block.inputs["layout_from_server"] == 1 and block.inputs["engine_from_server"] == 1
    assert block.inputs["max_batched_tokens_from_server"] == 2048 and block.inputs["kv_tokens_from_server"] == 60000
    assert block.predicted["engine"]["engine"] == "sglang-0.4"
    for label, row in block.comparison.items():
        if row.ratio is not None:
            assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    # read as plain tensor parallelism over 8 GPUs, the same run replays otherwise
    plain = replay_for(measured, run.records, hardware="h200", served_model=None, estimate_model="deepseek-v3", tp=8)
    assert plain.inputs["tp"] == 8 and "dp" not in plain.inputs and "layout_from_server" not in plain.inputs
    assert plain.comparison["tpot_s.mean"].ratio != pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("fields, layout", [
    ({"tp": 4}, {"tp": 4, "dp": 1, "ep": 1}),
    ({"tp": 8, "ep": 8}, {"tp": 8, "dp": 1, "ep": 8}),  # --enable-ep-moe: experts over the tp GPUs
    ({"tp": 2, "dp": 4}, {"tp": 2, "dp": 4, "ep": 1}),  # four replicas of two GPUs
    ({"tp": 8, "dp": 8, "dp_attention": True}, {"tp": 1, "dp": 8, "ep": 8}),
    ({"tp": 8, "dp": 2, "dp_attention": True}, {"tp": 4, "dp": 2, "ep": 8}),  # 0.5.x: --dp 2 --tp 8
    ({"tp": 8, "dp_attention": True}, {"tp": 8, "dp": 1, "ep": 1}),  # dp 1: attention over every GPU, plain
    ({"dp": 2}, None), ({}, None),  # no tp_size: the server said no layout
])
def test_the_layout_a_server_reports_in_simulates_terms(fields, layout):
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import server_layout

    assert server_layout(ServerMetrics(engine="sglang", **fields)) == layout
    assert server_layout(None) is None


@pytest.mark.parametrize("fields", [{"tp": 8, "dp": 3, "dp_attention": True}, {"tp": 4, "dp": 2, "ep": 4},
                                    {"tp": 8, "ep": 4}])
def test_a_layout_the_replay_cannot_take_names_the_flags_that_describe_one(fields):
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import server_layout

    with pytest.raises(SpeedlimitError, match="--tp, --dp and --ep"):
        server_layout(ServerMetrics(engine="sglang", **fields))


def test_sglangs_running_cap_and_prefill_budget_bound_the_replay_unless_the_spec_sets_them():
    from speedlimit.artifacts import ServerMetrics
    from speedlimit.bench.compare import with_server_engine

    server = ServerMetrics(engine="sglang", tp=1, batched_tokens=4096, max_running=48)
    assert with_server_engine(None, server) == ("max_seqs=48,max_batched_tokens=4096",
                                                {"max_seqs_from_server": 48.0, "max_batched_tokens_from_server": 4096.0})
    assert with_server_engine("max_batched_tokens=512", server) == (
        "max_batched_tokens=512,max_seqs=48", {"max_seqs_from_server": 48.0})
    # llama-server's slots come first where a server somehow reports both
    assert with_server_engine(None, server.model_copy(update={"slots": 4}))[0] == "max_seqs=4,max_batched_tokens=4096"


def test_a_catalog_model_priced_at_other_weights_than_the_served_gguf_is_warned_of():
    """llama-server names its model by the GGUF path it loaded: where that file is here and --estimate-model names
    the catalog model without --weights, the replay prices the catalog's bf16 weights, and the run says so."""
    from speedlimit.bench.compare import served_file_mismatch
    from speedlimit.bundled import default_gguf_path
    from speedlimit.catalog import resolve_model

    served = str(default_gguf_path())
    catalog = resolve_model("smollm2-135m")
    warning = served_file_mismatch(served, "smollm2-135m", catalog, None)
    assert warning is not None and "SmolLM2-135M-Instruct.Q4_1.gguf (q4_1)" in warning and "--weights q4_1" in warning
    assert served_file_mismatch(served, "smollm2-135m", catalog, "q4_1") is None  # the format is given
    assert served_file_mismatch(served, served, resolve_model(served), None) is None  # the file itself is priced
    assert served_file_mismatch(served, None, resolve_model(served), None) is None
    assert served_file_mismatch("/no/such/model.gguf", "smollm2-135m", catalog, None) is None
    assert served_file_mismatch("meta-llama/Llama-3.1-8B", "llama-3.1-8b", resolve_model("llama-3.1-8b"), None) is None
    # through the replay: the run's warnings carry it once
    run = simulate("smollm2-135m", "l40s", concurrency=1, requests=2, prompt_tokens=16, output_tokens=4)
    replay_for(run.summary, run.records, hardware="l40s", served_model=served, estimate_model="smollm2-135m")
    replay_for(run.summary, run.records, hardware="l40s", served_model=served, estimate_model="smollm2-135m")
    assert run.summary.warnings.count(warning) == 1


@pytest.mark.parametrize("engine, concurrency", [
    ("continuous,max_seqs=4,max_batched_tokens=1024,prefix_caching=1", 3),
    # a slot holds a turn only once it has ended: the turns of a conversation sent together share nothing there
    ("continuous,max_seqs=4,max_batched_tokens=1024,prefix_caching=1,slot_streams=1", 1)])
def test_replaying_a_run_of_conversations_shares_their_turns_as_the_run_did(tmp_path, engine, concurrency):
    """A dataset's conversation turns each hold the turns before them: the replay finds which request was which
    turn from the run's dataset and prompt seed (bench's row order), so a simulated run replays exactly, on a block
    cache and on llama-server's per-slot one."""
    import json

    dataset = tmp_path / "chats.jsonl"
    lines = [{"conversation": [{"role": "user", "content": "word " * (40 + 10 * c)},
                               {"role": "assistant", "content": "reply " * 30},
                               {"role": "user", "content": "more " * 25},
                               {"role": "assistant", "content": "again " * 20},
                               {"role": "user", "content": "last " * 15}], "output_tokens": 12} for c in range(4)]
    lines += [{"prompt": "plain " * 70, "output_tokens": 9}, {"prompt": "other " * 50, "output_tokens": 9}]
    dataset.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    options = parse_engine_spec(engine)
    options.pop("mode")
    run = simulate("llama-3.1-8b", "l40s", dataset=dataset, concurrency=concurrency, requests=14, seed=5,
                   engine="continuous", **options)
    assert run.summary.simulation["prefix_cache_hit_rate"] > 0.2
    block = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                       engine=engine)
    for label, row in block.comparison.items():
        assert row.ratio == pytest.approx(1.0, rel=1e-6), label
    # the dataset gone, the replay knows no turns: it says so, and predicts no hits
    dataset.unlink()
    run.summary.notes.clear()
    blind = replay_for(run.summary, run.records, hardware="l40s", served_model=None, estimate_model="llama-3.1-8b",
                       engine=engine)
    assert any("is not there" in note for note in run.summary.notes)
    assert blind.comparison["prefix_cache_hit_rate"].predicted in (None, 0.0)


def test_the_conversations_of_a_run_come_from_its_dataset_only_when_it_holds_them(tmp_path):
    from speedlimit.simulator.api import replay_conversations

    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"prompt": "a b c"}\n')
    assert replay_conversations({"dataset": str(plain), "prompt_seed": 1}) is None
    assert replay_conversations({"dataset": str(tmp_path), "prompt_seed": 1}) is None  # not a file
    assert replay_conversations({"dataset": str(tmp_path / "gone.jsonl"), "prompt_seed": 1}) is None
    assert replay_conversations({"dataset": str(plain), "prompt_seed": -4}) is None
    assert replay_conversations({"prompt_seed": 1}) is None and replay_conversations({"dataset": str(plain)}) is None
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"conversation": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},'
                     ' {"role": "user", "content": "and"}]}\n{"prompt": "x"}\n')
    order = replay_conversations({"dataset": str(chats), "prompt_seed": 3})
    assert sorted(order, key=lambda c: (c is None, c)) == [1, 1, None]
    assert "".join("t" if c == 1 else "." for c in order) in ("tt.", ".tt")  # the two turns stay together
