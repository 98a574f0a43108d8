"""The production path on a real Cassandra 5.0 and a real Redis: schema, tables, faults, cache."""

import gc
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import pytest
import pytest_twisted
from cassandra.cluster import Cluster, ResponseFuture
from cassandra.protocol import PrepareMessage
from twisted.internet import defer, reactor, task, threads

from gateway.core import samples
from gateway.core.layout import HOUR_MS, Layout, head_shard, parse_granularities
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.store.blocks import encode_block
from gateway.store.cassandra import CassandraStore, parse_url
from gateway.store.cassandra_schema import SchemaOptions, schema_text
from gateway.store.contract import ExemplarRow, HistogramRow, RawPoint, Rollup
from tests.conftest import read_blocks, read_head
from tests.gatewayproc import REPO, metric_value, wait_until_redis_is_used

SCHEMA_FILE = REPO / "schema.cql"


def cql_session(server):
    cluster = Cluster([server.host], port=server.port, protocol_version=5)
    return cluster, cluster.connect()


def tsgate(*args):
    return subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def describe(session, keyspace: str) -> dict:
    """What system_schema says about a keyspace's tables, keyspace names removed."""
    tables = {}
    for row in session.execute(
        "SELECT table_name, compaction, default_time_to_live, gc_grace_seconds FROM system_schema.tables WHERE keyspace_name = %s",
        [keyspace],
    ):
        tables[row.table_name] = {
            "compaction": dict(row.compaction),
            "ttl": row.default_time_to_live,
            "gc": row.gc_grace_seconds,
            "columns": {},
        }
    for row in session.execute(
        "SELECT table_name, column_name, kind, position, type, clustering_order FROM system_schema.columns WHERE keyspace_name = %s",
        [keyspace],
    ):
        tables[row.table_name]["columns"][row.column_name] = (row.kind, row.position, row.type, row.clustering_order)
    return tables


@pytest.mark.slow
def test_schema_file_is_the_default_schema():
    assert SCHEMA_FILE.read_text() == schema_text(SchemaOptions())
    printed = tsgate("schema", "print", "--store", "cassandra://127.0.0.1/tsdb")
    assert printed.returncode == 0 and printed.stdout == SCHEMA_FILE.read_text()


def test_schema_file_and_schema_apply_agree(cassandra_server):
    cluster, session = cql_session(cassandra_server)
    try:
        session.execute("DROP KEYSPACE IF EXISTS tsdb")
        session.execute("DROP KEYSPACE IF EXISTS tsdb_applied")
        for statement in filter(str.strip, re.sub(r"--[^\n]*", "", SCHEMA_FILE.read_text()).split(";")):
            session.execute(statement)
        url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/tsdb_applied"
        for _ in range(2):
            applied = tsgate("schema", "apply", "--store", url)
            assert applied.returncode == 0, applied.stderr
        assert describe(session, "tsdb") == describe(session, "tsdb_applied")
        assert set(describe(session, "tsdb")) == {
            "tenants",
            "metric_names",
            "series_set_hashes",
            "series_sets",
            "tag_keys",
            "tag_values",
            "graphite_paths",
            "tenant_tag_keys",
            "tenant_tag_values",
            "tag_metrics",
            "metric_metadata",
            "data_raw",
            "data_head",
            "data_blocks",
            "histograms",
            "exemplars",
            "pending_downsample_sets",
            "data_5m",
            "data_1h",
            "histograms_5m",
            "histograms_1h",
            "histogram_series",
            "bucket_metric_names",
            "bucket_series_sets",
            "bucket_tag_keys",
            "bucket_tag_values",
            "bucket_tenant_tag_keys",
            "bucket_tenant_tag_values",
            "bucket_tag_metrics",
            "index_state",
        }
        blocks = describe(session, "tsdb")["data_blocks"]
        assert blocks["compaction"]["class"].endswith("TimeWindowCompactionStrategy") and blocks["ttl"] == 7 * 86400
        assert describe(session, "tsdb")["data_raw"]["ttl"] == 7 * 3600
        assert describe(session, "tsdb")["data_head"]["ttl"] == 7 * 3600
        assert describe(session, "tsdb")["histograms_1h"]["ttl"] == 365 * 86400
        assert describe(session, "tsdb")["histogram_series"]["ttl"] == 365 * 86400
    finally:
        cluster.shutdown()


