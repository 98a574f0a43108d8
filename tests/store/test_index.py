"""The time index (gateway/store/index.py): the store contract of its buckets on every driver, the
planner's selection by range, the pipeline's registration, expiry and the upgrade of a store
written before it existed."""

import sqlite3
import time
import uuid

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gateway.core import metrics
from gateway.core.layout import HOUR_MS, INDEX_BUCKET_MS, Layout
from gateway.core.model import Limits, SeriesKey, series_set_hash, series_set_text
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import PRE_INDEX_MS, IngestPipeline
from gateway.query.planner import MAX_INDEX_BUCKETS, QueryPlanner, QueryTooLarge
from gateway.store.cassandra import CassandraStore
from gateway.store.contract import BUCKET_INDEX_ALWAYS, Buckets
from gateway.store.sqlite import SQLiteStore
from protocols.prometheus import Matcher, prometheus_labels

B = INDEX_BUCKET_MS


def key(tenant: str, metric: str, tags: dict[str, str]) -> SeriesKey:
    return SeriesKey(tenant, series_set_hash(series_set_text(metric, tags)), metric, tags)


def pod(tenant: str, generation: int, index: int) -> SeriesKey:
    return key(tenant, "churn_total", {"job": "api", "pod": f"p{generation}-{index}"})


@pytest_twisted.ensureDeferred
async def test_a_bucket_lists_only_the_series_indexed_in_it(store, tenant):
    first, second = pod(tenant, 0, 0), pod(tenant, 1, 0)
    graphite = key(tenant, "servers.a.cpu", {})
    await store.write_series([first, second, graphite])
    await store.write_series_buckets([(first, 10 * B), (second, 11 * B), (graphite, 11 * B)])
    only_10, only_11, both = Buckets(10 * B, 10 * B), Buckets(11 * B, 11 * B), Buckets(10 * B, 11 * B)

    assert await store.find_series(tenant, "churn_total", "job", "api", only_10) == {first.series_set_hash}
    assert await store.find_series(tenant, "churn_total", "job", "api", both) == {
        first.series_set_hash,
        second.series_set_hash,
    }
    assert await store.find_series(tenant, "churn_total", "job", "api", Buckets(12 * B, 20 * B)) == set()
    assert await store.list_tag_values(tenant, "churn_total", "pod", only_11) == ["p1-0"]
    assert await store.list_tag_values(tenant, "churn_total", "pod", both) == ["p0-0", "p1-0"]
    assert await store.list_tag_keys(tenant, "churn_total", only_10) == ["job", "pod"]
    assert await store.list_metric_names(tenant, only_10) == ["churn_total"]
    assert await store.list_metric_names(tenant, only_11) == ["churn_total", "servers.a.cpu"]
    assert await store.list_tenant_tag_keys(tenant, only_11) == ["job", "pod"]
    assert await store.list_tenant_tag_values(tenant, "pod", only_10) == ["p0-0"]
    assert await store.find_metrics_by_tag(tenant, "pod", "p1-0", both) == ["churn_total"]
    assert await store.find_metrics_by_tag(tenant, "pod", "p1-0", only_10) == []
    assert await store.find_series(tenant, "servers.a.cpu", "__name__", "servers.a.cpu", only_11) == {
        graphite.series_set_hash
    }
    # the all-time index still lists everything
    assert await store.list_tag_values(tenant, "churn_total", "pod") == ["p0-0", "p1-0"]
    assert await store.list_metric_names(tenant) == ["churn_total", "servers.a.cpu"]


@pytest_twisted.ensureDeferred
async def test_writing_a_bucket_again_is_harmless_and_tenants_stay_apart(store, tenant):
    series = pod(tenant, 0, 0)
    other = pod(f"{tenant}-other", 0, 1)
    await store.write_series([series, other])
    for _ in range(2):
        await store.write_series_buckets([(series, 5 * B), (other, 5 * B)])
    assert await store.find_series(tenant, "churn_total", "job", "api", Buckets(5 * B, 5 * B)) == {
        series.series_set_hash
    }
    assert await store.list_tenant_tag_values(tenant, "pod", Buckets(5 * B, 5 * B)) == ["p0-0"]


