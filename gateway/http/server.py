"""twisted.web glue shared by every HTTP API: routing, body limits, tenants, errors, metrics.

Handlers are ``async def handler(request) -> Response``. What they raise is answered by
gateway/http/errors.py, once for every API: client mistakes become 4xx JSON answers, a store that
cannot answer 503 (so senders retry), anything else is logged and becomes 500.
"""

import io
import json
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from operator import itemgetter
from typing import Any, NamedTuple

from twisted.internet import defer, reactor
from twisted.protocols.basic import FileSender
from twisted.web import http, resource, server

from gateway.core import metrics
from gateway.core.connections import Connections
from gateway.core.model import DEFAULT_TENANT, InvalidSample, validate_tenant
from gateway.http.auth import Credentials, Unauthorized
from gateway.http.errors import HTTPError, error_answer
from protocols.graphite import excerpt

log = logging.getLogger(__name__)

JSON = "application/json"
# Answers past this size are written as the client takes them, so a connection's send buffer
# holds about this much at most, and a write deadline sees progress at this grain.
LARGE_BODY_BYTES = 64 << 10
# A connection stalled in a write this long is one whose client does not read: at the bound on
# unsent bytes, such connections are closed for a new answer (UnsentAnswers).
STALLED_EVICTABLE_S = 1.0
UNSENT_RETRY_AFTER_S = 5


class Response(NamedTuple):
    """``body`` is bytes, or an async iterator of bytes that is streamed as it is produced."""

    status: int
    body: Any  # bytes, or an async iterator of bytes
    content_type: str = JSON
    headers: dict[str, str] = {}


def _needs_newline(response: Response) -> bool:
    """A JSON answer ends with a newline, so that ``curl`` leaves the shell prompt on a line of its
    own; the Content-Length counts it (Twisted's, or chunks)."""
    return response.content_type == JSON and bool(response.body) and not response.body.endswith(b"\n")


def json_response(status: int, document) -> Response:
    return Response(status, json.dumps(document, ensure_ascii=False, allow_nan=False).encode("utf-8"))


def error_response(error: BaseException, request, prometheus: bool = False) -> Response:
    """The answer to ``error`` (gateway/http/errors.py), in Prometheus's envelope or the
    gateway's ``{"error": ...}`` of the Graphite and native APIs."""
    answer = error_answer(error, request)
    document = answer.prometheus_document() if prometheus else answer.gateway_document()
    return json_response(answer.status, document)._replace(headers=answer.headers)


Handler = Callable[[server.Request], Awaitable[Response]]

_UNSENT_FULL = HTTPError(
    503,
    "the gateway holds too many answers its clients have not read yet (--http-max-unsent-bytes); retry later",
    {"Retry-After": str(UNSENT_RETRY_AFTER_S)},
)


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


class BodyDeadline(NamedTuple):
    """How fast a request body must arrive (``--http-body-timeout``, ``--http-body-min-rate``)."""

    timeout_s: float | None  # None: no deadline
    min_rate: int  # bytes per second on average from the headers on, past BODY_RATE_GRACE_S; 0: none

    @property
    def enabled(self) -> bool:
        return bool(self.timeout_s or self.min_rate)

    def refusal(self, elapsed_s: float, received: int) -> tuple[str, str] | None:
        """Why a body with ``received`` bytes ``elapsed_s`` after its headers is too slow, as
        (metric reason, message); None while it is on time."""
        if self.timeout_s and elapsed_s >= self.timeout_s:
            return "timeout", f"the request body did not arrive within {self.timeout_s:g}s (--http-body-timeout)"
        if self.min_rate and elapsed_s >= BODY_RATE_GRACE_S and received < self.min_rate * elapsed_s:
            return "rate", (
                f"the request body arrived at {received / elapsed_s:.0f} bytes/s, under the minimum of"
                f" {self.min_rate} (--http-body-min-rate)"
            )
        return None