def test_schema_apply_upgrades_retention(cassandra_server):
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/tsdb_upgrade"
    assert tsgate("schema", "apply", "--store", url).returncode == 0
    assert tsgate("schema", "apply", "--store", url, "--raw-retention", "2d").returncode == 0
    cluster, session = cql_session(cassandra_server)
    try:
        blocks = describe(session, "tsdb_upgrade")["data_blocks"]
        assert blocks["ttl"] == 2 * 86400
        assert blocks["compaction"]["compaction_window_size"] == "2"
    finally:
        session.execute("DROP KEYSPACE IF EXISTS tsdb_upgrade")
        cluster.shutdown()


def test_schema_apply_gives_an_existing_data_head_its_compaction_thresholds(cassandra_server):
    """A keyspace whose data_head compacts with Cassandra's default thresholds (4 sstables, as
    tables made before issue 23's measurement did) gets data_head's own from `schema apply`."""
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/tsdb_head_compaction"
    assert tsgate("schema", "apply", "--store", url).returncode == 0
    cluster, session = cql_session(cassandra_server)
    try:
        session.execute(
            "ALTER TABLE tsdb_head_compaction.data_head WITH compaction = {'class': 'TimeWindowCompactionStrategy',"
            " 'compaction_window_unit': 'HOURS', 'compaction_window_size': '1'}"
        )
        assert describe(session, "tsdb_head_compaction")["data_head"]["compaction"]["min_threshold"] == "4"
        applied = tsgate("schema", "apply", "--store", url)
        assert applied.returncode == 0, applied.stderr
        compaction = describe(session, "tsdb_head_compaction")["data_head"]["compaction"]
        assert (compaction["min_threshold"], compaction["max_threshold"]) == ("32", "64")
        assert compaction["compaction_window_size"] == "1"
    finally:
        session.execute("DROP KEYSPACE IF EXISTS tsdb_head_compaction")
        cluster.shutdown()


