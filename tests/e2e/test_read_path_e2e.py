"""The read path end to end on both stores, through real HTTP and `tsgate downsample --once`:
every read API answers the same before and after sealing (NaN payloads, -0.0 and a counter reset
at a slot boundary included), late samples are merged after their head rows expired, and a range
that starts past the raw retention still ends with the newest samples (native histograms too)."""

import json
import struct
import time
import urllib.parse

import pytest
from cassandra.cluster import Cluster

from gateway.core.layout import HOUR_MS, Layout, head_shard
from gateway.core.model import series_set_hash, series_set_text
from gateway.store.cassandra import parse_url
from protocols import prometheus
from protocols.prometheus import Matcher, ReadQuery, WriteSeries, remote_pb2, types_pb2
from tests.e2e.test_histograms_e2e import at, post_read
from tests.gatewayproc import downsample_once
from tests.protocols.test_prometheus_protocol import HISTOGRAM, histogram

STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
SCHEMAS = "[all]\npattern = .*\nretentions = 10s:7d\n"


def bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


@pytest.fixture
def store_args(backend_args, tmp_path):
    return backend_args or ("--data-dir", str(tmp_path / "data"))


def wait_until_head_rows_expired(store_args, tenant: str, name: str, slot: int, timeout_s: float = 30) -> None:
    """Cassandra lets a sealed slot's head rows live out their TTL (--head-retention, rounded up
    by the driver code): wait until they are gone. SQLite deletes them when it seals."""
    if "--store" not in store_args:
        return
    options = parse_url(store_args[store_args.index("--store") + 1], Layout())
    cluster = Cluster([host for host, _ in options.hosts], port=options.hosts[0][1], protocol_version=5)
    try:
        session = cluster.connect()
        query = session.prepare(
            f"SELECT ts FROM {options.schema.keyspace}.data_head"
            " WHERE tenant = ? AND slice IN ? AND shard = ? AND series_set_hash = ? LIMIT 1"
        )
        hash_ = series_set_hash(series_set_text(name, {}))
        slices = options.schema.layout.head_slices(slot, slot, slot + HOUR_MS - 1)
        key = (tenant, slices, head_shard(hash_), hash_)
        deadline = time.monotonic() + timeout_s
        while session.execute(query, key).one() is not None:
            assert time.monotonic() < deadline, "head rows outlived their TTL"
            time.sleep(0.2)
    finally:
        cluster.shutdown()


