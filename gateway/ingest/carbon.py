"""Carbon's socket listeners: plaintext over TCP and UDP, pickle over TCP.

Decoding is protocols/graphite's; this glues it to Twisted and to the ingest pipeline through
one GraphiteIngest per gateway, which batches samples from every connection into few store
writes (up to ``concurrency`` of them at once, so the store's latency does not bound the rate)
and pushes back on senders: while more samples wait than ``max_pending``, every TCP
connection stops reading (the kernel's buffers then stop the sender), and reading resumes when
the backlog drains. A batch the store refuses (Cassandra down) is retried, never dropped, so
nothing accepted from a TCP socket is lost. A batch over the tenant's rate
(``--tenant-max-samples-per-second``) is retried after the wait the limit names, with every TCP
connection paused meanwhile. Samples of new series over ``--tenant-max-active-series`` are
refused (counted and logged) and the rest of their batch is written: holding the batch would
stall every series of every carbon connection until the active window frees a place. UDP cannot
push back: what arrives over the backlog limit, or while the tenant is over its rate, is dropped
and counted.
"""

import logging
import time
from collections import deque
from typing import Any

from twisted.internet import defer, reactor, threads
from twisted.internet.protocol import DatagramProtocol, Factory, Protocol
from twisted.protocols.policies import TimeoutMixin

from gateway.core import metrics
from gateway.core.connections import Connections
from gateway.core.model import SeriesSamples, now_ms
from gateway.ingest.limits import RateLimited
from gateway.ingest.pipeline import IngestPipeline, Overloaded
from gateway.ingest.push import Batch, Pushed, Writer
from gateway.store import StoreUnavailable
from protocols.graphite import HTTP_REQUEST, http_request_line
from protocols.graphite.arrays import Samples, concat, name_and_tags
from protocols.graphite.pickle import PickleDecoder
from protocols.graphite.plaintext import PlaintextDecoder, decode_datagram

log = logging.getLogger(__name__)

# The longest wait before a refused batch is tried again once the gateway is stopping.
DRAINING_RETRY_S = 0.1


def series_samples(tenant: str, samples: Samples) -> SeriesSamples:
    """Decoded carbon points as the pipeline takes them (IngestPipeline.ingest_arrays): a path as
    received is the known-series cache's key; its series, which the decoder parsed already (it
    must, to refuse a bad path with the line's reject), gives the metric name and tags."""
    return SeriesSamples(
        tenant, samples.paths, samples.series, name_and_tags, samples.path_index, samples.timestamps, samples.values
    )


class RejectLog:
    """Log refused input at most once per reason every ``interval`` seconds (counting is exact)."""

    def __init__(self, interval: float = 10.0):
        self.interval = interval
        self._last: dict[tuple[str, str], float] = {}

    def __call__(self, protocol: str, rejects, peer: str) -> None:
        """Count and log what a decoder refused."""
        for reject in rejects:
            metrics.SAMPLES_REJECTED.labels(protocol, reject.reason).inc()
            self.log(protocol, reject.reason, reject.detail, peer)

    def log(self, protocol: str, reason: str, detail, peer: str) -> None:
        now = time.monotonic()
        key = (protocol, reason)
        if now - self._last.get(key, -self.interval) >= self.interval:
            self._last[key] = now
            log.warning(
                "%s from %s: %s: %s (logged once per %ds per reason)", protocol, peer, reason, detail, self.interval
            )


