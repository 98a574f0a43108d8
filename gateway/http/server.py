"""twisted.web glue shared by every HTTP API: routing, body limits, tenants, errors, metrics.

Handlers are ``async def handler(request) -> Response``. Client mistakes raise HTTPError and
become 4xx JSON answers; a store that cannot answer becomes 503 (so senders retry); anything
else is logged and becomes 500.
"""

import json
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from twisted.internet import defer
from twisted.web import http, resource, server

from gateway import metrics
from gateway.connections import Connections
from gateway.ingest import Overloaded
from gateway.limits import RateLimited
from gateway.model import DEFAULT_TENANT, InvalidSample, validate_tenant
from gateway.query import QueryTooLarge
from gateway.store import StoreUnavailable

log = logging.getLogger(__name__)

JSON = "application/json"


class Response(NamedTuple):
    """``body`` is bytes, or an async iterator of bytes that is streamed as it is produced."""

    status: int
    body: object
    content_type: str = JSON
    headers: dict[str, str] = {}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, **details):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details


def json_response(status: int, document) -> Response:
    return Response(status, json.dumps(document, ensure_ascii=False, allow_nan=False).encode("utf-8"))


Handler = Callable[[server.Request], Awaitable[Response]]


class LimitedRequest(server.Request):
    """A request that stops storing its body past the site's limit, so the handler can answer 413
    without the gateway ever holding an oversized body."""

    body_bytes = 0
    body_too_large = False

    def gotLength(self, length):
        super().gotLength(length)
        if length is not None and length > self.channel.site.max_body_bytes:
            self.body_too_large = True

    def handleContentChunk(self, data):
        self.body_bytes += len(data)
        if self.body_bytes > self.channel.site.max_body_bytes:
            self.body_too_large = True
        if not self.body_too_large:
            super().handleContentChunk(data)


class Channel(http.HTTPChannel):
    """An HTTP connection counted in the gateway's connection cap and closed gracefully at shutdown.

    The idle timeout (Site ``timeout``) is not restarted by the bytes of an incomplete request
    head: a client sending its headers slowly is closed like an idle one, however it trickles.
    """

    listener = "http"
    awaiting_headers = True

    @property
    def evictable(self) -> bool:
        """No request under way: what the connection cap may close for a new connection."""
        return self.awaiting_headers

    def connectionMade(self):
        super().connectionMade()
        self.site.connections.opened(self)

    def connectionLost(self, reason):
        super().connectionLost(reason)
        self.site.connections.closed(self)

    def resetTimeout(self):
        if not self.awaiting_headers:
            super().resetTimeout()

    def allHeadersReceived(self):
        self.awaiting_headers = False
        super().allHeadersReceived()

    def requestDone(self, request):
        self.awaiting_headers = True  # before the next pipelined request is parsed
        super().requestDone(request)

    def timeoutConnection(self):
        metrics.IDLE_CLOSED.labels(self.listener).inc()
        super().timeoutConnection()

    def checkPersistence(self, request, version):
        """Requests that arrive while the gateway stops are answered with ``Connection: close``."""
        if self.site.connections.closing:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return super().checkPersistence(request, version)

    def close_when_idle(self) -> None:
        """Close now if no request is under way, else once its answer is sent."""
        if not self.requests:
            self.loseConnection()
            return
        self.persistent = False
        for request in self.requests:
            if not request.startedWriting:
                request.responseHeaders.setRawHeaders(b"connection", [b"close"])


class Site(server.Site):
    protocol = Channel
    requestFactory = LimitedRequest
    noisy = False

    def __init__(self, root: resource.Resource, max_body_bytes: int, connections: Connections, idle_timeout_s: float | None):
        super().__init__(root, timeout=idle_timeout_s)
        self.max_body_bytes = max_body_bytes
        self.connections = connections

    def buildProtocol(self, addr):
        if not self.connections.admit("http", addr):
            return None
        return super().buildProtocol(addr)

    def log(self, request):
        """No per-request access log: /metrics has the request counts and latencies."""


def read_body(request: LimitedRequest) -> bytes:
    if request.body_too_large:
        limit = request.channel.site.max_body_bytes
        raise HTTPError(413, f"request body is over the limit of {limit} bytes (--max-body-bytes)")
    request.content.seek(0)
    return request.content.read()


def arg(request: server.Request, name: str, default: str | None = None) -> str | None:
    """A query-string or form argument as text; HTTPError 400 when it is not UTF-8."""
    values = request.args.get(name.encode())
    if not values:
        return default
    try:
        return values[-1].decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPError(400, f"parameter {name!r} is not valid UTF-8") from None


def args(request: server.Request, name: str) -> list[str]:
    try:
        return [value.decode("utf-8") for value in request.args.get(name.encode(), [])]
    except UnicodeDecodeError:
        raise HTTPError(400, f"parameter {name!r} is not valid UTF-8") from None


def require_arg(request: server.Request, name: str) -> str:
    value = arg(request, name)
    if not value:
        raise HTTPError(400, f"parameter {name!r} is required", field=name)
    return value


def explicit_tenant(request: server.Request) -> str | None:
    """The tenant a request names: ``tenant`` parameter, then X-Tenant, then X-Scope-OrgID."""
    tenant = arg(request, "tenant")
    for header in (b"x-tenant", b"x-scope-orgid"):
        if tenant:
            break
        raw = request.getHeader(header)
        tenant = raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else raw
    if not tenant:
        return None
    try:
        return validate_tenant(tenant)
    except InvalidSample as error:
        raise HTTPError(400, str(error), field="tenant") from None


