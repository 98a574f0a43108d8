"""The time index (gateway/store/index.py): the store contract of its buckets on every driver, the
planner's selection by range, the pipeline's registration, expiry and the upgrade of a store
written before it existed."""

import dataclasses
import sqlite3
import time
import uuid

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gateway.core import metrics
from gateway.core.layout import DAY_MS, HOUR_MS, INDEX_BUCKET_MS, Layout
from gateway.core.model import Limits, SeriesKey, series_set_hash, series_set_text
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import PRE_INDEX_MS, IngestPipeline
from gateway.query.planner import MAX_INDEX_BUCKETS, QueryPlanner, QueryTooLarge
from gateway.store.cassandra import CassandraStore
from gateway.store.cassandra_index import BOUNDED_LISTING_REQUESTS
from gateway.store.contract import BUCKET_INDEX_ALWAYS, Buckets
from gateway.store.index import DailyRefresh
from gateway.store.sqlite import SQLiteStore
from protocols.prometheus import Matcher, prometheus_labels

B = INDEX_BUCKET_MS


def key(tenant: str, metric: str, tags: dict[str, str]) -> SeriesKey:
    return SeriesKey(tenant, series_set_hash(series_set_text(metric, tags)), metric, tags)


def pod(tenant: str, generation: int, index: int) -> SeriesKey:
    return key(tenant, "churn_total", {"job": "api", "pod": f"p{generation}-{index}"})


def recent_hours() -> int:
    """A bucket start a day ago, whose buckets are all within the raw retention: Cassandra keeps a
    bucket's rows the raw retention past its end (a bucket of 1970 would live a second)."""
    now = time.time_ns() // 1_000_000
    return now - now % B - 24 * B


@pytest_twisted.ensureDeferred
async def test_a_bucket_lists_only_the_series_indexed_in_it(store, tenant):
    H = recent_hours()
    first, second = pod(tenant, 0, 0), pod(tenant, 1, 0)
    graphite = key(tenant, "servers.a.cpu", {})
    await store.write_series([first, second, graphite])
    await store.write_series_buckets([(first, H + 10 * B), (second, H + 11 * B), (graphite, H + 11 * B)])
    only_10, only_11, both = (
        Buckets(H + 10 * B, H + 10 * B),
        Buckets(H + 11 * B, H + 11 * B),
        Buckets(H + 10 * B, H + 11 * B),
    )

    assert await store.find_series(tenant, "churn_total", "job", "api", only_10) == {first.series_set_hash}
    assert await store.find_series(tenant, "churn_total", "job", "api", both) == {
        first.series_set_hash,
        second.series_set_hash,
    }
    assert await store.find_series(tenant, "churn_total", "job", "api", Buckets(H + 12 * B, H + 20 * B)) == set()
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
async def test_listings_over_buckets_are_distinct_sorted_and_exact(store, tenant):
    """A value in several buckets is listed once, every listing sorted by code point, and any
    text comes back as written (quotes, backslashes, control characters, NUL, beyond the BMP):
    SQLite lists through a JSON array it builds."""
    H = recent_hours()
    values = ["b", 'q"uote\\', "a\x00b", "\x01\n\t", "\u2028", "é", "😀", "Z", " "]
    written = [key(tenant, "m", {"k": value}) for value in values]
    await store.write_series(written)
    await store.write_series_buckets([(s, H + B * (n % 3)) for n, s in enumerate(written)] + [(written[0], H + 2 * B)])
    buckets = Buckets(H, H + 2 * B)
    assert await store.list_tag_values(tenant, "m", "k", buckets) == sorted(values)
    assert await store.list_tenant_tag_values(tenant, "k", buckets) == sorted(values)
    assert await store.list_tag_values(tenant, "m", "k") == sorted(values)
    assert await store.list_tag_keys(tenant, "m", buckets) == ["k"]
    assert await store.find_series(tenant, "m", "k", "a\x00b", buckets) == {written[2].series_set_hash}
    assert await store.find_series(tenant, "m", "__name__", "m", buckets) == {s.series_set_hash for s in written}


