"""The downsampler: roll-up arithmetic by hand, and `tsgate downsample --once` end to end on both
backends (SQLite with the pending table, Cassandra with Redis), late arrivals included."""

import math
import struct
import time
import urllib.parse

import pytest

from gateway.downsample.aggregate import CUMULATIVE_COUNTER, DELTA_COUNTER, GAUGE, MAX_ONLY, roll_up, series_kind
from gateway.downsample.histograms import decode_interval, encode_interval, is_counter_reset, kept_in_range, roll_up_histograms
from gateway.downsample.partitions import jump_hash, parse_partitions, partition_of
from gateway.read_path import choose_granularity
from gateway.store.contract import HistogramRow, Rollup
from gateway.store.layout import HOUR_MS, Layout, parse_granularities
from protocols.prometheus import types_pb2
from tests.gatewayproc import downsample_once
from tests.test_prometheus_protocol import histogram

MINUTE = 60_000
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


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


def test_gauge_roll_up_and_cascade():
    layout = Layout()
    points = [(i * MINUTE, float(v)) for i, v in enumerate([5, 7, 9, 1, 3, 8, 2, 2, 2, 10])]
    rows = roll_up("t", "h", GAUGE, points + [(10 * MINUTE, float("nan"))], None, layout.granularities)
    assert rows["5m"] == [Rollup("t", "h", 0, 1.0, 9.0, 25.0, 5), Rollup("t", "h", 5 * MINUTE, 2.0, 10.0, 24.0, 5)]
    assert rows["1h"] == [Rollup("t", "h", 0, 1.0, 10.0, 49.0, 10)]


def test_infinities_of_both_signs_sum_to_nan_instead_of_stopping_the_roll_up():
    layout = Layout()
    points = [(0, math.inf), (MINUTE, -math.inf), (2 * MINUTE, 1.0), (6 * MINUTE, math.inf)]
    rows = roll_up("t", "h", GAUGE, points, None, layout.granularities)
    first, second = rows["5m"]
    assert (first.min, first.max, math.isnan(first.sum), first.count) == (-math.inf, math.inf, True, 3)
    assert second.sum == math.inf
    assert math.isnan(rows["1h"][0].sum)
    delta = roll_up("t", "h", DELTA_COUNTER, points, None, layout.granularities)
    assert math.isnan(delta["5m"][0].sum)


def test_counter_increase_is_reset_aware():
    layout = Layout()
    points = [(i * MINUTE, float(v)) for i, v in enumerate([5, 7, 9, 1, 3, 8, 2, 2, 2, 10])]
    rows = roll_up("t", "h", CUMULATIVE_COUNTER, points, 4.0, layout.granularities)
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
    params = {"tenant": tenant, "metricName": metric, "granularity": granularity, "aggregator": aggregator, "start": start, "end": end}
    answer = gateway.get("/api/query?" + urllib.parse.urlencode(params))
    assert answer.status == 200, answer.body
    return [list(series["values"].values()) for series in answer.json()]