class UnsentAnswers:
    """The bytes of HTTP answers this process holds for clients that have not taken them yet
    (``--http-max-unsent-bytes``), over all its connections; a connection holds one answer at a
    time (the next pipelined request waits for it). An answer that does not fit closes the
    connections stalled in a write for over STALLED_EVICTABLE_S (clients that do not read),
    longest stalled first; if it still does not fit it is refused (the caller answers 503). An
    answer alone is never refused, whatever its size (other bounds cap answers)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        self.held: dict = {}  # request -> bytes of its answer

    def hold(self, request, size: int) -> bool:
        """Count the answer of ``size`` bytes to ``request`` until release(); False when it does not fit."""
        if self.total + size > self.limit:
            stalled = [
                (held.channel.stalled_s(), held.channel, held)
                for held in self.held
                if held.channel is not None and held.channel.stalled_s() >= STALLED_EVICTABLE_S
            ]
            for _, channel, victim in sorted(stalled, key=itemgetter(0), reverse=True):
                if self.total + size <= self.limit:
                    break
                self.release(victim)
                metrics.HTTP_WRITES_ABORTED.labels("unsent_bytes").inc()
                channel.transport.abortConnection()
        if self.total and self.total + size > self.limit:
            return False
        self.held[request] = size
        self.total += size
        metrics.HTTP_UNSENT_BYTES.set(self.total)
        return True

    def release(self, request) -> None:
        self.total -= self.held.pop(request, 0)
        metrics.HTTP_UNSENT_BYTES.set(self.total)


BODY_RATE_GRACE_S = 5.0  # a body's first seconds are not held to the minimum rate
BODY_CHECK_INTERVAL_S = 1.0
LINGER_S = 2.0  # after an early answer, how long what the client still sends is read and dropped


class Channel(http.HTTPChannel):
    """An HTTP connection counted in the gateway's connection cap and closed gracefully at shutdown.

    The idle timeout (Site ``timeout``) is not restarted by the bytes of an incomplete request
    head: a client sending its headers slowly is closed like an idle one, however it trickles.
    A request body must arrive within the site's BodyDeadline, else the request is answered 408
    and the connection closed. With credentials (``--auth-file``) the credential of a request with
    a body is checked from its headers before any of the body is read (the socket is paused
    meanwhile), so a refused client never gets to send a body. Until a request is read in full,
    its connection is evictable at the connection cap like an idle one: a request that never
    finishes arriving cannot hold a place.
    An answer the client does not take is bounded in time: once the connection's send buffer is
    full (Twisted pauses the channel), the client must empty it within the site's
    ``write_timeout_s`` (``--http-write-timeout``), else the connection is closed; a stalled
    connection is evictable at the connection cap after the idle ones.
    twisted.web closes the connection without a word when a request line or a header line is
    over ``MAX_LENGTH`` (16 KiB): this one says why first, 414 for the request line, 431 for a header.
    """

    # Set by the factory (Site.buildProtocol); a TCP transport (ITCPTransport, IProducer): see [tool.mypy].
    site: "Site"
    transport: Any
    listener = "http"
    awaiting_headers = True
    awaiting_request_line = True  # the next non-empty line starts a request
    _request_line_start = b""  # what came of it before its newline
    answering = False  # a request read in full and not answered yet
    lingering = False  # answered before its request was read: the rest is dropped until the close
    _held: list[bytes] | None = None  # body bytes that arrived while the credential was checked
    _paused = False  # reading paused while the credential is checked
    _body_clock = None  # the next check of the pace of the body under way
    _body_started = 0.0
    _body_bytes = 0
    _linger_call = None
    _lost = False
    _stalled_since: float | None = None  # when the send buffer filled, while it stays full
    _write_deadline = None
    _drained_waiters: list[defer.Deferred] | None = None

    @property
    def evictable(self) -> bool:
        """No request being answered (idle, or still sending a request): what the connection cap
        may close for a new connection."""
        return not self.answering

    def connectionMade(self):
        super().connectionMade()
        self.site.connections.opened(self)

    def connectionLost(self, reason):
        self._lost = True
        self._stop_body_clock()
        if self._linger_call is not None and self._linger_call.active():
            self._linger_call.cancel()
        super().connectionLost(reason)
        self.site.connections.closed(self)
        self._write_progressed()  # once its request knows the client is gone, so a writer waiting stops

    def pauseProducing(self):
        """The transport's send buffer is full: the client must take some of it within the write deadline."""
        super().pauseProducing()
        if self._stalled_since is None:
            self._stalled_since = reactor.seconds()
            if self.site.write_timeout_s:
                self._write_deadline = self.callLater(self.site.write_timeout_s, self._write_timed_out)

    def resumeProducing(self):
        self._write_progressed()
        super().resumeProducing()

    def _write_progressed(self) -> None:
        """The send buffer drained (or the connection is gone): no deadline, and writers waiting go on."""
        self._stalled_since = None
        if self._write_deadline is not None and self._write_deadline.active():
            self._write_deadline.cancel()
        self._write_deadline = None
        waiting, self._drained_waiters = self._drained_waiters, None
        for deferred in waiting or ():
            deferred.callback(None)

    def stalled_s(self) -> float:
        """How long the send buffer has stayed full (the client taking nothing); 0 when it is not."""
        return 0.0 if self._stalled_since is None else reactor.seconds() - self._stalled_since  # type: ignore[misc]  # zope interface: see [tool.mypy]

    def drained(self) -> defer.Deferred:
        """Fires once the send buffer has room (at once when it has), or the connection is gone."""
        if self._stalled_since is None:
            return defer.succeed(None)
        if self._drained_waiters is None:
            self._drained_waiters = []
        deferred: defer.Deferred[None] = defer.Deferred()
        self._drained_waiters.append(deferred)
        return deferred

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        metrics.HTTP_WRITES_ABORTED.labels("write_timeout").inc()
        self.transport.abortConnection()

    def resetTimeout(self):
        if not self.awaiting_headers:
            super().resetTimeout()

    def dataReceived(self, data):
        if self.lingering:
            return
        if self.awaiting_request_line and not self._request_line_is_http(data):
            return
        super().dataReceived(data)

    def _request_line_is_http(self, data: bytes) -> bool:
        """Whether the request's first line, once its newline came, is an HTTP request line
        (True until then). twisted.web splits lines at CRLF only, so carbon's LF-ended lines
        would never make a line: it would wait for more, and the sender hang without a word."""
        seen = (self._request_line_start + data)[: self.MAX_LENGTH]
        line, newline, _ = seen.lstrip(b"\r\n").partition(b"\n")
        if not newline:
            self._request_line_start = seen
            return True
        self.awaiting_request_line, self._request_line_start = False, b""
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith(b"HTTP/"):
            return True
        self._refuse_not_http(line.rstrip(b"\r"))
        return False

    def allHeadersReceived(self):
        self.awaiting_headers = False
        super().allHeadersReceived()
        if self.length != 0:  # a body follows (a Content-Length, or chunked)
            self._check_credential()

    def _check_credential(self) -> None:
        """Check the credential from the headers; the body waits (held, the socket paused)."""
        request = self.requests[-1]
        self._held = []
        checked = defer.ensureDeferred(
            self.site.resource.check_credential(request, self._command, self._path.split(b"?", 1)[0])
        )
        checked.addCallbacks(self._credential_allowed, self._credential_refused, errbackArgs=(request,))
        if self._held is not None:  # not decided at once: scrypt runs in a thread
            self._paused = True
            self.transport.pauseProducing()

    def _credential_allowed(self, _) -> None:
        held, self._held = self._held, None
        if self._lost:
            return
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()
        if self.site.body_deadline.enabled:
            self._body_started, self._body_bytes = reactor.seconds(), 0  # type: ignore[misc]  # zope interface: see [tool.mypy]
            self._body_clock = self.callLater(BODY_CHECK_INTERVAL_S, self._check_body_pace)
        if held:
            self.rawDataReceived(b"".join(held))

    def _credential_refused(self, failure, request) -> None:
        self._held = None
        if not self._lost:
            self._answer_early(error_response(failure.value, request))

    def rawDataReceived(self, data):
        if self.lingering:  # the rest of a read that held the head of a request answered early
            return
        if self._held is not None:
            self._held.append(data)
            return
        if self._body_clock is not None:
            self._body_bytes += len(data)
        super().rawDataReceived(data)

    def _check_body_pace(self) -> None:
        refusal = self.site.body_deadline.refusal(reactor.seconds() - self._body_started, self._body_bytes)  # type: ignore[misc]  # zope interface: see [tool.mypy]
        if refusal is None:
            self._body_clock = self.callLater(BODY_CHECK_INTERVAL_S, self._check_body_pace)
            return
        self._body_clock = None
        reason, message = refusal
        metrics.SLOW_REQUEST_BODIES.labels(reason).inc()
        self._answer_early(json_response(408, {"error": message}))

    def _stop_body_clock(self) -> None:
        if self._body_clock is not None:
            self._body_clock.cancel()
            self._body_clock = None

    def allContentReceived(self):
        self._stop_body_clock()
        self.answering = True
        super().allContentReceived()

    def requestDone(self, request):
        self.awaiting_headers = True  # before the next pipelined request is parsed
        self.awaiting_request_line = True
        self.answering = False
        super().requestDone(request)

    def _answer_early(self, response: Response) -> None:
        """Answer before the request was read in full, then close. The client may still be
        sending, and closing a socket with unread data resets it (the answer could be lost):
        what arrives is dropped for up to LINGER_S after the answer, then the socket is closed."""
        self._stop_body_clock()
        if _needs_newline(response):
            response = response._replace(body=response.body + b"\n")
        self.lingering, self.persistent = True, False
        self.setTimeout(None)
        status = response.status
        headers = {
            "Content-Type": response.content_type,
            "Content-Length": str(len(response.body)),
            "Connection": "close",
            **response.headers,
        }
        head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()
        )
        self.transport.write(head.encode("latin-1") + b"\r\n" + response.body)
        self.transport.resumeProducing()
        self.transport.loseWriteConnection()
        self._linger_call = self.callLater(LINGER_S, self.transport.abortConnection)

    def timeoutConnection(self):
        metrics.IDLE_CLOSED.labels(self.listener).inc()
        super().timeoutConnection()

    def checkPersistence(self, request, version):
        """Requests that arrive while the gateway stops are answered with ``Connection: close``;
        a connection kept open says for how long it may stay idle (``Keep-Alive: timeout=N``),
        for the clients that read it (Go's, Prometheus's, do not: see --http-idle-timeout)."""
        if self.site.connections.closing:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        persistent = super().checkPersistence(request, version)
        if persistent and self.timeOut:
            request.responseHeaders.setRawHeaders(b"keep-alive", [b"timeout=%d" % self.timeOut])
        return persistent

    def close_when_idle(self) -> None:
        """Close now if no request is under way, else once its answer is sent."""
        if not self.requests:
            self.loseConnection()
            return
        self.persistent = False
        for request in self.requests:
            if not request.startedWriting:
                request.responseHeaders.setRawHeaders(b"connection", [b"close"])

    def _refuse_not_http(self, line: bytes) -> None:
        """A first line that is no HTTP request line (carbon lines sent to the HTTP port) is
        answered 400 naming the carbon port, logged and counted, and the connection closed:
        twisted.web would wait for headers that never come."""
        metrics.NOT_HTTP.inc()
        peer = self.transport.getPeer()
        log.warning(
            "%s:%s sent %r, not an HTTP request, to the HTTP port; carbon lines go to the carbon port (--graphite)",
            getattr(peer, "host", "?"),
            getattr(peer, "port", "?"),
            excerpt(line),
        )
        message = (
            f"not an HTTP request line: {excerpt(line)!r}; this is tsgate's HTTP port: send carbon"
            " plaintext lines (path value timestamp) to the carbon port (--graphite, 2003 by default)"
        )
        self._answer_early(json_response(400, {"error": message}))

    def lineLengthExceeded(self, line):
        if self._receivedHeaderSize == 0:  # nothing of this request parsed yet: its request line
            message = f"the request line is over {self.MAX_LENGTH} bytes; send long parameters in a POST form body"
            self._answer_early(json_response(414, {"error": message}))
        else:
            self._answer_early(json_response(431, {"error": f"a request header is over {self.MAX_LENGTH} bytes"}))