@pytest_twisted.ensureDeferred
async def test_buckets_past_the_raw_retention_leave_the_time_index(store, tenant):
    """SQLite's sweep deletes them; Cassandra writes them with a TTL that ends at the same time."""
    now = int(time.time() * 1000)
    raw = store.layout.raw_retention_ms
    old_bucket = now - now % B - raw - 2 * B  # ended more than the raw retention ago
    recent_bucket = now - now % B
    old, recent = pod(tenant, 0, 0), pod(tenant, 1, 0)
    await store.write_series([old, recent])
    await store.write_series_buckets([(old, old_bucket), (recent, recent_bucket)])
    await store.sweep(now)
    await deferLater(reactor, 1.5, lambda: None)  # a TTL of 1 s has passed
    assert await store.find_series(tenant, "churn_total", "job", "api", Buckets(old_bucket, old_bucket)) == set()
    assert await store.list_tag_values(tenant, "churn_total", "pod", Buckets(old_bucket, old_bucket)) == []
    assert await store.find_series(tenant, "churn_total", "job", "api", Buckets(recent_bucket, recent_bucket)) == {
        recent.series_set_hash
    }


@pytest_twisted.ensureDeferred
async def test_a_new_store_has_its_whole_history_in_the_time_index(store):
    assert store.bucket_index_since == BUCKET_INDEX_ALWAYS or isinstance(store, CassandraStore)


@pytest_twisted.ensureDeferred
async def test_a_sqlite_file_another_process_is_creating_gets_its_time_index_row(tmp_path):
    """Two processes opening a new file at once (an import's workers): the second found the
    index_state table the first had just made, not yet its row, and failed to start ('NoneType'
    object is not subscriptable, CI). It now adds the row whatever it saw."""
    path = tmp_path / "new.db"
    store = SQLiteStore(path, Layout())
    await store.start()
    await store.close()
    with sqlite3.connect(path) as first:  # the first process, between making the table and its row
        first.execute("DELETE FROM index_state")
    store = SQLiteStore(path, Layout())
    await store.start()
    try:
        assert store.bucket_index_since == BUCKET_INDEX_ALWAYS
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_a_sqlite_file_written_before_the_time_index_answers_from_the_all_time_index(tmp_path):
    path = tmp_path / "old.db"
    store = SQLiteStore(path, Layout())
    await store.start()
    series = pod("t", 0, 0)
    await store.write_series([series])
    await store.close()
    with sqlite3.connect(path) as old:  # as the code before the time index left the file
        for table in [name for (name,) in old.execute("SELECT name FROM sqlite_master WHERE name LIKE 'bucket_%'")]:
            old.execute(f"DROP TABLE {table}")
        old.execute("DROP TABLE index_state")
    before = int(time.time() * 1000)
    store = SQLiteStore(path, Layout())
    await store.start()
    try:
        assert before <= store.bucket_index_since <= int(time.time() * 1000)
        planner = QueryPlanner(store, 10)
        matchers = [Matcher("EQ", "__name__", "churn_total"), Matcher("EQ", "job", "api")]
        earlier = await planner.select_by_matchers("t", matchers, prometheus_labels, before - HOUR_MS, before)
        assert earlier == [series]
        assert planner.index_buckets("t", before - HOUR_MS, before) is None
        since = store.bucket_index_since
        assert planner.index_buckets("t", since, since + 1) is not None
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_a_keyspace_written_before_the_time_index_answers_from_the_all_time_index(cassandra_url):
    url = cassandra_url.rsplit("/", 1)[0] + f"/upgrade_{uuid.uuid4().hex[:8]}"
    store = CassandraStore.from_url(url, Layout())
    store.apply_schema()
    await store.start()
    try:
        await store.write_series([pod("t", 0, 0)])
        assert store.bucket_index_since == BUCKET_INDEX_ALWAYS
        await store._execute(f"DROP TABLE {store.keyspace}.index_state")
    finally:
        await store.close()
    before = int(time.time() * 1000)
    upgraded = CassandraStore.from_url(url, Layout())
    upgraded.apply_schema()  # as `tsgate schema apply` does on upgrade
    await upgraded.start()
    try:
        assert before <= upgraded.bucket_index_since <= int(time.time() * 1000)
        again = CassandraStore.from_url(url, Layout())
        again.apply_schema()  # applying again keeps the moment
        await again.start()
        assert again.bucket_index_since == upgraded.bucket_index_since
        await again.close()
        await upgraded._execute(f"DROP KEYSPACE {upgraded.keyspace}")
    finally:
        await upgraded.close()


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


