"""The streaming HTTP client of `speedlimit bench`: one OpenAI-compatible request -> one `RequestRecord`.

aiohttp, not httpx: on the 2-core dev box aiohttp read ~7x more SSE tokens/s than httpx's `aiter_lines` against
the same local firehose with 1,000 concurrent streams (see benchmarks/bench_client_overhead.py for current figures).
A request's start is `time.perf_counter_ns()` taken when aiohttp has handed its last body byte to the socket (its
`on_request_chunk_sent` trace hook), not before `session.post`: waiting for a pooled connection, or for other streams'
work on the shared event loop, is not the server's latency. The timestamp of an SSE event is `time.perf_counter_ns()`
taken the moment the socket read that carried it returns;
the hot loop only stamps and stores reads and parsing happens after the stream (or every PARSE_BACKLOG_READS reads),
so neither this stream's nor other streams' parsing shows up as latency. uvloop is used when installed. Every failure becomes an error *kind*, never an
exception out of `send_request`.

Every request carries an `X-Request-Id` header (a fresh UUID4, kept on a retry) and its record keeps it, with the
server's own id when the response carries one (an `X-Request-Id` response header, else the OpenAI `id` of the
chunks), so that a run can be joined with server logs and traces.

A request that fails before any response arrived on a *reused* keep-alive connection is sent once more on a fresh
connection and counted in `RequestRecord.retries`: a server may close a pooled connection just as the next request goes
out on it, and that is the pool's failure, not the server's. llama.cpp's `llama-server` closes the connection after
every streamed response although its headers say `Keep-Alive: timeout=5, max=100` (curl retries those the same way).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from speedlimit.bench.metrics import RequestRecord
from speedlimit.bench.sse import MalformedSSE, SSEDecoder, interpret_event
from speedlimit.bench.workload import RequestSpec
from speedlimit.errors import SpeedlimitError

API_KEY_ENV = "SPEEDLIMIT_API_KEY"
API_PATHS = {"completions": "/completions", "chat": "/chat/completions"}


@dataclass
class Endpoint:
    """Where and how to send: base URL ending in /v1, API flavour, model, auth and the request extras."""

    base_url: str
    model: str | None = None
    api: str = "completions"
    api_key: str | None = None
    include_usage: bool = True  # send stream_options.include_usage (OpenAI, vLLM, SGLang, Ollama, TGI honour it)
    force_output: bool = True  # send min_tokens = ignore_eos-style forcing so every request yields max_tokens
    timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        if self.api not in API_PATHS:
            raise SpeedlimitError(f"unknown --api {self.api!r}: use completions or chat")
        if not self.base_url.startswith(("http://", "https://")):
            raise SpeedlimitError(f"--url must start with http:// or https:// (got {self.base_url!r})")
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or os.environ.get("OPENAI_API_KEY")

    @property
    def url(self) -> str:
        return self.base_url + API_PATHS[self.api]

    @property
    def root_url(self) -> str:
        """The server root (tokenize endpoints live there, not under /v1)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def request_body(endpoint: Endpoint, spec: RequestSpec) -> dict[str, Any]:
    """The JSON body for one request (pure). Forcing the length uses both vLLM/SGLang/llama.cpp's `ignore_eos` and
    vLLM/SGLang/llama-cpp-python's `min_tokens`; servers that do not know a field ignore it (OpenAI itself rejects
    them: use --no-force-output there)."""
    body: dict[str, Any] = {"model": endpoint.model, "stream": True, "max_tokens": spec.max_tokens}
    if endpoint.api == "chat":
        body["messages"] = spec.messages or [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if endpoint.include_usage:
        body["stream_options"] = {"include_usage": True}
    if endpoint.force_output:
        body["min_tokens"] = spec.max_tokens
        body["ignore_eos"] = True
    body.update(endpoint.extra_body)
    body.update(spec.extra)
    if body["model"] is None:
        body.pop("model")
    return body


class _Attempt:
    """One send attempt of a record, as the session's trace hooks see it (passed as aiohttp's trace_request_ctx)."""

    __slots__ = ("record", "reused_connection", "responded")

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.reused_connection = False  # the pool handed out a kept-alive connection
        self.responded = False  # a status line and headers arrived


async def _stamp_sent(_session: aiohttp.ClientSession, context: Any, _params: Any) -> None:
    """Trace hook: the request (its last body chunk so far) is on the socket now; that is its start."""
    if isinstance(context.trace_request_ctx, _Attempt):
        context.trace_request_ctx.record.start_ns = time.perf_counter_ns()


async def _on_connection_reused(_session: aiohttp.ClientSession, context: Any, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, _Attempt):
        context.trace_request_ctx.reused_connection = True


async def _on_connection_created(_session: aiohttp.ClientSession, context: Any, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, _Attempt):
        context.trace_request_ctx.reused_connection = False


def make_session(limit: int = 0, *, force_close: bool = False) -> aiohttp.ClientSession:
    """One pooled session for a whole run: no connection cap (0), no total timeout (we time each request).

    `force_close=True` gives a session whose every request opens its own connection (used for retries). The trace
    hooks stamp when a request is sent and tell whether it went out on a reused connection (aiohttp has no other
    API for either)."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, ttl_dns_cache=300, force_close=force_close)
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_stamp_sent)
    trace.on_connection_reuseconn.append(_on_connection_reused)
    trace.on_connection_create_end.append(_on_connection_created)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                 read_bufsize=2**16, auto_decompress=False, trace_configs=[trace])


def run_async(coro, use_uvloop: bool = True):
    """`asyncio.run(coro)`, on uvloop when it is installed (less event-loop overhead per SSE event)."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(coro)
    return asyncio.run(coro)


def raise_open_file_limit(wanted: int = 65536) -> int:
    """Lift RLIMIT_NOFILE's soft limit toward `wanted` (1,000 streams need > 1,024 fds on many systems)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        return soft
    except (ImportError, ValueError, OSError):
        return -1


#: Raw reads kept before they are parsed. Parsing is deferred so that the hot loop only stamps and stores each read:
#: when a batched server emits one chunk per stream at once, the last stream's timestamp then waits for cheap appends
#: of the others, not for their JSON parsing. Streams longer than this are parsed in slices.
PARSE_BACKLOG_READS = 1024


class _StreamParse:
    """Turns the timestamped raw reads of one response into tokens, usage, finish and in-stream errors."""

    __slots__ = ("decoder", "token_ns", "texts", "usage", "finish_reason", "finished", "error_kind", "error_text",
                 "response_id")

    def __init__(self) -> None:
        self.decoder = SSEDecoder()
        self.token_ns: list[int] = []
        self.texts: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.finished = False  # saw finish_reason or [DONE]
        self.error_kind: str | None = None
        self.error_text: str | None = None
        self.response_id: str | None = None  # the OpenAI `id` of the chunks (the server's id for this request)

    def _events(self, now_ns: int, events: list[tuple[str, str]]) -> None:
        for name, data in events:
            if self.error_kind is not None:
                return
            try:
                event = interpret_event(name, data)
            except MalformedSSE as error:
                self.error_kind, self.error_text = "malformed_sse", str(error)
                return
            if event.error is not None:
                self.error_kind, self.error_text = "server_error", event.error
                return
            if event.id is not None and self.response_id is None:
                self.response_id = event.id
            if event.text:
                self.token_ns.append(now_ns)
                self.texts.append(event.text)
            if event.usage is not None:
                self.usage = event.usage
            if event.finish_reason:
                self.finish_reason = event.finish_reason
                self.finished = True
            if event.done:
                self.finished = True

    def consume(self, stamps: list[int], reads: list[bytes]) -> None:
        for now_ns, chunk in zip(stamps, reads):
            self._events(now_ns, self.decoder.feed(chunk))

    def close(self, now_ns: int) -> None:
        self._events(now_ns, self.decoder.close())


#: Failures that may mean "the server closed this keep-alive connection before our request reached it".
_STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)


async def _stream(session: aiohttp.ClientSession, endpoint: Endpoint, payload: bytes, record: RequestRecord,
                  parse: _StreamParse) -> tuple[list[int], list[bytes], bool]:
    """One send attempt: stamps and raw reads not yet parsed, and whether the body completed. Fills the record's
    start, status and error fields; raises only a stale-connection error (on a reused connection, before any
    response), which `send_request` answers with one retry."""
    attempt = _Attempt(record)
    stamps: list[int] = []
    reads: list[bytes] = []
    body_complete = False
    record.start_ns = time.perf_counter_ns()  # replaced by _stamp_sent once the request is on the socket
    try:
        async with asyncio.timeout(endpoint.timeout_s):
            headers = endpoint.headers
            headers["X-Request-Id"] = record.request_id
            async with session.post(endpoint.url, data=payload, headers=headers,
                                    trace_request_ctx=attempt) as response:
                attempt.responded = True
                record.http_status = response.status
                record.server_request_id = response.headers.get("X-Request-Id") or None
                if response.status != 200:
                    body = await response.content.read(2000)
                    record.error_kind = f"http_{response.status}"
                    record.error_text = body.decode("utf-8", "replace")[:300]
                else:
                    async for chunk in response.content.iter_any():
                        stamps.append(time.perf_counter_ns())  # first thing after the read returns
                        reads.append(chunk)
                        if len(reads) >= PARSE_BACKLOG_READS:
                            parse.consume(stamps, reads)
                            stamps, reads = [], []
                    body_complete = True
    except TimeoutError:
        record.error_kind, record.error_text = "timeout", f"no complete response within {endpoint.timeout_s:g} s"
    except aiohttp.ClientConnectorError as error:
        record.error_kind, record.error_text = "connect", str(error)[:300]
    except aiohttp.ClientPayloadError as error:
        record.error_kind, record.error_text = "disconnect", (str(error) or type(error).__name__)[:300]
    except _STALE_CONNECTION_ERRORS as error:
        if attempt.reused_connection and not attempt.responded:
            raise
        record.error_kind, record.error_text = "disconnect", (str(error) or type(error).__name__)[:300]
    except aiohttp.ClientError as error:
        record.error_kind, record.error_text = "client", (str(error) or type(error).__name__)[:300]
    except asyncio.CancelledError:  # the run was stopped (Ctrl-C, SIGTERM): keep what arrived, as `cancelled`
        record.error_kind, record.error_text = "cancelled", "the run was interrupted while this request was in flight"
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
    return stamps, reads, body_complete


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint, spec: RequestSpec) -> RequestRecord:
    """Send one streaming request and time it; errors are recorded by kind, never raised."""
    record = RequestRecord(index=spec.index, prompt_tokens=spec.prompt_tokens,
                           prompt_token_source=spec.prompt_token_source, request_id=str(uuid.uuid4()))
    body = request_body(endpoint, spec)
    requested = body.get("max_tokens", body.get("max_completion_tokens"))
    record.max_tokens = requested if isinstance(requested, int) and not isinstance(requested, bool) else None
    payload = json.dumps(body).encode()
    parse = _StreamParse()
    try:
        stamps, reads, body_complete = await _stream(session, endpoint, payload, record, parse)
    except _STALE_CONNECTION_ERRORS:
        # Nothing came back on a reused connection, so the server most likely never saw the request (RFC 9112
        # 9.3.1 allows the retry for idempotent requests; a completion is one for a benchmark). Once, on a
        # connection of its own, timed from the retry's own send.
        record.retries += 1
        async with make_session(force_close=True) as fresh:
            try:
                stamps, reads, body_complete = await _stream(fresh, endpoint, payload, record, parse)
            except _STALE_CONNECTION_ERRORS as error:  # not reused, so only a race with a closing pool gets here
                record.error_kind, record.error_text = "disconnect", (str(error) or type(error).__name__)[:300]
                stamps, reads, body_complete = [], [], False
    record.end_ns = time.perf_counter_ns()
    parse.consume(stamps, reads)
    if body_complete:
        parse.close(record.end_ns)
    if record.error_kind is None and parse.error_kind is not None:
        record.error_kind, record.error_text = parse.error_kind, parse.error_text
    elif record.error_kind is None and record.http_status == 200:
        if not parse.finished:
            record.error_kind = "disconnect"
            record.error_text = "stream ended without finish_reason or [DONE]"
        elif parse.finish_reason is None and parse.token_ns:
            # e.g. llama-cpp-python with interrupt_requests (its default) cuts a stream when another request
            # waits: [DONE] with no finish_reason.
            record.error_kind = "truncated"
            record.error_text = "[DONE] arrived but no choice ever had a finish_reason"
    token_ns = parse.token_ns
    record.finish_reason = parse.finish_reason
    if record.server_request_id is None:
        record.server_request_id = parse.response_id
    record.e2e_s = (record.end_ns - record.start_ns) / 1e9
    record.output_chunks = len(token_ns)
    record.output_text = "".join(parse.texts)
    if token_ns:
        record.ttft_s = (token_ns[0] - record.start_ns) / 1e9
        record.itl_s = [(b - a) / 1e9 for a, b in zip(token_ns, token_ns[1:])]
    usage = parse.usage
    if usage is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.token_count_source = "usage"
        if usage.get("prompt_tokens") is not None:
            record.prompt_tokens = int(usage["prompt_tokens"])
            record.prompt_token_source = "usage"
    else:
        record.output_tokens = len(token_ns)
        # A chunk carries at least one token and a server stops at max_tokens, so a 'length' finish after exactly
        # max_tokens chunks is exactly max_tokens tokens; any other chunk count is only a lower bound.
        exact = record.finish_reason == "length" and record.max_tokens is not None and len(token_ns) == record.max_tokens
        record.token_count_source = "max_tokens" if exact else "chunks"
    if record.error_kind is None and not token_ns:
        record.error_kind, record.error_text = "empty", "the stream carried no generated text"
    return record


#: Seconds the pre-flight waits for `GET /models` (or --timeout, when shorter).
PREFLIGHT_TIMEOUT_S = 15.0


async def check_server(session: aiohttp.ClientSession, endpoint: Endpoint) -> list[str]:
    """Pre-flight `GET /models`: the model ids the server lists. Anything but a JSON answer with status 200 (no
    server, a hang, a refused key, a 404 from a URL without /v1 or from a server that is no OpenAI API) is a
    `SpeedlimitError` that says which."""
    url = endpoint.base_url + "/models"
    timeout_s = min(PREFLIGHT_TIMEOUT_S, endpoint.timeout_s)
    skip = "or pass --skip-preflight to send anyway"
    try:
        async with session.get(url, headers=endpoint.headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status in (401, 403):
                raise SpeedlimitError(f"{endpoint.base_url} refused the API key (HTTP {response.status}): "
                                      f"pass --api-key or set {API_KEY_ENV}")
            if response.status != 200:
                hint = ("--url is the API base, which usually ends in /v1 (e.g. --url "
                        f"{endpoint.base_url}/v1)" if not endpoint.base_url.endswith("/v1") else
                        "is this an OpenAI-compatible server, and is --url its API base?")
                raise SpeedlimitError(f"GET {url} answered HTTP {response.status}: {hint} ({skip})")
            reply = await response.json(content_type=None)
    except TimeoutError:
        raise SpeedlimitError(f"GET {url} timed out after {timeout_s:g} s: the server accepted the connection but "
                              f"did not answer (stuck, or still loading?) ({skip})") from None
    except aiohttp.ClientConnectorError as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise SpeedlimitError(f"cannot reach {endpoint.base_url} ({reason}): start the server or fix --url "
                              f"({skip} and record connection errors instead)") from None
    except aiohttp.ServerDisconnectedError:
        raise SpeedlimitError(f"{endpoint.base_url} closed the connection without answering GET {url} "
                              f"({skip})") from None
    except (aiohttp.ClientError, ValueError) as error:
        raise SpeedlimitError(f"GET {url} did not answer JSON ({str(error)[:120] or type(error).__name__}): is --url "
                              f"an OpenAI-compatible API base? ({skip})") from None
    data = reply.get("data") if isinstance(reply, dict) else None
    return [str(m.get("id")) for m in data or [] if isinstance(m, dict) and m.get("id")]
