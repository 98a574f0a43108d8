"""Per-tenant overrides (gateway/core/overrides.py): parsing and validation, reload with the last good
file kept, the limits and retentions each tenant gets, and the SQLite sweep by tenant."""

import logging
import os
import subprocess
import sys

import pytest
import pytest_twisted
from prometheus_client import REGISTRY

from gateway.app.cli import build_parser
from gateway.app.components import Components
from gateway.app.config import TENANT_VALUES, build_config
from gateway.core.layout import DAY_MS, HOUR_MS, Layout
from gateway.core.model import Sample, SeriesKey
from gateway.core.overrides import Overrides, OverridesError, parse_overrides
from gateway.ingest.limits import RateLimited, TenantLimits
from gateway.store.contract import RawPoint, Rollup
from gateway.store.read_path import ReadPath
from gateway.store.sqlite import SQLiteStore
from tests.conftest import read_head
from tests.gatewayproc import REPO, run_tsgate

pytestmark = pytest.mark.fast

GOOD = """
[tenants.small]
tenant-max-active-series = 2
max-points-per-query = 50
raw-retention = "2d"
rollup-retention = { 5m = "3d" }

[tenants."team-b"]
query-max-samples = 1000
"""


def config_of(*flags: str):
    return build_config(build_parser().parse_args(["serve", *flags]))


def overrides_on(path, *flags: str, clock=lambda: 1_700_000_000.0) -> Overrides:
    overrides = Overrides(config_of("--overrides", str(path), *flags), clock=clock)
    overrides.load()
    return overrides


def test_a_tenant_section_overrides_some_keys_and_the_flags_give_the_rest(tmp_path):
    path = tmp_path / "overrides.toml"
    path.write_text(GOOD)
    overrides = overrides_on(path, "--tenant-max-active-series", "100", "--raw-retention", "5d")
    small = overrides.for_tenant("small")
    assert (small["tenant-max-active-series"], small["max-points-per-query"]) == (2, 50)
    assert small["raw-retention"] == 2 * DAY_MS
    assert small["rollup-retention"] == {"5m": 3 * DAY_MS, "1h": 365 * DAY_MS}
    assert small["max-series-per-query"] == 10_000  # the flag's default
    other = overrides.for_tenant("anyone")
    assert (other["tenant-max-active-series"], other["raw-retention"]) == (100, 5 * DAY_MS)
    assert overrides.for_tenant("team-b")["tenant-max-active-series"] == 100
    limit = overrides.limit("max-points-per-query")
    assert (limit("small"), limit("team-b")) == (50, 10_000_000)
    assert limit.setting("small") == "max-points-per-query of tenant 'small' in --overrides"
    assert limit.setting("team-b") == "--max-points-per-query"
    layout = overrides.retentions.for_tenant("small")
    assert (layout.raw_retention_ms, layout.granularity("5m").retention_ms) == (2 * DAY_MS, 3 * DAY_MS)
    assert overrides.retentions.for_tenant("team-b") is overrides.layout  # sets no retention
    shown = overrides.shown()
    assert shown["tenants"]["small"]["raw-retention"] == "2d"
    assert shown["defaults"]["raw-retention"] == "5d"
    assert shown["overridden"] == {
        "small": ["max-points-per-query", "raw-retention", "rollup-retention", "tenant-max-active-series"],
        "team-b": ["query-max-samples"],
    }
    assert shown["loaded_at"] == 1_700_000_000.0


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "[tenants.a]\nmax-points-per-quer = 5\n",
            "tenant 'a': unknown key 'max-points-per-quer' (did you mean max-points-per-query?)",
        ),
        ('[tenants.a]\nmax-points-per-query = "5"\n', "tenant 'a': max-points-per-query = '5' is not a whole number"),
        ("[tenants.a]\nmax-points-per-query = 2.5\n", "tenant 'a': max-points-per-query = 2.5 is not a whole number"),
        (
            "[tenants.a]\ntenant-max-active-series = true\n",
            "tenant 'a': tenant-max-active-series = True is not a whole number",
        ),
        ("[tenants.a]\ntenant-max-active-series = -1\n", "tenant 'a': tenant-max-active-series = -1 must be 0 or more"),
        ("[tenants.a]\nmax-series-per-query = 0\n", "tenant 'a': max-series-per-query = 0 must be 1 or more"),
        ('[tenants.a]\nraw-retention = "5x"\n', "tenant 'a': raw-retention: '5x' is not a duration"),
        ("[tenants.a]\nraw-retention = 7\n", "tenant 'a': raw-retention = 7 is not a duration string"),
        ('[tenants.a]\nraw-retention = "0s"\n', "tenant 'a': raw-retention = '0s' must be longer than 0s"),
        ('[tenants.a]\nraw-retention = "400d"\n', "longer than the longest retention of the flags (31536000 s)"),
        (
            '[tenants.a]\nrollup-retention = { 10m = "1d" }\n',
            "tenant 'a': rollup-retention: '10m' is not one of --granularities (5m, 1h)",
        ),
        ('[tenants.a]\nrollup-retention = "1d"\n', "tenant 'a': rollup-retention must be a table"),
        ('[tenants.a]\nhead-retention = "1h"\n', "tenant 'a': unknown key 'head-retention'"),
        ('[tenants."a|b"]\nquery-max-samples = 5\n', "tenant 'a|b': "),
        ("[tenant.a]\nquery-max-samples = 5\n", "unknown top-level key 'tenant'"),
        ("[tenants.a\n", "not TOML"),
        ("", "no [tenants] table: an empty file (one being rewritten, say) would drop every tenant's values"),
        ("# every tenant removed\n", "write `tenants = {}` to give no tenant values of its own"),
    ],
)
def test_bad_files_are_refused_naming_the_tenant_the_key_and_why(text, problem):
    with pytest.raises(OverridesError) as refused:
        parse_overrides(text, Layout(), TENANT_VALUES)
    assert problem in str(refused.value)