async def churn(store, clock: Clock, generations: int, pods: int) -> IngestPipeline:
    """``generations`` of ``pods`` series, one an hour, a sample a minute, written through the
    pipeline on a fake clock in time order, the last generation ending at the clock's time."""
    pipeline = IngestPipeline(store, Limits(), KnownSeries(100_000), 10**7, clock=clock)
    end = clock.now
    for generation in range(generations):
        start = end - (generations - generation) * HOUR_MS
        for minute in range(60):
            at = start + minute * 60_000
            samples = [
                ("t", "churn_total", {"job": "api", "pod": f"p{generation}-{i}"}, at, float(minute))
                for i in range(pods)
            ]
            result = await pipeline.ingest("test", samples)
            assert not result.rejected
    return pipeline


@pytest_twisted.ensureDeferred
async def test_a_query_of_the_last_hour_selects_what_the_hour_holds_not_the_tenants_history(sqlite_store):
    clock = Clock(1_800_000_000_000 - 1_800_000_000_000 % B + 30 * 60_000)  # half past an hour
    await churn(sqlite_store, clock, generations=12, pods=20)
    planner = QueryPlanner(sqlite_store, 70, clock=clock)  # 240 series in all, 20-60 in the last hour's buckets
    matchers = [Matcher("EQ", "__name__", "churn_total"), Matcher("EQ", "job", "api")]
    last_hour = await planner.select(  # widened as PromQL does: 5 min of rate and 5 min of lookback
        "t", matchers, prometheus_labels, clock.now - HOUR_MS - 10 * 60_000, clock.now
    )
    pods = {selected.labels["pod"] for selected in last_hour}
    assert {f"p11-{i}" for i in range(20)} <= pods and {f"p10-{i}" for i in range(20)} <= pods
    assert all(p.startswith(("p9-", "p10-", "p11-")) for p in pods)
    with pytest.raises(QueryTooLarge):  # the whole history is 240 series
        await planner.select("t", matchers, prometheus_labels)
    assert planner.index_buckets("t", clock.now - MAX_INDEX_BUCKETS * B, clock.now) is None  # the all-time index
    values = await sqlite_store.list_tag_values(
        "t", "churn_total", "pod", planner.index_buckets("t", clock.now, clock.now)
    )
    assert set(values) <= {f"p{g}-{i}" for g in (10, 11) for i in range(20)} and len(values) >= 20


@pytest_twisted.ensureDeferred
async def test_each_series_is_indexed_once_a_bucket_and_early_in_the_next_one(sqlite_store):
    clock = Clock(1_800_000_000_000 - 1_800_000_000_000 % B)
    written = metrics.INDEX_BUCKET_SERIES._value.get()
    pipeline = await churn(sqlite_store, clock, generations=1, pods=200)
    # 200 series in their bucket, and most of them in the next one ahead of time (each from a
    # moment in the last PRE_INDEX_MS its hash picks); nothing more for the other 59 minutes
    indexed = metrics.INDEX_BUCKET_SERIES._value.get() - written
    assert 200 + 100 <= indexed <= 400
    bucket = clock.now - HOUR_MS
    ahead = await sqlite_store.find_series("t", "churn_total", "job", "api", Buckets(clock.now, clock.now))
    assert 100 <= len(ahead) < 200
    assert len(await sqlite_store.find_series("t", "churn_total", "job", "api", Buckets(bucket, bucket))) == 200
    # the next bucket's samples: the series indexed ahead cost nothing more
    before = metrics.INDEX_BUCKET_SERIES._value.get()
    samples = [("t", "churn_total", {"job": "api", "pod": f"p0-{i}"}, clock.now + 1000, 1.0) for i in range(200)]
    await pipeline.ingest("test", samples)
    assert metrics.INDEX_BUCKET_SERIES._value.get() - before == 200 - len(ahead)
    assert PRE_INDEX_MS < B