class Site(server.Site):
    protocol = Channel  # type: ignore[assignment]  # Twisted wraps its own (HTTP/2 negotiation); ours is HTTP/1.1
    requestFactory = LimitedRequest
    noisy = False

    def __init__(
        self,
        root: "Router",
        max_body_bytes: int,
        connections: Connections,
        idle_timeout_s: float | None,
        body_deadline: BodyDeadline,
        write_timeout_s: float | None = None,
    ):
        # Form bodies are decoded by the route that answers (parse_form): a query route's in its
        # query executor, off this process (Twisted takes 0.3 s to decode 1 MB of form).
        super().__init__(root, timeout=idle_timeout_s, parsePOSTFormSubmission=False)
        self.max_body_bytes = max_body_bytes
        self.connections = connections
        self.body_deadline = body_deadline
        self.write_timeout_s = write_timeout_s

    def buildProtocol(self, addr):
        if not self.connections.admit("http", addr):
            return None
        return super().buildProtocol(addr)

    def log(self, request):
        """No per-request access log: /metrics has the request counts and latencies."""


def read_body(request: LimitedRequest) -> bytes:
    if request.body_too_large:
        limit = request.channel.site.max_body_bytes  # type: ignore[attr-defined]  # the site's channels are Channel
        raise HTTPError(413, f"request body is over the limit of {limit} bytes (--max-body-bytes)")
    request.content.seek(0)  # type: ignore[attr-defined]  # the body is stored once the request is read
    return request.content.read()  # type: ignore[attr-defined]  # the body is stored once the request is read