def test_schema_apply_upgrades_a_keyspace_of_one_row_a_sample(start_gateway, cassandra_server, tenant):
    """A keyspace made before blocks existed (no data_blocks; data_raw rows
    written with the raw retention's TTL) is upgraded by `schema apply`, and what it held stays
    readable, before and after the downsampler seals it."""
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/tsdb_old_layout"
    cluster, session = cql_session(cassandra_server)
    try:
        session.execute("DROP KEYSPACE IF EXISTS tsdb_old_layout")
        old_schema = (
            SCHEMA_FILE.read_text()
            .replace("tsdb.", "tsdb_old_layout.")
            .replace("KEYSPACE IF NOT EXISTS tsdb\n", "KEYSPACE IF NOT EXISTS tsdb_old_layout\n")
        )
        for statement in filter(str.strip, re.sub(r"--[^\n]*", "", old_schema).split(";")):
            if "data_blocks" not in statement:
                session.execute(statement)
        t0 = (int(time.time()) // 3600 - 2) * 3600
        hash_ = series_set_hash(series_set_text("legacy_temp", {"room": "a"}))
        ks = "tsdb_old_layout"
        index_legacy_series(session, ks, tenant, hash_)
        for i in range(30):
            ts = (t0 + i * 60) * 1000
            session.execute(
                f"INSERT INTO {ks}.data_raw (tenant, series_set_hash, time_slot, ts, value) VALUES (%s, %s, %s, %s, %s) USING TTL 604800",
                [tenant, hash_, t0 * 1000, ts, float(i)],
            )
        applied = tsgate("schema", "apply", "--store", url)
        assert applied.returncode == 0, applied.stderr
        assert "indexed 1 data_raw partitions" in applied.stdout
        gateway = start_gateway("--store", url, "--roles", "ingest,query", "--downsample-delay", "0s")
        query = "/api/query?" + urllib.parse.urlencode(
            {"tenant": tenant, "metricName": "legacy_temp", "start": t0, "end": t0 + 3599}
        )

        def values():
            answer = gateway.get(query)
            assert answer.status == 200, answer.body
            return list(answer.json()[0]["values"].values())

        assert values() == [float(i) for i in range(30)]
        new = {"tenant": tenant, "metricName": "legacy_temp", "tags": {"room": "a"}, "ts": t0 + 1800, "value": 99.0}
        assert gateway.post("/api/write/single", new).status == 200
        sealed = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.app.cli",
                "downsample",
                "--once",
                "--downsample-delay",
                "0s",
                "--store",
                url,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sealed.returncode == 0, sealed.stderr
        assert values() == [float(i) for i in range(30)] + [99.0]
        assert [row.block is not None for row in session.execute(f"SELECT block FROM {ks}.data_blocks")] == [True]
    finally:
        session.execute("DROP KEYSPACE IF EXISTS tsdb_old_layout")
        cluster.shutdown()


def schema_before_data_head(keyspace: str) -> list[str]:
    """The statements of the schema before data_head (head rows in data_raw, data_blocks without head_written_at)."""
    text = re.sub(r"--[^\n]*", "", SCHEMA_FILE.read_text())
    text = text.replace("tsdb.", f"{keyspace}.").replace(
        "KEYSPACE IF NOT EXISTS tsdb\n", f"KEYSPACE IF NOT EXISTS {keyspace}\n"
    )
    text = text.replace("    head_written_at bigint,\n", "")
    return [s for s in filter(str.strip, text.split(";")) if f"{keyspace}.data_head " not in s]


def test_head_rows_of_data_raw_stay_readable_after_the_upgrade_to_data_head(start_gateway, cassandra_server, tenant):
    """A keyspace whose head rows are in data_raw (one partition a series-slot, each slot's
    written_at in data_blocks, as the code before data_head wrote them) is upgraded by `schema
    apply`: every sample reads the same through the native and the Prometheus API, with new
    samples (in data_head) beside them in the same slot, before and after the downsampler seals it."""
    ks = "tsdb_before_head"
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/{ks}"
    cluster, session = cql_session(cassandra_server)
    session.default_timeout = 120
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}")
        for statement in schema_before_data_head(ks):
            session.execute(statement)
        now = int(time.time())
        t0 = (now // 3600 - 1) * 3600  # the slot before this one: ended, not sealed yet
        hash_ = series_set_hash(series_set_text("legacy_temp", {"room": "a"}))
        index_legacy_series(session, ks, tenant, hash_)
        slot_ms, head_ttl = t0 * 1000, 7 * 3600
        for i in range(30):
            session.execute(
                f"INSERT INTO {ks}.data_raw (tenant, series_set_hash, time_slot, ts, value) VALUES (%s, %s, %s, %s, %s) USING TTL %s",
                [tenant, hash_, slot_ms, slot_ms + i * 60_000, float(i), head_ttl],
            )
        session.execute(
            f"UPDATE {ks}.data_blocks USING TTL %s SET written_at = %s"
            " WHERE tenant = %s AND series_set_hash = %s AND block_partition = %s AND time_slot = %s",
            [head_ttl, now * 1000, tenant, hash_, slot_ms - slot_ms % (168 * HOUR_MS), slot_ms],
        )
        applied = tsgate("schema", "apply", "--store", url)
        assert applied.returncode == 0, applied.stderr
        gateway = start_gateway("--store", url, "--roles", "ingest,query", "--downsample-delay", "0s")
        native = "/api/query?" + urllib.parse.urlencode(
            {"tenant": tenant, "metricName": "legacy_temp", "start": t0, "end": t0 + 3599}
        )
        promql = "/api/v1/query?" + urllib.parse.urlencode({"query": 'legacy_temp{room="a"}[1h]', "time": t0 + 3599})

        def read() -> tuple[list, list]:
            answer = gateway.get(native, headers={"X-Scope-OrgID": tenant})
            assert answer.status == 200, answer.body
            prometheus = gateway.get(promql, headers={"X-Scope-OrgID": tenant})
            assert prometheus.status == 200, prometheus.body
            (series,) = prometheus.json()["data"]["result"]
            return list(answer.json()[0]["values"].values()), [float(v) for _, v in series["values"]]

        old = [float(i) for i in range(30)]
        assert read() == (old, old)
        late = {"tenant": tenant, "metricName": "legacy_temp", "tags": {"room": "a"}, "ts": t0 + 1800, "value": 99.0}
        assert gateway.post("/api/write/single", late).status == 200
        assert read() == (old + [99.0], old + [99.0])
        sealed = tsgate("downsample", "--once", "--downsample-delay", "0s", "--store", url)
        assert sealed.returncode == 0, sealed.stderr
        assert "rolled up 1 series-slots" in sealed.stdout
        assert read() == (old + [99.0], old + [99.0])
        blocks = session.execute(f"SELECT block, sealed_at FROM {ks}.data_blocks").all()
        assert [(row.block is not None, row.sealed_at is not None) for row in blocks] == [(True, True)]
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}")
        cluster.shutdown()


