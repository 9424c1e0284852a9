"""OpenAI-style error bodies and the exception handlers that produce them."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixlm.runtime.tokenizer_manager import (
    EngineDeadError,
    QueueFullError,
    RidInFlightError,
    SchedulerTimeoutError,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_S = "1"  # what a full queue tells clients to wait

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


def _error_doc(what: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": what}


# NOTE: every status a route may answer, for the OpenAPI schema (clients and schemathesis).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error_doc("invalid request (the message names the field)"),
    401: _error_doc("missing or wrong API key"),
    404: _error_doc("unknown model"),
    409: _error_doc("a request with this rid is in flight, or the cache cannot be flushed"),
    413: _error_doc("request body over --max-request-bytes"),
    429: _error_doc("queue full: retry after the Retry-After header's seconds"),
    500: _error_doc("internal error"),
    503: _error_doc("scheduler busy, hung or dead, or server starting"),
}
STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the response, or with stream=true server-sent events",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


class APIError(Exception):
    """An error with an HTTP status, answered with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None, code: Any = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI answers."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    # NOTE: ``code`` is always a string (OpenAI's clients treat it as one); the status by default
    code = str(code or status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: Any = None):
    return JSONResponse(error_body(status, message, param, code), status_code=status)


def to_api_error(exc: BaseException) -> APIError:
    """Map an exception raised while serving a request to its HTTP status."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFullError):  # NOTE: the client's to retry; 503 means the engine
        return APIError(429, str(exc), code="queue_full", headers={"Retry-After": RETRY_AFTER_S})
    if isinstance(exc, SchedulerTimeoutError):
        return APIError(503, str(exc), code="scheduler_timeout")
    if isinstance(exc, RidInFlightError):
        return APIError(409, str(exc), param="rid", code="rid_in_flight")
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"the engine is not running: {exc}", code="engine_dead")
    if isinstance(exc, (ValueError, TypeError)):
        return APIError(400, str(exc), guess_param(str(exc)))
    logger.exception("unexpected error while serving a request", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")


def guess_param(message: str) -> str | None:
    """The field a validation message starts with ("top_k must be ..."), if any."""
    match = re.match(r"([a-z][a-z0-9_.\[\]]*):? (?:must|is|are)\b", message)
    return match.group(1) if match else None


def describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    """A message naming the offending field, and that field's dotted path."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    loc = [p for p in loc if not _is_union_tag(p)]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid value")
    if param is None:
        if first.get("type") == "missing":  # NOTE: FastAPI's verdict on an empty body
            return "the request body is empty: send a JSON object", None
        return f"invalid request body: {message}", None
    return f"{param}: {message}", param


def _is_union_tag(part: str) -> bool:
    return part.startswith(("list[", "dict[", "function-")) or part in ("str", "int", "float")


def install_handlers(app: FastAPI) -> None:
    """Answer every error with OpenAI's error body."""

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = error_response(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})  # NOTE: 405 keeps its Allow header
        return response

    async def _mapped(_: Request, exc: Exception) -> JSONResponse:
        err = to_api_error(exc)
        response = error_response(err.status, err.message, err.param, err.code)
        response.headers.update(err.headers)
        return response

    kinds = (
        APIError, QueueFullError, EngineDeadError, RidInFlightError, SchedulerTimeoutError,
        ValueError, Exception,
    )
    for kind in kinds:
        app.add_exception_handler(kind, _mapped)
