"""GraphiteIngest on its own: the real pipeline and SQLite store underneath, its timers on a
task.Clock, so pausing, resuming, backing off and dropping are counted exactly without sockets."""

import threading

import numpy as np
import pytest
import pytest_twisted
from prometheus_client import REGISTRY
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from gateway.core.connections import Connections
from gateway.core.model import Limits, now_ms, series_set_hash, series_set_text
from gateway.downsample.pending import PendingMarks, StorePending
from gateway.ingest.carbon import (
    DRAINING_RETRY_S,
    GraphiteIngest,
    PickleFactory,
    PlaintextDatagramProtocol,
    PlaintextFactory,
)
from gateway.ingest.limits import TenantLimits
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from protocols.graphite import REJECT_REASONS, http_request_line
from protocols.graphite.arrays import Samples, concat
from protocols.graphite.plaintext import PlaintextDecoder
from tests.unit import until

REASONS = sorted(REJECT_REASONS)


def counter(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def samples(name: str, count: int, start: int = 0) -> Samples:
    """Points start..start+count-1 of the plain path ``name``, as a decoder gives them."""
    now = now_ms()
    points = range(start, start + count)
    return Samples(
        [name],
        [(name, {})],
        np.zeros(count, dtype=np.intp),
        np.array([now - 60_000 + i for i in points], dtype=np.int64),
        np.array(points, dtype=np.float64),
    )


def pipeline_on(store, max_inflight: int = 1_000_000, tenant_limits=None) -> IngestPipeline:
    pending = PendingMarks(StorePending(store, store.slot_width_ms, 0), 64)
    return IngestPipeline(
        store, Limits(), KnownSeries(1000), max_inflight, pending=pending, tenant_limits=tenant_limits
    )


async def stored(store, tenant: str, name: str) -> int:
    now = now_ms()
    (found,) = await store.read_raw(tenant, [series_set_hash(series_set_text(name, {}))], now - 3_600_000, now)
    return len(found.head)


def next_timer(clock: Clock) -> float:
    """Seconds until the one timer GraphiteIngest has set."""
    (call,) = clock.getDelayedCalls()
    return call.getTime() - clock.seconds()


@pytest_twisted.ensureDeferred
async def test_a_full_backlog_pauses_every_tcp_sender_until_half_drained(sqlite_store, tenant):
    """TCP senders stop being read (and UDP datagrams are dropped) from max_pending on, until the
    backlog is under half of it."""
    clock = Clock()
    ingest = GraphiteIngest(
        pipeline_on(sqlite_store), batch_size=10, max_pending=20, flush_delay=0.05, concurrency=1, clock=clock
    )
    first, late = StringTransport(), StringTransport()
    ingest.register(first)
    paused_before = counter("tsgate_graphite_backpressure_total")
    for start in range(0, 25, 5):
        ingest.submit("graphite_plaintext", tenant, samples("backlog", 5, start))
    assert ingest.paused and first.producerState == "paused"
    assert counter("tsgate_graphite_backpressure_total") - paused_before == 1
    ingest.register(late)
    assert late.producerState == "paused"
    dropped_before = counter("tsgate_graphite_udp_dropped_samples_total")
    PlaintextDatagramProtocol(ingest, tenant, 1000).datagramReceived(b"backlog.udp 1 1700000000\n", ("127.0.0.1", 2003))
    assert counter("tsgate_graphite_udp_dropped_samples_total") - dropped_before == 1 and ingest.pending == 25
    assert next_timer(clock) == 0.05  # set by the first, partial, batch
    clock.advance(0.05)
    await until(lambda: ingest.pending == 15)
    assert ingest.paused  # 15 still wait: reading resumes below half of max_pending
    clock.advance(0)
    await until(lambda: ingest.pending == 5)
    assert not ingest.paused and first.producerState == late.producerState == "producing"
    assert next_timer(clock) == 0.05  # a partial batch waits a little for more samples
    drained = ingest.drain()
    clock.advance(0.05)
    await drained
    assert await stored(sqlite_store, tenant, "backlog") == 25
    assert counter("tsgate_graphite_backpressure_total") - paused_before == 1


@pytest_twisted.ensureDeferred
async def test_a_busy_store_is_retried_with_doubling_delays_and_nothing_is_lost(sqlite_store, tenant):
    """The pipeline refuses a second write while the first waits for the store (Overloaded): the
    batch goes back to the head of the queue, retried after 0.5, 1, 2 s; a stored batch resets the delay."""
    clock = Clock()
    ingest = GraphiteIngest(
        pipeline_on(sqlite_store, max_inflight=5), batch_size=5, max_pending=1000, concurrency=2, clock=clock
    )
    release = threading.Event()
    sqlite_store._writer.callInThread(release.wait)  # the store's one writer thread is busy
    try:
        ingest.submit("graphite_plaintext", tenant, samples("busy", 5))
        ingest.submit("graphite_plaintext", tenant, samples("busy", 5, 5))
        clock.advance(0)
        assert ingest.pending == 10 and ingest.pipeline.inflight_samples == 5
        for delay in (0.5, 1.0, 2.0):
            assert next_timer(clock) == delay
            clock.advance(delay)
        assert next_timer(clock) == 4.0
    finally:
        release.set()
    await until(lambda: ingest.pending == 5)
    assert ingest._retry_delay == 0.5
    drained = ingest.drain()
    clock.advance(4.0)
    await drained
    assert await stored(sqlite_store, tenant, "busy") == 10
    assert ingest._writing == 0


@pytest_twisted.ensureDeferred
async def test_at_shutdown_a_batch_waiting_to_be_retried_is_retried_at_once(sqlite_store, tenant):
    """A backoff of seconds would outlast --shutdown-timeout: drain retries the waiting batch now,
    and any refusal after it within DRAINING_RETRY_S."""
    clock = Clock()
    ingest = GraphiteIngest(
        pipeline_on(sqlite_store, max_inflight=5), batch_size=5, max_pending=1000, concurrency=2, clock=clock
    )
    release = threading.Event()
    sqlite_store._writer.callInThread(release.wait)  # the store's one writer thread is busy
    try:
        ingest.submit("graphite_plaintext", tenant, samples("stopping", 5))
        ingest.submit("graphite_plaintext", tenant, samples("stopping", 5, 5))
        clock.advance(0)
        for delay in (0.5, 1.0):
            clock.advance(delay)
        assert next_timer(clock) == 2.0
        drained = ingest.drain()
        assert next_timer(clock) == 0
        clock.advance(0)
        assert next_timer(clock) == pytest.approx(DRAINING_RETRY_S)  # refused again: the first write still waits
    finally:
        release.set()
    await until(lambda: ingest.pipeline.inflight_samples == 0)
    clock.advance(DRAINING_RETRY_S)
    await drained
    assert await stored(sqlite_store, tenant, "stopping") == 10


def limited_ingest(store, clock: Clock, limits: TenantLimits) -> tuple[GraphiteIngest, StringTransport]:
    """A GraphiteIngest under tenant limits, with one TCP sender registered."""
    ingest = GraphiteIngest(pipeline_on(store, tenant_limits=limits), batch_size=100, flush_delay=0.05, clock=clock)
    sender = StringTransport()
    ingest.register(sender)
    return ingest, sender


@pytest_twisted.ensureDeferred
async def test_over_the_tenant_rate_tcp_waits_and_udp_drops(sqlite_store, tenant):
    """A batch over the tenant's rate is held for the wait the limit names, TCP senders paused;
    datagrams arriving meanwhile are dropped and counted, not queued."""
    clock = Clock()
    ingest, sender = limited_ingest(sqlite_store, clock, TenantLimits(10, burst_seconds=1, clock=clock.seconds))
    udp = PlaintextDatagramProtocol(ingest, tenant, 1000)
    limited_before = counter("tsgate_rate_limited_requests_total", limit="samples_per_second")
    dropped_before = counter("tsgate_graphite_udp_dropped_samples_total")
    ingest.submit("graphite_plaintext", tenant, samples("limited", 10))
    clock.advance(0.05)
    await until(lambda: ingest.pending == 0)
    ingest.submit("graphite_plaintext", tenant, samples("limited", 5, 10))
    clock.advance(0.05)
    assert counter("tsgate_rate_limited_requests_total", limit="samples_per_second") - limited_before == 1
    assert ingest.paused and sender.producerState == "paused" and ingest.refusing
    udp.datagramReceived(b"limited.udp 1 1700000000\nlimited.udp 2 1700000001\n", ("127.0.0.1", 2003))
    assert counter("tsgate_graphite_udp_dropped_samples_total") - dropped_before == 2
    assert ingest.pending == 5
    assert next_timer(clock) == 1
    clock.advance(1)
    assert not ingest.refusing
    await until(lambda: ingest.pending == 0)
    assert not ingest.paused and sender.producerState == "producing"
    udp.datagramReceived(f"limited.udp 1 {now_ms() // 1000}\n".encode(), ("127.0.0.1", 2003))
    assert ingest.pending == 1 and counter("tsgate_graphite_udp_dropped_samples_total") - dropped_before == 2
    drained = ingest.drain()
    clock.advance(0.05)
    await drained
    assert await stored(sqlite_store, tenant, "limited") == 15
    assert await stored(sqlite_store, tenant, "limited.udp") == 1


@pytest_twisted.ensureDeferred
async def test_new_series_over_the_active_limit_are_refused_and_nothing_is_held_or_paused(sqlite_store, tenant):
    """A batch that crosses --tenant-max-active-series is written but for the new series beyond
    the limit: no batch held, no sender paused, no timer beyond the next flush."""
    clock = Clock()
    ingest, sender = limited_ingest(sqlite_store, clock, TenantLimits(0, max_active_series=2, clock=clock.seconds))
    refused_before = counter("tsgate_samples_rejected_total", protocol="graphite_plaintext", reason="max_active_series")
    ingest.submit("graphite_plaintext", tenant, concat([samples("active.a", 3), samples("active.b", 3)]))
    clock.advance(0.05)
    await until(lambda: ingest.pending == 0)
    crossing = concat([samples("active.a", 3, 3), samples("active.c", 2), samples("active.b", 3, 3)])
    ingest.submit("graphite_plaintext", tenant, crossing)
    clock.advance(0.05)
    await until(lambda: ingest.pending == 0)
    assert not ingest.paused and sender.producerState == "producing" and not ingest.refusing
    assert not clock.getDelayedCalls()
    refused = counter("tsgate_samples_rejected_total", protocol="graphite_plaintext", reason="max_active_series")
    assert refused - refused_before == 2
    assert [await stored(sqlite_store, tenant, name) for name in ("active.a", "active.b", "active.c")] == [6, 6, 0]


class BrokenPipeline(IngestPipeline):
    """A pipeline with a bug for batches of one metric: the error is neither the store's nor a limit."""

    async def ingest_arrays(self, protocol, batch):
        if "buggy" in batch.keys:
            raise ValueError("a bug")
        return await super().ingest_arrays(protocol, batch)


@pytest_twisted.ensureDeferred
async def test_a_batch_failing_unexpectedly_is_dropped_counted_and_its_write_finished_once(sqlite_store, tenant):
    """The in-flight write count went negative once (a dropped batch finished twice), which let
    more than ``concurrency`` writes run at once."""
    clock = Clock()
    pipeline = BrokenPipeline(sqlite_store, Limits(), KnownSeries(1000), 1_000_000)
    ingest = GraphiteIngest(pipeline, batch_size=5, concurrency=1, clock=clock)
    lost_before = counter("tsgate_graphite_lost_samples_total")
    ingest.submit("graphite_plaintext", tenant, samples("buggy", 5))
    ingest.submit("graphite_pickle", tenant, samples("fine", 5))
    clock.advance(0)
    assert counter("tsgate_graphite_lost_samples_total") - lost_before == 5
    assert ingest._writing == 1  # the next batch's write, and only it
    await ingest.drain()
    assert ingest._writing == 0
    assert await stored(sqlite_store, tenant, "fine") == 5


@pytest_twisted.ensureDeferred
async def test_a_backlog_over_the_tenant_rate_waits_instead_of_spinning(sqlite_store, tenant):
    """With a batch's worth of samples still queued, a refused batch used to be taken again at
    once, forever, in the same reactor turn."""
    clock = Clock()
    limits = TenantLimits(5, burst_seconds=1, clock=clock.seconds)
    ingest = GraphiteIngest(pipeline_on(sqlite_store, tenant_limits=limits), batch_size=5, concurrency=2, clock=clock)
    for start in range(0, 15, 5):
        ingest.submit("graphite_plaintext", tenant, samples("spin", 5, start))
    clock.advance(0)
    assert ingest.paused and next_timer(clock) == 1
    drained = ingest.drain()
    while not drained.called:
        await until(lambda: ingest._writing == 0)
        clock.advance(1)
    assert await stored(sqlite_store, tenant, "spin") == 15


@pytest.mark.parametrize("factory_class", [PlaintextFactory, PickleFactory])
def test_http_on_a_carbon_port_is_one_reject_one_log_line_and_a_close(sqlite_store, tenant, factory_class, caplog):
    """Prometheus pointed at port 2003 (or 2004): one http_request reject and a log line that
    says what happened, a 400 the client can show, the connection closed; no line rejects."""
    ingest = GraphiteIngest(pipeline_on(sqlite_store), clock=Clock())
    factory = factory_class(ingest, tenant, 16384, Connections(10), None)
    protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 50000))
    protocol.makeConnection(transport)
    name = protocol.protocol_name
    before = {reason: counter("tsgate_samples_rejected_total", protocol=name, reason=reason) for reason in REASONS}
    protocol.dataReceived(b"POST /api/v1/write HTTP/1.1\r\nHost: 127.0.0.1:2003\r\nContent-Length: 9000\r\n\r\n")
    protocol.dataReceived(b"\xff" * 9000)
    added = {r: counter("tsgate_samples_rejected_total", protocol=name, reason=r) - before[r] for r in REASONS}
    assert added == {reason: (1 if reason == "http_request" else 0) for reason in REASONS}
    assert transport.value().startswith(b"HTTP/1.1 400 Bad Request\r\n") and transport.disconnecting
    (line,) = [record.getMessage() for record in caplog.records if "http_request" in record.getMessage()]
    assert "this looks like HTTP on the carbon port (b'POST /api/v1/write HTTP/1.1')" in line
    assert ingest.pending == 0


