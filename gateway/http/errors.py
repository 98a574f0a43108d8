"""The one mapping of an exception to an HTTP error answer (status, error type, message, headers);
each API wraps the answer in its own envelope (gateway/http/server.py ``error_response``).

Errors derive from the bases of gateway/core/errors.py; protocols/ cannot import them, so its client
errors are recognised here. Anything else is a bug: 500, logged with its traceback.
"""

import logging
from typing import NamedTuple

from twisted.internet import defer

from gateway.core import metrics
from gateway.core.errors import GatewayError, StoreBusy
from gateway.ingest.limits import RateLimited
from protocols.linear_regex import BadPattern
from protocols.native_json import BadRequest
from protocols.prometheus.errors import ProtocolError
from protocols.timespec import BadTime

log = logging.getLogger(__name__)

PROTOCOL_CLIENT_ERRORS = (BadPattern, BadRequest, BadTime)  # protocols/ errors that are the client's (400)

# Prometheus's errorType of an explicit status (HTTPError); other 4xx are bad_data, other 5xx internal.
_ERROR_TYPE_OF_STATUS = {404: "not_found", 422: "execution", 429: "unavailable", 503: "unavailable"}


class HTTPError(GatewayError):
    """An answer with an explicit status (404, 405, 401, 413, or a 400 naming its ``field``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, **details):
        super().__init__(message)
        self.status = status
        self.error_type = _ERROR_TYPE_OF_STATUS.get(status, "bad_data" if status < 500 else "internal")
        self.message = message
        self.headers = headers or {}
        self.details = details


class ErrorAnswer(NamedTuple):
    status: int
    error_type: str  # Prometheus's errorType
    message: str
    headers: dict[str, str]
    details: dict[str, object]  # extra fields of the gateway's JSON answer

    def gateway_document(self) -> dict:
        """The Graphite and native APIs' answer, and the gateway's own routes'."""
        return {"error": self.message, **self.details}

    def prometheus_document(self) -> dict:
        return {"status": "error", "errorType": self.error_type, "error": self.message}


INTERNAL = ErrorAnswer(500, "internal", "internal error; see the gateway log", {}, {})


def root_cause(error: BaseException) -> BaseException:
    """gatherResults wraps the first failure in FirstError; the answer depends on what is inside."""
    while isinstance(error, defer.FirstError):
        error = error.subFailure.value
    return error


def error_answer(error: BaseException, request) -> ErrorAnswer:
    """The answer to ``error`` raised while answering ``request``: logged when it is a bug (500)
    or the store's refusal (503), counted when it is a tenant's rate limit (429)."""
    error = root_cause(error)
    if isinstance(error, defer.CancelledError) and getattr(request, "client_gone", False):
        return ErrorAnswer(499, "canceled", "the client closed the connection", {}, {})  # nginx's code; never sent
    if isinstance(error, ProtocolError):
        return ErrorAnswer(error.status, "bad_data", error.message, {}, {})
    if isinstance(error, PROTOCOL_CLIENT_ERRORS):
        return ErrorAnswer(400, "bad_data", str(error), {}, {})
    if not isinstance(error, GatewayError):
        log.error("error answering %s", request.uri, exc_info=error)
        return INTERNAL
    if isinstance(error, RateLimited):
        metrics.RATE_LIMITED.labels(error.limit).inc()
    if isinstance(error, StoreBusy):
        log.warning("answering 503 to %s: %s", request.uri, error)
    headers = dict(error.headers) if isinstance(error, HTTPError) else {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(error.retry_after_s)
    return ErrorAnswer(error.status, error.error_type, error.answer_message(), headers, dict(error.details))
