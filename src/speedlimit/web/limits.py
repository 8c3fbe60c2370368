"""What the web app accepts before a route sees a request: the request-body cap (`BodySizeLimit`), and the
wording of its errors (`web_wording`: the API's field names, not the CLI's flags)."""

from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable

#: The largest request body the API reads: a pasted config.json is a few kB.
MAX_BODY_BYTES = 1 << 20

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodySizeLimit:
    """ASGI middleware: a request whose body is over ``max_bytes`` gets 413 before the app runs.

    A declared Content-Length over the cap is refused without reading a byte; otherwise (chunked uploads) the body
    is read up to the cap and no further, then handed to the app. Memory per request stays under the cap plus
    one chunk.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        detail = (f"request body is larger than {self.max_bytes:,} bytes; send a model name, a size or one pasted "
                  "config.json")
        payload = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


_FLAG = re.compile(r"(?<![\w-])--(?:no-)?([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def web_wording(message: str) -> str:
    """An error written for the command line, reworded for the web: ``--bw-efficiency`` -> ``bw_efficiency``."""
    return _FLAG.sub(lambda match: match.group(1).replace("-", "_"), message)
