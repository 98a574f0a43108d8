"""twisted.web glue shared by every HTTP API: routing, body limits, tenants, errors, metrics.

Handlers are ``async def handler(request) -> Response``. Client mistakes raise HTTPError and
become 4xx JSON answers; a store that cannot answer becomes 503 (so senders retry); anything
else is logged and becomes 500.
"""

import io
import json
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from twisted.internet import defer
from twisted.protocols.basic import FileSender
from twisted.python.failure import Failure
from twisted.web import http, resource, server

from gateway import metrics
from gateway.connections import Connections
from gateway.http.auth import Credentials, Unauthorized
from gateway.ingest import Overloaded
from gateway.limits import RateLimited
from gateway.model import DEFAULT_TENANT, InvalidSample, validate_tenant
from gateway.query import QueryTooLarge
from gateway.store import StoreUnavailable
from protocols.linear_regex import BadPattern

log = logging.getLogger(__name__)

JSON = "application/json"
LARGE_BODY_BYTES = 1 << 20  # answers past this size are written as the client takes them


class Response(NamedTuple):
    """``body`` is bytes, or an async iterator of bytes that is streamed as it is produced."""

    status: int
    body: object
    content_type: str = JSON
    headers: dict[str, str] = {}


class HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, **details):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
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
    twisted.web closes the connection without a word when a request line or a header line is
    over ``MAX_LENGTH`` (16 KiB): this one says why first, 414 for the request line, 431 for a header.
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

    def lineLengthExceeded(self, line):
        if self._receivedHeaderSize == 0:  # nothing of this request parsed yet: its request line
            status, reason = 414, b"URI Too Long"
            message = f"the request line is over {self.MAX_LENGTH} bytes; send long parameters in a POST form body"
        else:
            status, reason = 431, b"Request Header Fields Too Large"
            message = f"a request header is over {self.MAX_LENGTH} bytes"
        body = json.dumps({"error": message}).encode()
        head = f"HTTP/1.1 {status} ".encode() + reason
        headers = f"\r\nContent-Type: {JSON}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        self.transport.write(head + headers + body)
        self.loseConnection()


class Site(server.Site):
    protocol = Channel
    requestFactory = LimitedRequest
    noisy = False

    def __init__(
        self, root: resource.Resource, max_body_bytes: int, connections: Connections, idle_timeout_s: float | None
    ):
        # Form bodies are decoded by the route that answers (parse_form): a query route's in its
        # query executor, off this process (Twisted takes 0.3 s to decode 1 MB of form).
        super().__init__(root, timeout=idle_timeout_s, parsePOSTFormSubmission=False)
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


FORM = b"application/x-www-form-urlencoded"


def parse_form(request) -> None:
    """Add the fields of a form body (``application/x-www-form-urlencoded`` POST) to
    ``request.args``, over the query string's, as twisted.web would (the Site leaves it to us)."""
    content_type = request.getHeader(b"content-type") or b""
    if request.method != b"POST" or request.body_too_large or content_type.split(b";")[0].strip().lower() != FORM:
        return
    request.content.seek(0)
    request.args.update(http.parse_qs(request.content.read(), 1))
    request.content.seek(0)


def _with_form(handler):
    async def call(request, *rest):
        parse_form(request)
        return await handler(request, *rest)

    return call


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


def _tenant_header(request: server.Request) -> str | None:
    """``X-Scope-OrgID`` or ``X-Tenant`` (a request carrying both must agree)."""
    named = set()
    for header in (b"x-scope-orgid", b"x-tenant"):
        raw = request.getHeader(header)
        value = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw or "").strip()
        if value:
            named.add(value)
    if len(named) > 1:
        raise HTTPError(400, "the X-Scope-OrgID and X-Tenant headers name different tenants", field="tenant")
    return named.pop() if named else None