@pytest_twisted.ensureDeferred
async def test_a_bounded_listing_reads_at_most_its_rows(store, tenant):
    """``most_rows`` counts index rows, a value once a bucket: a listing within it answers as
    without it, one past it None (the serving process leaves that one to an executor)."""
    H = recent_hours()
    pods = [pod(tenant, 0, n) for n in range(3)]
    await store.write_series(pods)
    await store.write_series_buckets([(s, H) for s in pods] + [(s, H + B) for s in pods])
    two = Buckets(H, H + B)
    assert await store.list_tenant_tag_values(tenant, "pod", two, most_rows=6) == ["p0-0", "p0-1", "p0-2"]
    assert await store.list_tenant_tag_values(tenant, "pod", two, most_rows=5) is None
    assert await store.list_tenant_tag_values(tenant, "pod", None, most_rows=3) == ["p0-0", "p0-1", "p0-2"]
    assert await store.list_tenant_tag_values(tenant, "pod", None, most_rows=2) is None
    assert await store.list_tenant_tag_keys(tenant, two, most_rows=4) == ["job", "pod"]
    assert await store.list_tenant_tag_keys(tenant, two, most_rows=3) is None
    assert await store.list_metric_names(tenant, Buckets(H, H), most_rows=1) == ["churn_total"]
    assert await store.list_metric_names(tenant, None, most_rows=0) is None
    # Cassandra reads a bucket a request: a bounded listing reads at most BOUNDED_LISTING_REQUESTS
    wide = Buckets(H - BOUNDED_LISTING_REQUESTS * B, H + B)
    expected = None if isinstance(store, CassandraStore) else ["p0-0", "p0-1", "p0-2"]
    assert await store.list_tenant_tag_values(tenant, "pod", wide, most_rows=100) == expected


@pytest_twisted.ensureDeferred
async def test_many_listings_are_asked_in_one_call(store, tenant):
    """What a delete asks of the index: whether each listing has a row (all-time), and the
    buckets in which each has one, or has a given value; answers in the order asked."""
    H = recent_hours()
    first, second = pod(tenant, 0, 0), pod(tenant, 1, 0)
    await store.write_series([first, second])
    await store.write_series_buckets([(first, H), (first, H + B), (second, H + B)])
    assert await store.listings_with_rows(
        "find_series", [(tenant, "churn_total", "pod", "p1-0"), (tenant, "churn_total", "pod", "p9-9")]
    ) == [True, False]
    assert await store.listings_with_rows("list_tenant_tag_values", [(tenant, "nope"), (tenant, "job")]) == [
        False,
        True,
    ]
    span = Buckets(H - B, H + 2 * B)
    assert await store.listings_buckets(
        "find_series",
        [(tenant, "churn_total", "pod", "p0-0"), (tenant, "churn_total", "pod", "p1-0"), (tenant, "x", "pod", "p")],
        span,
    ) == [{H, H + B}, {H + B}, set()]
    name = (tenant, "churn_total", "__name__", "churn_total")
    with_values = [(*name, first.series_set_hash), (*name, second.series_set_hash), (*name, "unknown")]
    assert await store.listings_buckets("find_series", with_values, span) == [{H, H + B}, {H + B}, set()]
    assert await store.listings_buckets("list_tag_values", [], span) == []


@pytest_twisted.ensureDeferred
async def test_writing_a_bucket_again_is_harmless_and_tenants_stay_apart(store, tenant):
    H = recent_hours()
    series = pod(tenant, 0, 0)
    other = pod(f"{tenant}-other", 0, 1)
    await store.write_series([series, other])
    for _ in range(2):
        await store.write_series_buckets([(series, H + 5 * B), (other, H + 5 * B)])
    assert await store.find_series(tenant, "churn_total", "job", "api", Buckets(H + 5 * B, H + 5 * B)) == {
        series.series_set_hash
    }
    assert await store.list_tenant_tag_values(tenant, "pod", Buckets(H + 5 * B, H + 5 * B)) == ["p0-0"]


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
async def test_the_index_of_a_tenant_whose_data_expired_shrinks_to_nothing(store, tenant, monkeypatch):
    """Series last indexed in a bucket that ended the tenant's longest retention ago leave every
    index, the all-time one and the Graphite tree included: SQLite's sweep takes them (by
    series_set_hashes.last_bucket), Cassandra's TTL (the longest retention, 1 s here, from the last
    write: no margin here); a live tenant's stay."""
    now = int(time.time() * 1000)
    second = dataclasses.replace(
        store.layout, raw_retention_ms=1000, exemplar_retention_ms=1000, head_retention_ms=1000, granularities=()
    )
    monkeypatch.setitem(store.retentions.by_tenant, tenant, second)
    monkeypatch.setattr(store, "all_time_margin_ms", 0)
    old = now - now % B - 3 * B
    live_tenant = f"{tenant}-live"
    dead = [pod(tenant, 0, 0), pod(tenant, 0, 1), key(tenant, "servers.a.cpu", {}), key(tenant, "servers.b.cpu", {})]
    live = pod(live_tenant, 1, 0)
    await store.write_series([live])
    await store.write_series_buckets([*((s, old) for s in dead), (dead[0], old + B), (live, now - now % B)])
    await store.sweep(now)
    await deferLater(reactor, 1.5, lambda: None)  # a TTL of 1 s has passed

    everything = Buckets(old, now)
    for buckets in (None, everything):
        assert await store.list_metric_names(tenant, buckets) == []
        assert await store.find_series(tenant, "churn_total", "job", "api", buckets) == set()
        assert await store.list_tag_keys(tenant, "churn_total", buckets) == []
        assert await store.list_tag_values(tenant, "churn_total", "pod", buckets) == []
        assert await store.list_tenant_tag_keys(tenant, buckets) == []
        assert await store.list_tenant_tag_values(tenant, "job", buckets) == []
        assert await store.find_metrics_by_tag(tenant, "job", "api", buckets) == []
    assert await store.list_path_children(tenant, "") == []
    assert await store.list_path_children(tenant, "servers") == []
    assert await store.get_series(tenant, [s.series_set_hash for s in dead]) == {}
    tenants = await store.list_tenants()
    assert tenant not in tenants and live_tenant in tenants
    assert await store.find_series(live_tenant, "churn_total", "job", "api") == {live.series_set_hash}
    assert await store.list_tag_values(live_tenant, "churn_total", "pod", everything) == ["p1-0"]


