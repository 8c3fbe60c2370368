"""llama.cpp's server with --parallel N (`EngineConfig.slot_streams`): a KV stream per slot, a step split into passes
of consecutive slots (llama-batch.cpp split_equal), slots taken least recently used (server-context.cpp)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedlimit.cli import app
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.simulator.api import engine_config, parse_engine_spec, resolve
from speedlimit.simulator.engine import UBATCH_TOKENS, EngineConfig, run, slot_passes
from tests.simulate.test_engine import _spy_steps

STEP = resolve("llama-3.1-8b", "rtx-4090")


def _passes(decoders, chunks):
    return [(int(p.decode_sequences), int(p.prefill_sequences), int(p.prefill_tokens))
            for p in slot_passes(decoders, chunks)]


def test_consecutive_slots_decode_in_one_pass_and_a_gap_splits_them():
    assert _passes([(4, 100), (5, 100), (6, 100), (7, 100)], []) == [(4, 0, 0)]
    # slots 0, 2, 3 and 5: three runs (0 | 2, 3 | 5), as the server's step with those slots busy runs three passes
    assert _passes([(5, 100), (0, 100), (3, 100), (2, 100)], []) == [(1, 0, 0), (2, 0, 0), (1, 0, 0)]


def test_a_prompt_after_a_decoder_gives_its_pass_one_token_and_runs_the_rest_alone():
    # decode tokens first in slot order, then the prompt tokens: slot 1's prompt follows slot 0's decode
    assert _passes([(0, 50)], [(1, 0, 128)]) == [(1, 1, 1), (0, 1, 127)]
    # a prompt whose slot does not follow the last decoder's runs apart, in passes of at most UBATCH_TOKENS
    assert _passes([(0, 50)], [(3, 0, 600)]) == [(1, 0, 0), (0, 1, UBATCH_TOKENS), (0, 1, 600 - UBATCH_TOKENS)]
    # two prompts in consecutive slots share passes, the same number of tokens from each
    assert _passes([], [(2, 0, 100), (3, 0, 40)]) == [(0, 2, 80), (0, 1, 60)]


def test_the_passes_hold_exactly_the_steps_work():
    decoders, chunks = [(0, 300), (2, 70), (3, 1000)], [(1, 16, 144), (6, 0, 700)]
    passes = slot_passes(decoders, chunks)
    total = core.StepBatch(*(sum(p[i] for p in passes) for i in range(len(core.StepBatch._fields))))
    assert total.decode_sequences == 3 and total.decode_context == (300 + 1) + (70 + 1) + (1000 + 1)
    assert total.prefill_tokens == 128 + 700
    assert total.prefill_pairs == pytest.approx((core.causal_pairs(144) - core.causal_pairs(16)) + core.causal_pairs(700))


def _closed(engine, prompts, outputs, concurrency, requests):
    return run(STEP.cost, STEP.machine, engine, prompts, outputs, concurrency=concurrency, requests=requests)


def test_fresh_slots_go_highest_first_then_least_recently_used():
    engine = EngineConfig(max_seqs=4, max_batched_tokens=2048, slot_streams=True)
    raw = _closed(engine, [64], [8], concurrency=4, requests=12)
    # never used: the highest-numbered first (the server's `<=` scan); released together: the first released
    assert raw.extra["slots"][:4] == [3, 2, 1, 0]
    assert raw.extra["slots"][4:8] == [0, 1, 2, 3]
    # equal requests that start together stay in consecutive slots: one pass a step, the same run as one stream
    plain = _closed(EngineConfig(max_seqs=4, max_batched_tokens=2048), [64], [8], concurrency=4, requests=12)
    assert max(raw.extra["step_passes"]) == 1 and raw.end_times == pytest.approx(plain.end_times, rel=1e-12)


def test_a_warm_up_before_the_run_shifts_the_slots_and_every_other_wave_straddles_them():
    """A fresh llama-server --parallel 8 whose warm-up request took slot 7 (bench --warmup 1): the run's first four
    requests take slots 6-3, the next four the never-used 2-0 and then 7, which are two runs (0-2 | 7), so that wave
    decodes in two passes a step; the wave after takes 6-3 again. The order is the server's LRU (its log without a
    warm-up: launch_slot_ id 7, 6, 5, 4, then 3, 2, 1, 0); the measured waves' steps took 31 and 45 ms by turns
    (benchmarks/README.md)."""
    engine = EngineConfig(max_seqs=8, max_batched_tokens=2048, slot_streams=True, slots_used=1)
    raw = _closed(engine, [64], [8], concurrency=4, requests=16)
    slots = raw.extra["slots"]
    assert slots[:8] == [6, 5, 4, 3, 2, 1, 0, 7]
    assert [sorted(slots[i:i + 4]) for i in (8, 12)] == [[3, 4, 5, 6], [0, 1, 2, 7]]  # the same sets again
    waves = [raw.extra["step_passes"][raw.first_step[i]:raw.last_step[i] + 1] for i in (0, 4, 8, 12)]
    assert [max(w) for w in waves] == [1, 2, 1, 2]
    fresh = _closed(EngineConfig(max_seqs=8, max_batched_tokens=2048, slot_streams=True), [64], [8], 4, 16)
    assert fresh.extra["slots"][:8] == [7, 6, 5, 4, 3, 2, 1, 0] and max(fresh.extra["step_passes"]) == 1
    assert raw.end_times[-1] > fresh.end_times[-1]


def test_slots_used_needs_slot_streams_and_a_count_of_slots():
    with pytest.raises(SpeedlimitError, match="slots_used"):
        EngineConfig(max_seqs=8, slots_used=1).check()
    with pytest.raises(SpeedlimitError, match="slots_used"):
        EngineConfig(max_seqs=8, slot_streams=True, slots_used=9).check()
    assert parse_engine_spec("continuous,max_seqs=8,slot_streams=1,slots_used=1")["slots_used"] == 1
    assert engine_config("continuous", max_seqs=8, slot_streams=True, slots_used=2).slots_used == 2


def test_the_servers_slot_history_sets_which_slots_the_run_takes():
    """The slots llama-server's /slots showed used before the run (least recently used first, as bench records
    them): the never-used ones go first, highest first, then the used ones in that order. The history is one a real
    server gave (--parallel 4): a warm-up in slot 3 and a run in slots 2 and 1 (tasks 1, 12, 13), then the next
    run's warm-up in slot 3 again (task 24), so /slots said 2, 1, 3."""
    engine = EngineConfig(max_seqs=4, max_batched_tokens=2048, slot_streams=True, slot_history=(2, 1, 3))
    assert _closed(engine, [64], [8], concurrency=1, requests=4).extra["slots"] == [0, 2, 1, 3]
    # a fresh server's warm-up, as /slots tells it, is slots_used=1's guess exactly
    told = _closed(replace(engine, slot_history=(3,)), [64, 200], [8, 30], concurrency=2, requests=12)
    guessed = _closed(replace(engine, slot_history=(), slots_used=1), [64, 200], [8, 30], concurrency=2, requests=12)
    assert told.extra["slots"] == guessed.extra["slots"] and told.end_times == guessed.end_times


