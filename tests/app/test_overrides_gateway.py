"""Per-tenant overrides end to end: a gateway process (with its query executors) applies each
tenant's limits, takes a new file on SIGHUP or when it changes, keeps the last good one when the
new one is bad, and shows them at GET /api/v1/admin/overrides; on Cassandra, rows are written
with each tenant's retention as their TTL."""

import signal
import subprocess
import sys
import time
import urllib.parse

import pytest
import pytest_twisted

from gateway.core.layout import DAY_MS, HOUR_MS, Layout, Retentions, parse_granularities
from gateway.http.auth import hash_token
from gateway.store.cassandra import CassandraStore
from gateway.store.contract import ExemplarRow, HistogramRow, Rollup
from tests.gatewayproc import REPO, free_port, metric_value, tsgate_serve
from tests.store.test_cassandra import cql_session

ACTIVE_REFUSAL = (
    "a new series over the tenant's limit of {limit} active series"
    " (tenant-max-active-series of tenant '{tenant}' in --overrides)"
)
POINTS_REFUSAL = "over its budget of {limit} points (max-points-per-query of tenant '{tenant}' in --overrides)"


def limits_file(path, tenant: str, active: int, points) -> None:
    path.write_text(f'[tenants."{tenant}"]\ntenant-max-active-series = {active}\nmax-points-per-query = {points}\n')


def write(gateway, tenant: str, series: int, now: int):
    """Four samples a series (a minute apart) of ``series`` series of metric ``m``."""
    body = [
        {"tenant": tenant, "metricName": "m", "tags": {"s": str(i)}, "ts": now - 60 * k, "value": float(k)}
        for i in range(series)
        for k in range(4)
    ]
    return gateway.post("/api/write", body)


def query(gateway, tenant: str, now: int):
    arguments = {"tenant": tenant, "metricName": "m", "start": now - 600, "end": now}
    return gateway.get("/api/query?" + urllib.parse.urlencode(arguments))


def wait_for_log(gateway, text: str, timeout_s: float = 30, times: int = 1) -> None:
    deadline = time.monotonic() + timeout_s
    while gateway.log().count(text) < times:
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{gateway.log()}"
        time.sleep(0.2)


def test_each_tenant_gets_its_limits_and_a_new_file_applies_without_restart(start_gateway, tmp_path, tenant):
    small, big = f"{tenant}-small", f"{tenant}-big"
    path = tmp_path / "overrides.toml"
    limits_file(path, small, active=2, points=5)
    gateway = start_gateway("--overrides", str(path), "--query-executors", "2")
    now = int(time.time())

    refused = write(gateway, small, 3, now)
    assert refused.status == 400, refused.body
    errors = {e["error"] for e in refused.json()["rejected"]}
    assert errors == {ACTIVE_REFUSAL.format(limit=2, tenant=small)}
    assert len(refused.json()["rejected"]) == 4  # the third series' four samples; the others written
    assert write(gateway, big, 3, now).status == 200

    too_many = query(gateway, small, now)
    assert too_many.status == 422, too_many.body
    assert POINTS_REFUSAL.format(limit=5, tenant=small) in too_many.json()["error"]
    assert query(gateway, big, now).status == 200

    shown = gateway.get("/api/v1/admin/overrides").json()["data"]
    assert shown["tenants"][small]["max-points-per-query"] == 5
    assert shown["defaults"]["max-points-per-query"] == 10_000_000
    assert big not in shown["tenants"]

    # a new file and SIGHUP: the new limits, in the gateway and in its query executors
    limits_file(path, small, active=5, points=1000)
    gateway.process.send_signal(signal.SIGHUP)
    wait_for_log(gateway, "reloaded (SIGHUP)")
    assert write(gateway, small, 3, now).status == 200
    answer = query(gateway, small, now)
    assert answer.status == 200, answer.body
    assert len(answer.json()) == 3

    # a bad file: refused with one line naming the tenant and key, the last good values stay
    path.write_text(f'[tenants."{small}"]\nmax-points-per-query = -1\n')
    gateway.process.send_signal(signal.SIGHUP)
    wait_for_log(gateway, "refused (SIGHUP)")
    assert f"tenant '{small}': max-points-per-query = -1 must be 1 or more" in gateway.log()
    assert query(gateway, small, now).status == 200
    assert gateway.get("/api/v1/admin/overrides").json()["data"]["tenants"][small]["max-points-per-query"] == 1000
    assert metric_value(gateway, "tsgate_overrides_reload_failures_total") == 1

    # an empty file (as one is while it is rewritten) is refused too: nobody's values are dropped
    path.write_text("")
    gateway.process.send_signal(signal.SIGHUP)
    wait_for_log(gateway, "refused (SIGHUP)", times=2)
    assert "no [tenants] table: an empty file (one being rewritten, say) would drop" in gateway.log()
    assert gateway.get("/api/v1/admin/overrides").json()["data"]["tenants"][small]["max-points-per-query"] == 1000
    assert metric_value(gateway, "tsgate_overrides_reload_failures_total") == 2

    # a file changed without SIGHUP is picked up by the poll (every 5 s)
    limits_file(path, small, active=5, points=5)
    deadline = time.monotonic() + 30
    while query(gateway, small, now).status != 422:
        assert time.monotonic() < deadline, gateway.log()
        time.sleep(0.5)
    assert "reloaded (file changed)" in gateway.log()
    assert metric_value(gateway, "tsgate_overrides_last_reload_success_timestamp_seconds") > now - 5
    assert gateway.process.poll() is None


