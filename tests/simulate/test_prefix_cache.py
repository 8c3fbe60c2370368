"""The prefix cache (issue 13): shared prefixes skip their prefill and count once in KV use, freed chain blocks stay
cached until evicted least recently freed first, and with caching off (or nothing shared) every number is as before."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speedlimit import simulate
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator import core
from speedlimit.simulator.api import build_records, build_workload, engine_config, resolve
from speedlimit.simulator.engine import EngineConfig, run

STEP = resolve("llama-3.1-8b", "h100-sxm")


def _run(prompts, outputs, engine, **load):
    return run(STEP.cost, STEP.machine, engine, prompts, outputs, **load)


def test_a_cached_prefix_is_skipped_and_its_prefill_priced_as_estimates_cached_prefill():
    engine = EngineConfig(max_seqs=4, block_size=16, prefix_caching=True)
    # one client: request 1 is sent when request 0 ends; both start with the same 256 tokens (16 whole blocks)
    raw = _run([356], [2], engine, concurrency=1, requests=2, prefix_group=[0], shared_tokens=[256])
    assert raw.prefix_cached == [0, 256]
    assert sum(raw.step_prefill) == 356 + 100
    assert (raw.prefix_hit_tokens, raw.prefix_query_tokens) == (256, 2 * 356)
    records = build_records(raw)
    seconds = lambda tokens, cached: core.step_seconds(STEP.cost, STEP.machine,  # noqa: E731
                                                       core.prefill_batch(STEP.cost, 1, tokens, cached))
    assert records[0].ttft_s == pytest.approx(seconds(356, 0), rel=1e-12)
    assert records[1].ttft_s == pytest.approx(seconds(100, 256), rel=1e-12)
    assert records[1].ttft_s < records[0].ttft_s
    plain = _run([356], [2], EngineConfig(max_seqs=4, block_size=16), concurrency=1, requests=2)
    assert [r.ttft_s for r in build_records(plain)] == pytest.approx([records[0].ttft_s] * 2, rel=1e-12)


def test_the_last_prompt_token_is_always_computed():
    engine = EngineConfig(max_seqs=4, block_size=16, prefix_caching=True)
    raw = _run([64], [1], engine, concurrency=1, requests=3, prefix_group=[0], shared_tokens=[64])  # the same prompt
    assert raw.prefix_cached == [0, 48, 48]  # 63 tokens at most, in whole blocks: 3 of the 4


def test_shared_blocks_count_once_and_requests_admitted_with_the_first_already_hit():
    engine = EngineConfig(max_seqs=8, max_batched_tokens=16384, block_size=16, kv_capacity_tokens=100_000,
                          prefix_caching=True)
    # 1,600 shared tokens (100 blocks) + 32 own (2 blocks); vLLM V1 caches a block when it is scheduled, so the 7
    # requests admitted in the same step as the first hit its prefix
    raw = _run([1632] * 8, [4] * 8, engine, concurrency=8, requests=8, prefix_group=[0] * 8, shared_tokens=[1600] * 8)
    assert raw.prefix_cached == [0] + [1600] * 7
    assert raw.step_prefill[0] == 1632 + 7 * 32
    assert raw.step_kv_blocks[0] == 100 + 8 * 2
    off = _run([1632] * 8, [4] * 8, EngineConfig(**{**vars(engine), "prefix_caching": False}), concurrency=8,
               requests=8)
    assert off.step_kv_blocks[0] == 8 * 102


def test_eviction_takes_the_least_recently_freed_blocks_deepest_first():
    # 30 blocks; each prompt is a 320-token prefix (20 blocks) + 16 own tokens, one token out, one client
    engine = EngineConfig(max_seqs=1, block_size=16, kv_capacity_tokens=30 * 16, prefix_caching=True)
    groups = [0, 0, 1, 1, 0]
    raw = _run([336] * 5, [1] * 5, engine, concurrency=1, requests=5, prefix_group=groups, shared_tokens=[320] * 5)
    # request 2 (group 1) takes the 10 free blocks that hold nothing, then evicts 11 of group 0's 20 (its deepest);
    # request 3's own block is the queue's head, one more of group 0's: 8 remain for request 4
    assert raw.prefix_cached == [0, 320, 0, 320, 8 * 16]
    assert max(raw.step_kv_blocks) <= 30


@pytest.mark.parametrize("load", [dict(concurrency=8, requests=60), dict(arrivals=[0.01 * i for i in range(60)])])
def test_caching_off_or_nothing_shared_changes_no_number(load):
    prompts, outputs = [300 + 37 * i for i in range(60)], [20 + i % 7 for i in range(60)]
    engine = EngineConfig(max_seqs=8, max_batched_tokens=1024, kv_capacity_tokens=6000)
    base = _run(prompts, outputs, engine, **load)
    assert base.prefix_cached == [] and base.prefix_hit_tokens == 0
    shared = dict(prefix_group=[i % 3 for i in range(60)], shared_tokens=[200] * 60)
    for other in (_run(prompts, outputs, engine, **load, **shared),  # caching off
                  _run(prompts, outputs, EngineConfig(**{**vars(engine), "prefix_caching": True}), **load,
                       prefix_group=[-1] * 60, shared_tokens=[0] * 60)):  # on, nothing shared
        assert other.end_times == base.end_times and other.step_kv_blocks == base.step_kv_blocks
        assert other.first_step == base.first_step and other.preemptions == base.preemptions


def test_the_engine_profile_sets_prefix_caching_and_the_flag_overrides_it():
    assert engine_config(step=resolve("llama-3.1-8b", "h100-sxm", engine="vllm")).prefix_caching
    assert not engine_config(step=resolve("llama-3.1-8b", "h100-sxm", engine="llama-cpp-python")).prefix_caching
    vllm = resolve("llama-3.1-8b", "h100-sxm", engine="vllm")
    assert not engine_config(step=vllm, prefix_caching=False).prefix_caching
    assert not engine_config("continuous").prefix_caching  # a generic scheduler caches nothing unless asked


def test_simulate_without_a_shared_prefix_is_unchanged_and_a_prefix_off_is_just_a_longer_prompt():
    common = dict(engine="vllm", concurrency=8, requests=40, output_tokens=32)
    on = simulate("llama-3.1-8b", "h100-sxm", prompt_tokens=384, **common)
    off = simulate("llama-3.1-8b", "h100-sxm", prompt_tokens=384, prefix_caching=False, **common)
    assert on.raw.end_times == off.raw.end_times
    assert on.summary.simulation["prefix_cache_hit_rate"] == 0.0
    assert off.summary.simulation["prefix_cache_hit_rate"] is None and not off.summary.engine["prefix_caching"]
    prefixed_off = simulate("llama-3.1-8b", "h100-sxm", prompt_tokens=128, prefix_tokens=256, prefix_caching=False,
                            **common)
    assert prefixed_off.raw.end_times == off.raw.end_times
    prefixed = simulate("llama-3.1-8b", "h100-sxm", prompt_tokens=128, prefix_tokens=256, **common)
    hit = prefixed.summary.simulation["prefix_cache_hit_rate"]
    assert hit == pytest.approx(39 * 256 / (40 * 384))  # the first request computes the prefix, every later one hits
    assert prefixed.summary.ttft_s.mean < off.summary.ttft_s.mean


def test_workload_prefix_groups_and_conversations(tmp_path):
    workload = build_workload(concurrency=2, requests=6, prompt_tokens=10, prefix_tokens=32, prefix_groups=4)
    assert workload.prompts == [42] * 6 and workload.prefix_group == [0, 1, 2, 3, 0, 1]
    assert workload.shared_tokens == [32] * 6 and workload.describe["prefix_groups"] == 4
    plain = build_workload(concurrency=2, requests=6, prompt_tokens=10)
    assert plain.prefix_group is None and "prefix_tokens" not in plain.describe
    chat = [{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "d e"},
            {"role": "user", "content": "f g h i"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"conversation": chat}) + "\n" + json.dumps({"prompt": "x y z"}) + "\n")
    workload = build_workload(concurrency=1, requests=3, dataset=path)
    turns = [i for i, g in enumerate(workload.prefix_group) if g >= 0]
    assert len(turns) == 2 and workload.prefix_group[turns[0]] == workload.prefix_group[turns[1]]
    assert [workload.shared_tokens[i] for i in turns] == [workload.prompts[i] for i in turns] == [3, 9]
    prefixed = build_workload(concurrency=1, requests=3, dataset=path, prefix_tokens=8, prefix_groups=2)
    assert prefixed.prefix_group == [0, 1, 0] and prefixed.shared_tokens == [8] * 3  # turns start differently
    with pytest.raises(SpeedlimitError, match="needs --prefix-tokens"):
        build_workload(concurrency=1, prefix_groups=2)
    with pytest.raises(SpeedlimitError, match="--prefix-tokens must be"):
        build_workload(concurrency=1, prefix_tokens=-1)


def test_a_conversations_later_turn_hits_its_earlier_turns_prompt(tmp_path):
    words = " ".join(["w"] * 64)
    chat = [{"role": "user", "content": words}, {"role": "assistant", "content": words},
            {"role": "user", "content": words}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"conversation": chat}) + "\n")
    result = simulate("llama-3.1-8b", "h100-sxm", engine="vllm", concurrency=1, requests=2, dataset=path,
                      output_tokens=4)
    assert result.raw.prompt == [64, 192] and result.raw.prefix_cached == [0, 64]


def test_every_conversation_continues_the_one_system_prefix(tmp_path):
    words = " ".join(["w"] * 64)
    chat = [{"role": "user", "content": words}, {"role": "assistant", "content": words},
            {"role": "user", "content": words}]
    path = tmp_path / "chats.jsonl"
    path.write_text((json.dumps({"conversation": chat}) + "\n") * 2)
    result = simulate("llama-3.1-8b", "h100-sxm", engine="vllm", concurrency=1, requests=4, dataset=path,
                      output_tokens=4, prefix_tokens=64)
    # 64 prefix tokens (4 blocks) + turn 1 (64) or turn 2 (192): the first request computes all; a conversation's
    # second turn hits its first turn's 8 blocks; the other conversation's first turn hits the prefix's 4
    assert result.raw.prompt == [128, 256, 128, 256]
    assert result.raw.prefix_cached == [0, 128, 64, 128]


def test_a_groups_parent_must_have_no_parent():
    engine = EngineConfig(prefix_caching=True)
    with pytest.raises(SpeedlimitError, match="parent"):
        _run([100], [2], engine, concurrency=1, requests=1, prefix_group=[2], shared_tokens=[50],
             group_parent={2: (1, 16), 1: (0, 16)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), block=st.sampled_from([1, 4, 16]), chunked=st.booleans(),
       capacity=st.sampled_from([400, 1200, None]), n=st.integers(1, 8))
def test_every_request_completes_and_hits_stay_within_the_prompt(data, block, chunked, capacity, n):
    prompts = data.draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    outputs = data.draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    groups = data.draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    shared = [data.draw(st.integers(0, p)) for p in prompts]
    parents = {}
    if data.draw(st.booleans()):  # group 1 continues group 0's first `base` tokens (conversations after a prefix)
        base = data.draw(st.integers(0, 100))
        parents = {1: (0, base)}
        for i, group in enumerate(groups):
            if group in (0, 1):
                prompts[i] = max(prompts[i], base + 1)
                shared[i] = data.draw(st.integers(base, prompts[i])) if group == 1 else base
    engine = EngineConfig(max_seqs=data.draw(st.integers(1, 6)),
                          max_batched_tokens=data.draw(st.sampled_from([512, 2048])),
                          chunked_prefill=chunked, prefill_first=data.draw(st.booleans()), block_size=block,
                          kv_capacity_tokens=float("inf") if capacity is None else capacity, prefix_caching=True)
    requests = data.draw(st.integers(1, 30))
    try:
        raw = _run(prompts, outputs, engine, concurrency=data.draw(st.integers(1, 6)), requests=requests,
                   prefix_group=groups, shared_tokens=shared, group_parent=parents)
    except SpeedlimitError as error:  # a request that can never fit, or a whole prompt over the token budget
        assert "can never be admitted" in str(error) or "without chunked prefill" in str(error)
        return
    assert raw.n == requests and all(step >= 0 for step in raw.last_step)
    assert all(0 <= cached < prompt for cached, prompt in zip(raw.prefix_cached, raw.prompt))
    assert 0 <= raw.prefix_hit_tokens <= raw.prefix_query_tokens
    # the hit rate counts each request's first lookup only (vLLM counts a preempted request's again apart)
    assert raw.prefix_query_tokens == sum(raw.prompt) and raw.prefix_hit_tokens == sum(raw.prefix_cached)
    assert max(raw.step_kv_blocks) <= raw.kv_blocks
    records = build_records(raw)
    assert all(r.output_tokens == len(r.itl_s) + 1 and r.ttft_s > 0 for r in records)