@pytest.mark.parametrize("history, why", [((8,), "names slot 8, but the engine has 8 slots"), ((1, 1), "twice"),
                                          ((-1,), "names slot -1"), ([1], "slot numbers"), ((True,), "slot numbers")])
def test_a_slot_history_names_distinct_slots_of_the_engine(history, why):
    with pytest.raises(SpeedlimitError, match=why):
        EngineConfig(max_seqs=8, slot_streams=True, slot_history=history).check()
    with pytest.raises(SpeedlimitError, match="slot_streams=1"):
        EngineConfig(max_seqs=8, slot_history=(1,)).check()
    with pytest.raises(SpeedlimitError, match="not both"):
        EngineConfig(max_seqs=8, slot_streams=True, slot_history=(7,), slots_used=1).check()
    assert parse_engine_spec("max_seqs=8,slot_streams=1,slot_history=7/6/0")["slot_history"] == (7, 6, 0)
    assert engine_config("continuous", max_seqs=8, slot_streams=True, slot_history=(5, 2)).slot_history == (5, 2)
    with pytest.raises(SpeedlimitError, match="not a number"):
        parse_engine_spec("slot_streams=1,slot_history=7/x")


def test_scattered_slots_cost_a_pass_each_and_slow_the_run(monkeypatch):
    priced = _spy_steps(monkeypatch)
    prompts, outputs = [40, 90, 20, 130, 60], [5, 40, 12, 70, 23]
    streams = _closed(EngineConfig(max_seqs=4, max_batched_tokens=2048, slot_streams=True), prompts, outputs, 4, 30)
    assert max(streams.extra["step_passes"]) > 1  # the lengths differ, so the slots scatter
    assert len(priced) == sum(streams.extra["step_passes"])  # every pass priced by the one step-cost model
    one = _closed(EngineConfig(max_seqs=4, max_batched_tokens=2048), prompts, outputs, 4, 30)
    assert streams.end_times[-1] > one.end_times[-1]  # each extra pass reads the weights again
    assert streams.n == one.n == 30


