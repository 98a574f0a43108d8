"""data_head writes through acsylla (gateway/store/cassandra_acsylla.py) on a real Cassandra 5.0:
rows read back as the driver's do, cluster faults become StoreUnavailable (503), close() stops the
loop thread, and a process that never closes its store still exits."""

import subprocess
import sys
import threading
import time

import pytest
import pytest_twisted
from prometheus_client import REGISTRY
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater

from gateway.core.layout import Layout
from gateway.store.cassandra import CassandraStore, parse_url
from gateway.store.cassandra_base import routing_key
from gateway.store.contract import RawPoint, StoreUnavailable, time_slot
from tests.store.test_contract import series

HOUR = 3_600_000


def writer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "acsylla-writer"]


def url_with(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"


@pytest.mark.parametrize("head_writer", ["acsylla", "driver"])
@pytest_twisted.ensureDeferred
async def test_both_head_writers_write_rows_that_read_back(cassandra_url, tenant, head_writer):
    store = CassandraStore.from_url(url_with(cassandra_url, f"head_writer={head_writer}"), Layout())
    assert store.options.head_writer == head_writer
    await store.start()
    try:
        keys = [series(tenant, f"hw_{head_writer}", {"i": str(i)}) for i in range(300)]
        await store.write_series(keys)
        slot = time_slot(int(time.time() * 1000), HOUR) - HOUR
        timestamps = [slot + minute * 60_000 for minute in range(0, 60, 7)]
        await store.write_raw(
            [
                RawPoint(tenant, k.series_set_hash, ts, float(i * ts % 1000))
                for i, k in enumerate(keys)
                for ts in timestamps
            ]
        )
        found = await store.read_raw(tenant, [k.series_set_hash for k in keys], slot, slot + HOUR - 1)
        for i, raw in enumerate(found):
            assert raw.head.points() == [(ts, float(i * ts % 1000)) for ts in timestamps]
        await store.write_series([])  # nothing to bind: no batch, not an empty one
        # the index rows of the 300 series (thousands of rows, bound on the binder thread)
        assert sorted(await store.list_tag_values(tenant, f"hw_{head_writer}", "i")) == sorted(
            str(i) for i in range(300)
        )
        assert len(await store.get_series(tenant, [k.series_set_hash for k in keys])) == 300
    finally:
        await store.close()
    assert not writer_threads()


SAMPLE_VALUES = {"text": "tenant-a", "varchar": "tenant-a", "bigint": 1795946760000, "int": 7, "blob": b"\x01\x02"}


@pytest_twisted.ensureDeferred
async def test_the_routing_key_of_an_unbound_row_is_the_drivers(cassandra_url):
    """Rows bound by acsylla are grouped by replica on the routing key computed from the driver's
    statement metadata: it must be the key the driver computes when it binds the row."""
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    try:
        checked = 0
        for statement in store._statements.values():
            if not statement.routing_key_indexes:
                continue
            columns = statement.column_metadata
            values = tuple(SAMPLE_VALUES.get(column.type.typename, None) for column in columns)
            if any(values[i] is None for i in statement.routing_key_indexes):
                continue
            assert routing_key((statement, values)) == statement.bind(values).routing_key, statement.query_string
            checked += 1
        assert checked > 20
    finally:
        await store.close()


def errors_counted() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "tsgate_cassandra_errors"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


@pytest_twisted.ensureDeferred
async def test_a_write_at_a_consistency_the_cluster_cannot_meet_is_store_unavailable(cassandra_url, tenant):
    """Three replicas asked of a one-node cluster: Cassandra answers Unavailable (the retry policy
    tries the next host, so the driver ends with NoHostsAvailable), which the head writer maps to
    StoreUnavailable (503, the sender retries) and counts, as the driver does."""
    store = CassandraStore.from_url(url_with(cassandra_url, "write_consistency=three"), Layout())
    await store.start()
    try:
        before = errors_counted()
        writer = store._acsylla
        slot = time_slot(int(time.time() * 1000), HOUR)
        rows = [(tenant, slot, 0, "h", slot + i, 1.0, 3600) for i in range(10)]
        with pytest.raises(StoreUnavailable, match=r"cassandra \(acsylla\): CassError.*(Unavailable|NoHostsAvailable)"):
            await writer.write([rows])
        assert errors_counted() == before + 1
        with pytest.raises(StoreUnavailable):
            await store.write_raw([RawPoint(tenant, "h", slot, 1.0)])
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_a_write_fails_when_one_of_its_batches_fails(cassandra_url, tenant):
    """Batches of one write run at once; one that Cassandra refuses (a negative TTL) fails the
    whole write, so nothing of it is acknowledged, once all have finished."""
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    try:
        slot = time_slot(int(time.time() * 1000), HOUR)
        good = [(tenant, slot, shard, "h", slot + shard, 1.0, 3600) for shard in range(8)]
        bad = [(tenant, slot, shard, "h", slot + shard, 1.0, -1) for shard in range(8, 16)]
        with pytest.raises(Exception, match="TTL"):
            await store._acsylla.write([good, bad, good])
        (found,) = await store.read_raw(tenant, ["h"], slot, slot + HOUR - 1)
        assert found.head.points() == []  # no head_written_at: a write that failed is not found
    finally:
        await store.close()


def batch_warnings_counted() -> float:
    return REGISTRY.get_sample_value("tsgate_cassandra_batch_warnings_total") or 0.0


@pytest_twisted.ensureDeferred
async def test_cassandras_warnings_about_batches_of_many_partitions_are_counted_not_logged_each(
    cassandra_url, tenant, caplog
):
    """A batch of 16 partitions over 5 KiB draws two server warnings a request, which acsylla
    logs: counted, and at most one line logged in ten minutes."""
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    try:
        before = batch_warnings_counted()
        slot = time_slot(int(time.time() * 1000), HOUR)
        rows = [(tenant, slot, i % 16, f"h{i}", slot, 1.0, 3600) for i in range(200)]
        for _ in range(3):
            await store._acsylla.write([rows])
        await deferLater(reactor, 0.2, lambda: None)  # acsylla logs from its own thread
        assert batch_warnings_counted() >= before + 6
        assert len([r for r in caplog.records if r.name == "acsylla" and "Batch for" in r.getMessage()]) <= 1
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_the_first_head_write_connects_and_close_stops_the_loop_thread(cassandra_url, tenant):
    """A store that writes no head rows (query executors, the downsampler) starts no thread."""
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    assert not writer_threads()
    now = int(time.time() * 1000)
    await defer.gatherResults([store.write_raw([RawPoint(tenant, "h", now + i, 1.0)]) for i in range(3)])
    assert len(writer_threads()) == 1
    await store.close()
    assert not writer_threads()
    await store._acsylla.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.write_raw([RawPoint(tenant, "h", now, 1.0)])


@pytest_twisted.ensureDeferred
async def test_a_store_that_never_wrote_head_rows_closes(cassandra_url):
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    await store.close()
    assert not writer_threads()


@pytest_twisted.ensureDeferred
async def test_a_failed_connect_fails_the_write_and_the_next_write_tries_again(cassandra_url, tenant):
    """acsylla alone cannot connect (here: a wrong port, the driver's session is fine): the write
    is StoreUnavailable (503), and so is the next one, each a new attempt."""
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    try:
        store._acsylla.options = store.options._replace(hosts=[("127.0.0.1", 1)], request_timeout_s=2.0)
        now = int(time.time() * 1000)
        for _ in range(2):
            with pytest.raises(StoreUnavailable, match="acsylla"):
                await store.write_raw([RawPoint(tenant, "h", now, 1.0)])
    finally:
        await store.close()


def test_a_process_that_never_closes_its_store_exits(cassandra_url):
    """A worker killed at its shutdown deadline, or a script that forgets close(), must not hang
    on the loop thread or acsylla's own I/O threads at interpreter exit."""
    script = f"""
import time
from twisted.internet import defer, task
from gateway.core.layout import Layout
from gateway.store.cassandra import CassandraStore
from gateway.store.contract import RawPoint

async def main(reactor):
    store = CassandraStore.from_url({cassandra_url!r}, Layout())
    await store.start()
    await store.write_raw([RawPoint("exit-test", "h", int(time.time() * 1000), 1.0)])
    print("written", flush=True)

task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "written\n"


def test_head_writer_option():
    assert parse_url("cassandra://h/ks", Layout()).head_writer == "acsylla"
    assert parse_url("cassandra://h/ks?head_writer=driver", Layout()).head_writer == "driver"
    with pytest.raises(ValueError, match="head_writer 'fast' is not one of acsylla, driver"):
        parse_url("cassandra://h/ks?head_writer=fast", Layout())