@pytest_twisted.ensureDeferred
async def test_schema_apply_indexes_histograms_written_before_histogram_series(cassandra_server, tenant):
    """Reads look only at the series histogram_series names: `schema apply` on a keyspace without it
    indexes the histograms and roll-ups already there, so they stay readable."""
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/tsdb_hindex"
    store = CassandraStore.from_url(url, Layout())
    fine = store.layout.granularities[0]
    cluster, session = cql_session(cassandra_server)
    try:
        await threads.deferToThread(store.apply_schema)
        await store.start()
        await store.write_histograms(
            [HistogramRow(tenant, "a", HOUR_MS, b"h"), HistogramRow(tenant, "a", 2 * HOUR_MS, b"i")]
        )
        await store.write_histogram_rollups(fine, [HistogramRow(tenant, "b", 0, b"r")])
        await store.close()
        await threads.deferToThread(session.execute, "DROP TABLE tsdb_hindex.histogram_series", timeout=120)
        store = CassandraStore.from_url(url, Layout())
        applied = await threads.deferToThread(store.apply_schema)
        assert "-- indexed 3 histogram partitions written before the upgrade in histogram_series" in applied
        await store.start()
        assert await store.read_histograms(tenant, ["b", "a"], 0, 3 * HOUR_MS) == [
            [],
            [HistogramRow(tenant, "a", HOUR_MS, b"h"), HistogramRow(tenant, "a", 2 * HOUR_MS, b"i")],
        ]
        assert await store.read_histogram_rollups(fine, tenant, ["a", "b"], 0, HOUR_MS) == [
            [],
            [HistogramRow(tenant, "b", 0, b"r")],
        ]
    finally:
        await store.close()
        session.execute("DROP KEYSPACE IF EXISTS tsdb_hindex", timeout=120)
        cluster.shutdown()


def test_url_options():
    options = parse_url(
        "cassandra://me:s%40cret@a:9142,b,[::1]:9043/ks?replication=dc1:3,dc2:2&consistency=quorum&read_consistency=one"
        "&local_dc=dc1&tls=true&request_timeout=3s&max_inflight=64",
        Layout(),
    )
    assert options.hosts == [("a", 9142), ("b", 9042), ("::1", 9043)]
    assert options.schema.keyspace == "ks" and options.schema.replication == (("dc1", 3), ("dc2", 2))
    assert (options.username, options.password, options.local_dc, options.tls) == ("me", "s@cret", "dc1", True)
    assert options.request_timeout_s == 3 and options.max_inflight == 64
    assert options.read_consistency == 1 and options.write_consistency == 4
    for bad in (
        "cassandra:///ks",
        "cassandra://h/ks?consistency=most",
        "cassandra://h/ks?replication=simple:0",
        "cassandra://h/ks?color=red",
        "cassandra://h/1ks",
    ):
        with pytest.raises(ValueError):
            parse_url(bad, Layout())