FORM = b"application/x-www-form-urlencoded"


def header(request: server.Request, name: bytes) -> str | None:
    """A request header as text (None when absent)."""
    value = request.getHeader(name)
    return value.decode("latin-1") if isinstance(value, bytes) else value


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


def _first_here(in_process: Handler | None, by_executor: Handler) -> Handler:
    """A query route's handler in a process with executors: ``in_process`` answers what it can
    here (a query-string request; it answers None for the rest), an executor the rest."""
    if in_process is None:
        return lambda request, *rest: by_executor(request)

    async def call(request, *rest):
        answer = await in_process(request, *rest)
        return await by_executor(request) if answer is None else answer

    return call


def arg(request: server.Request, name: str, default: str | None = None) -> str | None:
    """A query-string or form argument as text; HTTPError 400 when it is not UTF-8."""
    values = request.args.get(name.encode())  # type: ignore[attr-defined]  # Twisted sets args when it parses the request
    if not values:
        return default
    try:
        return values[-1].decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPError(400, f"parameter {name!r} is not valid UTF-8") from None


def args(request: server.Request, name: str) -> list[str]:
    return _decoded(name, request.args.get(name.encode(), []))  # type: ignore[attr-defined]  # Twisted sets args when it parses the request


def _decoded(name: str, values: list[bytes]) -> list[str]:
    try:
        return [value.decode("utf-8") for value in values]
    except UnicodeDecodeError:
        raise HTTPError(400, f"parameter {name!r} is not valid UTF-8") from None