@pytest_twisted.ensureDeferred
async def test_cassandra_rows_are_written_with_their_tenants_retention_as_ttl(cassandra_server, cassandra_url, tenant):
    """TTL(...) of the rows written: each tenant's retentions, read back from the shared server."""
    layout = Layout(granularities=parse_granularities("5m:14d,1h:365d", HOUR_MS))
    short = f"{tenant}-short"
    store = CassandraStore.from_url(cassandra_url, layout)
    store.retentions = Retentions(layout)
    store.retentions.by_tenant = {
        short: Layout(
            raw_retention_ms=2 * DAY_MS,
            exemplar_retention_ms=1 * DAY_MS,
            granularities=parse_granularities("5m:3d,1h:30d", HOUR_MS),
        )
    }
    await store.start()
    now = int(time.time() * 1000)
    slot = now - now % HOUR_MS
    fine = layout.granularity("5m")
    try:
        for owner in (tenant, short):
            await store.write_block(owner, "h", slot, b"block", [], now)
            await store.write_rollups(fine, [Rollup(owner, "h", slot, sum=1.0, count=1)])
            await store.write_exemplars([ExemplarRow(owner, "h", now, 1.0, {"trace": "t"})])
            await store.write_histograms([HistogramRow(owner, "h", now, b"hist")])
            await store.write_histogram_rollups(fine, [HistogramRow(owner, "h", slot, b"hist")])
    finally:
        await store.close()
    cluster, session = cql_session(cassandra_server)
    block_partition = slot - slot % layout.block_partition_width_ms
    rollup_partition = slot - slot % fine.partition_width_ms
    try:
        session.set_keyspace("tsgate_test")
        statements = {
            "block": ("SELECT TTL(block) FROM data_blocks WHERE {key} AND block_partition = %s", block_partition),
            "rollup": ("SELECT TTL(sum) FROM data_5m WHERE {key} AND time_slot = %s", rollup_partition),
            "exemplar": ("SELECT TTL(value) FROM exemplars WHERE {key} AND time_slot = %s", slot),
            "histogram": ("SELECT TTL(data) FROM histograms WHERE {key} AND time_slot = %s", slot),
            "histogram roll-up": (
                "SELECT TTL(data) FROM histograms_5m WHERE {key} AND time_slot = %s",
                rollup_partition,
            ),
        }
        for owner, raw, exemplars, rollups in ((tenant, 7, 7, 14), (short, 2, 1, 3)):
            wanted = {
                "block": raw,
                "rollup": rollups,
                "exemplar": exemplars,
                "histogram": raw,
                "histogram roll-up": rollups,
            }
            for what, (text, partition) in statements.items():
                statement = text.format(key="tenant = %s AND series_set_hash = 'h'")
                found = session.execute(statement, [owner, partition]).one()[0]
                assert wanted[what] * 86_400 - 120 <= found <= wanted[what] * 86_400, (owner, what, found)
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_an_empty_file_stops_the_start_and_the_empty_marker_is_taken(tmp_path):
    """`tsgate serve` with an empty overrides file exits 2 naming it; `tenants = {}` is the way to
    say that no tenant has values of its own (`tsgate overrides check` says the same)."""
    path = tmp_path / "overrides.toml"
    path.write_text("# nobody\n")
    result, _ = tsgate_serve(tmp_path, "--http", f"127.0.0.1:{free_port()}", "--overrides", str(path))
    assert result.returncode == 2, result.stderr
    assert f"--overrides {path}: no [tenants] table" in result.stderr
    assert "write `tenants = {}` to give no tenant values of its own" in result.stderr
    check = subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", "overrides", "check", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 1 and "no [tenants] table" in check.stderr
    path.write_text("tenants = {}\n")
    assert (
        "ok, 0 tenants with their own values"
        in subprocess.run(
            [sys.executable, "-m", "gateway.app.cli", "overrides", "check", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stderr
    )


def test_with_an_auth_file_the_overrides_need_the_admin_role(start_gateway, tenant, tmp_path):
    lines = []
    for name, roles in (("reader", '["write", "read"]'), ("operator", '["admin"]')):
        lines += ["[[tokens]]", f'name = "{name}"', f'sha256 = "{hash_token(name + "-token")}"']
        lines += [f'tenant = "{tenant}"', f"roles = {roles}", ""]
    (tmp_path / "auth.toml").write_text("\n".join(lines))
    limits_file(tmp_path / "overrides.toml", tenant, active=2, points=5)
    gateway = start_gateway("--auth-file", str(tmp_path / "auth.toml"), "--overrides", str(tmp_path / "overrides.toml"))
    assert gateway.get("/api/v1/admin/overrides").status == 401
    assert gateway.get("/api/v1/admin/overrides", headers={"Authorization": "Bearer reader-token"}).status == 403
    shown = gateway.get("/api/v1/admin/overrides", headers={"Authorization": "Bearer operator-token"})
    assert shown.status == 200, shown.body
    assert shown.json()["data"]["overridden"] == {tenant: ["max-points-per-query", "tenant-max-active-series"]}


def test_sighup_to_the_supervisor_reloads_every_worker(start_gateway, tenant, tmp_path):
    path = tmp_path / "overrides.toml"
    limits_file(path, tenant, active=2, points=5)
    gateway = start_gateway("--workers", "2", "--overrides", str(path), "--query-executors", "1")
    deadline = time.monotonic() + 30
    while gateway.log().count(") ready") < 2:
        assert time.monotonic() < deadline, gateway.log()
        time.sleep(0.2)
    limits_file(path, tenant, active=3, points=5)
    gateway.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while gateway.log().count("reloaded (SIGHUP)") < 2:
        assert time.monotonic() < deadline, gateway.log()
        time.sleep(0.2)
    assert "[worker 0 pid" in gateway.log() and "died" not in gateway.log()
    assert gateway.process.poll() is None