def test_gateway_writes_land_in_the_documented_tables(
    start_gateway, cassandra_server, cassandra_url, redis_server, tenant
):
    gateway = start_gateway("--store", cassandra_url, "--redis", redis_server.url)
    t0 = int(time.time()) - 60
    body = {"tenant": tenant, "metricName": "cpu_idle", "tags": {"host": "h-1", "os": "linux"}, "ts": t0, "value": 42.5}
    assert gateway.post("/api/write/single", body).status == 200
    hash_ = series_set_hash(series_set_text("cpu_idle", {"host": "h-1", "os": "linux"}))
    cluster, session = cql_session(cassandra_server)
    try:
        session.set_keyspace("tsgate_test")
        assert [r.tenant for r in session.execute("SELECT tenant FROM tenants WHERE tenant = %s", [tenant])] == [tenant]
        assert [
            r.metric_name for r in session.execute("SELECT metric_name FROM metric_names WHERE tenant = %s", [tenant])
        ] == ["cpu_idle"]
        row = session.execute(
            "SELECT metric_name, tags FROM series_set_hashes WHERE tenant = %s AND series_set_hash = %s",
            [tenant, hash_],
        ).one()
        assert (row.metric_name, dict(row.tags)) == ("cpu_idle", {"host": "h-1", "os": "linux"})
        index = session.execute(
            "SELECT series_set_hash FROM series_sets WHERE tenant = %s AND metric_name = 'cpu_idle' AND tag_key = 'os' AND tag_value = 'linux'",
            [tenant],
        )
        assert [r.series_set_hash for r in index] == [hash_]
        head_slice = t0 * 1000 - t0 * 1000 % 60_000
        raw = session.execute(
            "SELECT ts, value, TTL(value) AS ttl FROM data_head WHERE tenant = %s AND slice = %s AND shard = %s AND series_set_hash = %s",
            [tenant, head_slice, head_shard(hash_), hash_],
        ).one()
        assert (raw.ts, raw.value) == (t0 * 1000, 42.5) and 0 < raw.ttl <= 7 * 3600 + 1
    finally:
        cluster.shutdown()


