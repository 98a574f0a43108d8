"""``tsgate schema expire-old-index`` (gateway/store/cassandra_old_index.py) on a real Cassandra:
all-time index rows written without a TTL, as a gateway older than the time index wrote them,
get their tenant's TTL; a stopped run continues; with a tiny retention they expire."""

import uuid

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gateway.app.cli import main
from gateway.core.layout import DAY_MS, Layout
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.store.cassandra import CassandraStore
from gateway.store.cassandra_old_index import ALL_TIME_TABLES, TOKEN_RANGES, OldIndexExpiry
from gateway.store.contract import CreatedTimestamp, MetricMetadata, Store
from gateway.store.index import ALL_TIME_MARGIN_MS

RANGES = len(ALL_TIME_TABLES) * TOKEN_RANGES


def key(tenant: str, metric: str, tags: dict[str, str]) -> SeriesKey:
    return SeriesKey(tenant, series_set_hash(series_set_text(metric, tags)), metric, tags)


@pytest.fixture(scope="module")
def url(cassandra_url):
    """A keyspace of the module's own (the step walks whole tables), dropped after it."""
    url = cassandra_url.rsplit("/", 1)[0] + f"/expire_{uuid.uuid4().hex[:8]}"
    store = CassandraStore.from_url(url, Layout())
    store.apply_schema()
    yield url
    session = store._connect(None)
    session.execute(f"DROP KEYSPACE {store.keyspace}", timeout=120)
    store.cluster.shutdown()


@pytest_twisted.async_yield_fixture
async def store(url):
    driver = CassandraStore.from_url(url, Layout())
    await driver.start()
    yield driver
    await driver.close()


async def write_as_before_the_upgrade(store, monkeypatch, tenant: str) -> list[SeriesKey]:
    """Every all-time table written by the store's own statements with ``USING TTL 0``: in CQL a
    TTL of 0 is no TTL, what a gateway older than the time index wrote."""
    series = [
        key(tenant, "http_requests_total", {"job": "api", "pod": "p1"}),
        key(tenant, "http_requests_total", {"job": "api", "pod": "p2"}),
        key(tenant, "servers.a.cpu", {}),
    ]
    with monkeypatch.context() as patch:
        patch.setattr(store, "_all_time_ttl_s", lambda tenant: 0)
        await store.write_series(series)
        await store.add_metric_aggregators(tenant, "servers.a.cpu", ["sum"])
        await store.write_metric_metadata([MetricMetadata(tenant, "http_requests_total", "counter", "Requests.", "")])
        await store.write_created_timestamps([CreatedTimestamp(tenant, series[0].series_set_hash, 1_700_000_000_000)])
    return series


async def ttls(store, tenant: str, hashes: list[str]) -> list:
    ks = store.keyspace
    rows = []
    for hash_ in hashes:
        rows += await store._execute(
            f"SELECT TTL(metric_name) AS ttl FROM {ks}.series_set_hashes WHERE tenant = %s AND series_set_hash = %s",
            (tenant, hash_),
        )
    rows += await store._execute(
        f"SELECT TTL(is_leaf) AS ttl FROM {ks}.graphite_paths WHERE tenant = %s AND parent = 'servers.a'", (tenant,)
    )
    rows += await store._execute(
        f"SELECT TTL(type) AS ttl FROM {ks}.metric_metadata WHERE tenant = %s AND metric_name = 'http_requests_total'",
        (tenant,),
    )
    return [row.ttl for row in rows]


def run(capsys, url: str, *flags: str) -> str:
    assert main(["schema", "expire-old-index", "--store", url, *flags]) == 0
    return capsys.readouterr().out