def test_slot_streams_need_llama_servers_mixed_continuous_steps():
    with pytest.raises(SpeedlimitError, match="slot streams"):
        EngineConfig(mode="serial", slot_streams=True).check()
    with pytest.raises(SpeedlimitError, match="slot streams"):
        EngineConfig(chunked_prefill=False, slot_streams=True).check()
    assert engine_config("continuous", slot_streams=True).slot_streams
    assert parse_engine_spec("continuous,max_seqs=8,slot_streams=1")["slot_streams"] is True


def test_simulate_slot_streams_on_the_command_line():
    runner = CliRunner()
    base = ["simulate", "-m", "llama-3.1-8b", "-H", "rtx-4090", "--scheduler", "continuous", "--max-seqs", "4",
            "--prompt-tokens", "uniform:32:256", "--output-tokens", "48", "--concurrency", "4", "--requests", "24",
            "--json"]
    plain, split = (runner.invoke(app, base + extra) for extra in ([], ["--slot-streams"]))
    assert plain.exit_code == 0 and split.exit_code == 0, split.output
    import json

    plain, split = json.loads(plain.output), json.loads(split.output)
    summary = split.get("summary", split)
    assert summary["engine"]["slot_streams"] is True
    assert "slot_streams" not in plain.get("summary", plain)["engine"]
    assert summary["output_tok_s"] <= plain.get("summary", plain)["output_tok_s"] * (1 + 1e-9)
    assert math.isfinite(summary["output_tok_s"])


@pytest.mark.parametrize("spec, why", [
    ("slots_used=1", "needs slot_streams=1"), ("slot_streams=1,slot_history=2/2", "twice"),
    ("continuous,max_seqs=4,slot_streams=1,slot_history=5", "has 4 slots"), ("serial,slot_streams=1", "slot streams"),
    ("slot_streams=1,slot_history=1,slots_used=2", "not both"),
    ("slot_streams=1,slot_similarity=2", "from 0 \\(off\\) to 1"),
    ("slot_streams=1,slot_similarity=nan", "share from 0"), ("slot_streams=1,cache_ram=-2", "or -1"),
    ("slot_streams=1,cache_ram=nan", "MiB from 0"),
])
def test_a_replay_spec_that_describes_no_server_fails_before_the_run(spec, why):
    """bench --compare-estimate checks its --replay-engine before it sends a request; what needs the server's slot
    count waits for the replay."""
    from speedlimit.simulator.api import check_engine_spec

    with pytest.raises(SpeedlimitError, match=why):
        check_engine_spec(spec)
    for fine in ("max_batched_tokens=2048", "slot_streams=1,slot_history=700/3", None,
                 "continuous,max_seqs=8,max_batched_tokens=2048,kv_tokens=8192,slot_streams=1,slots_used=1",
                 "slot_streams=1,cache_ram=-1,slot_similarity=0,cache_idle_slots=0"):
        assert check_engine_spec(fine) == parse_engine_spec(fine)


# --- llama-server's prompt reuse: a slot keeps the prompt it last served ----------------------------------------------
def _prefixed(engine, concurrency=1, requests=4):
    """Requests of two prefix groups by turns (0, 1, 0, 1, ...), each 600 tokens of which the group's 512 lead."""
    return run(STEP.cost, STEP.machine, engine, [600, 600], [8, 8], concurrency=concurrency, requests=requests,
               prefix_group=[0, 1], shared_tokens=[512, 512])


