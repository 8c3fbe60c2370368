"""The scheduler: continuous batching, chunked and prefill-first steps, slots and queue, paged KV with preemption,
the serial engine, and the properties a serving engine must have."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speedlimit import simulate
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.simulator.api import build_records, build_workload, engine_config, resolve, run_workload
from speedlimit.simulator.engine import EngineConfig, run

STEP = resolve("llama-3.1-8b", "h100-sxm")
WINDOWED = resolve("gemma-2-9b", "h100-sxm")


def _run(prompts, outputs, engine, **load):
    return run(STEP.cost, STEP.machine, engine, prompts, outputs, **load)


def _check_records(raw):
    records = build_records(raw)
    for record in records:
        assert record.ttft_s > 0 and record.e2e_s >= record.ttft_s
        assert len(record.itl_s) == record.output_tokens - 1
        assert all(gap > 0 for gap in record.itl_s)
        assert record.e2e_s == pytest.approx(record.ttft_s + sum(record.itl_s), rel=1e-9)
        assert record.queue_s + record.prefill_s + record.decode_s == pytest.approx(record.e2e_s, rel=1e-9)
    return records


def test_every_step_is_priced_by_the_one_step_cost_model(monkeypatch):
    calls = []
    original = core.step_seconds

    def spy(cost, machine, step):
        calls.append(step)
        return original(cost, machine, step)

    monkeypatch.setattr(core, "step_seconds", spy)
    raw = _run([300, 40], [5, 9], EngineConfig(max_seqs=4, max_batched_tokens=256), concurrency=2, requests=2)
    assert len(calls) == len(raw.end_times)
    assert [c.prefill_tokens for c in calls[:3]] == [256, 44 + 40, 0]  # chunks: 256, then 44 + the second prompt
    assert calls[2].decode_sequences == 2 and calls[2].decode_context == (300 + 1) + (40 + 1)


def test_preemption_recomputes_and_every_request_still_finishes(monkeypatch):
    seen = _spy_steps(monkeypatch)
    engine = EngineConfig(max_seqs=8, max_batched_tokens=512, block_size=16, kv_capacity_tokens=1200)
    raw = _run([200] * 20, [300] * 20, engine, concurrency=8, requests=20)
    records = _audit(raw, seen)
    assert sum(raw.preemptions) > 0 and len(raw.segments) > 0
    assert all(r.output_tokens == 300 for r in records)
    assert max(raw.step_kv_blocks) <= 1200 // 16


def test_serial_engine_runs_one_request_at_a_time():
    engine = EngineConfig(mode="serial", max_batched_tokens=512)
    raw = _run([700, 100, 300], [20, 10, 5], engine, arrivals=[0.0, 0.0, 0.001])
    records = _check_records(raw)
    spans = sorted((raw.scheduled[i], raw.end_times[raw.last_step[i]]) for i in range(raw.n))
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:]))
    assert len(records) == 3
    assert max(raw.step_batch) == 1
    assert raw.step_tokens[:2] == [512, 188]  # a 700-token prompt in n_batch-sized calls


def test_a_closed_loops_next_request_waits_for_the_step_after_its_previous_reply():
    """A client sends its next request as its reply's last token arrives; an engine with work has started its next
    step by the time it gets there (llama-server and vLLM read new requests between steps), so the prompt joins the
    step after, and the replies still decoding are not stalled by it in the step right after. An engine left idle
    starts on the request at once."""
    engine = EngineConfig(max_seqs=4, max_batched_tokens=2048)
    raw = _run([1000, 1000], [4, 12], engine, concurrency=2, requests=3)
    records = _check_records(raw)
    ends = raw.end_times
    done = raw.last_step[0]  # request 0 (4 tokens) ends here; request 2 is sent at that moment
    assert raw.arrival[2] == pytest.approx(ends[done])
    assert raw.step_prefill[done + 1] == 0 and raw.step_batch[done + 1] == 1  # request 1 decodes alone
    assert raw.step_prefill[done + 2] == 1000  # request 2's prompt, one step later
    assert records[2].ttft_s == pytest.approx(ends[done + 2] - ends[done])
    # one client (nothing else running): its next request starts at once
    alone = _run([1000], [4], engine, concurrency=1, requests=2)
    assert alone.step_prefill[alone.last_step[0] + 1] == 1000


def test_prefill_first_pauses_decodes_without_chunking():
    engine = EngineConfig(max_seqs=4, max_batched_tokens=4096, chunked_prefill=False)
    raw = _run([1000], [50], engine, arrivals=[0.0, 0.05, 0.1, 0.12])
    for tokens, prefill in zip(raw.step_tokens, raw.step_prefill):
        assert prefill == 0 or tokens == prefill  # a step prefills whole prompts or decodes, never both
    # whole prompts only (one, or several that arrived during the step before): never a chunk of one
    assert set(raw.step_prefill) - {0} and all(prefill % 1000 == 0 for prefill in raw.step_prefill)


def test_in_flight_batching_prefills_whole_prompts_beside_the_decodes(monkeypatch):
    # TensorRT-LLM's scheduler: no chunking, but a context request joins the generation requests' step
    seen = _spy_steps(monkeypatch)
    engine = EngineConfig(max_seqs=4, max_batched_tokens=4096, chunked_prefill=False, prefill_first=False)
    raw = _run([100, 1000], [10, 5], engine, arrivals=[0.0, 0.02])
    _audit(raw, seen)
    join = next(s for s in range(len(raw.end_times)) if raw.step_prefill[s] == 1000)
    assert raw.step_tokens[join] == 1001  # the whole second prompt and the first request's decode, in one step
    assert join in raw.emitted(0)
    assert sorted(set(raw.step_prefill) - {0}) == [100, 1000]  # prompts are never split


def test_the_tensorrt_llm_profile_mixes_whole_prompts_with_decodes():
    step = resolve("llama-3.1-8b", "h100-sxm", engine="tensorrt-llm")
    engine = engine_config(step=step)
    assert (engine.chunked_prefill, engine.prefills_alone) == (False, False)
    generic = engine_config("continuous", chunked_prefill=False, step=step)
    assert (generic.chunked_prefill, generic.prefills_alone) == (False, True)


def test_sglang_prefills_chunks_while_its_decodes_pause_and_vllm_mixes_them():
    # SGLang's scheduler runs a prefill batch first and mixes no chunk into the decode batch (enable_mixed_chunk is
    # off by default); vLLM V1 schedules running requests and waiting ones in one token budget
    sglang = engine_config(step=resolve("llama-3.1-8b", "h100-sxm", engine="sglang"))
    vllm = engine_config(step=resolve("llama-3.1-8b", "h100-sxm", engine="vllm"))
    assert (sglang.chunked_prefill, sglang.prefills_alone) == (True, True)
    assert (vllm.chunked_prefill, vllm.prefills_alone) == (True, False)
    assert engine_config("continuous", step=STEP).prefills_alone is False  # the generic chunking scheduler mixes


def test_chunked_prefill_first_pauses_decodes_between_a_prompts_chunks(monkeypatch):
    seen = _spy_steps(monkeypatch)
    engine = EngineConfig(max_seqs=4, max_batched_tokens=256, chunked_prefill=True, prefill_first=True)
    raw = _run([100, 1000], [40, 5], engine, arrivals=[0.0, 0.02])
    _audit(raw, seen)
    for tokens, prefill in zip(raw.step_tokens, raw.step_prefill):
        assert prefill == 0 or tokens == prefill  # a step prefills or decodes, never both
    assert max(raw.step_prefill) == 256 and raw.step_prefill.count(256) == 3  # 1000 tokens: 256 x 3 + 232
    chunks = [s for s, p in enumerate(raw.step_prefill) if p and s > raw.first_step[0]]
    emitted = raw.emitted(0)
    assert not set(chunks) & set(emitted)  # the first request does not decode while the second one's chunks run
    assert emitted[0] < chunks[0] and chunks[-1] < emitted[-1]
    mixed = _run([100, 1000], [40, 5], EngineConfig(max_seqs=4, max_batched_tokens=256, chunked_prefill=True),
                 arrivals=[0.0, 0.02])
    assert any(0 < p < t for t, p in zip(mixed.step_tokens, mixed.step_prefill))  # the default mixes them


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=5),
       max_seqs=st.integers(1, 8), block=st.sampled_from([1, 4, 16]), budget=st.integers(8, 400))
def test_chunked_prefill_first_runs_complete_every_request_under_kv_pressure(data, lengths, max_seqs, block, budget):
    # the regression: a chunk waiting for KV blocks held the decodes that would free them ('stalled')
    prompts = [p for p, _ in lengths]
    outputs = [o for _, o in lengths]
    needed = -(-(max(p + o for p, o in lengths) - 1) // block) * block
    kv = data.draw(st.integers(needed, needed * 4), label="kv")
    engine = EngineConfig(max_seqs=max_seqs, max_batched_tokens=max(budget, max_seqs), chunked_prefill=True,
                          prefill_first=True, block_size=block, kv_capacity_tokens=kv)
    load = dict(concurrency=data.draw(st.integers(1, 10), label="concurrency"), requests=data.draw(st.integers(1, 30), label="requests"))
    with pytest.MonkeyPatch.context() as patch:
        seen = _spy_steps(patch)
        raw = run(STEP.cost, STEP.machine, engine, prompts, outputs, **load)
    assert raw.n == load["requests"]
    for tokens, prefill in zip(raw.step_tokens, raw.step_prefill):
        assert prefill == 0 or tokens == prefill
    _audit(raw, seen)


def test_a_queue_forms_beyond_max_seqs():
    engine = EngineConfig(max_seqs=2, max_batched_tokens=2048)
    raw = _run([100], [20], engine, concurrency=5, requests=10)
    records = _check_records(raw)
    assert max(raw.step_batch) == 2 and max(raw.step_waiting) == 3
    assert sum(1 for r in records if r.queue_s > 0) >= 8


def test_a_request_larger_than_the_kv_cache_is_an_error():
    with pytest.raises(SpeedlimitError, match="can never be admitted"):
        _run([5000], [10], EngineConfig(kv_capacity_tokens=4096), concurrency=1, requests=1)


def test_sliding_window_sums_match_a_direct_computation():
    step = resolve("gemma-2-9b", "h100-sxm")
    window = step.cost.window
    seen = []
    original = core.step_seconds

    def spy(cost, machine, batch):
        seen.append(batch)
        return original(cost, machine, batch)

    import speedlimit.estimator.core as c
    c.step_seconds = spy
    try:
        raw = run(step.cost, step.machine, EngineConfig(max_seqs=4, max_batched_tokens=8192), [4000, 4090, 10],
                  [200, 50, 30], arrivals=[0.0, 0.0, 0.0])
    finally:
        c.step_seconds = original
    for batch in seen:
        if batch.decode_sequences and not batch.prefill_sequences:
            assert batch.decode_context_local <= batch.decode_context
    # at steady decode of request 0 alone (cached 4000 + k), the local sum is capped at the window
    alone = [b for b in seen if b.decode_sequences == 1 and b.decode_context > window]
    assert alone and all(b.decode_context_local == window for b in alone)


# --- properties -----------------------------------------------------------------------------------------------

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(prompt=st.integers(16, 2048), output=st.integers(2, 200), low=st.integers(1, 16), extra=st.integers(1, 16),
       seed=st.integers(0, 5))
def test_throughput_is_non_decreasing_in_concurrency_until_saturation(prompt, output, low, extra, seed):
    step = resolve("llama-3.1-8b", "h100-sxm")
    engine = engine_config("continuous", max_seqs=32, max_batched_tokens=4096, step=step)
    high = min(low + extra, 32)
    # whole waves at both concurrencies: a fixed request count that one of them ends with a part-filled wave
    # measures the drain, not the engine
    waves = math.lcm(low, high)
    requests = waves * max(1, math.ceil(64 / waves))
    throughput = []
    for concurrency in (low, high):
        workload = build_workload(concurrency=concurrency, requests=requests, prompt_tokens=prompt, output_tokens=output,
                                  seed=seed)
        throughput.append(run_workload(step, engine, workload).summary.output_tok_s)
    assert throughput[1] >= throughput[0] * 0.99


@PROPERTY
@given(rate=st.floats(0.5, 40), factor=st.floats(1.0, 4.0), seed=st.integers(0, 5))
def test_ttft_is_non_decreasing_in_rate(rate, factor, seed):
    step = resolve("llama-3.1-8b", "l40s")
    engine = engine_config("continuous", max_seqs=16, max_batched_tokens=2048, step=step)
    ttft = []
    for r in (rate, rate * factor):
        workload = build_workload(rate=r, requests=150, prompt_tokens="uniform:100:1500", output_tokens=64, seed=seed)
        ttft.append(run_workload(step, engine, workload, saturation={"request_s": math.inf, "output_tok_s": 0}).summary.ttft_s.mean)
    assert ttft[1] >= ttft[0] * 0.97


def test_the_queue_is_first_in_first_out():
    engine = EngineConfig(max_seqs=3, max_batched_tokens=2048)
    arrivals = [0.001 * i for i in range(30)]  # all arrive well before the first ones finish
    raw = _run([200] * 30, [40] * 30, engine, arrivals=arrivals)
    order = sorted(range(raw.n), key=lambda i: (raw.scheduled[i], i))
    assert order == list(range(30))  # admitted in arrival order
    assert max(raw.step_waiting) > 20


# --- prefill-first (whole-prompt) scheduling: decodes pause, token accounting stays exact -------------------------

def _spy_steps(monkeypatch):
    """Records every batch the engine prices (``monkeypatch``: the fixture, or a `pytest.MonkeyPatch.context()`)."""
    seen = []
    original = core.step_seconds

    def spy(cost, machine, batch):
        seen.append(batch)
        return original(cost, machine, batch)

    monkeypatch.setattr(core, "step_seconds", spy)
    return seen


def _audit(raw, seen=None, window=math.inf):
    """Replays every request's emissions independently of the engine's bookkeeping: each request emits exactly its
    output tokens, in increasing steps, one per decode step it ran in; every step's decode count and (with ``seen``,
    the priced batches) decode context, whole and within the sliding ``window``, match the requests that emitted in
    it; ITL gaps are the times between them."""
    decoded = [0] * len(raw.end_times)  # decode emissions per step
    context = [0] * len(raw.end_times)  # Σ (prompt + tokens emitted before the step) over the step's decoders
    local = [0.0] * len(raw.end_times)  # the same, each capped at the window
    for rid in range(raw.n):
        emitted = raw.emitted(rid)
        assert len(emitted) == raw.output[rid], rid
        assert emitted == sorted(set(emitted)) and emitted[0] == raw.first_step[rid] and emitted[-1] == raw.last_step[rid]
        starts = {a for a, _ in raw.emission_steps(rid)}
        for g, s in enumerate(emitted):
            if s in starts:  # its prefill (or recompute) ended in this step
                assert raw.step_prefill[s] > 0
                starts.discard(s)
            else:
                decoded[s] += 1
                context[s] += raw.prompt[rid] + g
                local[s] += min(raw.prompt[rid] + g, window)
    assert decoded == [t - p for t, p in zip(raw.step_tokens, raw.step_prefill)]
    if seen is not None:
        assert len(seen) == len(raw.end_times)
        assert [b.decode_sequences for b in seen] == decoded
        assert [b.decode_context for b in seen] == [float(c) for c in context]
        assert [b.decode_context_local for b in seen] == [float(c) for c in local]
    records = _check_records(raw)
    ends = raw.end_times
    for record in records:
        emitted = raw.emitted(record.index)
        assert record.itl_s == pytest.approx([ends[b] - ends[a] for a, b in zip(emitted, emitted[1:])], rel=1e-9)
    return records


def test_whole_prompt_prefill_pauses_decodes_and_they_still_finish(monkeypatch):
    """The regression: decoders were advanced (and their finish step consumed) by prefill-only steps in which they did
    not decode, so they decoded forever and the run ended in 'the simulated engine stalled'."""
    seen = _spy_steps(monkeypatch)
    engine = EngineConfig(max_seqs=4, max_batched_tokens=4096, chunked_prefill=False)
    raw = _run([100, 1000], [10, 5], engine, arrivals=[0.0, 0.02])
    _audit(raw, seen)
    pause = next(s for s in range(len(raw.end_times)) if raw.step_prefill[s] == 1000)
    assert raw.step_tokens[pause] == 1000  # the second prompt's step: the first request does not decode in it
    emitted = raw.emitted(0)
    assert pause not in emitted and emitted[0] < pause < emitted[-1]
    after = next(s for s in emitted if s > pause)
    before = max(s for s in emitted if s < pause)
    gap = raw.end_times[after] - raw.end_times[before]  # the pause shows up in the ITL, as one gap
    assert gap > raw.step_s[pause]
    assert gap in build_records(raw)[0].itl_s


@pytest.mark.parametrize("kwargs", [dict(engine="tensorrt-llm"),
                                    dict(chunked_prefill=False, max_batched_tokens=8192)])
def test_the_whole_prompt_repro_completes_every_request_exactly(kwargs, monkeypatch):
    # speedlimit simulate -m llama-3.3-70b -H h100-sxm --tp 2 --weights fp8 --no-chunked-prefill --concurrency 25
    #   --prompt-tokens 5000 --output-tokens 500 --requests 100   (stalled before the fix)
    seen = _spy_steps(monkeypatch)
    sim = simulate("llama-3.3-70b", "h100-sxm", tp=2, weights="fp8", concurrency=25, prompt_tokens=5000,
                   output_tokens=500, requests=100, **kwargs)
    assert sim.summary.completed == 100
    assert sim.summary.engine["chunked_prefill"] is False
    records = _audit(sim.raw, seen[-len(sim.raw.end_times):])  # the last run (before it: the saturation run, if any)
    assert all(r.output_tokens == 500 and len(r.itl_s) == 499 for r in records)
    assert sum(t - p for t, p in zip(sim.raw.step_tokens, sim.raw.step_prefill)) == 100 * 499


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=5),
       mode=st.sampled_from(["continuous", "continuous", "serial"]), max_seqs=st.integers(1, 8),
       block=st.sampled_from([1, 4, 16]), extra_budget=st.integers(0, 600), closed=st.booleans(),
       window=st.sampled_from([math.inf, 8, 64, 200]), prefill_first=st.booleans())
def test_whole_prompt_runs_complete_every_request_with_exactly_its_tokens(data, lengths, mode, max_seqs, block,
                                                                          extra_budget, closed, window, prefill_first):
    prompts = [p for p, _ in lengths]
    outputs = [o for _, o in lengths]
    longest = max(p + o for p, o in lengths)
    budget = max(prompts) + max(outputs) - 1 + extra_budget
    needed = -(-(longest - 1) // block) * block
    kv = data.draw(st.one_of(st.just(math.inf), st.integers(needed, needed * 6)), label="kv")
    engine = EngineConfig(mode=mode, max_seqs=max_seqs, max_batched_tokens=max(budget, max_seqs), chunked_prefill=False,
                          prefill_first=prefill_first, block_size=block, kv_capacity_tokens=kv)
    if closed:
        load = dict(concurrency=data.draw(st.integers(1, 10), label="concurrency"),
                    requests=data.draw(st.integers(1, 30), label="requests"))
    else:
        gaps = data.draw(st.lists(st.floats(0, 0.05), min_size=1, max_size=30), label="gaps")
        load = dict(arrivals=[sum(gaps[:i + 1]) for i in range(len(gaps))])
    # a sliding window small enough to fill during these replies (gemma-2's costs, its window shrunk)
    cost = STEP.cost if window == math.inf else WINDOWED.cost._replace(window=float(window))
    with pytest.MonkeyPatch.context() as patch:
        seen = _spy_steps(patch)
        raw = run(cost, STEP.machine, engine, prompts, outputs, **load)  # never 'stalled'
    assert raw.n == (load["requests"] if closed else len(load["arrivals"]))
    if prefill_first:
        for tokens, prefill in zip(raw.step_tokens, raw.step_prefill):
            assert prefill == 0 or tokens == prefill  # a step prefills whole prompts or decodes, never both
    _audit(raw, seen, window)
