"""Workloads: length distributions, seeded prompts, exact-length fitting, datasets and arrival times."""

from __future__ import annotations

import json

import numpy as np
import pytest

from speedlimit.bench.workload import (
    LengthSpec,
    arrival_offsets_s,
    build_requests,
    fit_prompt,
    load_dataset,
    parse_length_spec,
)
from speedlimit.errors import SpeedlimitError


def test_length_specs_parse_and_sample_deterministically():
    assert parse_length_spec("512") == LengthSpec("fixed", 512.0)
    assert parse_length_spec("uniform:10:20").kind == "uniform"
    spec = parse_length_spec("normal:100:10")
    a = spec.sample(500, np.random.default_rng(1))
    assert a == spec.sample(500, np.random.default_rng(1))
    assert 97 < np.mean(a) < 103 and 8 < np.std(a) < 12
    uniform = parse_length_spec("uniform:10:20").sample(1000, np.random.default_rng(0))
    assert min(uniform) == 10 and max(uniform) == 20
    for bad in ("abc", "uniform:5", "uniform:9:3", "0", "normal:5:-1", "poisson:3:4"):
        with pytest.raises(SpeedlimitError):
            parse_length_spec(bad)


def test_poisson_arrivals_have_the_asked_rate_and_are_seeded():
    offsets = arrival_offsets_s(4000, rate=10.0, burstiness=1.0, seed=3)
    assert offsets == arrival_offsets_s(4000, rate=10.0, burstiness=1.0, seed=3)
    assert offsets != arrival_offsets_s(4000, rate=10.0, burstiness=1.0, seed=4)
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.1, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # exponential: CV 1
    bursty = np.diff(arrival_offsets_s(4000, rate=10.0, burstiness=0.25, seed=3))
    steady = np.diff(arrival_offsets_s(4000, rate=10.0, burstiness=8.0, seed=3))
    assert bursty.std() > gaps.std() > steady.std()
    assert arrival_offsets_s(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]


class WordTokenizer:
    """A stand-in server tokenizer: one token per word, plus a BOS like many servers add."""

    special_offset = 1

    async def tokenize(self, text):
        return [0] + [sum(w.encode()) % 1000 + 1 for w in text.split()]

    async def detokenize(self, tokens):
        return " ".join(f"w{t}" for t in tokens if t)

    async def count(self, text):
        return len(await self.tokenize(text))


async def test_fit_prompt_hits_the_exact_count_including_special_tokens():
    text, count = await fit_prompt(WordTokenizer(), 37, np.random.default_rng(0))
    assert count == 37 and len(text.split()) == 36


async def test_build_requests_is_deterministic_and_exact_with_a_tokenizer():
    spec = parse_length_spec("uniform:5:50")
    first = await build_requests(20, prompt_spec=spec, output_tokens=8, seed=7, tokenizer=WordTokenizer())
    again = await build_requests(20, prompt_spec=spec, output_tokens=8, seed=7, tokenizer=WordTokenizer())
    assert [r.prompt for r in first] == [r.prompt for r in again]
    assert all(r.prompt_token_source == "tokenizer" for r in first)
    assert [await WordTokenizer().count(r.prompt) for r in first] == [r.prompt_tokens for r in first]
    assert len({r.prompt for r in first}) == 20  # distinct prompts: no accidental prefix-cache hits


async def test_without_a_tokenizer_prompts_are_words_and_say_so():
    requests = await build_requests(3, prompt_spec=LengthSpec("fixed", 12), output_tokens=4, seed=0)
    assert [len(r.prompt.split()) for r in requests] == [12, 12, 12]
    assert {r.prompt_token_source for r in requests} == {"words"} and requests[0].max_tokens == 4


async def test_dataset_rows_are_shuffled_cycled_and_keep_their_output_length(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "alpha beta"}, {"text": "gamma", "output_tokens": 3},
            {"messages": [{"role": "user", "content": "hi there"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    dataset = load_dataset(path)
    requests = await build_requests(7, prompt_spec=LengthSpec("fixed", 1), output_tokens=9, seed=1, dataset=dataset)
    prompts = [r.prompt for r in requests]
    assert sorted(set(prompts)) == ["alpha beta", "gamma", "hi there"]
    assert {r.max_tokens for r in requests if r.prompt == "gamma"} == {3}
    assert any(r.messages for r in requests)


def test_dataset_errors_are_one_line_speedlimit_errors(tmp_path):
    with pytest.raises(SpeedlimitError, match="does not exist"):
        load_dataset(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    with pytest.raises(SpeedlimitError, match="bad.jsonl:2"):
        load_dataset(bad)


async def test_sweep_levels_draw_other_prompts_and_lengths_than_level_0():
    from speedlimit.bench.workload import level_seed

    spec = parse_length_spec("uniform:10:500")
    levels = [await build_requests(12, prompt_spec=spec, output_tokens=4, seed=level_seed(3, level)) for level in (0, 1)]
    assert [s.prompt_tokens for s in levels[0]] == spec.sample(12, np.random.default_rng([3, 0]))
    assert [s.prompt_tokens for s in levels[1]] == spec.sample(12, np.random.default_rng([level_seed(3, 1), 0]))
    assert not {s.prompt for s in levels[0]} & {s.prompt for s in levels[1]}  # nothing for a prefix cache to serve


@pytest.mark.parametrize("seed", [-1, 2**63])
def test_a_seed_numpy_cannot_take_is_one_error_before_any_request(seed):
    # found by the fuzz test: `bench --seed -1` reached numpy's SeedSequence and ended in a traceback
    from speedlimit.bench.runner import WorkloadPlan

    with pytest.raises(SpeedlimitError, match="--seed must be a whole number between 0 and"):
        WorkloadPlan(seed=seed)
    assert WorkloadPlan(seed=0).seed == 0


@pytest.mark.parametrize("seed", [-1, 2**63, True, 1.5, "7"])
def test_bench_and_simulate_refuse_the_same_seeds_with_the_same_line(seed):
    # one check (bench.workload.checked_seed) for both legs, so simulate draws exactly what bench would have accepted
    from speedlimit.bench.runner import WorkloadPlan
    from speedlimit.simulator.api import build_workload

    with pytest.raises(SpeedlimitError) as from_bench:
        WorkloadPlan(seed=seed)
    with pytest.raises(SpeedlimitError) as from_simulate:
        build_workload(seed=seed)
    assert str(from_bench.value) == str(from_simulate.value)
    assert str(from_bench.value).startswith("--seed must be a whole number between 0 and 9,223,372,036,854,775,807")
