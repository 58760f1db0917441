"""The per-job token on worker RPCs: clients send it as `authorization: Bearer <token>` metadata; the
server's interceptor refuses any call without the right one (UNAUTHENTICATED) and logs it.

The token comes from the job's Secret (rendered by the operator; the local runner makes one up).
Neighbours: `rpc/server.py` installs `TokenInterceptor`; `rpc/client.py` sends `metadata(token)`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

KEY = "authorization"


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that proves a client belongs to the job."""
    return ((KEY, f"Bearer {token}"),)


class TokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped here
    """Lets a call through only if its metadata carries this job's token (constant-time compare).

    `on_refused(method)` is called for every refused call (metrics count them by reason).
    """

    def __init__(self, token: str, on_refused: Callable[[str], None] | None = None) -> None:
        if not token:
            raise ValueError("the job token must not be empty (an empty token would let anyone in)")
        self._expected = f"Bearer {token}".encode()
        self._on_refused = on_refused

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        got = ""
        for key, value in details.invocation_metadata or ():
            if key == KEY:
                got = value if isinstance(value, str) else value.decode(errors="replace")
        if hmac.compare_digest(got.encode(), self._expected):
            return continuation(details)
        log.warning("refused %s: %s job token", details.method, "wrong" if got else "missing")
        if self._on_refused is not None:
            self._on_refused(details.method)
        handler = continuation(details)
        return _denying(handler) if handler is not None else None


def _deny(request: Any, context: Any) -> Any:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")


def _denying(handler: Any) -> Any:
    """A handler of the same shape as `handler` (so requests still parse) that aborts at once."""
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_deny, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_deny, **kw)
    return grpc.unary_unary_rpc_method_handler(_deny, **kw)
