"""FaultyOpenAIServer: a deliberately misbehaving, fake OpenAI-compatible streaming server for tests and benchmarks.

It is NOT a real inference server: it never runs a model. It speaks just enough HTTP/1.1 (raw asyncio, chunked
transfer encoding, keep-alive) to stream `/v1/completions` and `/v1/chat/completions` SSE responses, and it can
fail on purpose. The fault is chosen by the first path segment of the URL, so one server serves every mode:

    http://127.0.0.1:PORT/<mode>/v1/completions

Modes:
    ok            `max_tokens` (or `max_completion_tokens`, default 16) chunks (one "token" each), then a finish chunk, a usage chunk when
                  `stream_options.include_usage` is asked for, and `[DONE]`.
    nousage       like ok but never reports usage (llama-cpp-python style).
    firehose      like ok, as fast as the socket allows; every chunk's text is the server's send time
                  (`time.perf_counter_ns()`, CLOCK_MONOTONIC, comparable across processes on Linux) plus a space;
                  the first chunk's text starts with `r<ns> `, the time the server had read the whole request.
    paced-<ms>    like firehose but sleeps <ms> milliseconds before each chunk (the first one too: a known TTFT).
    multi-<k>     like nousage, but every chunk carries <k> tokens (k words that are one token each in GPT-2-style
                  BPE vocabularies, SmolLM2's included): a server that packs several tokens into one event.
    mute          accepts the connection, reads the request, never answers (GET /v1/models included).
    http_429 / http_500 / http_503   that status with an OpenAI-style JSON error body.
    disconnect    two chunks, then the TCP connection is dropped mid-stream.
    malformed     two chunks, then a `data:` line that is not JSON.
    hang          one chunk, then nothing, forever (the client's per-request timeout must end it).
    empty         a finish chunk and `[DONE]`, no text at all.
    error_event   one chunk, then an in-stream `data: {"error": ...}` event (vLLM/TGI style).
    mixed         request i (server-wide counter) takes mode MIXED_CYCLE[i % len(MIXED_CYCLE)].
    stale         like ok for the first request on a connection; a completion request that arrives on a kept-alive
                  connection is read and the connection closed with no response byte: what a client sees when the
                  server closed an idle keep-alive connection just as the client reused it (llama-server does).
    drop          every completion request is read and its connection closed with no response byte.
    metrics       like ok, paced 2 ms a chunk, and `GET /metrics/metrics` answers vLLM-format Prometheus text
                  (`vllm:` gauges, counters and a TTFT histogram) computed from what this mode has served so far.
    echo_id       like ok, and the response carries `X-Request-Id: server-<the id the request sent>`.
    metrics_garbage   like ok; `GET .../metrics` answers 200 with an HTML page (not Prometheus text).
    metrics_hang      like ok; `GET .../metrics` never answers.
    Any other mode answers `GET .../metrics` with 404 (a server without Prometheus metrics).

`GET /<mode>/v1/models` lists one model, `fake-model`. Run it in a background thread (`FaultyOpenAIServer`, a context
manager) or as a separate process: `python tests/bench/faulty_server.py --port 0` prints `PORT <n>` when ready.
`served` lists (mode, position of the request on its connection: 1 = first) for every request, in arrival order;
`request_ids` the X-Request-Id header of every completion request (None when it had none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from typing import Any

MIXED_CYCLE = ("ok", "http_429", "http_500", "http_503", "disconnect", "malformed", "empty", "hang", "error_event")
MODEL_NAME = "fake-model"
#: vLLM's TTFT histogram buckets (seconds), the first ones of its list.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
#: Words that are exactly one token each, with their leading space, in GPT-2-style BPE vocabularies (SmolLM2's too).
MULTI_WORDS = ("the", "of", "and", "to", "in", "is", "was", "for")


def _chunk_bytes(payload: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer-encoding chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(obj: Any) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


def _token_event(chat: bool, text: str, finish_reason: str | None = None) -> dict:
    if chat:
        choice = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish_reason}
        return {"id": "fake", "object": "chat.completion.chunk", "model": MODEL_NAME, "choices": [choice]}
    choice = {"index": 0, "text": text, "finish_reason": finish_reason}
    return {"id": "fake", "object": "text_completion", "model": MODEL_NAME, "choices": [choice]}


class _Handler:
    """The asyncio protocol logic: parse requests on one connection, answer each by mode."""

    def __init__(self, server: "FaultyOpenAIServer") -> None:
        self.server = server
        self.received_ns = 0
        self.headers: dict[str, str] = {}
        self.echo_id = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.server.connections.add(task)
        position = 0  # requests read on this connection so far
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    return
                method, path, _ = request_line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                self.received_ns = time.perf_counter_ns()
                self.headers = headers
                position += 1
                keep_open = await self.respond(method, path, body, writer, position)
                if not keep_open:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            self.server.connections.discard(task)
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass

    async def respond(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter,
                      position: int = 1) -> bool:
        parts = path.split("?", 1)[0].strip("/").split("/", 1)
        mode = parts[0]
        route = "/" + (parts[1] if len(parts) > 1 else "")
        if mode == "mixed":
            with self.server.lock:
                index = self.server.request_counter
                self.server.request_counter += 1
            mode = MIXED_CYCLE[index % len(MIXED_CYCLE)]
        self.server.modes_served.append(mode)
        self.server.served.append((mode, position))
        self.echo_id = mode == "echo_id"
        if mode == "mute":
            await asyncio.sleep(3600)
            return False
        if method == "GET" and route == "/health":
            writer.write(self._head(200, "application/json", 2) + b"{}")
            await writer.drain()
            return True
        if method == "GET" and route == "/v1/models":
            payload = json.dumps({"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]}).encode()
            writer.write(self._head(200, "application/json", len(payload)) + payload)
            await writer.drain()
            return True
        if method == "GET" and route == "/metrics":
            if mode == "metrics_hang":
                await asyncio.sleep(3600)
                return False
            if mode in ("metrics", "metrics_garbage"):
                payload = (self.server.vllm_metrics() if mode == "metrics" else
                           "<html><body><h1>Welcome</h1><p>nothing to see</p></body></html>\n").encode()
                kind = "text/plain; version=0.0.4; charset=utf-8" if mode == "metrics" else "text/html"
                writer.write(self._head(200, kind, len(payload)) + payload)
                await writer.drain()
                return True
        if method != "POST" or route not in ("/v1/completions", "/v1/chat/completions"):
            payload = b'{"error":{"message":"not found"}}'
            writer.write(self._head(404, "application/json", len(payload)) + payload)
            await writer.drain()
            return True
        if mode == "drop" or (mode == "stale" and position > 1):
            return False  # close without a byte: the connection was "already closed" when this request came
        request = json.loads(body or b"{}")
        chat = route.endswith("chat/completions")
        self.server.request_ids.append(self.headers.get("x-request-id"))
        if mode.startswith("http_"):
            status = int(mode[5:])
            payload = json.dumps({"error": {"message": f"fake {status}", "code": status}}).encode()
            writer.write(self._head(status, "application/json", len(payload)) + payload)
            await writer.drain()
            return True
        if mode != "metrics":
            return await self.stream(mode, request, chat, writer)
        with self.server.lock:
            self.server.metrics_state["running"] += 1
        try:
            return await self.stream(mode, request, chat, writer)
        finally:
            with self.server.lock:
                state = self.server.metrics_state
                state["running"] -= 1
                state["finished"] += 1
                state["prompt_tokens"] += 7
                state["generation_tokens"] += int(request.get("max_tokens") or 16)

    def _head(self, status: int, content_type: str, length: int | None) -> bytes:
        reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
                  503: "Service Unavailable"}.get(status, "Status")
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}", "Connection: keep-alive"]
        if self.echo_id and self.headers.get("x-request-id"):
            lines.append(f"X-Request-Id: server-{self.headers['x-request-id']}")
        lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def stream(self, mode: str, request: dict, chat: bool, writer: asyncio.StreamWriter) -> bool:
        n_tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
        received_ns = self.received_ns
        per_chunk = int(mode.split("-", 1)[1]) if mode.startswith("multi-") else 1
        include_usage = (bool((request.get("stream_options") or {}).get("include_usage")) and mode != "nousage"
                         and per_chunk == 1)
        writer.write(self._head(200, "text/event-stream", None))
        pace_s = float(mode.split("-", 1)[1]) / 1000 if mode.startswith("paced-") else 0.0
        if mode == "metrics":
            pace_s = 0.002
        timestamped = mode == "firehose" or mode.startswith("paced-")
        n_tokens = -(-n_tokens // per_chunk) if per_chunk > 1 else n_tokens  # chunks to send
        if mode == "empty":
            n_tokens = 0
        elif mode in ("disconnect", "malformed"):
            n_tokens = min(n_tokens, 2)
        elif mode in ("hang", "error_event"):
            n_tokens = 1
        for i in range(n_tokens):
            if pace_s:
                await asyncio.sleep(pace_s)
            if timestamped:
                text = (f"r{received_ns} " if i == 0 else "") + f"{time.perf_counter_ns()} "
            elif per_chunk > 1:
                text = "".join(f" {MULTI_WORDS[(i * per_chunk + j) % len(MULTI_WORDS)]}" for j in range(per_chunk))
            else:
                text = f"tok{i} "
            writer.write(_chunk_bytes(_sse(_token_event(chat, text))))
            if i == 0 and mode == "metrics":
                self.server.observe_ttft((time.perf_counter_ns() - received_ns) / 1e9)
            if pace_s or i % 16 == 15:
                await writer.drain()
        await writer.drain()
        if mode == "disconnect":
            writer.transport.abort()
            return False
        if mode == "malformed":
            writer.write(_chunk_bytes(b"data: {this is not json\n\n"))
            writer.write(_chunk_bytes(_sse("[DONE]")) + b"0\r\n\r\n")
            await writer.drain()
            return True
        if mode == "hang":
            await asyncio.sleep(3600)
            return False
        if mode == "error_event":
            writer.write(_chunk_bytes(_sse({"error": {"message": "fake in-stream failure", "code": 500}})))
            writer.write(_chunk_bytes(_sse("[DONE]")) + b"0\r\n\r\n")
            await writer.drain()
            return True
        writer.write(_chunk_bytes(_sse(_token_event(chat, "", "length" if n_tokens else "stop"))))
        if include_usage:
            usage = {"prompt_tokens": 7, "completion_tokens": n_tokens, "total_tokens": 7 + n_tokens}
            event = {"id": "fake", "object": "chat.completion.chunk" if chat else "text_completion",
                     "model": MODEL_NAME, "choices": [], "usage": usage}
            writer.write(_chunk_bytes(_sse(event)))
        writer.write(_chunk_bytes(_sse("[DONE]")) + b"0\r\n\r\n")
        await writer.drain()
        return True


class FaultyOpenAIServer:
    """The faulty fake server on 127.0.0.1 in a background thread; `with FaultyOpenAIServer() as s: s.url("ok")`."""

    def __init__(self, port: int = 0) -> None:
        self.requested_port = port
        self.port = 0
        self.lock = threading.Lock()
        self.request_counter = 0
        self.modes_served: list[str] = []
        self.served: list[tuple[str, int]] = []
        self.request_ids: list[str | None] = []
        self.metrics_state = {"running": 0, "finished": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.ttft_buckets = {bound: 0 for bound in TTFT_BUCKETS}
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.connections: set = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    def observe_ttft(self, seconds: float) -> None:
        with self.lock:
            self.ttft_sum += seconds
            self.ttft_count += 1
            for bound in self.ttft_buckets:
                if seconds <= bound:
                    self.ttft_buckets[bound] += 1

    def vllm_metrics(self) -> str:
        """What vLLM's /metrics looks like (names, types, labels, float formatting), from this mode's counters."""
        labels = f'engine="0",model_name="{MODEL_NAME}"'
        with self.lock:
            state = dict(self.metrics_state)
            buckets, total, count = dict(self.ttft_buckets), self.ttft_sum, self.ttft_count
        lines = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for suffix, extra, value in samples:
                lines.append(f"{name}{suffix}{{{extra}{labels}}} {float(value)!r}")

        family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
               [("", "", state["running"])])
        family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [("", "", 0)])
        family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               [("", "", min(1.0, state["running"] / 64))])
        family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
               [("", "", state["prompt_tokens"])])
        family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
               [("", "", state["generation_tokens"])])
        family("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried "
               "tokens.", [("", "", state["prompt_tokens"])])
        family("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
               [("", "", state["prompt_tokens"] // 7 * 3)])
        rows = [("_bucket", f'le="{bound}",', n) for bound, n in buckets.items()]
        rows += [("_bucket", 'le="+Inf",', count), ("_count", "", count), ("_sum", "", total)]
        family("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", rows)
        lines.append("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.")
        lines.append("# TYPE process_cpu_seconds_total counter")
        lines.append("process_cpu_seconds_total 1.5")
        return "\n".join(lines) + "\n"

    def url(self, mode: str) -> str:
        """Base URL (ending in /v1) that makes this server behave in `mode`."""
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    async def serve(self, on_ready=None) -> None:
        self._stop = asyncio.Event()
        handler = _Handler(self)
        server = await asyncio.start_server(handler.handle, "127.0.0.1", self.requested_port, backlog=4096)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready:
            on_ready(self.port)
        async with server:
            await self._stop.wait()
            for task in list(self.connections):
                task.cancel()
            await asyncio.gather(*self.connections, return_exceptions=True)

    def start(self) -> "FaultyOpenAIServer":
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.serve(lambda _port: self._ready.set()))

        self._thread = threading.Thread(target=run, name="FaultyOpenAIServer", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("FaultyOpenAIServer did not start")
        return self

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(5)

    def __enter__(self) -> "FaultyOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (for 'connection refused' and real servers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop if installed")
    args = parser.parse_args()
    server = FaultyOpenAIServer(args.port)
    if args.uvloop:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    asyncio.run(server.serve(lambda port: print(f"PORT {port}", flush=True)))


if __name__ == "__main__":
    main()