@pytest.mark.parametrize("text", ["tenants = {}\n", "[tenants]\n"])
def test_an_explicit_empty_tenants_table_gives_no_tenant_its_own_values(text):
    assert parse_overrides(text, Layout(), TENANT_VALUES) == {}


def reload_failures() -> float:
    return REGISTRY.get_sample_value("tsgate_overrides_reload_failures_total") or 0.0


def test_a_bad_reload_keeps_the_last_good_file_logs_why_and_counts(tmp_path, caplog):
    path = tmp_path / "overrides.toml"
    path.write_text(GOOD)
    now = [1000.0]
    overrides = overrides_on(path, clock=lambda: now[0])
    failures = reload_failures()
    now[0] = 2000.0
    path.write_text("[tenants.small]\ntenant-max-active-series = -5\n")
    with caplog.at_level(logging.ERROR, logger="gateway.core.overrides"):
        assert not overrides.reload("SIGHUP")
    assert overrides.for_tenant("small")["tenant-max-active-series"] == 2
    assert overrides.loaded_at == 1000.0
    assert reload_failures() == failures + 1
    assert REGISTRY.get_sample_value("tsgate_overrides_last_reload_success_timestamp_seconds") == 1000.0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "refused (SIGHUP), keeping the last good one" in line
    assert "tenant 'small': tenant-max-active-series = -5 must be 0 or more" in line
    assert not overrides.changed()  # a refused file is not read again until it changes
    path.write_text("[tenants.small]\ntenant-max-active-series = 7\n")
    assert overrides.reload("file changed")
    assert overrides.for_tenant("small")["tenant-max-active-series"] == 7
    assert overrides.for_tenant("small")["raw-retention"] == 7 * DAY_MS  # no longer overridden
    assert overrides.retentions.by_tenant == {}
    assert overrides.loaded_at == 2000.0


def test_a_changed_file_is_seen_by_its_modification_time(tmp_path):
    path = tmp_path / "overrides.toml"
    path.write_text(GOOD)
    overrides = overrides_on(path)
    assert not overrides.changed()
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert overrides.changed()
    overrides.reload("file changed")
    assert not overrides.changed()
    path.unlink()
    assert overrides.changed()
    assert not overrides.reload("file changed")  # a missing file is refused too
    assert overrides.for_tenant("small")["max-points-per-query"] == 50


def test_a_missing_or_bad_file_at_start_up_stops_the_start(tmp_path):
    with pytest.raises(ValueError, match=r"--overrides .*missing.toml: cannot read it"):
        config_of("--overrides", str(tmp_path / "missing.toml"))
    (tmp_path / "bad.toml").write_text("[tenants.a]\nfoo = 1\n")
    with pytest.raises(ValueError, match=r"--overrides .*bad.toml: tenant 'a': unknown key 'foo'"):
        config_of("--overrides", str(tmp_path / "bad.toml"))
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(ValueError, match=r"--overrides .*empty.toml: no \[tenants\] table"):
        config_of("--overrides", str(tmp_path / "empty.toml"))


def test_ingest_limits_follow_each_tenant_and_a_reload(tmp_path):
    path = tmp_path / "overrides.toml"
    path.write_text("[tenants.small]\ntenant-max-active-series = 2\ntenant-max-samples-per-second = 10\n")
    overrides = overrides_on(path)
    now = [0.0]
    limits = TenantLimits(
        overrides.limit("tenant-max-samples-per-second"),
        overrides.limit("tenant-max-active-series"),
        burst_seconds=1,
        clock=lambda: now[0],
    )
    assert limits.enabled
    batch = {"small": {"a": 1, "b": 1, "c": 1}, "big": {f"s{i}": 1 for i in range(100)}}
    assert limits.admit(batch) == {"small": {"c"}}
    with pytest.raises(RateLimited) as limited:
        limits.admit({"small": {"a": 20}})
    assert str(limited.value) == (
        "tenant 'small' is over its limit of 10 samples/s (tenant-max-samples-per-second of tenant 'small' in --overrides)"
    )
    path.write_text("[tenants.small]\ntenant-max-active-series = 3\n")
    overrides.reload()
    now[0] = 1.0
    assert limits.admit({"small": {"c": 1000, "d": 1}}) == {"small": {"d"}}  # no rate limit any more
    path.write_text("tenants = {}\n")
    overrides.reload()
    assert not limits.enabled


