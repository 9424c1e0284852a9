"""Request bodies over ``--max-request-bytes`` are refused with 413 before anything parses
them: by their Content-Length when they declare one, else while they are read."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlm.server.errors import error_body


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        body, more, size = [], True, 0
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([], message, receive), send)
                return
            body.append(message.get("body", b""))
            size += len(body[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._refuse(send)
                return
        await self.app(scope, _replay(body, None, receive), send)

    async def _refuse(self, send: Send) -> None:
        message = (f"Payload Too Large: the request body exceeds max_request_bytes "
                   f"({self.max_bytes} bytes)")  # fmt: skip
        payload = json.dumps(error_body(413, message, None, "request_too_large")).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _replay(chunks: list[bytes], pending: Message | None, receive: Receive) -> Receive:
    """A receive that gives the buffered body once, then the original receive's messages."""
    first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
    queue: list[Message] = [pending] if pending is not None else [first]

    async def replayed() -> Message:
        return queue.pop(0) if queue else await receive()

    return replayed