def explicit_tenant(request: server.Request) -> str | None:
    """The tenant a request is for, by one rule for every HTTP API (docs/security.rst):

    with ``--auth-file``, the credential's tenant, and a header or parameter naming another is
    403; without, the ``X-Scope-OrgID``/``X-Tenant`` header a trusted proxy sets always wins, and
    a ``tenant`` parameter (query or form) that disagrees with it is 400, never a silent switch;
    else the parameter; else None (the caller's default).
    """
    header, parameter = _tenant_header(request), arg(request, "tenant")
    principal = getattr(request, "principal", None)
    if principal is not None:
        for named in (header, parameter):
            if named and named != principal.tenant:
                raise HTTPError(
                    403,
                    f"credential {principal.name!r} is for tenant {principal.tenant!r}, not {named!r}",
                    field="tenant",
                )
        return principal.tenant
    if header and parameter and parameter != header:
        raise HTTPError(
            400, f"tenant parameter {parameter!r} differs from the tenant header's {header!r}", field="tenant"
        )
    tenant = header or parameter
    if not tenant:
        return None
    try:
        return validate_tenant(tenant)
    except InvalidSample as error:
        raise HTTPError(400, str(error), field="tenant") from None


def request_tenant(request: server.Request) -> str:
    return explicit_tenant(request) or DEFAULT_TENANT