@pytest_twisted.ensureDeferred
async def test_old_rows_get_their_tenants_ttl_and_a_stopped_run_continues(
    store, url, tenant, monkeypatch, capsys, tmp_path
):
    short = f"{tenant}-short"
    overrides = tmp_path / "overrides.toml"
    overrides.write_text(f'[tenants."{short}"]\nrollup-retention = {{ 1h = "30d" }}\n')
    series = {t: await write_as_before_the_upgrade(store, monkeypatch, t) for t in (tenant, short)}
    hashes = {t: [s.series_set_hash for s in keys] for t, keys in series.items()}
    assert await ttls(store, tenant, hashes[tenant]) == [None] * 5
    names_before = await store.get_series(tenant, hashes[tenant])

    out = run(capsys, url, "--overrides", str(overrides), "--restart", "--max-ranges", "5")
    assert "tenants: 5 of 256 token ranges" in out and "stopped before the end" in out
    assert f"5 token ranges walked (5 of {RANGES} done)" in out
    out = run(capsys, url, "--overrides", str(overrides))
    assert "tenants: 5 of 256 token ranges done by an earlier run" in out
    assert f"{RANGES - 5} token ranges walked ({RANGES} of {RANGES} done)" in out
    assert "every all-time index row has a TTL" in out

    for t, longest_ms in ((tenant, Layout().longest_retention_ms), (short, 30 * DAY_MS)):
        expected_s = (longest_ms + ALL_TIME_MARGIN_MS) // 1000
        assert all(expected_s - 600 <= ttl <= expected_s for ttl in await ttls(store, t, hashes[t])), t
    # the rows say what they said before
    assert await store.get_series(tenant, hashes[tenant]) == names_before
    assert await store.list_tag_values(tenant, "http_requests_total", "pod") == ["p1", "p2"]
    assert [node.name for node in await store.list_path_children(tenant, "servers.a")] == ["cpu"]
    assert await store.get_created_timestamps(tenant, hashes[tenant][:1]) == {hashes[tenant][0]: 1_700_000_000_000}
    metadata = await store.get_metric_metadata(tenant, "http_requests_total")
    assert (metadata.type, metadata.help) == ("counter", "Requests.")
    rows = await store._execute(
        f"SELECT aggregators FROM {store.keyspace}.metric_names WHERE tenant = %s AND metric_name = 'servers.a.cpu'",
        (tenant,),
    )
    assert rows[0].aggregators == {"sum"}

    out = run(capsys, url)  # done: nothing left to walk
    assert "0 token ranges walked" in out and "every all-time index row has a TTL" in out


@pytest_twisted.ensureDeferred
async def test_with_a_tiny_retention_the_old_rows_expire(store, url, tenant, monkeypatch, capsys):
    """The TTL is the longest retention and ALL_TIME_MARGIN_MS: a margin shortened so that it is 1 s."""
    dead = await write_as_before_the_upgrade(store, monkeypatch, tenant)
    monkeypatch.setattr(Store, "all_time_margin_ms", 1000 - Layout().longest_retention_ms)
    run(capsys, url, "--restart")
    await deferLater(reactor, 1.5, lambda: None)  # a TTL of 1 s has passed

    assert await store.list_metric_names(tenant) == []
    assert await store.find_series(tenant, "http_requests_total", "job", "api") == set()
    assert await store.list_tag_keys(tenant, "http_requests_total") == []
    assert await store.list_tag_values(tenant, "http_requests_total", "pod") == []
    assert await store.list_tenant_tag_keys(tenant) == []
    assert await store.list_tenant_tag_values(tenant, "job") == []
    assert await store.find_metrics_by_tag(tenant, "job", "api") == []
    assert await store.list_path_children(tenant, "") == []
    assert await store.get_series(tenant, [s.series_set_hash for s in dead]) == {}
    assert await store.get_metric_metadata(tenant, "http_requests_total") is None
    assert tenant not in await store.list_tenants()


@pytest_twisted.ensureDeferred
async def test_a_series_deleted_while_the_step_runs_stays_deleted(store, url, tenant, monkeypatch, capsys):
    """The rewrites carry the run's start as their write time: a gateway's delete between the
    step's read of a row and its rewrite (later) wins, and the series does not come back."""
    kept, gone, graphite = await write_as_before_the_upgrade(store, monkeypatch, tenant)
    send, deleted = OldIndexExpiry._send, []

    def delete_then_send(self, requests):
        if not deleted and any(
            "series_set_hashes" in statement.query_string and parameters[1] == gone.series_set_hash
            for statement, parameters in requests
        ):
            self.session.execute(
                f"DELETE FROM {self.keyspace}.series_set_hashes WHERE tenant = %s AND series_set_hash = %s",
                (tenant, gone.series_set_hash),
            )
            deleted.append(gone)
        return send(self, requests)

    monkeypatch.setattr(OldIndexExpiry, "_send", delete_then_send)
    run(capsys, url, "--restart")
    assert deleted == [gone]
    found = await store.get_series(tenant, [s.series_set_hash for s in (kept, gone, graphite)])
    assert sorted(found) == sorted([kept.series_set_hash, graphite.series_set_hash])


def test_the_flags_of_the_step_are_refused_elsewhere(capsys):
    assert main(["schema", "print", "--store", "cassandra://127.0.0.1/tsdb", "--max-ranges", "3"]) == 2
    assert "--max-ranges and --restart belong to `tsgate schema expire-old-index`" in capsys.readouterr().err
