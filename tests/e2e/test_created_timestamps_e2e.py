"""Created timestamps of remote write 2.0 over real HTTP on both stores: stored per series and
shown by /api/query, and with --created-timestamp-zero-ingestion a zero sample (or an empty
histogram) at each new one, never over a stored sample."""

import urllib.parse

from protocols.prometheus import Matcher, ReadQuery, WriteSeries, types_pb2
from tests.e2e.test_exemplars_e2e import now_ms, read_samples, write
from tests.e2e.test_histograms_e2e import at
from tests.protocols.test_prometheus_protocol import HISTOGRAM


def raw_query(gateway, tenant: str, name: str, start: int, end: int) -> list[dict]:
    params = {"tenant": tenant, "metricName": name, "start": start, "end": end, "aggregator": "raw"}
    answer = gateway.get("/api/query?" + urllib.parse.urlencode(params))
    assert answer.status == 200, answer.body
    return answer.json()


def values(result: dict) -> list[float]:
    return list(result["values"].values())


def test_created_timestamps_are_stored_and_shown_without_zero_samples(gateway, tenant):
    t = now_ms() - 600_000
    series = [
        WriteSeries(
            {"__name__": "jobs_total", "job": "a"},
            [(t + 1000, 3.0), (t + 2000, 5.0)],
            created_timestamp=t,
            metric_type="counter",
        ),
        WriteSeries({"__name__": "jobs_total", "job": "b"}, [(t + 1000, 1.0)]),
    ]
    answer = write(gateway, tenant, series, version=2)
    assert answer.status == 204, answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "3"
    a, b = raw_query(gateway, tenant, "jobs_total", t - 1000, t + 5000)
    assert (a["tags"], a["createdTimestamp"], values(a)) == ({"job": "a"}, t, [3.0, 5.0])
    assert b["tags"] == {"job": "b"} and "createdTimestamp" not in b
    # a counter reset: a newer created timestamp replaces the stored one
    assert (
        write(
            gateway,
            tenant,
            [WriteSeries({"__name__": "jobs_total", "job": "a"}, [(t + 4000, 1.0)], created_timestamp=t + 3000)],
            version=2,
        ).status
        == 204
    )
    a, _ = raw_query(gateway, tenant, "jobs_total", t - 1000, t + 5000)
    assert (a["createdTimestamp"], values(a)) == (t + 3000, [3.0, 5.0, 1.0])
    # a series whose every sample is refused keeps no created timestamp, even once it is written
    refused = {"__name__": "jobs_total", "job": "c"}
    answer = write(gateway, tenant, [WriteSeries(refused, [(1000, 1.0)], created_timestamp=500)], version=2)
    assert answer.status == 400 and b"older than the accepted window" in answer.body
    assert write(gateway, tenant, [WriteSeries(refused, [(t + 1000, 2.0)])], version=2).status == 204
    *_, c = raw_query(gateway, tenant, "jobs_total", t - 1000, t + 5000)
    assert c["tags"] == {"job": "c"} and "createdTimestamp" not in c


def test_zero_ingestion_writes_a_zero_at_each_new_created_timestamp(start_gateway, backend_args, tenant):
    gateway = start_gateway(*backend_args, "--created-timestamp-zero-ingestion", "--max-sample-age", "1d")
    t = now_ms() - 600_000
    counter = {"__name__": "jobs_total", "job": "a"}
    answer = write(
        gateway, tenant, [WriteSeries(counter, [(t + 1000, 3.0), (t + 2000, 5.0)], created_timestamp=t)], version=2
    )
    assert answer.status == 204, answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "2"  # the zero is not the sender's
    (found,) = raw_query(gateway, tenant, "jobs_total", t - 1000, t + 9000)
    assert (
        list(found["values"].items())[0][1] == 0.0
        and values(found) == [0.0, 3.0, 5.0]
        and found["createdTimestamp"] == t
    )
    # the same created timestamp again: nothing more; a reset: a zero at the new one
    write(gateway, tenant, [WriteSeries(counter, [(t + 3000, 6.0)], created_timestamp=t)], version=2)
    write(gateway, tenant, [WriteSeries(counter, [(t + 5000, 2.0)], created_timestamp=t + 4000)], version=2)
    (found,) = raw_query(gateway, tenant, "jobs_total", t - 1000, t + 9000)
    assert values(found) == [0.0, 3.0, 5.0, 6.0, 0.0, 2.0]

    # a sample stored at or after the created timestamp: no zero over it or between samples
    other = {"__name__": "jobs_total", "job": "b"}
    write(gateway, tenant, [WriteSeries(other, [(t, 7.0), (t + 1000, 8.0)])], version=2)
    write(gateway, tenant, [WriteSeries(other, [(t + 2000, 9.0)], created_timestamp=t)], version=2)
    # a created timestamp at or after the first sample, or older than --max-sample-age: stored, no zero
    late = {"__name__": "jobs_total", "job": "c"}
    write(gateway, tenant, [WriteSeries(late, [(t + 1000, 4.0)], created_timestamp=t + 1000)], version=2)
    ancient = {"__name__": "jobs_total", "job": "d"}
    write(gateway, tenant, [WriteSeries(ancient, [(t + 1000, 4.0)], created_timestamp=t - 2 * 86_400_000)], version=2)
    found = {r["tags"]["job"]: r for r in raw_query(gateway, tenant, "jobs_total", t - 3 * 86_400_000, t + 9000)}
    assert values(found["b"]) == [7.0, 8.0, 9.0] and found["b"]["createdTimestamp"] == t
    assert values(found["c"]) == [4.0] and found["c"]["createdTimestamp"] == t + 1000
    assert values(found["d"]) == [4.0] and found["d"]["createdTimestamp"] == t - 2 * 86_400_000

    # a histogram series: an empty histogram at the created timestamp, hinted as a reset
    answer = write(
        gateway,
        tenant,
        [WriteSeries({"__name__": "latency_seconds"}, histograms=[at(HISTOGRAM, t + 1000)], created_timestamp=t)],
        version=2,
    )
    assert answer.status == 204 and answer.headers["X-Prometheus-Remote-Write-Histograms-Written"] == "1"
    response = read_samples(
        gateway, tenant, [ReadQuery(t - 1000, t + 9000, [Matcher("EQ", "__name__", "latency_seconds")])]
    )
    (series,) = response.results[0].timeseries
    zero, first = series.histograms
    assert first.SerializeToString() == at(HISTOGRAM, t + 1000).data
    assert (zero.timestamp, zero.count_int, zero.zero_count_int, zero.sum, zero.schema, zero.reset_hint) == (
        t,
        0,
        0,
        0.0,
        first.schema,
        types_pb2.Histogram.ResetHint.YES,
    )
    assert list(zero.positive_spans) == [] and zero.WhichOneof("count") == "count_int"
