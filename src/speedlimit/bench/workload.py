"""Workloads for `speedlimit bench`: what each request asks (prompt, length) and when open-loop requests arrive.

Pure and seeded (numpy Generator), except `build_requests`, which may ask the server's tokenizer to cut synthetic
prompts to an exact token length. Same `--seed`, same prompts, lengths and arrival times.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speedlimit.errors import SpeedlimitError

#: Common English words; nearly all are one token with a leading space in BPE vocabularies, so N words ~ N tokens
#: when no tokenizer is reachable.
WORDS = (
    "the of and to in is was for on are as with his they at be this from have or by one had not but what all were "
    "when we there can an your which their said if do will each about how up out them then she many some so these "
    "would other into has more her two like him see time could no make than first been its who now people my made "
    "over did down only way find use may water long little very after words called just where most know get through "
    "back much before go good new write our used me man too any day same right look think also around another came "
    "come work three word must because does part even place well such here take why things help put years different "
    "away again off went old number great tell men say small every found still between name should home big give air "
    "line set own under read last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house world going want school important until form food keep "
    "children feet land side without boy once animals life enough took sometimes four head above kind began almost live "
    "page got earth need far hand high year mother light parts country father let night following picture being study "
    "second eyes soon times story boys since white days ever paper hard near sentence better best across during today "
    "others however sure means knew its try told young miles sun ways thing whole hear example heard several change "
    "answer room sea against top turned learn point city play toward five using himself usually"
).split()


@dataclass
class LengthSpec:
    """A token-length distribution: fixed N, uniform over [low, high], or normal(mean, std) clipped to >= 1."""

    kind: str
    a: float
    b: float = 0.0

    def sample(self, n: int, rng: np.random.Generator) -> list[int]:
        if self.kind == "fixed":
            return [int(self.a)] * n
        if self.kind == "uniform":
            return [int(x) for x in rng.integers(int(self.a), int(self.b) + 1, size=n)]
        return [max(1, int(round(x))) for x in rng.normal(self.a, self.b, size=n)]

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a


def parse_length_spec(text: str) -> LengthSpec:
    """'512' | 'fixed:512' | 'uniform:256:768' | 'normal:512:64' -> LengthSpec."""
    parts = [p.strip() for p in str(text).split(":")]
    try:
        if len(parts) == 1 or (parts[0] == "fixed" and len(parts) == 2):
            spec = LengthSpec("fixed", float(int(parts[-1])))
        elif parts[0] in ("uniform", "normal") and len(parts) == 3:
            spec = LengthSpec(parts[0], float(parts[1]), float(parts[2]))
        else:
            raise ValueError
    except ValueError:
        raise SpeedlimitError(f"bad token length {text!r}: use N, uniform:LOW:HIGH or normal:MEAN:STD") from None
    if spec.a < 1 or (spec.kind == "uniform" and spec.b < spec.a) or (spec.kind == "normal" and spec.b < 0):
        raise SpeedlimitError(f"bad token length {text!r}: lengths must be >= 1, LOW <= HIGH, STD >= 0")
    return spec


@dataclass
class RequestSpec:
    """One request's content: a completion prompt or chat messages, its token count if known, and max_tokens."""

    index: int
    prompt: str
    max_tokens: int
    prompt_tokens: int | None = None
    prompt_token_source: str = "unknown"
    messages: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


#: A sweep level draws its prompts and lengths from seed + level x LEVEL_SEED_STEP (its arrival times keep the run's
#: seed): with one set of prompts for every level, a server's prefix cache would serve every level after the first.
LEVEL_SEED_STEP = 1_000


#: Largest --seed: numpy's seed sequences take non-negative integers, and 2**63 - 1 stays exact in every JSON reader
#: that parses to int64.
MAX_SEED = 2**63 - 1