def test_a_carbon_line_is_not_taken_for_http(sqlite_store, tenant):
    assert http_request_line(b"GET.requests.count 3 1700000000\n") is None
    assert http_request_line(b"POST /x HTTP/1.0\r\n") == "b'POST /x HTTP/1.0'"
    ingest = GraphiteIngest(pipeline_on(sqlite_store), clock=Clock())
    protocol = PlaintextFactory(ingest, tenant, 16384, Connections(10), None).buildProtocol(None)
    protocol.makeConnection(StringTransport())
    protocol.dataReceived(b"GET requests 3 1700000000\n")  # three fields: a sample named GET
    assert ingest.pending == 0 and not protocol.refused_http


@pytest_twisted.ensureDeferred
async def test_listeners_of_two_tenants_are_batched_apart_and_paths_merged_within_one(sqlite_store, tenant):
    """Batches merge queued arrays of one protocol and tenant only (the arrays carry no tenant);
    within one, two spellings of a tagged path are one series and a repeated path one entry."""
    other = tenant + "-other"
    clock = Clock()
    ingest = GraphiteIngest(pipeline_on(sqlite_store), batch_size=100, clock=clock)
    now = int(now_ms() / 1000) - 60
    first, _ = PlaintextDecoder().feed(b"m;a=1;b=2 1 %d\nm;b=2;a=1 2 %d\nplain 3 %d\n" % (now, now + 1, now), 0)
    ingest.submit("graphite_plaintext", tenant, first)
    ingest.submit("graphite_plaintext", other, samples("plain", 2))
    ingest.submit("graphite_plaintext", tenant, samples("plain", 1, 5))
    for _ in range(3):  # one batch a tenant's run of the queue, each after the flush delay
        clock.advance(ingest.flush_delay)
        await until(lambda: ingest._writing == 0)
    assert ingest.pending == 0
    assert await stored(sqlite_store, tenant, "plain") == 2
    assert await stored(sqlite_store, other, "plain") == 2
    hash_ = series_set_hash(series_set_text("m", {"a": "1", "b": "2"}))
    (found,) = await sqlite_store.read_raw(tenant, [hash_], (now - 10) * 1000, (now + 10) * 1000)
    assert found.head.values.tolist() == [1.0, 2.0]