@pytest_twisted.ensureDeferred
async def test_a_deleted_series_leaves_the_time_index_of_every_bucket_it_was_in(store, tenant):
    """Its own rows go from each bucket, and the shared ones no series of that bucket needs: label
    values over those hours no longer show it."""
    now = int(time.time() * 1000)
    current, previous = now - now % B, now - now % B - B
    gone, kept = pod(tenant, 0, 0), pod(tenant, 0, 1)
    graphite = key(tenant, "servers.a.cpu", {})
    await store.write_series([gone, kept, graphite])
    await store.write_series_buckets([(gone, previous), (gone, current), (kept, current), (graphite, previous)])
    await store.delete_series([gone, graphite])

    both, only_previous = Buckets(previous, current), Buckets(previous, previous)
    assert await store.find_series(tenant, "churn_total", "job", "api", both) == {kept.series_set_hash}
    assert await store.find_series(tenant, "churn_total", "pod", "p0-0", both) == set()
    assert await store.list_tag_values(tenant, "churn_total", "pod", both) == ["p0-1"]
    assert await store.list_tenant_tag_values(tenant, "pod", both) == ["p0-1"]
    assert await store.find_metrics_by_tag(tenant, "pod", "p0-0", both) == []
    assert await store.list_metric_names(tenant, both) == ["churn_total"]
    assert await store.list_metric_names(tenant, only_previous) == []
    assert await store.list_tag_keys(tenant, "churn_total", only_previous) == []
    assert await store.list_tenant_tag_keys(tenant, only_previous) == []
    assert await store.list_tenant_tag_values(tenant, "job", only_previous) == []
    assert await store.list_tag_values(tenant, "churn_total", "pod") == ["p0-1"]


@pytest_twisted.ensureDeferred
async def test_a_range_older_than_the_time_index_selects_the_series_seen_since_its_start(store, tenant):
    """Past the time index (30 and 365 days) the planner reads the all-time index, one lookup a
    filter, and keeps the series last indexed in a bucket since the range's start; late data of
    an older bucket does not make a series look older."""
    now = int(time.time() * 1000)
    hour = now - now % B
    year_old, recent = pod(tenant, 0, 0), pod(tenant, 1, 0)
    await store.write_series_buckets([(year_old, hour - 40 * 24 * B)])
    await store.write_series_buckets([(recent, hour - 2 * B)])
    await store.write_series_buckets([(recent, hour - 10 * 24 * B)])  # late data
    planner = QueryPlanner(store, 100, clock=lambda: now)
    for days, expected in ((30, [recent]), (365, [year_old, recent])):
        assert planner.index_buckets(tenant, now - days * 24 * B, now) is None
        found = await planner.select_series(tenant, "churn_total", {"job": "api"}, now - days * 24 * B, now)
        assert sorted(found) == sorted(expected)
    assert await store.series_seen_since(tenant, [year_old.series_set_hash], hour - 41 * 24 * B) == {
        year_old.series_set_hash
    }


def test_a_series_rewrites_its_all_time_rows_once_a_day_and_for_late_data():
    refresh = DailyRefresh()
    day = 20_000 * DAY_MS
    a, b = pod("t", 0, 0), pod("t", 0, 1)
    assert refresh.due([(a, day), (a, day + B), (b, day + 5 * B)]) == [a, b]
    assert refresh.due([(a, day + 6 * B), (b, day + 7 * B)]) == []
    assert refresh.due([(a, day + DAY_MS)]) == [a]  # the next day (ahead of time, say)
    assert refresh.due([(b, day + 23 * B)]) == []  # the day before it is still remembered
    assert refresh.due([(a, day + 2 * DAY_MS)]) == [a]
    assert refresh.due([(b, day)]) == [b]  # older than two days: late data, rewritten each time
    assert refresh.due([(b, day)]) == [b]


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
