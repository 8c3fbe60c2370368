"""`simulate --dp N`: N engine replicas behind a round-robin front end, merged into one run in bench's terms
(simulator/api.py: `replica_step`, `route_workload`, `run_replicas`): independent, or, with --ep, stepping together
(`engine.run_lockstep`, `core.lockstep_step_seconds`)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedlimit import simulate
from speedlimit.cli import app
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator.api import step_model
from speedlimit.simulator.api import (build_workload, engine_config, replica_step, route_workload, run_replicas,
                                      run_workload)
from speedlimit.estimator import core
from speedlimit.simulator.engine import replica, run, run_lockstep

FIXED = dict(prompt_tokens=256, output_tokens=32, engine="vllm", max_seqs=8)


def _latencies(records, key):
    return sorted(getattr(r, key) for r in records)


def test_a_replica_is_one_tp_group_with_the_dp_1_kv_cache_and_step_costs():
    one = step_model("llama-3.1-70b", "h100-sxm", tp=4)
    four = step_model("llama-3.1-70b", "h100-sxm", tp=4, dp=4)
    replica, replicas = replica_step(four)
    assert replicas == 4 and replica.machine == one.machine and replica.cost == one.cost
    assert engine_config(step=four) == engine_config(step=one)  # each replica's own KV cache and scheduler
    assert replica_step(one) == (one, 1)


def test_replicas_that_share_experts_keep_the_group_and_their_own_kv_share():
    """--dp with --ep: the step model keeps dp and ep (the lockstep price needs them); each replica's KV cache is what
    its devices hold beside its dense weights and its 1/dp share of the experts."""
    step = step_model("mixtral-8x7b", "h200", dp=2, ep=2)
    kept, replicas = replica_step(step)
    assert replicas == 2 and kept is step
    assert engine_config(step=step).kv_capacity_tokens > engine_config(step=step_model("mixtral-8x7b", "h200")).kv_capacity_tokens
    with pytest.raises(SpeedlimitError, match="--pp") as error:
        replica_step(step_model("mixtral-8x7b", "h200", dp=2, ep=2, pp=2))
    assert "\n" not in str(error.value)


def _loads(workload, replicas):
    return [dict(prompts=s.prompts, outputs=s.outputs, arrivals=s.arrivals, concurrency=s.concurrency,
                 requests=s.requests, duration_s=s.duration_s) for s in route_workload(workload, replicas)]


@pytest.mark.parametrize("closed", [True, False])
def test_one_lockstep_replica_is_exactly_the_engine(closed):
    """A group of one: every step priced by the lockstep rule equals `core.step_seconds`, so the run is `run`'s."""
    step = step_model("mixtral-8x7b", "h200", engine="vllm")
    engine = engine_config(step=step, max_seqs=4)
    workload = build_workload(concurrency=3 if closed else None, rate=None if closed else 40.0, requests=17, seed=3)
    workload.prompts, workload.outputs = [900, 40, 3000, 7], [5, 60, 2, 30]
    load = _loads(workload, 1)[0]
    assert run_lockstep(step.cost, step.machine, engine, [load])[0] == run(step.cost, step.machine, engine, **load)


def test_symmetric_replicas_step_as_the_whole_group():
    """Identical closed loops on every replica: each lockstep step is the estimate's step of the whole group (one
    replica's batch times dp, priced by `core.step_seconds`, which spreads it evenly over the replicas)."""
    step = step_model("mixtral-8x7b", "h200", dp=4, ep=4, engine="vllm")
    engine = engine_config(step=step, max_seqs=8, max_batched_tokens=1024)
    workload = build_workload(concurrency=12, requests=48, seed=1, prompt_tokens=700, output_tokens=24)
    loads = _loads(workload, 4)
    raws = run_lockstep(step.cost, step.machine, engine, loads)
    assert all(raw.end_times == raws[0].end_times for raw in raws)
    loop = replica(step.cost, engine, **loads[0])
    try:
        request = next(loop)
        while True:
            request = loop.send(core.step_seconds(step.cost, step.machine, core.StepBatch(*(4 * v for v in request))))
    except StopIteration as stop:
        whole_group = stop.value
    assert len(set(whole_group.step_prefill)) > 2  # chunked prefills and decodes of several sizes
    assert raws[0].end_times == pytest.approx(whole_group.end_times, rel=1e-12)