def request_tenant(request: server.Request) -> str:
    return explicit_tenant(request) or DEFAULT_TENANT


def _root_cause(failure):
    """gatherResults wraps the first failure in FirstError; the answer depends on what is inside."""
    error = failure.value
    while isinstance(error, defer.FirstError):
        error = error.subFailure.value
    return error


class Router(resource.Resource):
    """Exact-path routing with 404 for unknown paths and 405 (with Allow) for wrong methods."""

    isLeaf = True

    def __init__(self, roles: set[str] | None = None):
        super().__init__()
        self.roles = roles
        self.routes: dict[bytes, dict[bytes, tuple[str, Handler]]] = {}
        self.prefixes: list[tuple[bytes, dict[bytes, tuple[str, Handler]]]] = []

    def add(self, path: str, methods: tuple[str, ...], name: str, handler: Handler, role: str | None = None) -> None:
        """Routes of a role this process does not have (``--roles``) are left out: 404."""
        if role is not None and self.roles is not None and role not in self.roles:
            return
        by_method = self.routes.setdefault(path.encode(), {})
        for method in methods:
            by_method[method.encode()] = (name, handler)

    def add_prefix(self, prefix: str, methods: tuple[str, ...], name: str, handler, role: str | None = None) -> None:
        """Route every path under ``prefix``; the handler gets the rest of the path (decoded)."""
        if role is not None and self.roles is not None and role not in self.roles:
            return

        def bound(rest: str):
            async def call(request):
                return await handler(request, rest)

            return call

        self.prefixes.append((prefix.encode(), {m.encode(): (name, bound) for m in methods}))

    def _lookup(self, path: bytes):
        by_method = self.routes.get(path)
        if by_method is not None:
            return by_method
        for prefix, handlers in self.prefixes:
            if path.startswith(prefix) and len(path) > len(prefix):
                rest = urllib.parse.unquote(path[len(prefix) :].decode("utf-8", "replace"))
                return {method: (name, make(rest)) for method, (name, make) in handlers.items()}
        return None

    def render(self, request: server.Request):
        started = time.perf_counter()
        by_method = self._lookup(request.path)
        if by_method is None:
            name, handler = "unknown", self._not_found
        elif request.method not in by_method:
            name, handler = "unknown", self._method_not_allowed(sorted(m.decode() for m in by_method))
        else:
            name, handler = by_method[request.method]
        request.notifyFinish().addErrback(lambda _: setattr(request, "client_gone", True))
        deferred = defer.ensureDeferred(handler(request))
        deferred.addErrback(self._error_response, request)
        deferred.addCallback(lambda response: defer.ensureDeferred(self._send(response, request, name, started)))
        deferred.addErrback(lambda failure: log.error("could not answer %s: %s", request.uri, failure.getTraceback()))
        return server.NOT_DONE_YET

    async def _not_found(self, request):
        raise HTTPError(404, f"no such endpoint: {request.path.decode('utf-8', 'replace')}")

    def _method_not_allowed(self, allowed: list[str]):
        async def handler(request):
            raise HTTPError(405, f"method {request.method.decode()} not allowed; use {', '.join(allowed)}", allow=allowed)

        return handler

    def _error_response(self, failure, request) -> Response:
        error = _root_cause(failure)
        if isinstance(error, HTTPError):
            response = json_response(error.status, {"error": error.message, **error.details})
            if error.status == 405:
                return response._replace(headers={"Allow": ", ".join(error.details["allow"])})
            return response
        if isinstance(error, RateLimited):
            metrics.RATE_LIMITED.labels(error.limit).inc()
            response = json_response(429, {"error": str(error)})
            return response._replace(headers={"Retry-After": str(error.retry_after_s)})
        if isinstance(error, QueryTooLarge):
            return json_response(422, {"error": str(error)})
        if isinstance(error, (StoreUnavailable, Overloaded)):
            log.warning("answering 503 to %s: %s", request.uri, error)
            response = json_response(503, {"error": f"the store cannot take this request now, retry later: {error}"})
            return response._replace(headers={"Retry-After": "1"})
        log.error("error answering %s: %s", request.uri, failure.getTraceback())
        return json_response(500, {"error": "internal error; see the gateway log"})

    async def _send(self, response: Response, request: server.Request, name: str, started: float) -> None:
        status = response.status
        try:
            if request.finished or getattr(request, "client_gone", False):
                return
            request.setResponseCode(status)
            request.setHeader(b"content-type", response.content_type.encode())
            for header, value in response.headers.items():
                request.setHeader(header.encode(), value.encode())
            if isinstance(response.body, bytes):
                request.write(response.body)
            else:
                await self._stream(response.body, request)
            if not getattr(request, "client_gone", False):
                request.finish()
        finally:
            metrics.HTTP_REQUESTS.labels(name, request.method.decode("ascii", "replace"), str(status)).observe(
                time.perf_counter() - started
            )

    @staticmethod
    async def _stream(chunks, request: server.Request) -> None:
        """Write chunks as they come. The status is already sent, so a failure midway can only be
        logged and the connection closed: the client sees a truncated stream, never a wrong one."""
        try:
            async for chunk in chunks:
                if getattr(request, "client_gone", False):
                    return
                request.write(chunk)
        except Exception:
            log.exception("stream to %s failed midway; closing the connection", request.uri)
            request.channel.loseConnection()
            request.client_gone = True