def checked_seed(seed: Any) -> int:
    """``seed`` as an int, or one error line saying what --seed takes (bench and simulate both check here)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise SpeedlimitError(f"--seed must be a whole number between 0 and {MAX_SEED:,}, got {seed!r}")
    return int(seed)


def level_seed(seed: int, level: int) -> int:
    """The seed of sweep level ``level``'s prompts and lengths (level 0: the run's own seed)."""
    return seed + level * LEVEL_SEED_STEP


def synthetic_text(n_words: int, rng: np.random.Generator) -> str:
    """`n_words` random words from WORDS (seeded); distinct per request, so no prefix caching between requests."""
    picks = rng.integers(0, len(WORDS), size=max(1, n_words))
    return " ".join(WORDS[i] for i in picks)


def _jsonl(path: Path, what: str) -> list[tuple[int, Any]]:
    """(line number, parsed JSON) of every non-blank line; one-line errors for a missing file or a bad line."""
    if not path.is_file():
        raise SpeedlimitError(f"{what} {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SpeedlimitError(f"cannot read {what} {path} ({error})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except ValueError:
            raise SpeedlimitError(f"{path}:{number} is not JSON") from None
    return rows


def expand_conversation(turns: Any, where: str, output_tokens: Any = None, conversation: int = 0
                        ) -> list[dict[str, Any]]:
    """A multi-turn conversation -> one dataset row per user turn, whose `messages` are every earlier turn and
    reply (the replies recorded in the dataset) plus this turn: turn k's prompt is a prefix of turn k+1's, as in a
    chat session, so prefix caching can be measured. `output_tokens` on a user turn (or the row) sets its reply's
    length."""
    if not isinstance(turns, list) or not turns:
        raise SpeedlimitError(f"{where}: 'conversation' must be a non-empty list of {{'role', 'content'}} turns")
    rows, history = [], []
    for k, turn in enumerate(turns):
        if (not isinstance(turn, dict) or turn.get("role") not in ("system", "user", "assistant")
                or not isinstance(turn.get("content"), str)):
            raise SpeedlimitError(f"{where}: conversation turn {k} needs a 'role' (system, user or assistant) and a "
                                  "string 'content'")
        history.append({"role": turn["role"], "content": turn["content"]})
        if turn["role"] == "user":
            rows.append({"messages": list(history), "output_tokens": turn.get("output_tokens") or output_tokens,
                         "_conversation": conversation, "_turn": len(rows)})
    if not rows:
        raise SpeedlimitError(f"{where}: the conversation has no user turn")
    return rows


def load_dataset(path: Path) -> list[dict[str, Any]]:
    """JSONL rows with `prompt` (or `text`), `messages` (one request), or `conversation` (a multi-turn chat: one
    request per user turn, see `expand_conversation`); optional `output_tokens`/`max_tokens`."""
    rows = []
    for number, row in _jsonl(path, "dataset"):
        if isinstance(row, dict) and "conversation" in row:
            rows.extend(expand_conversation(row["conversation"], f"{path}:{number}",
                                            row.get("output_tokens") or row.get("max_tokens"), number))
            continue
        if not isinstance(row, dict) or not (isinstance(row.get("prompt") or row.get("text"), str)
                                             or isinstance(row.get("messages"), list)):
            raise SpeedlimitError(f"{path}:{number} needs a string 'prompt' (or 'text'), a 'messages' list or a "
                                  "'conversation' list")
        rows.append(row)
    for row in rows:
        value = row.get("output_tokens") or row.get("max_tokens")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpeedlimitError(f"{path}: output_tokens/max_tokens must be whole numbers >= 1 (got {value!r})")
    if not rows:
        raise SpeedlimitError(f"dataset {path} has no prompts")
    return rows


@dataclass
class TraceRow:
    """One request of a recorded trace: when it arrived (s from the trace's start) and its lengths in tokens."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


#: Accepted spellings in a trace row. `timestamp` is in milliseconds (as in the Mooncake traces).
TRACE_KEYS = {"arrival": ("arrival_s", "timestamp"), "prompt": ("prompt_tokens", "input_length"),
              "output": ("output_tokens", "output_length")}


def load_trace(path: Path) -> list[TraceRow]:
    """A JSONL trace, one request a line: {"arrival_s": 0.5, "prompt_tokens": 512, "output_tokens": 128} (or
    Mooncake's {"timestamp": ms, "input_length", "output_length"}); sorted by arrival, times from the first one."""
    rows = []
    for number, row in _jsonl(path, "trace"):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise SpeedlimitError(f"{where} is not a JSON object")
        found = {}
        for name, keys in TRACE_KEYS.items():
            key = next((k for k in keys if k in row), None)
            if key is None:
                raise SpeedlimitError(f"{where} needs {' or '.join(repr(k) for k in keys)}")
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SpeedlimitError(f"{where}: {key!r} must be a number (got {value!r})")
            if name == "arrival":
                if value < 0:
                    raise SpeedlimitError(f"{where}: {key!r} must be >= 0 (got {value!r})")
                found[name] = value / 1000 if key == "timestamp" else float(value)
            else:
                if value != int(value) or not 1 <= value <= 2**20:
                    raise SpeedlimitError(f"{where}: {key!r} must be a whole number of tokens between 1 and "
                                          f"{2**20:,} (got {value!r})")
                found[name] = int(value)
        rows.append(TraceRow(found["arrival"], found["prompt"], found["output"]))
    if not rows:
        raise SpeedlimitError(f"trace {path} has no requests")
    rows.sort(key=lambda r: r.arrival_s)
    first = rows[0].arrival_s
    return [TraceRow(r.arrival_s - first, r.prompt_tokens, r.output_tokens) for r in rows]


def trace_offsets_s(rows: list[TraceRow], time_scale: float = 1.0) -> list[float]:
    """Send times of a replayed trace: its recorded arrivals times `time_scale` (2 = half the rate, 0.5 = double)."""
    if not 0 < time_scale < math.inf:
        raise SpeedlimitError("--time-scale must be a finite number > 0")
    return [row.arrival_s * time_scale for row in rows]


def arrival_offsets_s(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Open-loop send times (seconds from start): gamma inter-arrival gaps with mean 1/rate.

    burstiness = gamma shape: 1 is a Poisson process, < 1 burstier, > 1 more regular; rate = inf sends all at once.
    """
    if n <= 0:
        return []
    if rate == float("inf"):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise SpeedlimitError("--rate and --burstiness must be > 0")
    rng = np.random.default_rng([seed, 1])
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return [float(x) for x in np.cumsum(gaps)]


async def fit_prompt(tokenizer, target: int, rng: np.random.Generator) -> tuple[str, int]:
    """Synthetic text the server tokenizes to exactly `target` tokens (or the closest found in a few tries)."""
    words = synthetic_text(target + 16, rng)
    tokens = await tokenizer.tokenize(words)
    content = tokens[tokenizer.special_offset:]
    for _ in range(32):  # each round adds `target` words: a working tokenizer needs one or two
        if len(content) >= target:
            break
        words += " " + synthetic_text(target, rng)
        content = (await tokenizer.tokenize(words))[tokenizer.special_offset:]
    else:
        raise SpeedlimitError(f"the tokenizer turned {len(words.split()):,} words of English into {len(content):,} "
                              f"tokens, short of the {target:,} asked for: not a working tokenizer for this model "
                              "(check --tokenizer, or the server's /tokenize)")
    keep = max(1, target - tokenizer.special_offset)
    best: tuple[str, int] | None = None
    for _ in range(8):
        text = await tokenizer.detokenize(content[:keep])
        count = await tokenizer.count(text)
        if best is None or abs(count - target) < abs(best[1] - target):
            best = (text, count)
        if count == target:
            break
        keep = max(1, keep + target - count)
    assert best is not None
    return best


def _dataset_order(dataset: list[dict[str, Any]], rng: np.random.Generator) -> list[int]:
    """Row order for a run: rows shuffled, except that a conversation's turns stay together and in order."""
    groups: list[list[int]] = []
    for i, row in enumerate(dataset):
        key = row.get("_conversation")
        if key is not None and groups and dataset[groups[-1][0]].get("_conversation") == key:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [i for g in rng.permutation(len(groups)) for i in groups[int(g)]]


async def build_requests(n: int, *, prompt_spec: LengthSpec, output_tokens: int, seed: int, tokenizer=None,
                         dataset: list[dict[str, Any]] | None = None, parallel: int = 8, prefix_tokens: int = 0,
                         trace: list[TraceRow] | None = None, prefix_groups: int = 1) -> list[RequestSpec]:
    """`n` request specs, deterministic for a seed: dataset rows (shuffled, a conversation's turns kept in order,
    cycled), synthetic prompts, or synthetic prompts of a trace's lengths (row i for request i). `prefix_tokens`:
    the same synthetic text of that many tokens starts every prompt (a system message for chat rows), so a
    server's prefix cache can hit; `prefix_groups` such texts, prompt i starting with text i mod groups."""
    if output_tokens < 1:
        raise SpeedlimitError("--output-tokens must be >= 1")
    rng = np.random.default_rng([seed, 0])
    specs: list[RequestSpec] = []
    if dataset is not None:
        order = _dataset_order(dataset, rng)
        for i in range(n):
            row = dataset[int(order[i % len(dataset)])]
            max_tokens = int(row.get("output_tokens") or row.get("max_tokens") or output_tokens)
            messages = row.get("messages")
            prompt = row.get("prompt") or row.get("text") or ""
            if messages and not prompt:
                prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            specs.append(RequestSpec(i, prompt, max_tokens, messages=messages))
    elif trace is not None:
        for i in range(n):
            row = trace[i % len(trace)]
            specs.append(RequestSpec(i, "", row.output_tokens, prompt_tokens=row.prompt_tokens))
    else:
        lengths = prompt_spec.sample(n, rng)
        for i, length in enumerate(lengths):
            specs.append(RequestSpec(i, "", output_tokens, prompt_tokens=length))
    gate = asyncio.Semaphore(parallel)

    async def complete(spec: RequestSpec) -> None:
        request_rng = np.random.default_rng([seed, 2, spec.index])
        async with gate:
            if dataset is not None:
                if tokenizer is not None and not spec.messages:
                    spec.prompt_tokens = await tokenizer.count(spec.prompt)
                    spec.prompt_token_source = "tokenizer"
                else:
                    spec.prompt_tokens = len(spec.prompt.split())
                    spec.prompt_token_source = "words"
            elif tokenizer is not None:
                spec.prompt, spec.prompt_tokens = await fit_prompt(tokenizer, spec.prompt_tokens, request_rng)
                spec.prompt_token_source = "tokenizer"
            else:
                spec.prompt = synthetic_text(spec.prompt_tokens, request_rng)
                spec.prompt_token_source = "words"

    await asyncio.gather(*(complete(spec) for spec in specs))
    if prefix_tokens > 0:
        await add_shared_prefix(specs, prefix_tokens, seed, tokenizer, prefix_groups)
    return specs


async def add_shared_prefix(specs: list[RequestSpec], prefix_tokens: int, seed: int, tokenizer=None,
                            groups: int = 1) -> list[str]:
    """Start every prompt with one of `groups` seeded texts of `prefix_tokens` tokens each (exact with a tokenizer,
    else words), request i with text i mod groups (the first text is the same whatever `groups`); chat rows get it
    as a leading system message. Prompt token counts grow by the prefix's. Returns the texts."""
    groups = max(1, min(groups, len(specs)))  # a text no request would start with is not built
    rng = np.random.default_rng([seed, 3])
    prefixes: list[tuple[str, int]] = []
    for _ in range(groups):
        if tokenizer is not None:
            prefixes.append(await fit_prompt(tokenizer, prefix_tokens, rng))
        else:
            prefixes.append((synthetic_text(prefix_tokens, rng), prefix_tokens))
    for spec in specs:
        prefix, count = prefixes[spec.index % groups]
        spec.prompt = prefix + "\n" + spec.prompt
        if spec.messages:
            spec.messages = [{"role": "system", "content": prefix}, *spec.messages]
        if spec.prompt_tokens is not None:
            spec.prompt_tokens += count
    return [text for text, _ in prefixes]