class GraphiteIngest:
    """The batching, retrying, back-pressuring stage between Graphite listeners and the pipeline."""

    def __init__(
        self,
        pipeline: IngestPipeline,
        batch_size: int = 5000,
        max_pending: int = 200_000,
        flush_delay: float = 0.05,
        concurrency: int = 4,
        clock=reactor,
    ):
        self.pipeline = pipeline
        self.writer = Writer(pipeline)
        self.clock = clock  # the reactor's time and timers (a task.Clock in unit tests)
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.max_pending = max_pending
        self.flush_delay = flush_delay
        self.reject_log = RejectLog()
        self._queue: deque[tuple[str, str, Samples]] = deque()  # (protocol, tenant, samples)
        self.pending = 0
        self._writing = 0
        self._queued = 0
        self.paused = False
        self._transports: set = set()
        self._flush_call = None
        self._retry_delay = 0.5
        self._limited_until = 0.0
        self.draining = False
        self._idle: list[defer.Deferred] = []

    def register(self, transport) -> None:
        self._transports.add(transport)
        if self.paused:
            transport.pauseProducing()

    def unregister(self, transport) -> None:
        self._transports.discard(transport)

    @property
    def full(self) -> bool:
        """``max_pending`` samples wait, or more than the store takes in the pipeline's flush
        time (IngestPipeline.flushable_samples), which SIGTERM would find still to store."""
        return self.pending >= min(self.max_pending, self.pipeline.flushable_samples())

    @property
    def refusing(self) -> bool:
        """What UDP asks before taking a datagram: the backlog is full or the tenant is over its rate."""
        return self.full or self.clock.seconds() < self._limited_until

    def _pause(self) -> None:
        if not self.paused:
            self.paused = True
            metrics.GRAPHITE_BACKPRESSURE.inc()
            for transport in self._transports:
                transport.pauseProducing()

    def submit(self, protocol: str, tenant: str, samples: Samples) -> None:
        if not samples.size:
            return
        self._queue.append((protocol, tenant, samples))
        self._queued += samples.size
        self.pending += samples.size
        metrics.GRAPHITE_PENDING.set(self.pending)
        if self.full:
            self._pause()
        self._schedule(self.flush_delay if self.pending < self.batch_size else 0)

    def _schedule(self, delay: float) -> None:
        if self._flush_call is None and self._writing < self.concurrency:
            self._flush_call = self.clock.callLater(delay, self._flush)

    def _take_batch(self) -> tuple[str, str, Samples]:
        """The queue's head, with what follows it from the same protocol and tenant up to
        ``batch_size`` samples: one pipeline call."""
        protocol, tenant, first = self._queue.popleft()
        parts, size = [first], first.size
        while (
            self._queue
            and self._queue[0][:2] == (protocol, tenant)
            and size + self._queue[0][2].size <= self.batch_size
        ):
            parts.append(self._queue.popleft()[2])
            size += parts[-1].size
        self._queued -= size
        return protocol, tenant, concat(parts)

    def _flush(self) -> None:
        """Start writes while batches wait and fewer than ``concurrency`` are in flight, until a
        write sets the next flush: a batch the pipeline refuses at once (Overloaded, RateLimited)
        goes back to the head of the queue with a retry timer, and taking it again here would spin."""
        self._flush_call = None
        while self._queue and self._writing < self.concurrency and self._flush_call is None:
            self._writing += 1
            protocol, tenant, batch = self._take_batch()
            defer.ensureDeferred(self.writer.push(protocol, Batch(series_samples(tenant, batch)))).addCallbacks(
                self._stored,
                self._failed,
                callbackArgs=(protocol, tenant, batch),
                errbackArgs=(protocol, tenant, batch),
            )
            if self._queued < self.batch_size:
                break  # a partial batch waits for more samples or the next completed write

    def _stored(self, pushed: Pushed, protocol: str, tenant: str, batch: Samples) -> None:
        """Log the samples the pipeline refused (it counted them; batches mix connections, so
        no peer), then account for the write."""
        for reject in pushed.samples.rejected:
            metric_name = name_and_tags(batch.series[batch.path_index[reject.index]])[0]
            self.reject_log.log(
                protocol, reject.reason, f"{metric_name[:200]!r}: {reject.field} {reject.problem}", "a sender"
            )
        self._written(None, batch)

    def _written(self, result, batch: Samples) -> None:
        self._writing -= 1
        self._retry_delay = 0.5
        self.pending -= batch.size
        metrics.GRAPHITE_PENDING.set(self.pending)
        if self.paused and self.pending < min(self.max_pending, self.pipeline.flushable_samples()) // 2:
            self.paused = False
            for transport in self._transports:
                transport.resumeProducing()
        if self._queue:
            self._schedule(0 if self.pending >= self.batch_size else self.flush_delay)
        elif not self.pending:
            waiting, self._idle = self._idle, []
            for deferred in waiting:
                deferred.callback(None)

    def _failed(self, failure, protocol: str, tenant: str, batch: Samples) -> None:
        """Keep the batch at the head of the queue and try again later: never drop accepted data."""
        if failure.check(RateLimited):
            self._wait_for_the_limit(failure.value, protocol, tenant, batch)
            return
        if not failure.check(StoreUnavailable, Overloaded, defer.FirstError):
            log.error("graphite batch of %d samples failed and is dropped: %s", batch.size, failure.getTraceback())
            metrics.GRAPHITE_LOST.inc(batch.size)
            self._written(None, batch)  # counts the write as finished
            return
        self._writing -= 1
        log.warning(
            "graphite batch of %d samples not stored (%s); retrying in %.1fs",
            batch.size,
            failure.getErrorMessage(),
            self._retry_delay,
        )
        self._retry_later(protocol, tenant, batch, self._retry_delay)
        self._retry_delay = min(self._retry_delay * 2, 10.0)

    def _wait_for_the_limit(self, error: RateLimited, protocol: str, tenant: str, batch: Samples) -> None:
        """Hold the batch and pause the TCP senders until the rate limit's wait is over."""
        self._writing -= 1
        metrics.RATE_LIMITED.labels(error.limit).inc()
        self._limited_until = self.clock.seconds() + error.retry_after_s
        log.warning(
            "graphite batch of %d samples held for %ds, carbon connections paused: %s",
            batch.size,
            error.retry_after_s,
            error,
        )
        self._pause()
        self._retry_later(protocol, tenant, batch, error.retry_after_s)

    def _retry_later(self, protocol: str, tenant: str, batch: Samples, delay: float) -> None:
        self._queue.appendleft((protocol, tenant, batch))
        self._queued += batch.size
        if self._flush_call is not None:
            self._flush_call.cancel()
        if self.draining:
            delay = min(delay, DRAINING_RETRY_S)
        self._flush_call = self.clock.callLater(delay, self._flush)

    def drain(self) -> defer.Deferred:
        """Fire when everything submitted has been stored (used at shutdown). From now on a
        refused batch is retried within DRAINING_RETRY_S, and one waiting is retried at once: a
        backoff of up to 10 s would outlast --shutdown-timeout."""
        self.draining = True
        if self._flush_call is not None and self._flush_call.getTime() > self.clock.seconds():
            self._flush_call.reset(0)
        if not self.pending:
            return defer.succeed(None)
        deferred: defer.Deferred[None] = defer.Deferred()
        self._idle.append(deferred)
        return deferred