def test_a_prefill_on_one_replica_stalls_the_decodes_of_the_others():
    """SGLang's DP attention: a long prompt prefilling on replica 1 holds up replica 0's decoders for that whole step,
    which independent replicas never do."""
    arrivals = [0.0, 0.05]
    lengths = dict(prompts=[16, 8192], outputs=[64, 2])
    coupled_step = step_model("mixtral-8x7b", "h200", dp=2, ep=2, engine="sglang")
    alone_step = step_model("mixtral-8x7b", "h200", dp=2, engine="sglang")
    results = {}
    for name, step in (("coupled", coupled_step), ("independent", alone_step)):
        engine = engine_config(step=step, max_batched_tokens=8192)  # the whole prompt in one step on both layouts
        workload = build_workload(rate=1.0, requests=2, seed=0)
        workload.arrivals, workload.prompts, workload.outputs = arrivals, lengths["prompts"], lengths["outputs"]
        results[name] = run_workload(step, engine, workload).records
    decoder_coupled, prompt_coupled = results["coupled"]
    decoder_alone, _ = results["independent"]
    assert max(decoder_alone.itl_s) < 0.05
    assert max(decoder_coupled.itl_s) >= 0.9 * prompt_coupled.ttft_s > 5 * max(decoder_alone.itl_s)
    assert decoder_coupled.e2e_s > decoder_alone.e2e_s


def test_a_replica_waits_out_the_step_in_flight():
    """A request reaching an idle replica while another replica's step runs starts at that step's end."""
    step = step_model("mixtral-8x7b", "h200", dp=2, ep=2, engine="sglang")
    engine = engine_config(step=step)
    workload = build_workload(rate=1.0, requests=2, seed=0)
    workload.arrivals, workload.prompts, workload.outputs = [0.0, 0.01], [16384, 16], [2, 2]
    raws = run_lockstep(step.cost, step.machine, engine, _loads(workload, 2))
    first_step_end = raws[0].end_times[0]
    assert first_step_end > 0.01  # the long prefill was still running when the second request arrived
    assert raws[1].scheduled[0] == pytest.approx(first_step_end) and raws[1].idle_s == pytest.approx(first_step_end)


