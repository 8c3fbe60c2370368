"""Workloads measured against peers: --prefix-tokens (shared prefix), multi-turn conversation datasets, trace replay
with --time-scale, and their one-line errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from speedlimit.bench.runner import WorkloadPlan
from speedlimit.bench.workload import LengthSpec, build_requests, load_dataset, load_trace, trace_offsets_s
from speedlimit.errors import SpeedlimitError
from test_bench_hardening import _rows


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_prefix_tokens_start_every_prompt_with_one_shared_text():
    specs = asyncio.run(build_requests(4, prompt_spec=LengthSpec("fixed", 10), output_tokens=3, seed=1,
                                       prefix_tokens=6))
    prefixes = {spec.prompt.split("\n")[0] for spec in specs}
    assert len(prefixes) == 1 and len(prefixes.pop().split()) == 6
    assert len({spec.prompt for spec in specs}) == 4 and all(spec.prompt_tokens == 16 for spec in specs)


def test_prefix_groups_give_prompt_i_prefix_i_mod_groups_and_the_first_prefix_stays():
    one = asyncio.run(build_requests(6, prompt_spec=LengthSpec("fixed", 10), output_tokens=3, seed=1, prefix_tokens=6))
    specs = asyncio.run(build_requests(6, prompt_spec=LengthSpec("fixed", 10), output_tokens=3, seed=1,
                                       prefix_tokens=6, prefix_groups=3))
    prefixes = [spec.prompt.split("\n")[0] for spec in specs]
    assert prefixes[:3] == prefixes[3:] and len(set(prefixes)) == 3
    assert prefixes[0] == one[0].prompt.split("\n")[0]  # what --prefix-tokens alone always sent
    with pytest.raises(SpeedlimitError, match="needs --prefix-tokens"):
        WorkloadPlan(prefix_groups=2)


def test_prompts_share_their_first_prefix_tokens_at_the_tokenizer_level():
    from speedlimit.bench.tokenizer import load_local_tokenizer
    from speedlimit.bundled import default_gguf_path

    tokenizer = load_local_tokenizer(default_gguf_path())
    specs = asyncio.run(build_requests(6, prompt_spec=LengthSpec("uniform", 20, 60), output_tokens=3, seed=2,
                                       tokenizer=tokenizer, prefix_tokens=50, prefix_groups=2))
    ids = [tokenizer.encode(spec.prompt) for spec in specs]
    for group in (0, 1):
        heads = {tuple(i[:50]) for i in ids[group::2]}
        assert len(heads) == 1  # every prompt of the group starts with the same 50 tokens (BOS included)
    assert ids[0][:50] != ids[1][:50]
    assert all(abs(len(i) - spec.prompt_tokens) <= 2 for i, spec in zip(ids, specs))


def test_conversation_turns_carry_the_turns_before_them_and_stay_in_order(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b"},
            {"role": "assistant", "content": "c d e"}, {"role": "user", "content": "f", "output_tokens": 9}]
    path = _write(tmp_path / "d.jsonl", [{"conversation": chat, "output_tokens": 5}, {"prompt": "x y"},
                                         {"conversation": chat[1:2]}])
    rows = load_dataset(path)
    assert len(rows) == 4
    assert rows[0]["messages"] == chat[:2] and rows[0]["output_tokens"] == 5
    assert rows[1]["messages"] == [{k: m[k] for k in ("role", "content")} for m in chat]
    assert rows[1]["output_tokens"] == 9
    for seed in range(6):
        specs = asyncio.run(build_requests(4, prompt_spec=LengthSpec("fixed", 1), output_tokens=3, seed=seed,
                                           dataset=rows, prefix_tokens=2))
        turns = [len(s.messages) for s in specs if s.messages and len(s.messages) > 2]
        first = next(i for i, s in enumerate(specs) if s.messages and len(s.messages) == 3)  # system+prefix, sys, u
        assert specs[first + 1].messages[-1]["content"] == "f"  # turn 2 right after turn 1
        assert all(s.messages is None or s.messages[0]["role"] == "system" for s in specs) and turns


@pytest.mark.parametrize("row, message", [
    ('{"conversation": []}', "non-empty list"),
    ('{"conversation": [{"role": "bot", "content": "x"}]}', "needs a 'role'"),
    ('{"conversation": [{"role": "assistant", "content": "x"}]}', "no user turn"),
    ('{"prompt": "x", "output_tokens": -3}', "whole numbers >= 1"),
    ('[1, 2]', "needs a string 'prompt'"),
])
def test_malformed_datasets_are_one_line_errors(tmp_path, row, message):
    with pytest.raises(SpeedlimitError, match=message) as error:
        load_dataset(_write(tmp_path / "d.jsonl", [row]))
    assert "\n" not in str(error.value)


def test_trace_is_sorted_relative_and_scaled(tmp_path):
    rows = load_trace(_write(tmp_path / "t.jsonl", [
        {"arrival_s": 10.5, "prompt_tokens": 8, "output_tokens": 2},
        {"arrival_s": 10.0, "prompt_tokens": 4, "output_tokens": 3}]))
    assert [(r.arrival_s, r.prompt_tokens) for r in rows] == [(0.0, 4), (0.5, 8)]
    assert trace_offsets_s(rows, 2.0) == [0.0, 1.0]
    mooncake = load_trace(_write(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1},
                                                        {"timestamp": 250, "input_length": 6, "output_length": 2}]))
    assert [r.arrival_s for r in mooncake] == [0.0, 0.25]
    specs = asyncio.run(build_requests(2, prompt_spec=LengthSpec("fixed", 1), output_tokens=64, seed=0,
                                       trace=rows))
    assert [(s.prompt_tokens, s.max_tokens) for s in specs] == [(4, 3), (8, 2)]


@pytest.mark.parametrize("row, message", [
    ('not json', "is not JSON"),
    ('{"prompt_tokens": 3, "output_tokens": 2}', "needs 'arrival_s' or 'timestamp'"),
    ('{"arrival_s": -1, "prompt_tokens": 3, "output_tokens": 2}', "must be >= 0"),
    ('{"arrival_s": "soon", "prompt_tokens": 3, "output_tokens": 2}', "must be a number"),
    ('{"arrival_s": 0, "prompt_tokens": 2.5, "output_tokens": 2}', "whole number of tokens"),
    ('{"arrival_s": 0, "prompt_tokens": 3}', "needs 'output_tokens' or 'output_length'"),
])
def test_malformed_traces_are_one_line_errors(tmp_path, row, message):
    with pytest.raises(SpeedlimitError, match=message) as error:
        load_trace(_write(tmp_path / "t.jsonl", [row]))
    assert "\n" not in str(error.value) and "t.jsonl:1" in str(error.value)


def test_trace_replay_sends_at_the_recorded_times(run_cli, faulty_server, tmp_path):
    trace = _write(tmp_path / "t.jsonl", [{"arrival_s": t, "prompt_tokens": 5, "output_tokens": 2}
                                          for t in (0.0, 0.6, 1.2, 1.8)])
    code, _, err = run_cli(["bench", "--url", faulty_server.url("ok"), "--trace", str(trace), "--time-scale", "0.5",
                            "--out", str(tmp_path / "run"), "--no-progress", "--workers", "2"])
    assert code == 0, err
    rows = sorted(_rows(tmp_path / "run" / "requests.jsonl"), key=lambda r: r["index"])
    assert len(rows) == 4
    sent = [(r["start_ns"] - rows[0]["start_ns"]) / 1e9 for r in rows]
    assert all(abs(s - p) < 0.2 for s, p in zip(sent, (0.0, 0.3, 0.6, 0.9))), sent
    load = json.loads((tmp_path / "run" / "summary.json").read_text())["load"]
    assert load["trace"] == str(trace) and load["time_scale"] == 0.5 and load["requests"] == 4


def test_trace_with_a_rate_is_an_error(run_cli, tmp_path):
    trace = _write(tmp_path / "t.jsonl", [{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}])
    code, _, err = run_cli(["bench", "--url", "http://127.0.0.1:9/v1", "--trace", str(trace), "--rate", "2"])
    assert code == 2 and "--trace sets the arrivals" in err
