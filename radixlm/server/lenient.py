"""Request fields the server does not know: accepted and named (as vLLM does), or refused.

OpenAI's API and SDKs, and the gateways in front of them, add top-level fields as the API grows
(``metadata``, ``store``, ``service_tier``, ``prompt_cache_key``, ...). By default a request
carrying fields the server does not know is served as if they were absent; each such field is
logged once per server and named in the ``x-radixlm-ignored-fields`` response header.
``--strict-api`` refuses them with a 400 instead. Known fields are always validated.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlm.server.errors import APIError
from radixlm.server.state import server_state

logger = logging.getLogger(__name__)

HEADER = "x-radixlm-ignored-fields"
_STATE_KEY = "ignored_fields"
MAX_HEADER_CHARS = 1024
MAX_LOGGED = 256  # distinct names remembered (a client could send endless made-up ones)
_logged: set[str] = set()  # NOTE: process-wide: the log names each field once


def check_fields(request: Request, body: BaseModel) -> list[str]:
    """The top-level fields of ``body`` no route reads; under ``--strict-api`` a 400 naming the
    first. Otherwise they are logged (once each) and left for ``IgnoredFieldsHeader``."""
    names = sorted(body.model_extra or {})
    if not names:
        return names
    if server_state(request).args.strict_api:
        raise APIError(
            400, f"{names[0]}: Extra inputs are not permitted (--strict-api)", param=names[0],
            code="unknown_field",
        )  # fmt: skip
    for name in names:
        if name not in _logged and len(_logged) < MAX_LOGGED:
            _logged.add(name)
            logger.info("ignoring the unknown request field %r (%s)", name, request.url.path)
    request.state.ignored_fields = names
    return names


class IgnoredFieldsHeader:
    """Adds ``x-radixlm-ignored-fields: a, b`` to a response whose request had unknown fields
    (streams too: the header goes out with the first bytes)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # NOTE: created here, so routes further in (which may copy the scope) share this dict
        state = scope.setdefault("state", {})

        async def send_with_header(message: Message) -> None:
            names = state.get(_STATE_KEY)
            if message["type"] == "http.response.start" and names:
                headers = [*message.get("headers", []), (HEADER.encode(), header_value(names))]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_header)


def header_value(names: list[str]) -> bytes:
    """The names as a header value: printable ASCII, other characters escaped as ``ascii()``
    writes them (``\\xe9``), cut at ``MAX_HEADER_CHARS``."""
    text = ", ".join(names)
    text = "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)
    return text[:MAX_HEADER_CHARS].encode("ascii")