def require_arg(request: server.Request, name: str) -> str:
    value = arg(request, name)
    if not value:
        raise HTTPError(400, f"parameter {name!r} is required", field=name)
    return value


def _tenant_header(request: server.Request) -> str | None:
    """``X-Scope-OrgID`` or ``X-Tenant``: every one a request carries must name the same tenant
    (either header repeated with two tenants is ambiguous: 400, never the last one silently)."""
    named = set()
    for header in ("X-Scope-OrgID", "X-Tenant"):
        values = {
            raw.decode("utf-8", "replace").strip() for raw in request.requestHeaders.getRawHeaders(header.encode(), [])
        }
        if len(values) > 1:
            raise HTTPError(400, f"the {header} header names {len(values)} different tenants; give one", field="tenant")
        named |= values - {""}
    if len(named) > 1:
        raise HTTPError(400, "the X-Scope-OrgID and X-Tenant headers name different tenants", field="tenant")
    return named.pop() if named else None


def _tenant_parameter(request: server.Request) -> str | None:
    """The ``tenant`` parameter; given more than once with different tenants it is ambiguous:
    400 (promtool sends its URL's parameters in the query string and again in the form body).
    In ``request.args`` a form body's parameter replaces the query string's of the same name
    (Twisted), so when both may hold one, both are read."""
    given = request.args.get(b"tenant", [])  # type: ignore[attr-defined]  # Twisted sets args when it parses the request
    content_type = (request.getHeader(b"content-type") or b"").partition(b";")[0].strip().lower()
    if request.method == b"POST" and content_type == b"application/x-www-form-urlencoded":
        in_query = http.parse_qs(request.uri.partition(b"?")[2], 1).get(b"tenant", [])
        if in_query:
            given = in_query + http.parse_qs(read_body(request), 1).get(b"tenant", [])  # type: ignore[arg-type]  # the site's requests are LimitedRequest
    values = set(_decoded("tenant", given))
    if len(values) > 1:
        raise HTTPError(400, f"the tenant parameter names {len(values)} different tenants; give one", field="tenant")
    return values.pop() if values else None


