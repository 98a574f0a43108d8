"""The downsampler: roll-up arithmetic by hand, and `tsgate downsample --once` end to end on both
backends (SQLite with the pending table, Cassandra with Redis), late arrivals included."""

import math
import time
import urllib.parse

import pytest
import redis

from gateway.core.layout import HOUR_MS, Layout, parse_granularities
from gateway.core.samples import from_points
from gateway.downsample.aggregate import CUMULATIVE_COUNTER, DELTA_COUNTER, GAUGE, MAX_ONLY, roll_up, series_kind
from gateway.downsample.partitions import jump_hash, parse_partitions, partition_of
from gateway.store.contract import Rollup
from gateway.store.read_path import choose_granularity
from tests.gatewayproc import downsample_once, metric_value, wait_until_redis_is_used

MINUTE = 60_000


def test_jump_hash_spreads_and_moves_few_series():
    keys = [f"h{i}" for i in range(20_000)]
    assert {partition_of("t", k, 64) for k in keys} == set(range(64))
    moved = sum(partition_of("t", k, 64) != partition_of("t", k, 65) for k in keys)
    assert moved < 20_000 * 2 / 65
    assert jump_hash(0, 1) == 0 and all(0 <= jump_hash(k, 7) < 7 for k in range(1000))
    assert parse_partitions("0-3,9", 64) == [0, 1, 2, 3, 9]
    with pytest.raises(ValueError):
        parse_partitions("60-70", 64)


def test_granularities_must_fit_the_slot():
    assert [g.name for g in parse_granularities("1h:365d,5m:14d", HOUR_MS)] == ["5m", "1h"]
    for bad in ("7m:1d", "5m", "2h:1d", "5m:1d,7m:1d"):
        with pytest.raises(ValueError):
            parse_granularities(bad, HOUR_MS)


def test_series_kinds():
    assert series_kind("http_requests_total", None, ()) == CUMULATIVE_COUNTER
    assert series_kind("temperature", "counter", ()) == CUMULATIVE_COUNTER
    assert series_kind("disk_reads", None, ("reads",)) == DELTA_COUNTER
    assert series_kind("servers.a.latency.max", None, ()) == MAX_ONLY
    assert series_kind("cpu_idle", "gauge", ("reads",)) == GAUGE


def test_gauge_roll_up_at_every_granularity():
    layout = Layout()
    points = [(i * MINUTE, float(v)) for i, v in enumerate([5, 7, 9, 1, 3, 8, 2, 2, 2, 10])]
    rows = roll_up("t", "h", GAUGE, from_points(points + [(10 * MINUTE, float("nan"))]), None, layout.granularities)
    assert rows["5m"] == [Rollup("t", "h", 0, 1.0, 9.0, 25.0, 5), Rollup("t", "h", 5 * MINUTE, 2.0, 10.0, 24.0, 5)]
    assert rows["1h"] == [Rollup("t", "h", 0, 1.0, 10.0, 49.0, 10)]


def test_infinities_of_both_signs_sum_to_nan_instead_of_stopping_the_roll_up():
    layout = Layout()
    points = [(0, math.inf), (MINUTE, -math.inf), (2 * MINUTE, 1.0), (6 * MINUTE, math.inf)]
    rows = roll_up("t", "h", GAUGE, from_points(points), None, layout.granularities)
    first, second = rows["5m"]
    assert (first.min, first.max, math.isnan(first.sum), first.count) == (-math.inf, math.inf, True, 3)
    assert second.sum == math.inf
    assert math.isnan(rows["1h"][0].sum)
    delta = roll_up("t", "h", DELTA_COUNTER, from_points(points), None, layout.granularities)
    assert math.isnan(delta["5m"][0].sum)


def test_counter_increase_is_reset_aware():
    layout = Layout()
    points = [(i * MINUTE, float(v)) for i, v in enumerate([5, 7, 9, 1, 3, 8, 2, 2, 2, 10])]
    rows = roll_up("t", "h", CUMULATIVE_COUNTER, from_points(points), 4.0, layout.granularities)
    assert [(r.last, r.increase) for r in rows["5m"]] == [(3.0, 8.0), (10.0, 15.0)]
    assert [(r.last, r.increase) for r in rows["1h"]] == [(10.0, 23.0)]