SLOTS3 = EngineConfig(max_seqs=3, max_batched_tokens=2048, slot_streams=True, prefix_caching=True)


@pytest.mark.parametrize("options, slots, cached", [
    # the server's defaults: a prompt goes to the free slot that holds its group's (512 / 600 shared, above 0.1)
    ({}, [2, 1, 2, 1], [0, 0, 512, 512]),
    # least recently used only, no prompt cache: slot 0 is empty and slot 2 holds the other group's prompt
    ({"slot_similarity": 0.0, "cache_ram_mib": 0.0}, [2, 1, 0, 2], [0, 0, 0, 0]),
    # least recently used, with the prompt cache: each start copied the idle slots' prompts there, and a slot given
    # to another request loads the saved prompt that shares the most
    ({"slot_similarity": 0.0}, [2, 1, 0, 2], [0, 0, 512, 512]),
    # without the idle copies the cache holds only the prompts of slots handed over, none of them the group's yet
    ({"slot_similarity": 0.0, "cache_idle_slots": False}, [2, 1, 0, 2], [0, 0, 0, 0]),
    # a cache of 100 MiB holds one of these prompts (607 tokens x 128 KiB of llama-3.1-8b's fp16 KV): the second
    # idle copy evicts the first, so request 3 finds only the other group's
    ({"slot_similarity": 0.0, "cache_ram_mib": 100.0}, [2, 1, 0, 2], [0, 0, 512, 0]),
])
def test_a_prompt_reuses_what_its_slot_or_the_prompt_cache_holds(options, slots, cached):
    """llama-server's get_available_slot (server-context.cpp): the free slot whose cached tokens share the largest
    part of the prompt above --slot-prompt-similarity, else the least recently used, whose prompt is saved to the
    --cache-ram prompt cache and a better one loaded from it (server-task.cpp server_prompt_cache::load); the prompt
    then computes only what it does not share with the slot's tokens."""
    raw = _prefixed(replace(SLOTS3, **options))
    assert raw.extra["slots"] == slots
    assert raw.prefix_cached == cached
    assert raw.prefix_hit_tokens == sum(cached) and raw.prefix_query_tokens == 4 * 600


def test_two_prompts_of_one_group_that_start_together_each_compute_the_prefix_in_their_own_slot():
    """A slot reuses only the tokens it holds itself: two requests of a group admitted together on a fresh
    llama-server compute the prefix twice (measured: --parallel 8, 8 clients, 4 groups of a 1,024-token prefix: the
    first 8 prompts each evaluated 1,153 tokens), where a shared block cache (vLLM V1) lets the later one hit the
    blocks the first schedules."""
    streams = _prefixed(replace(SLOTS3, max_seqs=4), concurrency=4, requests=4)
    shared = _prefixed(EngineConfig(max_seqs=4, max_batched_tokens=4096, prefix_caching=True), concurrency=4,
                       requests=4)
    assert streams.prefix_cached == [0, 0, 0, 0]
    assert shared.prefix_cached == [0, 0, 512, 512]


def test_a_long_cached_prompt_of_another_group_is_not_similar_and_the_lcp_needs_a_tenth():
    """The share counts against the new prompt: a 40-token prefix of a 600-token prompt (under 0.1) does not pick
    the slot, so the least recently used one serves it and reuses what it happens to share."""
    raw = run(STEP.cost, STEP.machine, SLOTS3, [600, 600], [8, 8], concurrency=1, requests=4,
              prefix_group=[0, 1], shared_tokens=[40, 40])
    assert raw.extra["slots"] == [2, 1, 0, 2]
    # request 2 (group 0) on empty slot 0 loads group 0's copy only if it keeps a quarter of it: 40 / 607 does not
    assert raw.prefix_cached == [0, 0, 0, 0]
    with pytest.raises(SpeedlimitError, match="slot_streams=1"):
        engine_config("continuous", max_seqs=4, cache_ram=0)
    assert engine_config("continuous", max_seqs=4, slot_streams=True, cache_ram=-1).cache_ram_mib == math.inf


