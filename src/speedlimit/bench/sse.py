"""Pure server-sent-events handling for OpenAI-compatible streams: bytes -> events -> (text, usage, finish, error).

Servers differ in how a stream ends and where usage goes; `interpret_event` accepts all of them:

- OpenAI, vLLM, SGLang, Ollama (/v1): with `stream_options.include_usage` a last chunk has `"choices": []` and
  `usage`; other chunks carry `"usage": null`. vLLM's `continuous_usage_stats` puts a running usage in every chunk
  (we keep the last one). Then `data: [DONE]`.
- TGI (/v1 Messages API): usage rides on the chunk that has `finish_reason`; older versions send none.
- llama.cpp `llama-server`: usage (and `timings`) on the final chunk; llama-cpp-python's server: never any usage,
  a final chunk with empty text and `finish_reason`, then `[DONE]`; sse-starlette `: ping` comment lines between.
- Chat streams start with a role-only delta (no text): it is not a token and does not end TTFT.
- Errors inside a 200 stream (vLLM, TGI, llama.cpp) arrive as `data: {"error": ...}` (sometimes `event: error`).
- Reasoning models stream `delta.reasoning_content` (vLLM/SGLang/DeepSeek) or `delta.reasoning` (Ollama, newer vLLM):
  those are generated tokens too, so they count as text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class MalformedSSE(ValueError):
    """A `data:` payload that is neither `[DONE]` nor a JSON object."""


class SSEDecoder:
    """Incremental SSE decoder: `feed(bytes)` returns the complete events' (event_name, data) pairs.

    Follows the WHATWG rules we need: lines end in LF or CRLF, `:` starts a comment, several `data:` lines join with
    LF, a blank line dispatches. Bytes are kept until a full line arrives, so events split across reads are fine.
    """

    __slots__ = ("_buffer", "_data", "_event")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._event = b""

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        if self._buffer:
            chunk = self._buffer + chunk
        lines = chunk.split(b"\n")
        self._buffer = lines.pop()
        events: list[tuple[str, str]] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append((self._event.decode() or "message", b"\n".join(self._data).decode("utf-8", "replace")))
                self._data = []
                self._event = b""
                continue
            if line[0] == 58:  # b":" comment / keep-alive ping
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value
        return events

    def close(self) -> list[tuple[str, str]]:
        """Flush an event the server left without its terminating blank line (some servers do at EOF)."""
        events = self.feed(b"\n\n") if (self._buffer or self._data) else []
        self._buffer = b""
        return events


@dataclass(slots=True)
class StreamEvent:
    """What one SSE data payload means for the benchmark."""

    text: str = ""
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    id: str | None = None  # the chunk's OpenAI `id` (the server's id for the request)


DONE = StreamEvent(done=True)


def _choice_text(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if isinstance(text, str):
        return text
    delta = choice.get("delta") or choice.get("message") or {}
    parts = []
    for key in ("content", "reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str):
            parts.append(value)
    for call in delta.get("tool_calls") or ():
        arguments = (call.get("function") or {}).get("arguments")
        if isinstance(arguments, str):
            parts.append(arguments)
    return "".join(parts)


def interpret_event(event_name: str, data: str) -> StreamEvent:
    """Map one SSE event to text/usage/finish/error; raises MalformedSSE on a payload that is not JSON."""
    if data == "[DONE]":
        return DONE
    try:
        obj = json.loads(data)
    except ValueError as error:
        raise MalformedSSE(f"not JSON: {data[:80]!r}") from error
    if not isinstance(obj, dict):
        raise MalformedSSE(f"not a JSON object: {data[:80]!r}")
    if event_name == "error" or obj.get("error"):
        detail = obj.get("error", obj)
        message = detail.get("message", detail) if isinstance(detail, dict) else detail
        return StreamEvent(error=str(message)[:500])
    result = StreamEvent()
    response_id = obj.get("id")
    if isinstance(response_id, str) and response_id:
        result.id = response_id[:200]
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        result.usage = usage
    choices = obj.get("choices")
    if isinstance(choices, list):
        texts = []
        for choice in choices:
            if isinstance(choice, dict):
                texts.append(_choice_text(choice))
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
        result.text = "".join(texts)
    elif "choices" not in obj and "usage" not in obj:
        if isinstance(obj.get("content"), str) and "stop" in obj:
            # llama-server's own /completion(s) stream, which its root also serves: its OpenAI API is under /v1
            raise MalformedSSE("llama.cpp's native completion stream (content/stop events, no choices): its "
                               "OpenAI-compatible API is under /v1, so pass --url ending in /v1")
        raise MalformedSSE(f"no choices in event: {data[:80]!r}")
    return result
