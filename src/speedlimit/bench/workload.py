"""Workloads for `speedlimit bench`: what each request asks (prompt, length) and when open-loop requests arrive.

Pure and seeded (numpy Generator), except `build_requests`, which may ask the server's tokenizer to cut synthetic
prompts to an exact token length. Same `--seed`, same prompts, lengths and arrival times.
"""

from __future__ import annotations

import asyncio
import json
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


def synthetic_text(n_words: int, rng: np.random.Generator) -> str:
    """`n_words` random words from WORDS (seeded); distinct per request, so no prefix caching between requests."""
    picks = rng.integers(0, len(WORDS), size=max(1, n_words))
    return " ".join(WORDS[i] for i in picks)


def load_dataset(path: Path) -> list[dict[str, Any]]:
    """JSONL rows with `prompt` (or `text`) or `messages`, optional `output_tokens`/`max_tokens`."""
    if not path.is_file():
        raise SpeedlimitError(f"dataset {path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise SpeedlimitError(f"{path}:{number} is not JSON") from None
        if not isinstance(row, dict) or not (isinstance(row.get("prompt") or row.get("text"), str)
                                             or isinstance(row.get("messages"), list)):
            raise SpeedlimitError(f"{path}:{number} needs a string 'prompt' (or 'text') or a 'messages' list")
        rows.append(row)
    if not rows:
        raise SpeedlimitError(f"dataset {path} has no prompts")
    return rows


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
    while len(content) < target:
        words += " " + synthetic_text(target, rng)
        content = (await tokenizer.tokenize(words))[tokenizer.special_offset:]
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


async def build_requests(n: int, *, prompt_spec: LengthSpec, output_tokens: int, seed: int, tokenizer=None,
                         dataset: list[dict[str, Any]] | None = None, parallel: int = 8) -> list[RequestSpec]:
    """`n` request specs, deterministic for a seed: dataset rows (shuffled, cycled) or synthetic prompts."""
    if output_tokens < 1:
        raise SpeedlimitError("--output-tokens must be >= 1")
    rng = np.random.default_rng([seed, 0])
    specs: list[RequestSpec] = []
    if dataset is not None:
        order = rng.permutation(len(dataset))
        for i in range(n):
            row = dataset[int(order[i % len(dataset)])]
            max_tokens = int(row.get("output_tokens") or row.get("max_tokens") or output_tokens)
            messages = row.get("messages")
            prompt = row.get("prompt") or row.get("text") or ""
            if messages and not prompt:
                prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            specs.append(RequestSpec(i, prompt, max_tokens, messages=messages))
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
    return specs