def test_cli_simulates_expert_sharing_replicas():
    done = CliRunner().invoke(app, ["simulate", "-m", "mixtral-8x7b", "-H", "h200", "--dp", "2", "--ep", "2",
                                    "--concurrency", "4", "--requests", "8", "--json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert data["simulation"]["replicas"] == 2 and data["engine"]["dp"] == 2 and data["completed"] == 8
    assert data["simulation"]["lockstep"] is True
    table = CliRunner().invoke(app, ["simulate", "-m", "mixtral-8x7b", "-H", "h200", "--dp", "2", "--ep", "2",
                                     "--requests", "8"], terminal_width=220)
    assert table.exit_code == 0 and "step together" in table.output, table.output
    # with --pp too it is a one-line refusal (tests/estimator/test_parallel.py runs it as the console command)


def test_closed_loop_at_n_times_c_is_n_copies_of_one_engine_at_c():
    one = simulate("llama-3.1-8b", "h100-sxm", concurrency=6, requests=60, **FIXED)
    four = simulate("llama-3.1-8b", "h100-sxm", dp=4, concurrency=24, requests=240, **FIXED)
    assert four.summary.completed == 240 and [r.index for r in four.records] == list(range(240))
    for key in ("ttft_s", "e2e_s", "queue_s"):
        assert _latencies(four.records, key) == sorted(_latencies(one.records, key) * 4)
    assert sorted(x for r in four.records for x in r.itl_s) == sorted(x for r in one.records for x in r.itl_s * 4)
    assert four.summary.duration_s == one.summary.duration_s
    assert four.summary.output_tok_s == pytest.approx(4 * one.summary.output_tok_s, rel=1e-12)
    assert four.summary.request_s == pytest.approx(4 * one.summary.request_s, rel=1e-12)
    assert four.summary.ttft_s.mean == pytest.approx(one.summary.ttft_s.mean, rel=1e-12)
    assert four.summary.tpot_s.mean == pytest.approx(one.summary.tpot_s.mean, rel=1e-12)
    sim, base = four.summary.simulation, one.summary.simulation
    assert sim["replicas"] == 4 and sim["replicas_with_requests"] == 4 and sim["routing"] == "round-robin"
    assert sim["batch"]["mean"] == pytest.approx(base["batch"]["mean"]) and sim["steps"] == 4 * base["steps"]
    assert [p["requests"] for p in sim["per_replica"]] == [60] * 4
    assert sim["timeline"] == base["timeline"] and sim["kv"]["capacity_tokens"] == base["kv"]["capacity_tokens"]
    assert four.summary.engine["dp"] == 4 and "dp" not in one.summary.engine


def test_each_replica_runs_exactly_its_routed_share():
    """Random lengths and shared prefixes: replica r's records are those of one engine running its round-robin share
    (requests r, r + N, …), with the request indices of the whole run."""
    step = step_model("llama-3.1-8b", "h100-sxm", dp=3, engine="vllm")
    replica, _ = replica_step(step)
    engine = engine_config(step=step, max_seqs=4)
    workload = build_workload(concurrency=7, requests=50, prompt_tokens="uniform:16:900", output_tokens="uniform:2:40",
                              seed=5, prefix_tokens=64, prefix_groups=3)
    merged = run_replicas(step, engine, workload)
    shares = route_workload(workload, 3)
    assert [s.concurrency for s in shares] == [3, 2, 2] and [s.requests for s in shares] == [17, 17, 16]
    for r, share in enumerate(shares):
        alone = run_workload(replica, engine, share).records
        ours = [rec for rec in merged.records if rec.index % 3 == r]
        assert [rec.index for rec in ours] == [3 * j + r for j in range(len(alone))]
        assert [(a.ttft_s, a.e2e_s, a.itl_s, a.prompt_tokens, a.output_tokens) for a in alone] == \
               [(o.ttft_s, o.e2e_s, o.itl_s, o.prompt_tokens, o.output_tokens) for o in ours]
    # request i keeps the lengths one engine would give it
    single = build_workload(concurrency=7, requests=50, prompt_tokens="uniform:16:900", output_tokens="uniform:2:40",
                            seed=5, prefix_tokens=64, prefix_groups=3)
    pool = len(single.prompts)
    assert [r.prompt_tokens for r in merged.records] == [single.prompts[i % pool] for i in range(50)]


def test_open_loop_rate_r_over_n_replicas_is_each_at_r_over_n():
    """Rate R dealt round-robin over N replicas: each replica gets every N-th Poisson arrival, gaps Erlang-N (gamma
    shape N: bench's burstiness N), steadier than Poisson at R/N, so it queues no more than one engine at R/N."""
    four = simulate("llama-3.1-8b", "l4", dp=4, rate=8.0, requests=1200, seed=1, **FIXED)
    one = simulate("llama-3.1-8b", "l4", rate=2.0, requests=300, seed=1, **FIXED)
    steady = simulate("llama-3.1-8b", "l4", rate=2.0, burstiness=4.0, requests=300, seed=1, **FIXED)
    assert four.summary.completed == 1200 and [r.index for r in four.records] == list(range(1200))
    assert four.summary.output_tok_s == pytest.approx(4 * steady.summary.output_tok_s, rel=0.1)
    assert four.summary.output_tok_s == pytest.approx(4 * one.summary.output_tok_s, rel=0.15)
    assert four.summary.tpot_s.mean == pytest.approx(one.summary.tpot_s.mean, rel=0.05)
    assert four.summary.ttft_s.mean == pytest.approx(steady.summary.ttft_s.mean, rel=0.1)
    assert four.summary.ttft_s.mean <= one.summary.ttft_s.mean
    sim = four.summary.simulation
    assert [p["requests"] for p in sim["per_replica"]] == [300] * 4
    assert sim["saturation_request_s"] == pytest.approx(4 * one.summary.simulation["saturation_request_s"])
    assert sim["saturated"] is False


def test_duration_runs_number_their_requests_contiguously():
    closed = simulate("llama-3.1-8b", "h100-sxm", dp=3, concurrency=5, duration_s=2.0, **FIXED)
    opened = simulate("llama-3.1-8b", "h100-sxm", dp=3, rate=20.0, duration_s=3.0, **FIXED)
    for run in (closed, opened):
        assert [r.index for r in run.records] == list(range(len(run.records))) and run.summary.completed > 3


def test_fewer_requests_or_clients_than_replicas_leave_replicas_idle():
    run = simulate("llama-3.1-8b", "h100-sxm", dp=8, concurrency=3, requests=5, **FIXED)
    sim = run.summary.simulation
    assert sim["replicas"] == 8 and sim["replicas_with_requests"] == 3 and run.summary.completed == 5
    assert [p["requests"] for p in sim["per_replica"]] == [2, 2, 1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dp=st.integers(1, 4), closed=st.booleans(), load=st.integers(1, 9), requests=st.integers(1, 14),
       lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 30)), min_size=1, max_size=5),
       max_seqs=st.integers(1, 4), kv_tokens=st.sampled_from([None, 400, 2000]), coupled=st.booleans())