def explicit_tenant(request: server.Request) -> str | None:
    """The tenant a request is for, by one rule for every HTTP API (docs/security.rst):

    with ``--auth-file``, the credential's tenant, and a header or parameter naming another is
    403; without, the ``X-Scope-OrgID``/``X-Tenant`` header a trusted proxy sets always wins, and
    a ``tenant`` parameter (query or form) that disagrees with it is 400, never a silent switch;
    else the parameter; else None (the caller's default).
    """
    header, parameter = _tenant_header(request), _tenant_parameter(request)
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


_ACCESS_OF_ROLE: dict[str | None, str] = {"ingest": "write", "query": "read"}


class Router(resource.Resource):
    """Exact-path routing with 404 for unknown paths and 405 (with Allow) for wrong methods.

    With ``credentials`` (``--auth-file``) every route needs a credential holding the route's
    access: ``write`` for ingest routes, ``read`` for query routes, ``admin`` for operator
    routes, ``any`` for any valid credential; ``public`` routes need none.

    With ``executors`` (gateway.app.executors), the routes of role ``query`` are answered by an
    executor process running the same router: this process only checks the credential and
    moves the request and its answer.

    With ``unsent`` (UnsentAnswers), every answer body counts against the process's bound on
    unsent bytes until it is written to the connection; one that does not fit gets 503.
    """

    isLeaf = True

    def __init__(
        self,
        roles: set[str] | None = None,
        credentials: Credentials | None = None,
        executors=None,
        unsent: UnsentAnswers | None = None,
    ):
        super().__init__()
        self.unsent = unsent
        self.roles = roles
        self.credentials = credentials
        self.executors = executors
        self.routes: dict[bytes, dict[bytes, tuple[str, Handler, str]]] = {}
        self.prefixes: list[tuple[bytes, dict[bytes, tuple[str, Callable[[str], Handler], str]]]] = []

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
        in_process: Handler | None = None,
    ) -> None:
        """With executors, a query route is answered by one, but for what ``in_process`` answers
        (not None) first, here: the cheap requests of the route, bounded in cost by the handler."""
        if not self._wanted(role):
            return
        if role == "query" and self.executors is not None:
            handler = _first_here(in_process, self.executors.run)
        else:
            handler = _with_form(handler)
        access = access or _ACCESS_OF_ROLE.get(role, "admin")
        by_method = self.routes.setdefault(path.encode(), {})
        for method in methods:
            by_method[method.encode()] = (name, handler, access)

    def add_prefix(
        self, prefix: str, methods: tuple[str, ...], name: str, handler, role: str | None = None, in_process=None
    ) -> None:
        """Route every path under ``prefix``; the handler (and ``in_process``, as ``add``'s) gets
        the rest of the path (decoded)."""
        if not self._wanted(role):
            return
        access = _ACCESS_OF_ROLE.get(role, "admin")
        executors = self.executors if role == "query" else None
        with_form = _with_form(handler)
        by_executor = _first_here(in_process, executors.run) if executors is not None else None

        def bound(rest: str):
            async def call(request):
                if by_executor is not None:
                    return await by_executor(request, rest)
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

    def _route(self, method: bytes, path: bytes) -> tuple[str, Handler, str]:
        """The name, handler and access of a request's route (404 and 405 included)."""
        by_method = self._lookup(path)
        if by_method is None:
            return "unknown", self._not_found, "any"
        if method not in by_method:
            return "unknown", self._method_not_allowed(sorted(m.decode() for m in by_method)), "any"
        return by_method[method]

    async def answer(self, request) -> Response:
        """The response to an already authorized request, its body whole, not sent: how a query
        executor runs a route. MemoryError is left to the caller, which answers for the memory cap."""
        _, handler, _ = self._route(request.method, request.path)
        try:
            response = await handler(request)
            if not isinstance(response.body, bytes):
                response = response._replace(body=b"".join([chunk async for chunk in response.body]))
            return response
        except MemoryError:
            raise
        except Exception as error:
            return error_response(error, request)

    def render(self, request: server.Request):
        started = time.perf_counter()
        name, handler, access = self._route(request.method, request.path)
        deferred = defer.ensureDeferred(self._authorized(handler, access, request))
        request.notifyFinish().addErrback(lambda _: self._client_gone(request, deferred))
        deferred.addErrback(lambda failure: error_response(failure.value, request))
        deferred.addCallback(lambda response: defer.ensureDeferred(self._send(response, request, name, started)))
        deferred.addErrback(lambda failure: log.error("could not answer %s: %s", request.uri, failure.getTraceback()))
        return server.NOT_DONE_YET

    async def check_credential(self, request: server.Request, method: bytes, path: bytes) -> None:
        """Check the credential of a request from its headers alone (Channel calls this before
        reading the body of one); the handler then does not check it again."""
        await self._check_access(request, self._route(method, path)[2])

    @staticmethod
    def _client_gone(request: server.Request, handling: defer.Deferred) -> None:
        """The client closed the connection: cancel the handler's work, which stops at the store
        call or thread it awaits (a read loop at its next batch, PromQL evaluation at its next check)."""
        request.client_gone = True  # type: ignore[attr-defined]  # our own attribute on Twisted's request
        if not handling.called:
            metrics.CANCELLED_REQUESTS.inc()
            handling.cancel()

    async def _authorized(self, handler: Handler, access: str, request: server.Request) -> Response:
        """Run ``handler`` once the request's credential allows ``access``."""
        if not getattr(request, "credential_checked", False):
            await self._check_access(request, access)
        return await handler(request)

    async def _check_access(self, request: server.Request, access: str) -> None:
        """Set ``request.principal`` when the route needs a credential; 401/403, or 429 for a
        client or user name with too many failed credentials (auth.FailureLimit)."""
        if self.credentials is not None and access != "public":
            raw = request.getHeader(b"authorization")
            address = request.getClientAddress()
            try:
                principal = await self.credentials.authenticate(
                    raw.decode("latin-1") if isinstance(raw, bytes) else raw, getattr(address, "host", str(address))
                )
            except Unauthorized as error:
                metrics.AUTH_FAILURES.labels("unauthenticated").inc()
                raise HTTPError(401, str(error), headers={"WWW-Authenticate": 'Basic realm="tsgate"'}) from None
            if access != "any" and access not in principal.roles and "admin" not in principal.roles:
                metrics.AUTH_FAILURES.labels("forbidden").inc()
                raise HTTPError(403, f"credential {principal.name!r} lacks the {access!r} role this endpoint needs")
            request.principal = principal  # type: ignore[attr-defined]  # our own attribute on Twisted's request
        request.credential_checked = True  # type: ignore[attr-defined]  # our own attribute on Twisted's request

    async def _not_found(self, request):
        raise HTTPError(404, f"no such endpoint: {request.path.decode('utf-8', 'replace')}")

    def _method_not_allowed(self, allowed: list[str]):
        async def handler(request):
            raise HTTPError(
                405,
                f"method {request.method.decode()} not allowed; use {', '.join(allowed)}",
                {"Allow": ", ".join(allowed)},
                allow=allowed,
            )

        return handler

    async def _send(self, response: Response, request: server.Request, name: str, started: float) -> None:
        status = response.status
        held = False  # the answer counts in self.unsent
        try:
            if request.finished or getattr(request, "client_gone", False):
                return
            if self.unsent is not None and isinstance(response.body, bytes):
                held = self.unsent.hold(request, len(response.body))
                if not held:
                    metrics.HTTP_ANSWERS_REFUSED.inc()
                    response = error_response(_UNSENT_FULL, request)
                    status = response.status
            request.setResponseCode(status)
            request.setHeader(b"content-type", response.content_type.encode())
            for header, value in response.headers.items():
                request.setHeader(header.encode(), value.encode())
            if isinstance(response.body, bytes) and len(response.body) > LARGE_BODY_BYTES:
                await self._write_large(response.body, request)
                if _needs_newline(response) and not getattr(request, "client_gone", False):
                    request.write(b"\n")  # not appended: that would copy the large body on the reactor
            elif isinstance(response.body, bytes):
                request.write(response.body + b"\n" if _needs_newline(response) else response.body)
            else:
                await self._stream(response.body, request)
            if not getattr(request, "client_gone", False):
                request.finish()
        finally:
            if held:
                self.unsent.release(request)  # type: ignore[union-attr]  # held only with a bound
            metrics.HTTP_REQUESTS.labels(name, _method_label(request.method), str(status)).observe(
                time.perf_counter() - started
            )

    @staticmethod
    async def _write_large(body: bytes, request: server.Request) -> None:
        """Write a large body 16 KB at a time as the socket drains (a pull producer): written at
        once, Twisted would copy all of it in one piece on the reactor (~50 ms for 80 MB). The
        source is closed at the end: a FileSender stopped midway keeps it, in a reference cycle
        with the request, until the garbage collector's rare full pass."""
        source = io.BytesIO(body)
        try:
            await FileSender().beginFileTransfer(source, request)
        except Exception:  # FileSender's way of saying the client went away
            request.client_gone = True  # type: ignore[attr-defined]  # our own attribute on Twisted's request
        finally:
            source.close()

    @staticmethod
    async def _stream(chunks, request: server.Request) -> None:
        """Write chunks as the client takes them: the next one is produced once the connection's
        send buffer has room. The status is already sent, so a failure midway can only be
        logged and the connection closed: the client sees a truncated stream, never a wrong one."""
        channel = request.channel
        try:
            async for chunk in chunks:
                if getattr(request, "client_gone", False):
                    return
                request.write(chunk)
                await channel.drained()  # type: ignore[attr-defined]  # the site's channels are Channel
        except Exception:
            log.exception("stream to %s failed midway; closing the connection", request.uri)
            channel.loseConnection()
            request.client_gone = True  # type: ignore[attr-defined]  # our own attribute on Twisted's request