def test_redis_shares_the_metadata_cache_between_replicas(start_gateway, cassandra_url, redis_server, tenant):
    first = start_gateway("--store", cassandra_url, "--redis", redis_server.url)
    second = start_gateway("--store", cassandra_url, "--redis", redis_server.url)
    # mid-way through the last hour bucket: far from its last quarter, where ingest also indexes
    # a series in the next bucket ahead of time (which would count twice)
    hour_s = 3600
    mid_last_hour = (int(time.time()) // hour_s - 1) * hour_s + hour_s // 4
    batch = [{"metricName": "shared", "tags": {"i": str(i)}, "timestamp": mid_last_hour, "value": i} for i in range(20)]
    assert first.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
    assert second.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
    assert metric_value(first, "tsgate_series_metadata_writes_total") == 20
    assert metric_value(second, "tsgate_series_metadata_writes_total") == 0
    # the time index too: the second replica finds each series' bucket in Redis and writes nothing
    assert metric_value(first, "tsgate_index_bucket_series_total") == 20
    assert metric_value(second, "tsgate_index_bucket_series_total") == 0
    assert metric_value(second, 'tsgate_metadata_cache_lookups_total{level="redis",result="hit"}') == 20 + 20


def test_two_keyspaces_sharing_one_redis_keep_their_keys_apart(
    start_gateway, cassandra_server, cassandra_url, redis_server, tenant
):
    """Before Redis keys were namespaced, the second keyspace found the first one's "already
    indexed" marks, skipped its metadata writes, and answered [] for data it had accepted. Dropping
    and making a keyspace again gives it a new identity too."""
    other_url = cassandra_url.rsplit("/", 1)[0] + "/tsgate_test_other"
    cluster, session = cql_session(cassandra_server)
    try:
        session.execute("DROP KEYSPACE IF EXISTS tsgate_test_other")
        CassandraStore.from_url(other_url, Layout()).apply_schema()
        first_identity = (
            session.execute(
                "SELECT id FROM system_schema.tables WHERE keyspace_name = 'tsgate_test_other' AND table_name = 'series_set_hashes'"
            )
            .one()
            .id
        )
        batch = [{"metricName": "shared_redis", "tags": {"i": str(i)}, "value": i} for i in range(5)]
        for url in (cassandra_url, other_url):
            gateway = start_gateway("--store", url, "--redis", redis_server.url)
            assert gateway.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
            assert metric_value(gateway, "tsgate_series_metadata_writes_total") == 5
            answer = gateway.get(
                "/api/metadata/tagValues?metricName=shared_redis&tagKey=i", headers={"X-Tenant": tenant}
            )
            assert answer.json() == ["0", "1", "2", "3", "4"]
            gateway.stop()
        session.execute("DROP KEYSPACE tsgate_test_other")
        CassandraStore.from_url(other_url, Layout()).apply_schema()
        again = (
            session.execute(
                "SELECT id FROM system_schema.tables WHERE keyspace_name = 'tsgate_test_other' AND table_name = 'series_set_hashes'"
            )
            .one()
            .id
        )
        assert again != first_identity
        gateway = start_gateway("--store", other_url, "--redis", redis_server.url)
        assert gateway.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
        assert gateway.get("/api/metadata/metricNames", headers={"X-Tenant": tenant}).json() == ["shared_redis"]
        gateway.stop()
    finally:
        session.execute("DROP KEYSPACE IF EXISTS tsgate_test_other")
        cluster.shutdown()


def test_ingest_goes_on_when_redis_is_down(start_gateway, cassandra_url, tmp_path, tenant):
    from gateway.app.devservices.redis import RedisServer

    redis = RedisServer(tmp_path / "redis")
    redis.start()
    gateway = start_gateway("--store", cassandra_url, "--redis", redis.url)
    q = urllib.parse.urlencode({"tenant": tenant, "metricName": "resilient", "start": "5m-ago"})
    assert (
        gateway.post(
            "/api/write/single", {"tenant": tenant, "metricName": "resilient", "tags": {"n": "1"}, "value": 1}
        ).status
        == 200
    )
    redis.stop()
    assert (
        gateway.post(
            "/api/write/single", {"tenant": tenant, "metricName": "resilient", "tags": {"n": "2"}, "value": 2}
        ).status
        == 200
    )
    assert len(gateway.get("/api/query?" + q).json()) == 2
    assert metric_value(gateway, 'tsgate_redis_errors_total{operation="lookup"}') >= 1
    redis.start()
    wait_until_redis_is_used(gateway, tenant)
    assert (
        gateway.post(
            "/api/write/single", {"tenant": tenant, "metricName": "resilient", "tags": {"n": "3"}, "value": 3}
        ).status
        == 200
    )
    assert len(gateway.get("/api/query?" + q).json()) == 3
    redis.stop()


def test_cassandra_outage_answers_503_and_loses_nothing_acknowledged(
    start_gateway, cassandra_server, cassandra_url, tenant
):
    """Stop Cassandra mid-run: writes get 503 (not acknowledged); after a restart, writing
    resumes without restarting the gateway and every acknowledged sample is readable."""
    gateway = start_gateway("--store", cassandra_url + "?request_timeout=2s")
    acknowledged = []
    t0 = int(time.time()) - 600

    def write(i: int) -> int:
        body = {"tenant": tenant, "metricName": "outage", "tags": {"phase": str(i // 10)}, "ts": t0 + i, "value": i}
        status = gateway.post("/api/write/single", body, timeout=60).status
        if status == 200:
            acknowledged.append(i)
        return status

    for i in range(10):
        assert write(i) == 200
    cassandra_server.stop()
    statuses = {write(i) for i in range(10, 15)}
    assert statuses == {503}, statuses
    deadline = time.monotonic() + 40  # a ping that hangs rather than fails reads as slow (200) for 30 s
    while gateway.get("/healthz").status != 503:
        assert time.monotonic() < deadline, gateway.log()
        time.sleep(0.5)
    cassandra_server.start()
    deadline = time.monotonic() + 120
    i = 15
    while time.monotonic() < deadline and write(i) != 200:
        i += 1
        time.sleep(1)
    for j in range(i + 1, i + 10):
        assert write(j) == 200
    assert gateway.get("/healthz").status == 200
    q = urllib.parse.urlencode({"tenant": tenant, "metricName": "outage", "start": t0 - 1, "end": t0 + 1000})
    # the query executors hold sessions of their own, which reconnect on the driver's schedule
    deadline = time.monotonic() + 60
    while (answer := gateway.get("/api/query?" + q)).status != 200:
        assert answer.status == 503 and time.monotonic() < deadline, (answer.status, answer.body[:300])
        time.sleep(1)
    stored = sorted(int(v) for series in answer.json() for v in series["values"].values())
    assert set(acknowledged) <= set(stored)
    assert "Traceback" not in gateway.log()


class StallingProxy:
    """A TCP proxy to ``target`` that stalls on demand: while stalled it forwards nothing and
    keeps every connection open, so the requests sent through it are never answered (a store
    that hangs, as an overloaded or partitioned node does)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.flowing.set()
        self.listener.close()
        for each in self.sockets:
            each.close()


def test_healthz_answers_within_its_deadline_while_the_store_hangs(start_gateway, cassandra_server, cassandra_url):
    """Cassandra behind a proxy that stops forwarding: /healthz answers within its deadline
    (HEALTHZ_DEADLINE_S, 0.5 s; 3 s allowed for a loaded box) saying the store is slow, where it
    waited on the ping (503 after 15 s under heavy ingest); once the store answers again, ok."""
    proxy = StallingProxy((cassandra_server.host, cassandra_server.port))
    keyspace = cassandra_url.rsplit("/", 1)[1]
    try:
        gateway = start_gateway("--store", f"cassandra://127.0.0.1:{proxy.port}/{keyspace}?request_timeout=60s")
        assert gateway.get("/healthz").json() == {"status": "ok"}
        proxy.flowing.clear()
        for _ in range(5):
            started = time.monotonic()
            answer = gateway.get("/healthz", timeout=10)
            assert time.monotonic() - started < 3
            assert answer.status == 200 and answer.json()["store"] == "slow", answer.body
        assert answer.json()["waiting_s"] >= 2.0  # the same ping, still out
        proxy.flowing.set()
        deadline = time.monotonic() + 30
        while gateway.get("/healthz").json() != {"status": "ok"}:
            assert time.monotonic() < deadline, gateway.log()
            time.sleep(0.2)
        assert "Traceback" not in gateway.log()
    finally:
        proxy.close()


def test_serve_on_a_missing_keyspace_says_how_to_create_it(cassandra_server):
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/no_such_keyspace"
    result = tsgate("serve", "--http", "127.0.0.1:0", "--graphite", "", "--pickle", "", "--store", url)
    assert result.returncode == 1 and "tsgate schema apply" in result.stderr


@pytest_twisted.ensureDeferred
async def test_ttl_expires_raw_and_roll_up_rows(cassandra_server, tenant):
    """Writes carry each table's TTL (exemplars and histograms too): with 2 s retentions, rows are gone 3.5 s later."""
    layout = Layout(
        HOUR_MS, 2000, parse_granularities("5m:2s", HOUR_MS), head_retention_ms=2000, exemplar_retention_ms=2000
    )
    store = CassandraStore.from_url(f"cassandra://{cassandra_server.host}:{cassandra_server.port}/tsgate_ttl", layout)
    await threads.deferToThread(store.apply_schema)
    await store.start()
    try:
        five = layout.granularity("5m")
        await store.write_raw([RawPoint(tenant, "h", 1000, 1.0)])
        await store.write_rollups(five, [Rollup(tenant, "h", 0, 1.0, 1.0, 1.0, 1)])
        await store.write_block(tenant, "h", 0, encode_block(np.array([1000]), np.array([1.0])), samples.empty(), 0)
        assert (await read_head(store, tenant, "h", 0, 2000)).points() == [(1000, 1.0)]
        assert len(await read_blocks(store, tenant, "h", 0, 2000)) == 1
        await store.write_exemplars([ExemplarRow(tenant, "h", 1000, 1.0, {"trace_id": "x"})])
        assert len((await store.read_exemplars(tenant, ["h"], 0, 2000))[0]) == 1
        await store.write_histograms([HistogramRow(tenant, "h", 1000, b"\x08\x00")])
        assert len((await store.read_histograms(tenant, ["h"], 0, 2000))[0]) == 1
        await task.deferLater(reactor, 3.5, lambda: None)
        assert await store.read_exemplars(tenant, ["h"], 0, 2000) == [[]]
        assert await store.read_histograms(tenant, ["h"], 0, 2000) == [[]]
        assert (await read_head(store, tenant, "h", 0, 2000)).points() == []
        assert await read_blocks(store, tenant, "h", 0, 2000) == []
        assert await store.read_rollups(five, tenant, "h", 0, 2000) == []
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_sealed_head_rows_are_not_read_again(cassandra_url, tenant):
    """After a seal, read_head skips the slot's head rows (they are in the block) until a write
    lands in the slot again; then it reads the slot's head rows, the new one included."""
    store = CassandraStore.from_url(cassandra_url, Layout(settle_delay_ms=0))
    await store.start()
    try:
        await store.write_raw([RawPoint(tenant, "sealed", ts, 1.0) for ts in (10, 20, HOUR_MS + 10)])
        head = await read_head(store, tenant, "sealed", 0, HOUR_MS - 1)
        await store.write_block(
            tenant, "sealed", 0, encode_block(head.timestamps, head.values), head, int(time.time() * 1000) + 1
        )
        assert (await read_head(store, tenant, "sealed", 0, 2 * HOUR_MS)).points() == [(HOUR_MS + 10, 1.0)]
        await task.deferLater(reactor, 0.01, lambda: None)
        await store.write_raw([RawPoint(tenant, "sealed", 30, 3.0)])
        assert (await read_head(store, tenant, "sealed", 0, HOUR_MS - 1)).points() == [(10, 1.0), (20, 1.0), (30, 3.0)]
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_writes_and_paged_reads_through_a_tight_request_bound(cassandra_url, tenant):
    """max_inflight=2: thousands of rows (batched by replica), series with 40 KiB of tag values
    (batches split by size under Cassandra's 50 KiB limit), and a read of 12,000 points (three
    driver pages) all complete, and every row comes back."""
    store = CassandraStore.from_url(f"{cassandra_url}?max_inflight=2", Layout())
    await store.start()
    try:
        points = [RawPoint(tenant, f"h{i % 300}", 1000 * (i // 300), float(i)) for i in range(6000)]
        points += [RawPoint(tenant, "long", t * 100, float(t)) for t in range(12_000)]
        await store.write_raw(points)
        wide = {f"k{k}": "v" * 2000 for k in range(20)}
        series = [
            SeriesKey(tenant, series_set_hash(series_set_text(f"wide{i}", wide)), f"wide{i}", wide) for i in range(5)
        ]
        await store.write_series(series)
        reads = await defer.gatherResults(
            [defer.ensureDeferred(read_head(store, tenant, f"h{i}", 0, HOUR_MS)) for i in range(300)]
        )
        assert [len(found) for found in reads] == [20] * 300
        assert reads[7].points()[3] == (3000, 907.0)
        long = await read_head(store, tenant, "long", 0, HOUR_MS)
        assert long.points() == [(t * 100, float(t)) for t in range(12_000)]
        found = await store.get_series(tenant, [s.series_set_hash for s in series])
        assert {key: value.tags for key, value in found.items()} == {s.series_set_hash: wide for s in series}
    finally:
        await store.close()


def index_legacy_series(session, ks: str, tenant: str, hash_: str) -> None:
    """The index rows of legacy_temp{room="a"}, written by raw CQL as an older gateway did."""
    session.execute(f"INSERT INTO {ks}.tenants (tenant) VALUES (%s)", [tenant])
    session.execute(f"INSERT INTO {ks}.metric_names (tenant, metric_name) VALUES (%s, 'legacy_temp')", [tenant])
    session.execute(
        f"INSERT INTO {ks}.series_set_hashes (tenant, series_set_hash, metric_name, tags) VALUES (%s, %s, 'legacy_temp', {{'room': 'a'}})",
        [tenant, hash_],
    )
    for key, value in (("__name__", "legacy_temp"), ("room", "a")):
        session.execute(
            f"INSERT INTO {ks}.series_sets (tenant, metric_name, tag_key, tag_value, series_set_hash) VALUES (%s, 'legacy_temp', %s, %s, %s)",
            [tenant, key, value, hash_],
        )


@pytest_twisted.ensureDeferred
async def test_finished_requests_leave_no_cyclic_garbage(cassandra_url, tenant):
    """A finished write or read leaves its driver futures (and their statement values) to
    reference counting: none waits in a reference cycle for the collector's full pass, which a
    raised collector threshold makes rarer (docs/performance-log.rst). The futures of the store's
    prepares (once a statement, at start) are not requests: the driver may still hold the last of
    them when the collector first runs here (CI once found the one of request 80 of about 80)."""
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    try:
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        await store.write_raw([RawPoint(tenant, f"h{i % 300}", 1000 * (i // 300), float(i)) for i in range(3000)])
        assert len(await read_head(store, tenant, "h7", 0, HOUR_MS)) == 10
        gc.collect()
        futures = [
            found
            for found in gc.garbage
            if isinstance(found, ResponseFuture) and not isinstance(found.message, PrepareMessage)
        ]
        assert futures == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        await store.close()
