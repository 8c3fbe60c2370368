"""The served model's own tokenizer, reached over HTTP: used to build prompts of exact token length and to count
output tokens when the server reports no usage.

Probed in order (the first that answers with a sane shape wins):

- llama-cpp-python server: `POST /extras/tokenize {"input", "model"}` -> `{"tokens"}`, `/extras/detokenize`.
- vLLM: `POST /tokenize {"model", "prompt"}` -> `{"tokens", "count"}`, `/detokenize {"model", "tokens"}` -> `{"prompt"}`.
- llama.cpp llama-server: `POST /tokenize {"content", "add_special": true}` -> `{"tokens"}`, `/detokenize` ->
  `{"content"}`.

SGLang, TGI and Ollama's /v1 expose no such pair: then prompts are built from words (approximate length) and output
tokens are counted from usage or chunks; the summary's `prompt_token_source`/`token_count_source` says which.
`count` includes the special tokens the server adds to a prompt (e.g. BOS), which is what the server itself counts.
"""

from __future__ import annotations

from typing import Any

import aiohttp

PROBE_TEXT = "hello world, one two three"


class ServerTokenizer:
    """Tokenize/detokenize through one server's endpoints (`kind` names which API shape)."""

    def __init__(self, session: aiohttp.ClientSession, root_url: str, model: str | None, kind: str,
                 headers: dict[str, str] | None = None) -> None:
        self.session = session
        self.root_url = root_url.rstrip("/")
        self.model = model
        self.kind = kind
        self.headers = headers or {}
        self.special_offset = 0  # tokens the server adds to any text (BOS...), measured at probe time

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(self.root_url + path, json=body, headers=self.headers,
                                     timeout=aiohttp.ClientTimeout(total=30)) as response:
            if response.status != 200:
                raise RuntimeError(f"{path} answered HTTP {response.status}")
            return await response.json(content_type=None)

    async def tokenize(self, text: str) -> list[int]:
        if self.kind == "llama-cpp-python":
            reply = await self._post("/extras/tokenize", {"input": text, "model": self.model})
        elif self.kind == "vllm":
            reply = await self._post("/tokenize", {"model": self.model, "prompt": text})
        else:
            reply = await self._post("/tokenize", {"content": text, "add_special": True})
        tokens = reply.get("tokens")
        if not isinstance(tokens, list):
            raise RuntimeError(f"{self.kind} tokenize reply has no token list")
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]

    async def detokenize(self, tokens: list[int]) -> str:
        if self.kind == "llama-cpp-python":
            return (await self._post("/extras/detokenize", {"tokens": tokens, "model": self.model}))["text"]
        if self.kind == "vllm":
            return (await self._post("/detokenize", {"model": self.model, "tokens": tokens}))["prompt"]
        return (await self._post("/detokenize", {"tokens": tokens}))["content"]

    async def count(self, text: str) -> int:
        """Tokens the server counts for `text` as a prompt (special tokens included)."""
        return len(await self.tokenize(text))

    async def count_generated(self, text: str) -> int:
        """Tokens of generated `text` (the special tokens a prompt would get are subtracted)."""
        return max(0, len(await self.tokenize(text)) - self.special_offset)


async def probe_tokenizer(session: aiohttp.ClientSession, root_url: str, model: str | None,
                          headers: dict[str, str] | None = None) -> ServerTokenizer | None:
    """The first tokenizer API the server answers, or None."""
    for kind in ("llama-cpp-python", "vllm", "llama.cpp"):
        tokenizer = ServerTokenizer(session, root_url, model, kind, headers)
        try:
            tokens = await tokenizer.tokenize(PROBE_TEXT)
            text = await tokenizer.detokenize(tokens)
            empty = await tokenizer.tokenize("")
        except (aiohttp.ClientError, RuntimeError, KeyError, TypeError, ValueError, TimeoutError):
            continue
        if tokens and isinstance(text, str) and "one two three" in text:
            tokenizer.special_offset = len(empty)
            return tokenizer
    return None