_KNOWN_METHODS = {b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"}


def _method_label(method: bytes) -> str:
    """Any other method a client invents is ``other``, so /metrics stays bounded."""
    return method.decode("ascii") if method in _KNOWN_METHODS else "other"


def _root_cause(failure):
    """gatherResults wraps the first failure in FirstError; the answer depends on what is inside."""
    error = failure.value
    while isinstance(error, defer.FirstError):
        error = error.subFailure.value
    return error


_ACCESS_OF_ROLE = {"ingest": "write", "query": "read"}


class Router(resource.Resource):
    """Exact-path routing with 404 for unknown paths and 405 (with Allow) for wrong methods.

    With ``credentials`` (``--auth-file``) every route needs a credential holding the route's
    access: ``write`` for ingest routes, ``read`` for query routes, ``admin`` for operator
    routes, ``any`` for any valid credential; ``public`` routes need none.

    With ``executors`` (gateway.executors), the routes of role ``query`` are answered by an
    executor process running the same router: this process only checks the credential and
    moves the request and its answer.
    """

    isLeaf = True

    def __init__(self, roles: set[str] | None = None, credentials: Credentials | None = None, executors=None):
        super().__init__()
        self.roles = roles
        self.credentials = credentials
        self.executors = executors
        self.routes: dict[bytes, dict[bytes, tuple[str, Handler, str]]] = {}
        self.prefixes: list[tuple[bytes, dict[bytes, tuple[str, object, str]]]] = []

    def _wanted(self, role: str | None) -> bool:
        """Routes of a role this process does not have (``--roles``) are left out: 404."""
        return role is None or self.roles is None or role in self.roles

    def add(
        self,
        path: str,
        methods: tuple[str, ...],
        name: str,
        handler: Handler,
        role: str | None = None,
        access: str | None = None,
    ) -> None:
        if not self._wanted(role):
            return
        handler = self.executors.run if role == "query" and self.executors is not None else _with_form(handler)
        access = access or _ACCESS_OF_ROLE.get(role, "admin")
        by_method = self.routes.setdefault(path.encode(), {})
        for method in methods:
            by_method[method.encode()] = (name, handler, access)

    def add_prefix(self, prefix: str, methods: tuple[str, ...], name: str, handler, role: str | None = None) -> None:
        """Route every path under ``prefix``; the handler gets the rest of the path (decoded)."""
        if not self._wanted(role):
            return
        access = _ACCESS_OF_ROLE.get(role, "admin")
        executors = self.executors if role == "query" else None
        with_form = _with_form(handler)

        def bound(rest: str):
            async def call(request):
                if executors is not None:
                    return await executors.run(request)
                return await with_form(request, rest)

            return call

        self.prefixes.append((prefix.encode(), {m.encode(): (name, bound, access) for m in methods}))

    def _lookup(self, path: bytes):
        by_method = self.routes.get(path)
        if by_method is not None:
            return by_method
        for prefix, handlers in self.prefixes:
            if path.startswith(prefix) and len(path) > len(prefix):
                rest = urllib.parse.unquote(path[len(prefix) :].decode("utf-8", "replace"))
                return {method: (name, make(rest), access) for method, (name, make, access) in handlers.items()}
        return None

    def _route(self, request) -> tuple[str, Handler, str]:
        """The route's name, handler and access; a handler answering 404 or 405 when none fits."""
        by_method = self._lookup(request.path)
        if by_method is None:
            return "unknown", self._not_found, "any"
        if request.method not in by_method:
            return "unknown", self._method_not_allowed(sorted(m.decode() for m in by_method)), "any"
        return by_method[request.method]

    async def answer(self, request) -> Response:
        """The response to an already authorized request, its body whole, not sent: how a query
        executor runs a route. MemoryError is left to the caller, which answers for the memory cap."""
        _, handler, _ = self._route(request)
        try:
            response = await handler(request)
            if not isinstance(response.body, bytes):
                response = response._replace(body=b"".join([chunk async for chunk in response.body]))
            return response
        except MemoryError:
            raise
        except Exception:
            return self._error_response(Failure(), request)

    def render(self, request: server.Request):
        started = time.perf_counter()
        name, handler, access = self._route(request)
        request.notifyFinish().addErrback(lambda _: setattr(request, "client_gone", True))
        deferred = defer.ensureDeferred(self._authorized(handler, access, request))
        deferred.addErrback(self._error_response, request)
        deferred.addCallback(lambda response: defer.ensureDeferred(self._send(response, request, name, started)))
        deferred.addErrback(lambda failure: log.error("could not answer %s: %s", request.uri, failure.getTraceback()))
        return server.NOT_DONE_YET

    async def _authorized(self, handler: Handler, access: str, request: server.Request) -> Response:
        """Run ``handler`` once the request's credential allows ``access`` (401/403 otherwise)."""
        if self.credentials is not None and access != "public":
            raw = request.getHeader(b"authorization")
            try:
                principal = await self.credentials.authenticate(
                    raw.decode("latin-1") if isinstance(raw, bytes) else raw
                )
            except Unauthorized as error:
                metrics.AUTH_FAILURES.labels("unauthenticated").inc()
                raise HTTPError(401, str(error), headers={"WWW-Authenticate": 'Basic realm="tsgate"'}) from None
            if access != "any" and access not in principal.roles and "admin" not in principal.roles:
                metrics.AUTH_FAILURES.labels("forbidden").inc()
                raise HTTPError(403, f"credential {principal.name!r} lacks the {access!r} role this endpoint needs")
            request.principal = principal
        return await handler(request)

    async def _not_found(self, request):
        raise HTTPError(404, f"no such endpoint: {request.path.decode('utf-8', 'replace')}")

    def _method_not_allowed(self, allowed: list[str]):
        async def handler(request):
            raise HTTPError(
                405, f"method {request.method.decode()} not allowed; use {', '.join(allowed)}", allow=allowed
            )

        return handler

    def _error_response(self, failure, request) -> Response:
        error = _root_cause(failure)
        if isinstance(error, HTTPError):
            response = json_response(error.status, {"error": error.message, **error.details})
            if error.status == 405:
                return response._replace(headers={"Allow": ", ".join(error.details["allow"])})
            return response._replace(headers=error.headers)
        if isinstance(error, RateLimited):
            metrics.RATE_LIMITED.labels(error.limit).inc()
            response = json_response(429, {"error": str(error)})
            return response._replace(headers={"Retry-After": str(error.retry_after_s)})
        if isinstance(error, QueryTooLarge):
            return json_response(422, {"error": str(error)})
        if isinstance(error, BadPattern):
            return json_response(400, {"error": str(error)})
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
            if isinstance(response.body, bytes) and len(response.body) > LARGE_BODY_BYTES:
                await self._write_large(response.body, request)
            elif isinstance(response.body, bytes):
                request.write(response.body)
            else:
                await self._stream(response.body, request)
            if not getattr(request, "client_gone", False):
                request.finish()
        finally:
            metrics.HTTP_REQUESTS.labels(name, _method_label(request.method), str(status)).observe(
                time.perf_counter() - started
            )

    @staticmethod
    async def _write_large(body: bytes, request: server.Request) -> None:
        """Write a large body 16 KB at a time as the socket drains (a pull producer): written at
        once, Twisted would copy all of it in one piece on the reactor (~50 ms for 80 MB)."""
        try:
            await FileSender().beginFileTransfer(io.BytesIO(body), request)
        except Exception:  # FileSender's way of saying the client went away
            request.client_gone = True

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
