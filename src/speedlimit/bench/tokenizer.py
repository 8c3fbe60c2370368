"""The served model's tokenizer: reached over HTTP (`ServerTokenizer`), or read from a local file with `--tokenizer`
(`LocalTokenizer`: a Hugging Face `tokenizer.json` through the `tokenizers` package, or the vocabulary inside a
`.gguf` through the `gguf` package). Used to build prompts of exact token length and to count output tokens when the
server reports no usage.

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

from pathlib import Path
from typing import Any

import aiohttp

from speedlimit.errors import SpeedlimitError, file_error

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


# --- a local tokenizer (--tokenizer PATH) --------------------------------------------------------------------------

#: llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) whose split rules a `tokenizers` pre-tokenizer reproduces,
#: from llama.cpp's llama-vocab.cpp. Others: pass the model's tokenizer.json instead.
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GGUF_PRE_TOKENIZERS = {
    "default": "gpt2", "gpt2": "gpt2", "gpt-2": "gpt2",
    "smollm": "digits+gpt2", "starcoder": "digits+gpt2", "refact": "digits+gpt2", "codeshell": "digits+gpt2",
    "llama3": "llama3", "llama-bpe": "llama3", "llama-v3": "llama3",
    "qwen2": "qwen2",
}

#: GGUF token types (gguf.TokenType) that are special tokens, not text.
_SPECIAL_TOKEN_TYPES = {2, 3, 4}  # UNKNOWN, CONTROL, USER_DEFINED


class LocalTokenizer:
    """A tokenizer read from a local file, with the same interface as `ServerTokenizer` (its methods are async so
    both fit the same call sites; the work is local and synchronous)."""

    def __init__(self, tokenizer: Any, kind: str, source: Path, special_offset: int | None = None) -> None:
        self._tokenizer = tokenizer
        self.kind = kind
        self.source = source
        self.special_offset = (len(tokenizer.encode("", add_special_tokens=True).ids) if special_offset is None
                               else special_offset)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=True).ids)

    async def tokenize(self, text: str) -> list[int]:
        return self.encode(text)

    async def detokenize(self, tokens: list[int]) -> str:
        return self._tokenizer.decode(tokens, skip_special_tokens=False)

    async def count(self, text: str) -> int:
        return len(self.encode(text))

    async def count_generated(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def load_local_tokenizer(path: Path) -> LocalTokenizer:
    """A `tokenizer.json` (Hugging Face `tokenizers`) or a `.gguf` (its BPE vocabulary via `gguf`); one-line errors."""
    path = Path(path)
    if not path.exists() or path.is_dir():
        what = "a tokenizer.json or a .gguf"
        raise file_error(path, FileNotFoundError() if not path.exists() else IsADirectoryError(), what)
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as error:
        raise file_error(path, error, "a tokenizer.json or a .gguf") from None
    if magic == b"GGUF":
        return _gguf_tokenizer(path)
    return _json_tokenizer(path)


def _json_tokenizer(path: Path) -> LocalTokenizer:
    from tokenizers import Tokenizer

    try:
        text = path.read_text(encoding="utf-8")
        tokenizer = Tokenizer.from_str(text)
    except (OSError, UnicodeDecodeError) as error:
        raise file_error(path, error, "a Hugging Face tokenizer.json") from None
    except Exception as error:  # noqa: BLE001 - tokenizers raises plain Exception subclasses from Rust
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SpeedlimitError(f"{path} is not a Hugging Face tokenizer.json ({first[:200]})") from None
    return LocalTokenizer(tokenizer, "tokenizer.json", path)


def _gguf_tokenizer(path: Path) -> LocalTokenizer:
    import gguf
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    try:
        reader = gguf.GGUFReader(str(path))
        fields = reader.fields

        def value(key: str, default: Any = None) -> Any:
            field = fields.get(key)
            return default if field is None else field.contents()

        model = value("tokenizer.ggml.model")
        pre = value("tokenizer.ggml.pre", "default")
        tokens = value("tokenizer.ggml.tokens")
        merges = value("tokenizer.ggml.merges")
        token_types = value("tokenizer.ggml.token_type") or []
        add_bos = bool(value("tokenizer.ggml.add_bos_token", False))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
        raise SpeedlimitError(f"{path} is not a readable GGUF ({str(error)[:200] or type(error).__name__})") from None
    if model != "gpt2" or not tokens or not merges:
        raise SpeedlimitError(f"{path}: only byte-level BPE vocabularies (tokenizer.ggml.model 'gpt2') are read from a "
                              f"GGUF, this one is {model!r}: pass the model's tokenizer.json as --tokenizer")
    rule = GGUF_PRE_TOKENIZERS.get(str(pre))
    if rule is None:
        raise SpeedlimitError(f"{path}: llama.cpp pre-tokenizer {pre!r} is not one speedlimit reproduces "
                              f"({', '.join(sorted(GGUF_PRE_TOKENIZERS))}): pass the model's tokenizer.json as "
                              "--tokenizer")
    vocab = {str(token): index for index, token in enumerate(tokens)}
    pairs = [tuple(str(merge).split(" ", 1)) for merge in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    if rule == "gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif rule == "digits+gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        split = _LLAMA3_SPLIT if rule == "llama3" else _QWEN2_SPLIT
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    specials = [str(tokens[i]) for i, kind in enumerate(token_types) if int(kind) in _SPECIAL_TOKEN_TYPES]
    tokenizer.add_special_tokens(specials)
    return LocalTokenizer(tokenizer, "gguf", path, special_offset=1 if add_bos else 0)