@settings(max_examples=60, deadline=None)
@given(slots=st.integers(1, 5), concurrency=st.integers(1, 6), groups=st.integers(1, 4),
       shared=st.integers(0, 300), lengths=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 20)), min_size=1,
                                                    max_size=5),
       similarity=st.sampled_from([0.0, 0.1, 0.9]), cache_ram=st.sampled_from([0.0, 50.0, 8192.0]),
       idle=st.booleans())
def test_slot_reuse_never_reuses_more_than_a_prompt_shares(slots, concurrency, groups, shared, lengths, similarity,
                                                           cache_ram, idle):
    """Whatever the slots, groups and cache: every request ends, none reuses more than its group's shared tokens
    (nor its whole prompt), and with no similarity and no cache the slots go exactly as without prefixes."""
    prompts = [shared + p for p, _ in lengths]
    outputs = [o for _, o in lengths]
    engine = EngineConfig(max_seqs=slots, max_batched_tokens=2048, slot_streams=True, prefix_caching=True,
                          slot_similarity=similarity, cache_ram_mib=cache_ram, cache_idle_slots=idle)
    group = [i % groups for i in range(len(prompts))]
    raw = run(STEP.cost, STEP.machine, engine, prompts, outputs, concurrency=concurrency, requests=12,
              prefix_group=group, shared_tokens=[shared] * len(prompts))
    assert raw.n == 12 and all(last >= 0 for last in raw.last_step)
    assert all(0 <= hit <= min(shared, prompt - 1) for hit, prompt in zip(raw.prefix_cached, raw.prompt))
    assert raw.prefix_hit_tokens == sum(raw.prefix_cached)
    if similarity == 0 and cache_ram == 0:
        plain = run(STEP.cost, STEP.machine, replace(engine, prefix_caching=False), prompts, outputs,
                    concurrency=concurrency, requests=12)
        assert raw.extra["slots"] == plain.extra["slots"]


def test_one_kv_cache_for_all_slots_clears_the_idle_ones_as_each_request_starts():
    """llama-server with --parallel auto (one KV cache for all slots; the llama.cpp profiles' `slot_prompts`) saves
    every idle slot's prompt to the prompt cache and clears the slot as each request starts (server-context.cpp,
    TAG_IDLE_SLOT_CLEAR): two requests of one group that start together each compute the prefix; of the next two,
    the first finds its group's prompt in a slot just released, the second only in the prompt cache, where the
    cleared slot's was saved. With a KV stream per slot that prompt would still be in its slot."""
    unified = EngineConfig(max_seqs=3, max_batched_tokens=2048, prefix_caching=True, slot_prompts=True)
    raw = run(STEP.cost, STEP.machine, unified, [600], [8], concurrency=2, requests=4, prefix_group=[0],
              shared_tokens=[512])
    assert raw.extra["slots"] == [2, 1, 1, 0] and raw.prefix_cached == [0, 0, 512, 512]
    split = run(STEP.cost, STEP.machine, replace(unified, slot_prompts=False, slot_streams=True), [600], [8],
                concurrency=2, requests=4, prefix_group=[0], shared_tokens=[512])
    assert split.extra["slots"] == [2, 1, 1, 2] and split.prefix_cached == [0, 0, 512, 512]
    # without the prompt cache the server keeps its idle slots ("--cache-idle-slots requires --cache-ram, disabling")
    bare = run(STEP.cost, STEP.machine, replace(unified, cache_ram_mib=0.0), [600], [8], concurrency=2, requests=4,
               prefix_group=[0], shared_tokens=[512])
    assert bare.extra["slots"] == [2, 1, 1, 2] and bare.prefix_cached == [0, 0, 512, 512]
    # the llama.cpp profiles reuse prompts per slot; vLLM's one block cache for all
    assert engine_config(step=resolve("llama-3.1-8b", "h100-sxm", engine="llama-cpp-cuda")).slot_prompts
    assert not engine_config(step=resolve("llama-3.1-8b", "h100-sxm", engine="vllm")).slot_prompts
