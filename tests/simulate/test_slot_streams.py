"""llama.cpp's server with --parallel N (`EngineConfig.slot_streams`): a KV stream per slot, a step split into passes
of consecutive slots (llama-batch.cpp split_equal), slots taken least recently used (server-context.cpp)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
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
])
def test_a_replay_spec_that_describes_no_server_fails_before_the_run(spec, why):
    """bench --compare-estimate checks its --replay-engine before it sends a request; what needs the server's slot
    count waits for the replay."""
    from speedlimit.simulator.api import check_engine_spec

    with pytest.raises(SpeedlimitError, match=why):
        check_engine_spec(spec)
    for fine in ("max_batched_tokens=2048", "slot_streams=1,slot_history=700/3", None,
                 "continuous,max_seqs=8,max_batched_tokens=2048,kv_tokens=8192,slot_streams=1,slots_used=1"):
        assert check_engine_spec(fine) == parse_engine_spec(fine)