def test_resolution_choice():
    layout = Layout()
    now = 1000 * 86_400_000
    assert choose_granularity(layout, now - 86_400_000, now) is None
    assert choose_granularity(layout, now - 10 * 86_400_000, now).name == "5m"
    assert choose_granularity(layout, now - 100 * 86_400_000, now).name == "1h"
    assert choose_granularity(layout, now - 900 * 86_400_000, now).name == "1h"


def rollups(gateway, tenant, metric, granularity, aggregator, start, end):
    params = {
        "tenant": tenant,
        "metricName": metric,
        "granularity": granularity,
        "aggregator": aggregator,
        "start": start,
        "end": end,
    }
    answer = gateway.get("/api/query?" + urllib.parse.urlencode(params))
    assert answer.status == 200, answer.body
    return [list(series["values"].values()) for series in answer.json()]


def test_downsample_once_end_to_end_with_late_arrivals(start_gateway, backend_args, tmp_path, tenant):
    store_args = backend_args or ("--data-dir", str(tmp_path / "data"))
    gateway = start_gateway(*store_args, "--roles", "ingest,query", "--downsample-delay", "0s")
    slot = (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS
    t0 = slot // 1000
    gauge = [
        {"metricName": "room_temp", "tags": {"room": "a"}, "ts": t0 + i * 60, "value": float(i % 10)} for i in range(60)
    ]
    counter = [
        {"metricName": "jobs_total", "tags": {"q": "x"}, "ts": t0 + i * 60, "value": float(i if i < 30 else i - 30)}
        for i in range(60)
    ]
    assert gateway.post("/api/write", gauge + counter, headers={"X-Tenant": tenant}).status == 200
    assert "rolled up" in downsample_once(*store_args)
    window = (t0, t0 + 3599)
    assert rollups(gateway, tenant, "room_temp", "5m", "avg", *window) == [[2.0, 7.0] * 6]
    assert rollups(gateway, tenant, "room_temp", "5m", "max", *window) == [[4.0, 9.0] * 6]
    assert rollups(gateway, tenant, "room_temp", "1h", "count", *window) == [[60.0]]
    assert rollups(gateway, tenant, "room_temp", "1h", "sum", *window) == [[270.0]]
    assert rollups(gateway, tenant, "jobs_total", "1h", "increase", *window) == [[58.0]]
    assert rollups(gateway, tenant, "jobs_total", "1h", "last", *window) == [[29.0]]
    assert "rolled up 0 " in downsample_once(*store_args)
    late = [{"metricName": "room_temp", "tags": {"room": "a"}, "ts": t0 + 30, "value": 100.0}]
    other_slot = [{"metricName": "room_temp", "tags": {"room": "a"}, "ts": t0 + 3600 + 60, "value": 5.0}]
    assert gateway.post("/api/write", late + other_slot, headers={"X-Tenant": tenant}).status == 200
    assert "rolled up 2 " in downsample_once(*store_args)
    assert rollups(gateway, tenant, "room_temp", "1h", "count", t0, t0 + 7200) == [[61.0, 1.0]]
    assert rollups(gateway, tenant, "room_temp", "1h", "max", *window) == [[100.0]]
    assert rollups(gateway, tenant, "room_temp", "5m", "min", t0 + 3600, t0 + 7200) == [[5.0]]
    bad = gateway.get(
        "/api/query?" + urllib.parse.urlencode({"tenant": tenant, "metricName": "room_temp", "granularity": "7m"})
    )
    assert bad.status == 400 and "granularity" in bad.json()["error"]


def test_two_downsampler_replicas_share_the_work(start_gateway, cassandra_url, tmp_path, tenant):
    """Two downsample-only processes compete for partitions through Redis locks: every pending
    series-slot is rolled up, and no series-slot is counted twice (the replicas' counts add up to
    exactly the 40 series-slots once no pending work is left in Redis). The Redis is the test's
    own: any other downsampler on the keyspace and a shared Redis would take part of the work."""
    from gateway.app.devservices.redis import RedisServer

    own_redis = RedisServer(tmp_path / "redis")
    own_redis.start()
    try:
        shared = ("--store", cassandra_url, "--redis", own_redis.url, "--downsample-delay", "0s")
        ingest = start_gateway(*shared, "--roles", "ingest,query")
        slot = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
        t0 = slot // 1000
        batch = [
            {"metricName": "shared_load", "tags": {"i": str(i)}, "ts": t0 + p * 600, "value": float(p)}
            for i in range(40)
            for p in range(6)
        ]
        assert ingest.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
        replicas = [
            start_gateway(*shared, "--roles", "downsample,query", "--downsample-interval", "1s") for _ in range(2)
        ]
        client = redis.Redis.from_url(own_redis.url)

        def total() -> float:
            return sum(metric_value(r, "tsgate_downsampled_series_slots_total") for r in replicas)

        def work_left() -> bool:
            return any(b"|pending|" in key or b"|processing|" in key for key in client.scan_iter(match="tsgate|*"))

        deadline = time.monotonic() + 60
        while total() < 40 or work_left():
            assert time.monotonic() < deadline, total()
            time.sleep(0.5)
        assert total() == 40
        client.close()
        counts = rollups(ingest, tenant, "shared_load", "1h", "count", t0, t0 + 3599)
        assert counts == [[6.0]] * 40
        assert "Traceback" not in replicas[0].log() + replicas[1].log()
    finally:
        own_redis.stop()


def test_reads_past_raw_retention_use_roll_ups(start_gateway, tmp_path, tenant):
    """With 1 h of raw retention, a render or remote read starting 3 h ago answers from 5m roll-ups."""
    from protocols import prometheus
    from protocols.prometheus import Matcher, ReadQuery

    store_args = ("--data-dir", str(tmp_path / "data"), "--raw-retention", "1h", "--downsample-delay", "0s")
    gateway = start_gateway(*store_args, "--roles", "ingest,query")
    t0 = (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS // 1000
    batch = [{"metricName": "old.gauge", "ts": t0 + i * 60, "value": float(i % 5)} for i in range(60)]
    assert gateway.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
    downsample_once(*store_args)
    rendered = gateway.get(
        f"/render?target=old.gauge&from={t0 - 1}&until={t0 + 3599}&format=json&tenant={tenant}"
    ).json()
    points = [(ts, v) for v, ts in rendered[0]["datapoints"] if v is not None]
    assert points[:2] == [(t0, 2.0), (t0 + 300, 2.0)] and len(points) == 12
    target = "consolidateBy(old.gauge,'max')"
    maxima = gateway.get(f"/render?target={target}&from={t0 - 1}&until={t0 + 3599}&format=json&tenant={tenant}").json()
    assert {v for v, _ in maxima[0]["datapoints"] if v is not None} == {4.0}
    body = prometheus.encode_read_request(
        [ReadQuery(t0 * 1000, (t0 + 3599) * 1000, [Matcher("EQ", "__name__", "old.gauge")])]
    )
    answer = gateway.post("/api/v1/read", body, headers={"X-Scope-OrgID": tenant, "Content-Encoding": "snappy"})
    (result,) = prometheus.decode_read_response(answer.body, 1 << 20)
    assert [v for _, v in result[0][1]] == [2.0] * 12


def test_redis_restarting_mid_run_loses_no_roll_up(start_gateway, cassandra_url, tmp_path, tenant):
    """While Redis is down, ingest marks the store's pending table instead; after Redis is back,
    one `downsample --once` rolls up what was written during and after the outage."""
    from gateway.app.devservices.redis import RedisServer

    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        args = ("--store", cassandra_url, "--redis", redis.url, "--downsample-delay", "0s")
        gateway = start_gateway(*args, "--roles", "ingest,query")
        t0 = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS // 1000

        def write(name: str) -> None:
            batch = [{"metricName": name, "ts": t0 + i * 60, "value": 1.0} for i in range(10)]
            assert gateway.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200

        write("before_outage")
        downsample_once(*args)
        redis.stop()
        write("during_outage")
        redis.start()
        wait_until_redis_is_used(gateway, tenant)
        write("after_outage")
        downsample_once(*args)
        for name in ("before_outage", "during_outage", "after_outage"):
            assert rollups(gateway, tenant, name, "1h", "count", t0, t0 + 3599) == [[10.0]], name
        assert "marking the store table instead" in gateway.log()
    finally:
        redis.stop()
