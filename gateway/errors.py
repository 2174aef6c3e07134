"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    417: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


class ApiError(Exception):
    """An answer the handler gives instead of a completion; never a traceback."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None,
        param: str | None = None,
        retry_after: int | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after
        self.error_type = error_type  # where OpenAI names another than the status's
        # The connection closes after the answer: what the client still sends (a refused
        # body) would be read as its next request.
        self.closes = False

    def body(self) -> dict[str, object]:
        return error_body(self.status, self.message, self.code, self.param, self.error_type)

    def encoded(self) -> bytes:
        return json.dumps(self.body()).encode()

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """`extra` and the error's own headers (Retry-After)."""
        all_headers = dict(extra or {})
        if self.retry_after is not None:
            all_headers["Retry-After"] = str(self.retry_after)
        return all_headers

    def response(self, headers: Mapping[str, str] | None = None) -> web.Response:
        response = web.Response(
            status=self.status,
            body=self.encoded(),
            content_type="application/json",
            headers=self.headers(headers),
        )
        if self.closes:
            response.force_close()
        return response


def error_body(
    status: int,
    message: str,
    code: str | None,
    param: str | None = None,
    error_type: str | None = None,
) -> dict[str, object]:
    return {
        "error": {
            "message": message,
            "type": error_type or ERROR_TYPES.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request", param)


def unreadable_body(error: Exception) -> ApiError:
    """A body the HTTP layer could not read: a gzip header on plain text, a bad chunk."""
    detail = " ".join(str(error).split())
    return ApiError(400, f"The request body cannot be read: {detail}"[:300], "invalid_body")


def not_found(kind: str, ident: str) -> ApiError:
    return ApiError(404, f"No such {kind}: {ident!r}", f"{kind}_not_found")