def test_downsample_once_end_to_end_with_late_arrivals(start_gateway, backend_args, tmp_path, tenant):
    store_args = backend_args or ("--data-dir", str(tmp_path / "data"))
    gateway = start_gateway(*store_args, "--roles", "ingest,query", "--downsample-delay", "0s")
    slot = (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS
    t0 = slot // 1000
    gauge = [{"metricName": "room_temp", "tags": {"room": "a"}, "ts": t0 + i * 60, "value": float(i % 10)} for i in range(60)]
    counter = [{"metricName": "jobs_total", "tags": {"q": "x"}, "ts": t0 + i * 60, "value": float(i if i < 30 else i - 30)} for i in range(60)]
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
    bad = gateway.get("/api/query?" + urllib.parse.urlencode({"tenant": tenant, "metricName": "room_temp", "granularity": "7m"}))
    assert bad.status == 400 and "granularity" in bad.json()["error"]


def metric_value(gateway, name: str) -> float:
    import re

    match = re.search(rf"^{re.escape(name)} (\S+)$", gateway.get("/metrics").body.decode(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_two_downsampler_replicas_share_the_work(start_gateway, cassandra_url, redis_server, tenant):
    """Two downsample-only processes compete for partitions through Redis locks: every pending
    series-slot is rolled up, and no series-slot is counted twice."""
    shared = ("--store", cassandra_url, "--redis", redis_server.url, "--downsample-delay", "0s")
    ingest = start_gateway(*shared, "--roles", "ingest,query")
    slot = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    t0 = slot // 1000
    batch = [{"metricName": "shared_load", "tags": {"i": str(i)}, "ts": t0 + p * 600, "value": float(p)} for i in range(40) for p in range(6)]
    assert ingest.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
    replicas = [start_gateway(*shared, "--roles", "downsample,query", "--downsample-interval", "1s") for _ in range(2)]

    def total() -> float:
        return sum(metric_value(r, "tsgate_downsampled_series_slots_total") for r in replicas)

    deadline = time.monotonic() + 60
    while total() < 40 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)
    assert total() >= 40
    counts = rollups(ingest, tenant, "shared_load", "1h", "count", t0, t0 + 3599)
    assert counts == [[6.0]] * 40
    assert "Traceback" not in replicas[0].log() + replicas[1].log()


def test_reads_past_raw_retention_use_roll_ups(start_gateway, tmp_path, tenant):
    """With 1 h of raw retention, a render or remote read starting 3 h ago answers from 5m roll-ups."""
    from protocols import prometheus
    from protocols.prometheus import Matcher, Query

    store_args = ("--data-dir", str(tmp_path / "data"), "--raw-retention", "1h", "--downsample-delay", "0s")
    gateway = start_gateway(*store_args, "--roles", "ingest,query")
    t0 = (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS // 1000
    batch = [{"metricName": "old.gauge", "ts": t0 + i * 60, "value": float(i % 5)} for i in range(60)]
    assert gateway.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
    downsample_once(*store_args)
    rendered = gateway.get(f"/render?target=old.gauge&from={t0 - 1}&until={t0 + 3599}&format=json&tenant={tenant}").json()
    points = [(ts, v) for v, ts in rendered[0]["datapoints"] if v is not None]
    assert points[:2] == [(t0, 2.0), (t0 + 300, 2.0)] and len(points) == 12
    target = "consolidateBy(old.gauge,'max')"
    maxima = gateway.get(f"/render?target={target}&from={t0 - 1}&until={t0 + 3599}&format=json&tenant={tenant}").json()
    assert {v for v, _ in maxima[0]["datapoints"] if v is not None} == {4.0}
    body = prometheus.encode_read_request([Query(t0 * 1000, (t0 + 3599) * 1000, [Matcher("EQ", "__name__", "old_gauge")])])
    answer = gateway.post("/api/v1/read", body, headers={"X-Scope-OrgID": tenant, "Content-Encoding": "snappy"})
    (result,) = prometheus.decode_read_response(answer.body, 1 << 20)
    assert [v for _, v in result[0][1]] == [2.0] * 12


def test_redis_restarting_mid_run_loses_no_roll_up(start_gateway, cassandra_url, tmp_path, tenant):
    """While Redis is down, ingest marks the store's pending table instead; after Redis is back,
    one `downsample --once` rolls up what was written during and after the outage."""
    from gateway.devservices.redis import RedisServer

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
        time.sleep(5.5)
        write("after_outage")
        downsample_once(*args)
        for name in ("before_outage", "during_outage", "after_outage"):
            assert rollups(gateway, tenant, name, "1h", "count", t0, t0 + 3599) == [[10.0]], name
        assert "marking the store table instead" in gateway.log()
    finally:
        redis.stop()


def _histogram_row(minute: int, count: int, reset_hint: int = 0, schema: int = 0, stale: bool = False) -> HistogramRow:
    """An integer histogram at ``minute``: 1 zero-bucket observation, the rest in bucket 1."""
    sum_ = STALE_NAN if stale else 1.5 * count
    data = histogram(count=count, sum_=sum_, zero_count=1, positive=((1, 1),), deltas=(count - 1,), timestamp=minute * MINUTE, reset_hint=reset_hint, schema=schema)
    return HistogramRow("t", "h", minute * MINUTE, data)


def _kept(rows: list[HistogramRow]) -> list[tuple[int, int, int]]:
    """(minute, count, reset hint) of the histograms roll-up rows keep."""
    found = [types_pb2.Histogram.FromString(h.data) for row in rows for h in decode_interval(row)]
    return [(h.timestamp // MINUTE, h.count_int, h.reset_hint) for h in found]


def _increase(rows: list[HistogramRow], previous: HistogramRow | None = None) -> int:
    """increase() of the count as PromQL takes it: a reset starts again from zero."""
    messages = [types_pb2.Histogram.FromString(row.data) for row in ([previous] if previous else []) + rows]
    return sum(b.count_int if is_counter_reset(a, b) else b.count_int - a.count_int for a, b in zip(messages, messages[1:]))


def test_histogram_roll_up_keeps_the_last_and_the_one_before_each_reset():
    """A counter histogram scraped each minute, reset after minute 6 (and its count back above
    the old one by minute 9) and again after minute 31: every interval keeps its last histogram,
    and the one before a reset; the kept one after a reset says so. increase() over each roll-up
    equals increase() over the raw histograms, at both granularities."""
    layout = Layout()
    counts = [10 + i for i in range(7)] + [2, 8, 30] + [31 + i for i in range(22)] + [3 + i for i in range(28)]
    raw = [_histogram_row(minute, count) for minute, count in enumerate(counts)]
    previous = _histogram_row(-1, 9)
    rows = roll_up_histograms(raw, previous, layout.granularities)
    assert [row.timestamp_ms for row in rows["5m"]] == [i * 5 * MINUTE for i in range(12)]
    kept_5m = _kept(rows["5m"])
    assert kept_5m[:4] == [(4, 14, 0), (6, 16, 0), (9, 30, 1), (14, 35, 0)]
    assert (31, 52, 0) in kept_5m and (34, 5, 1) in kept_5m and kept_5m[-1] == (59, 30, 0)
    assert _kept(rows["1h"]) == [(6, 16, 0), (31, 52, 1), (59, 30, 1)]
    expected = _increase(raw, previous)
    for name in ("5m", "1h"):
        kept = [h for row in rows[name] for h in decode_interval(row)]
        assert _increase(kept, previous) == expected == 9 - 9 + 7 + 2 + 6 + 22 + 22 + 3 + 27


def test_histogram_roll_up_of_a_reset_at_the_slot_start_and_of_gauge_histograms():
    layout = Layout()
    raw = [_histogram_row(minute, 5 + minute) for minute in range(3)]
    rows = roll_up_histograms(raw, _histogram_row(-1, 100), layout.granularities)
    assert _kept(rows["5m"]) == [(2, 7, 1)] and _kept(rows["1h"]) == [(2, 7, 1)]
    gauge = [_histogram_row(minute, count, reset_hint=3) for minute, count in enumerate([9, 2, 7, 1, 8, 3, 5])]
    rows = roll_up_histograms(gauge, _histogram_row(-1, 50, reset_hint=3), layout.granularities)
    assert _kept(rows["5m"]) == [(4, 8, 3), (6, 5, 3)] and _kept(rows["1h"]) == [(6, 5, 3)]
    assert rows["5m"][0].data == encode_interval([gauge[4]])  # kept as written


def test_histogram_roll_up_leaves_stale_markers_out_and_keeps_bytes():
    layout = Layout()
    raw = [_histogram_row(0, 4), _histogram_row(1, 5), _histogram_row(2, 5, stale=True)]
    rows = roll_up_histograms(raw, None, layout.granularities)
    (only,) = rows["5m"]
    assert [h.data for h in decode_interval(only)] == [raw[1].data]
    assert kept_in_range(rows["1h"], MINUTE, MINUTE) == [raw[1]] and kept_in_range(rows["1h"], 0, MINUTE - 1) == []
    assert roll_up_histograms([], None, layout.granularities) == {"5m": [], "1h": []}


def test_counter_reset_detection_follows_prometheus():
    def message(**fields):
        return types_pb2.Histogram.FromString(histogram(**fields))

    base = message(count=3, zero_count=1, positive=((0, 2),), deltas=(1, 0))
    assert not is_counter_reset(base, base)
    assert is_counter_reset(base, message(count=3, zero_count=1, positive=((0, 2),), deltas=(1, 0), reset_hint=1))
    assert not is_counter_reset(base, message(count=1, zero_count=1, positive=(), deltas=(), reset_hint=2))
    # the same count, but an observation moved from a bucket to another: a reset
    assert is_counter_reset(base, message(count=3, zero_count=1, positive=((0, 2),), deltas=(0, 2)))
    assert is_counter_reset(base, message(count=3, zero_count=0, positive=((0, 2),), deltas=(1, 1)))
    # schema 1 buckets 1 and 2 fall into schema 0 bucket 1: compared there, nothing went down
    finer = message(count=4, schema=1, zero_count=1, positive=((1, 2),), deltas=(1, 1))
    coarser = message(count=5, schema=0, zero_count=1, positive=((1, 1),), deltas=(4,))
    assert not is_counter_reset(finer, coarser) and is_counter_reset(coarser, finer)
    floats = message(count=3.5, zero_count=0.5, deltas=(1.0, 2.0), is_float=True)
    assert not is_counter_reset(floats, message(count=4.5, zero_count=0.5, deltas=(2.0, 2.0), is_float=True))
    assert is_counter_reset(floats, message(count=4.5, zero_count=0.5, deltas=(3.0, 1.0), is_float=True))
    custom = message(count=2, zero_count=0, schema=-53, positive=((0, 2),), deltas=(1, 0), custom=(1.0,))
    assert is_counter_reset(custom, message(count=5, zero_count=0, schema=-53, positive=((0, 2),), deltas=(2, 1), custom=(2.0,)))
    assert not is_counter_reset(custom, message(count=5, zero_count=0, schema=-53, positive=((0, 2),), deltas=(2, 1), custom=(1.0,)))