@pytest_twisted.ensureDeferred
async def test_the_sqlite_sweep_applies_each_tenants_retention(tmp_path):
    """On a fake clock: the tenant with raw-retention 2h and a 5m roll-up retention of 3h loses
    its older head rows and roll-ups; the other tenant keeps them (the flags' 1d)."""
    config = tmp_path / "overrides.toml"
    config.write_text('[tenants.short]\nraw-retention = "2h"\nrollup-retention = { 5m = "3h" }\n')
    overrides = overrides_on(config, "--raw-retention", "1d", "--granularities", "5m:1d,1h:2d")
    store = SQLiteStore(tmp_path / "sweep.db", overrides.layout)
    store.retentions = overrides.retentions
    await store.start()
    try:
        fine = store.layout.granularity("5m")
        for tenant in ("short", "long"):
            await store.write_raw([RawPoint(tenant, "h", t, 1.0) for t in (HOUR_MS, 5 * HOUR_MS, 9 * HOUR_MS)])
            await store.write_rollups(fine, [Rollup(tenant, "h", t, sum=1.0, count=1) for t in (HOUR_MS, 8 * HOUR_MS)])
        await store.sweep(10 * HOUR_MS)
        for tenant, raw, rollups in (("short", [9], [8]), ("long", [1, 5, 9], [1, 8])):
            head = await read_head(store, tenant, "h", 0, 10 * HOUR_MS)
            assert [int(t) // HOUR_MS for t in head.timestamps] == raw
            found = await store.read_rollups(fine, tenant, "h", 0, 10 * HOUR_MS)
            assert [row.timestamp_ms // HOUR_MS for row in found] == rollups
    finally:
        await store.close()


def test_overrides_check_validates_a_file_without_a_server(tmp_path):
    path = tmp_path / "overrides.toml"
    path.write_text(GOOD)
    out = run_tsgate("overrides", "check", str(path), "--max-points-per-query", "1000")
    assert '"max-points-per-query": 50' in out and '"max-points-per-query": 1000' in out
    path.write_text('[tenants.small]\nraw-retention = "forever"\n')
    refused = subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", "overrides", "check", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1
    assert "tenant 'small': raw-retention: 'forever' is not a duration" in refused.stderr


@pytest_twisted.ensureDeferred
async def test_tsgate_delete_selects_under_each_tenants_own_max_series_per_query(tmp_path):
    """``tsgate delete`` plans with the one planner of gateway.app.components: a tenant's own
    max-series-per-query, not only the flag's."""
    path = tmp_path / "overrides.toml"
    path.write_text("[tenants.roomy]\nmax-series-per-query = 10\n")
    flags = ["--data-dir", str(tmp_path / "data"), "--max-series-per-query", "1", "--overrides", str(path)]
    components = Components(config_of(*flags))
    pipeline = components.get("pipeline")
    await components.start_store()
    try:
        for tenant in ("roomy", "plain"):
            samples = [Sample(tenant, "up", {"job": job}, pipeline.clock() - 60_000, 1.0) for job in "abc"]
            assert not (await pipeline.ingest("prometheus", samples)).rejected
    finally:
        await components.get("store").close()
    delete = ["delete", *flags, "--match", "up", "--dry-run"]
    out = run_tsgate(*delete, "--tenant", "roomy")
    assert out.splitlines()[-1].startswith("dry run: would delete 3 samples and 0 histograms of 3 series"), out
    refused = subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", *delete, "--tenant", "plain"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1 and "--max-series-per-query" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr


@pytest_twisted.ensureDeferred
async def test_the_read_path_switches_to_roll_ups_at_each_tenants_raw_retention(sqlite_store, tmp_path):
    """A tenant with raw-retention 2h reads a roll-up 3 h back, where the others (7d) read raw."""
    config = tmp_path / "overrides.toml"
    config.write_text('[tenants.short]\nraw-retention = "2h"\n')
    sqlite_store.retentions = overrides_on(config).retentions
    now = 100 * HOUR_MS
    reader = ReadPath(sqlite_store, clock=lambda: now)
    fine = sqlite_store.layout.granularity("5m")
    for tenant in ("short", "long"):
        await sqlite_store.write_raw(
            [RawPoint(tenant, "h", now - 3 * HOUR_MS, 1.0), RawPoint(tenant, "h", now - HOUR_MS, 2.0)]
        )
        await sqlite_store.write_rollups(fine, [Rollup(tenant, "h", now - 3 * HOUR_MS, sum=5.0, count=1)])
    assert reader.rollup_for(now - 3 * HOUR_MS, "short") == fine
    assert reader.rollup_for(now - 3 * HOUR_MS, "long") is None
    for tenant, first, aggregate in (("short", 5.0, "avg"), ("long", 1.0, None)):
        (found,) = await reader.read([SeriesKey(tenant, "h", "m", {})], now - 4 * HOUR_MS, now)
        assert (found.samples.values.tolist(), found.aggregate) == ([first, 2.0], aggregate)