class _StreamProtocol(Protocol, TimeoutMixin):
    """A TCP connection feeding one incremental decoder into GraphiteIngest.

    Counted in the gateway's connection cap; closed after ``idle_timeout_s`` without a complete
    line or frame (not while reading is paused for backpressure: then the silence is the
    gateway's own doing). Only complete lines and frames count: bytes of one that never ends,
    however they trickle, keep neither the timeout nor the connection cap away.
    """

    # A TCP transport (ITCPTransport, IProducer): zope interfaces are not typed for mypy.
    transport: Any
    protocol_name = ""
    evictable = True  # until a first line or frame is decoded (see gateway.core.connections)
    silent = True  # until the first bytes arrive
    refused_http = False

    def __init__(
        self, ingest: GraphiteIngest, tenant: str, decoder, connections: Connections, idle_timeout_s: float | None
    ):
        self.ingest = ingest
        self.tenant = tenant
        self.decoder = decoder
        self.connections = connections
        self.idle_timeout_s = idle_timeout_s

    def connectionMade(self):
        peer = self.transport.getPeer()
        self.peer = f"{peer.host}:{peer.port}"
        self.ingest.register(self.transport)
        self.connections.opened(self)
        self.setTimeout(self.idle_timeout_s)

    @property
    def listener(self) -> str:
        return self.protocol_name

    def stalled_s(self) -> float:
        """Never stalled in a write (see gateway.core.connections): carbon answers nothing."""
        return 0.0

    def dataReceived(self, data: bytes):
        if self._refused_http(data):
            return
        self._submit(self.decoder.feed(data, now_ms()))

    def _refused_http(self, data: bytes) -> bool:
        """An HTTP client on a carbon port (a wrong port in prometheus.yml) is told so once, in
        the log and in a 400 it can show, and disconnected: not decoded into a stream of line
        rejects. True from then on: the rest of its request is ignored until the close."""
        if self.refused_http:
            return True
        first_bytes, self.silent = self.silent, False
        request_line = http_request_line(data) if first_bytes else None
        if request_line is None:
            return False
        self.refused_http = True
        metrics.SAMPLES_REJECTED.labels(self.protocol_name, HTTP_REQUEST).inc()
        self.ingest.reject_log.log(
            self.protocol_name,
            HTTP_REQUEST,
            f"this looks like HTTP on the carbon port ({request_line}); send HTTP (Prometheus remote_write,"
            " the APIs) to the HTTP port (--http), and carbon lines or pickle frames here; closing the connection",
            self.peer,
        )
        body = f"this is tsgate's {self.protocol_name} port, not HTTP; use the HTTP port (--http)\n".encode()
        head = f"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        self.transport.write(head.encode() + b"Connection: close\r\n\r\n" + body)
        self.transport.loseConnection()
        return True

    def _submit(self, decoded) -> None:
        samples, rejects = decoded
        if samples.size or rejects:  # a line or frame was complete: the connection is in use
            self.resetTimeout()
            self.evictable = False
        if rejects:
            self.ingest.reject_log(self.protocol_name, rejects, self.peer)
        self.ingest.submit(self.protocol_name, self.tenant, samples)

    def timeoutConnection(self):
        if self.ingest.paused:
            self.resetTimeout()
            return
        log.info(
            "%s: closing the connection from %s, no complete line or frame for %ds (--carbon-idle-timeout)",
            self.protocol_name,
            self.peer,
            self.idle_timeout_s,
        )
        metrics.IDLE_CLOSED.labels(self.protocol_name).inc()
        self.transport.loseConnection()

    def close_when_idle(self) -> None:
        """At shutdown: what was read is already submitted; carbon has no answer to wait for."""
        self.transport.loseConnection()

    def connectionLost(self, reason=None):
        self.setTimeout(None)
        self.ingest.unregister(self.transport)
        self.connections.closed(self)
        self._finish()

    def _finish(self) -> None:
        rejects = self.decoder.finish()
        if rejects:
            self.ingest.reject_log(self.protocol_name, rejects, self.peer)