def remote_write(gateway, tenant: str, series: list[WriteSeries]) -> None:
    answer = gateway.post(
        "/api/v1/write",
        prometheus.encode_write_request_v1(series),
        headers={"X-Scope-OrgID": tenant, "Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
    )
    assert answer.status == 204, answer.body


def remote_read(
    gateway, tenant: str, name: str, start_ms: int, end_ms: int, response_type: str = prometheus.SAMPLES
) -> bytes:
    body = prometheus.encode_read_request(
        [ReadQuery(start_ms, end_ms, [Matcher("EQ", "__name__", name)])], [response_type]
    )
    answer = gateway.post("/api/v1/read", body, headers={"X-Scope-OrgID": tenant, "Content-Encoding": "snappy"})
    assert answer.status == 200, answer.body
    return answer.body


def read_samples(gateway, tenant: str, name: str, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
    """(timestamp, value bits) of every sample of every series a SAMPLES remote read returns."""
    (result,) = prometheus.decode_read_response(remote_read(gateway, tenant, name, start_ms, end_ms), 1 << 26)
    return [(ts, bits(value)) for _, found in result for ts, value in found]


def api_query(gateway, tenant: str, **params) -> list:
    answer = gateway.get("/api/query?" + urllib.parse.urlencode({"tenant": tenant, **params}))
    assert answer.status == 200, answer.body
    return answer.json()


def render(gateway, tenant: str, target: str, start: int, until: int) -> bytes:
    query = urllib.parse.urlencode({"target": target, "from": start, "until": until, "format": "json"})
    answer = gateway.get(f"/render?{query}", headers={"X-Scope-OrgID": tenant})
    assert answer.status == 200, answer.body
    return answer.body


def test_every_read_api_answers_the_same_before_and_after_sealing(start_gateway, store_args, tmp_path, tenant):
    schemas = tmp_path / "schemas.conf"
    schemas.write_text(SCHEMAS)
    gateway = start_gateway(
        *store_args, "--roles", "ingest,query", "--downsample-delay", "0s", "--graphite-storage-schemas", str(schemas)
    )
    slot = (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS
    gauge = [(slot + i * 10_000 + i % 7, float(i) / 4) for i in range(300)]
    gauge[10], gauge[11], gauge[12] = (gauge[10][0], float("nan")), (gauge[11][0], STALE), (gauge[12][0], -0.0)
    # a counter across the slot boundary, reset at the first sample of the second slot
    counter = [(slot + i * 60_000, 100.0 + i) for i in range(60)] + [
        (slot + HOUR_MS + i * 60_000, float(i)) for i in range(60)
    ]
    remote_write(
        gateway,
        tenant,
        [WriteSeries({"__name__": "room_temp", "room": "a"}, gauge), WriteSeries({"__name__": "jobs_total"}, counter)],
    )
    start_ms, end_ms = slot, slot + 2 * HOUR_MS - 1

    def answers(reader_tenant: str) -> dict:
        return {
            "query": api_query(gateway, reader_tenant, metricName="room_temp", start=start_ms, end=end_ms),
            "counter": api_query(gateway, reader_tenant, metricName="jobs_total", start=start_ms, end=end_ms),
            "render": render(gateway, reader_tenant, "seriesByTag('name=room_temp')", slot // 1000 - 1, end_ms // 1000),
            "samples": read_samples(gateway, reader_tenant, "room_temp", start_ms, end_ms),
            "counter_samples": read_samples(gateway, reader_tenant, "jobs_total", start_ms, end_ms),
            "chunks": remote_read(
                gateway, reader_tenant, "room_temp", start_ms, end_ms, prometheus.STREAMED_XOR_CHUNKS
            ),
        }

    before, other_before = answers(tenant), answers(tenant + "-other")
    assert before["samples"] == [(ts, bits(value)) for ts, value in gauge]
    assert before["counter_samples"] == [(ts, bits(value)) for ts, value in counter]
    assert (
        len(before["query"][0]["values"]) == 300
        and before["query"][0]["values"][next(iter(before["query"][0]["values"]))] == 0.0
    )
    assert b"null" in before["render"] and b"[74.75, " in before["render"]
    assert other_before["query"] == [] and other_before["samples"] == [] and other_before["render"] == b"[]\n"
    assert "rolled up" in downsample_once(*store_args)  # other tests' series may be pending too
    assert answers(tenant) == before
    assert answers(tenant + "-other") == other_before
    hourly = api_query(
        gateway, tenant, metricName="jobs_total", granularity="1h", aggregator="increase", start=start_ms, end=end_ms
    )
    assert list(hourly[0]["values"].values()) == [59.0, 59.0]


def test_late_samples_are_merged_after_their_head_rows_expired(start_gateway, store_args, tenant):
    # Each seal below must read its head rows before they expire, with a CLI process's start-up on a
    # loaded box in between (8 s was too short on CI's); the wait for the first rows' expiry is as long.
    args = (*store_args, "--downsample-delay", "0s", "--head-retention", "15s")
    gateway = start_gateway(*args, "--roles", "ingest,query")
    slot = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    first = [(slot + i * 60_000, float(i)) for i in range(10)]
    remote_write(gateway, tenant, [WriteSeries({"__name__": "late_gauge"}, first)])
    assert "rolled up" in downsample_once(*args)
    wait_until_head_rows_expired(store_args, tenant, "late_gauge", slot)
    late = [(slot + 30 * 60_000, 30.0), (slot + 2 * 60_000, -2.0)]
    remote_write(gateway, tenant, [WriteSeries({"__name__": "late_gauge"}, late)])
    assert "rolled up" in downsample_once(*args)
    expected = sorted(dict(first + late).items())
    assert read_samples(gateway, tenant, "late_gauge", slot, slot + HOUR_MS - 1) == [
        (ts, bits(v)) for ts, v in expected
    ]
    (series,) = api_query(
        gateway, tenant, metricName="late_gauge", granularity="raw", start=slot, end=slot + HOUR_MS - 1
    )
    assert list(series["values"].values()) == [v for _, v in expected]
    (count,) = api_query(
        gateway, tenant, metricName="late_gauge", granularity="1h", aggregator="count", start=slot, end=slot
    )
    (minimum,) = api_query(
        gateway, tenant, metricName="late_gauge", granularity="1h", aggregator="min", start=slot, end=slot
    )
    assert list(count["values"].values()) == [11.0] and list(minimum["values"].values()) == [-2.0]


def test_a_range_past_raw_retention_ends_with_the_newest_samples(start_gateway, store_args, tmp_path, tenant):
    schemas = tmp_path / "schemas.conf"
    schemas.write_text(SCHEMAS)
    args = (*store_args, "--raw-retention", "1h", "--downsample-delay", "0s")
    gateway = start_gateway(*args, "--roles", "ingest,query", "--graphite-storage-schemas", str(schemas))
    now = int(time.time() * 1000)
    old_slot = (now // HOUR_MS - 3) * HOUR_MS
    old = [(old_slot + i * 60_000, float(i % 5)) for i in range(60)]
    recent = [(now - 600_000 + i * 60_000, 42.0) for i in range(10)]
    counter_old = [(ts, 1000.0 + i) for i, (ts, _) in enumerate(old)]
    counter_recent = [(ts, 2000.0 + i) for i, (ts, _) in enumerate(recent)]
    remote_write(
        gateway,
        tenant,
        [
            WriteSeries({"__name__": "stitched_gauge"}, old + recent),
            WriteSeries({"__name__": "reqs_total"}, counter_old + counter_recent),
        ],
    )
    downsample_once(*args)
    start = old_slot
    (series,) = api_query(gateway, tenant, metricName="stitched_gauge", start=start, end="now")
    values = list(series["values"].values())
    assert values[:12] == [2.0] * 12 and values[-10:] == [42.0] * 10
    rendered = render(gateway, tenant, "stitched_gauge", start // 1000 - 1, now // 1000 + 60)
    points = [(v, ts) for v, ts in json.loads(rendered)[0]["datapoints"] if v is not None]
    assert points[0] == (2.0, old_slot // 1000) and points[-1][0] == 42.0 and points[-1][1] - points[0][1] >= 2 * 3600
    gauge_read = read_samples(gateway, tenant, "stitched_gauge", start, now + 1000)
    assert gauge_read[-10:] == [(ts, bits(v)) for ts, v in recent] and len(gauge_read) == 12 + 10
    counter_read = read_samples(gateway, tenant, "reqs_total", start, now + 1000)
    assert [struct.unpack("<d", struct.pack("<Q", b))[0] for _, b in counter_read[:2]] == [1004.0, 1009.0]
    assert counter_read[-10:] == [(ts, bits(v)) for ts, v in counter_recent]


def test_native_histograms_past_raw_retention_come_from_their_roll_up(start_gateway, store_args, tenant):
    """A counter histogram each minute of a slot 3 h old, reset after minute 21, and a few recent
    ones, through `tsgate downsample --once` with a 1 h raw retention: remote read of the whole
    range gives the 5m roll-up's histograms (the last of each 5 minutes, and minute 21 before the
    reset, minute 24 after it hinted YES), then the recent ones as written; PromQL's
    histogram_count() and histogram_sum() of the old slot answer from the roll-up."""
    args = (*store_args, "--raw-retention", "1h", "--downsample-delay", "0s")
    gateway = start_gateway(*args, "--roles", "ingest,query")
    now = int(time.time() * 1000)
    old_slot = (now // HOUR_MS - 3) * HOUR_MS
    counts = [100 + i for i in range(22)] + [1 + 2 * i for i in range(38)]
    old = [
        at(histogram(count=c, sum_=0.5 * c, zero_count=1, positive=((1, 1),), deltas=(c - 1,)), old_slot + i * 60_000)
        for i, c in enumerate(counts)
    ]
    recent = [at(HISTOGRAM, now - 300_000 + i * 60_000) for i in range(3)]
    remote_write(gateway, tenant, [WriteSeries({"__name__": "latency_seconds"}, histograms=old + recent)])
    assert "rolled up" in downsample_once(*args)

    answer = post_read(
        gateway,
        tenant,
        [ReadQuery(old_slot, now, [Matcher("EQ", "__name__", "latency_seconds")])],
        [prometheus.SAMPLES],
    )
    assert answer.status == 200, answer.body
    (series,) = (
        remote_pb2.ReadResponse.FromString(prometheus.decompress_block(answer.body, 1 << 24)).results[0].timeseries
    )
    minutes = [4, 9, 14, 19, 21, 24, 29, 34, 39, 44, 49, 54, 59]
    expected = [old[m].data for m in minutes]
    hinted = types_pb2.Histogram.FromString(old[24].data)
    hinted.reset_hint = types_pb2.Histogram.ResetHint.YES
    expected[minutes.index(24)] = hinted.SerializeToString()
    assert [h.SerializeToString() for h in series.histograms] == expected + [h.data for h in recent]

    at_minute_24 = (old_slot + 24 * 60_000) / 1000
    for function, value in (("histogram_count", counts[24]), ("histogram_sum", 0.5 * counts[24])):
        answer = gateway.get(
            "/api/v1/query?" + urllib.parse.urlencode({"query": f"{function}(latency_seconds)", "time": at_minute_24}),
            headers={"X-Scope-OrgID": tenant},
        )
        assert answer.status == 200, answer.body
        (result,) = answer.json()["data"]["result"]
        assert float(result["value"][1]) == value