def test_every_request_completes_exactly_once(dp, closed, load, requests, lengths, max_seqs, kv_tokens, coupled):
    """Independent replicas, or (``coupled``) replicas that share their experts and step together."""
    step = (step_model("mixtral-8x7b", "h200", dp=dp, ep=dp) if coupled and dp > 1
            else step_model("llama-3.1-8b", "h100-sxm", dp=dp))
    engine = engine_config("continuous", step=step, max_seqs=max_seqs, max_batched_tokens=512, kv_tokens=kv_tokens)
    workload = build_workload(concurrency=load if closed else None, rate=None if closed else 5.0 * load,
                              requests=requests, seed=load)
    workload.prompts, workload.outputs = [p for p, _ in lengths], [o for _, o in lengths]
    result = run_workload(step, engine, workload)
    assert [r.index for r in result.records] == list(range(requests)) and result.summary.completed == requests
    pool = len(lengths)
    assert [(r.prompt_tokens, r.output_tokens) for r in result.records] == [lengths[i % pool] for i in range(requests)]
    assert all(0 < r.ttft_s <= r.e2e_s and len(r.itl_s) == r.output_tokens - 1 for r in result.records)
    if dp > 1:
        sim = result.summary.simulation
        assert sum(p["requests"] for p in sim["per_replica"]) == requests
        assert sim["replicas"] == dp and sim["replicas_with_requests"] == min(dp, requests, load if closed else dp)
    else:
        assert "replicas" not in result.summary.simulation


def test_cli_json_shows_the_replicas():
    done = CliRunner().invoke(app, ["simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--dp", "2", "--concurrency",
                                    "4", "--requests", "8", "--json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert data["simulation"]["replicas"] == 2 and data["engine"]["dp"] == 2 and data["completed"] == 8
    assert data["simulation"]["lockstep"] is False
    table = CliRunner().invoke(app, ["simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--dp", "2",
                                     "--requests", "8"], terminal_width=200)
    assert table.exit_code == 0 and "data-parallel replicas" in table.output, table.output


def test_a_replicated_run_makes_bench_files_and_a_report(tmp_path):
    """Files, timeline and plots that assume one engine read a replicated run (its timeline is replica 0's)."""
    run = tmp_path / "run"
    done = CliRunner().invoke(app, ["simulate", "-m", "smollm2-135m", "-H", "h100-sxm", "--dp", "3", "--concurrency",
                                    "5", "--requests", "20", "--out", str(run)])
    assert done.exit_code == 0, done.output
    lines = (run / "requests.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in lines) == list(range(20))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["simulation"]["timeline_replica"] == 0 and len(summary["simulation"]["per_replica"]) == 3
    report = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    assert (tmp_path / "report" / "timeline.png").exists()