class PlaintextProtocol(_StreamProtocol):
    protocol_name = "graphite_plaintext"


class PickleProtocol(_StreamProtocol):
    """Pickle decodes in a thread: a 1 MB frame is up to 130,000 items, hundreds of ms of Python
    that must not hold the reactor. One decode at a time per connection, in arrival order; the
    connection stops reading meanwhile, so what waits for the decoder stays small."""

    protocol_name = "graphite_pickle"

    def __init__(self, *args):
        super().__init__(*args)
        self._received: list[bytes] = []
        self._decoding = False
        self._lost = False

    def dataReceived(self, data: bytes):
        if self._refused_http(data):
            return
        self._received.append(data)
        if not self._decoding:
            self._decode()

    def _decode(self) -> None:
        data = b"".join(self._received)
        self._received = []
        self._decoding = True
        if not self._lost:
            self.transport.pauseProducing()
        decoding = threads.deferToThread(self.decoder.feed, data, now_ms())
        decoding.addCallbacks(self._decoded, self._decode_failed)

    def _decode_failed(self, failure) -> None:
        """A decoder bug, not bad input (that is a reject): drop the connection, keep serving."""
        log.error("pickle decoding failed; closing %s: %s", self.peer, failure.getTraceback())
        self.transport.abortConnection()

    def _decoded(self, decoded) -> None:
        self._decoding = False
        self._submit(decoded)
        if self._received:
            self._decode()
        elif self._lost:
            self._finish()
        elif not self.ingest.paused:
            self.transport.resumeProducing()

    def connectionLost(self, reason=None):
        self._lost = True
        self.setTimeout(None)
        self.ingest.unregister(self.transport)
        self.connections.closed(self)
        if not self._decoding:
            self._finish()


class _StreamFactory(Factory):
    """Builds a listener's connections, unless the gateway-wide connection cap is reached.
    ``limit`` is the decoder's: the longest plaintext line or the largest pickle frame."""

    noisy = False
    protocol_class: type[_StreamProtocol]
    decoder_class: type

    def __init__(
        self, ingest: GraphiteIngest, tenant: str, limit: int, connections: Connections, idle_timeout_s: float | None
    ):
        self.ingest, self.tenant, self.limit = ingest, tenant, limit
        self.connections, self.idle_timeout_s = connections, idle_timeout_s

    def buildProtocol(self, addr):
        if not self.connections.admit(self.protocol_class.protocol_name, addr):
            return None
        return self.protocol_class(
            self.ingest, self.tenant, self.decoder_class(self.limit), self.connections, self.idle_timeout_s
        )


class PlaintextFactory(_StreamFactory):
    protocol_class = PlaintextProtocol
    decoder_class = PlaintextDecoder


class PickleFactory(_StreamFactory):
    protocol_class = PickleProtocol
    decoder_class = PickleDecoder


class PlaintextDatagramProtocol(DatagramProtocol):
    """Whole lines per datagram; over the backlog or tenant limits the datagram is dropped and counted."""

    noisy = False
    protocol_name = "graphite_udp"

    def __init__(self, ingest: GraphiteIngest, tenant: str, max_line_length: int):
        self.ingest, self.tenant, self.max_line_length = ingest, tenant, max_line_length

    def datagramReceived(self, data: bytes, addr):
        samples, rejects = decode_datagram(data, now_ms(), self.max_line_length)
        if rejects:
            self.ingest.reject_log(self.protocol_name, rejects, f"{addr[0]}:{addr[1]}")
        if self.ingest.refusing:
            metrics.GRAPHITE_UDP_DROPPED.inc(samples.size)
            return
        self.ingest.submit(self.protocol_name, self.tenant, samples)
