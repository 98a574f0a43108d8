"""Native histograms over real HTTP on both stores: remote write 1.0 and 2.0 in, the RW 2.0
Histograms-Written header, remote read SAMPLES out, bit for bit."""

from protocols import prometheus
from protocols.prometheus import Matcher, ReadQuery, WriteHistogram, WriteSeries, remote_pb2, types_pb2
from tests.e2e.test_exemplars_e2e import now_ms, read_samples, write
from tests.histogram_messages import to_protobuf
from tests.protocols.test_prometheus_protocol import HISTOGRAM, VALID_HISTOGRAMS, custom_bounds, histogram


def at(data: bytes, timestamp: int) -> WriteHistogram:
    """The same histogram at another timestamp, as protobuf writes it."""
    message = types_pb2.Histogram.FromString(data)
    message.timestamp = timestamp
    return WriteHistogram(timestamp, message.SerializeToString())


def stored(answer) -> list[list[tuple[dict, list, list[bytes]]]]:
    """Each query's series as (labels, samples, histogram bytes re-serialised by protobuf)."""
    return [
        [
            (
                {label.name: label.value for label in series.labels},
                [(sample.timestamp, sample.value) for sample in series.samples],
                [h.SerializeToString() for h in series.histograms],
            )
            for series in result.timeseries
        ]
        for result in answer.results
    ]


def post_read(gateway, tenant, queries, accepted):
    body = prometheus.encode_read_request(queries, accepted)
    return gateway.post(
        "/api/v1/read", body, headers={"Content-Type": "application/x-protobuf", "X-Scope-OrgID": tenant}
    )


def test_rw1_and_rw2_histograms_come_back_bit_exact(gateway, tenant):
    """Every kind (integer, float, empty, negative only, NaN sum, custom buckets, schemas -4 and 8,
    reset hint) through both versions; the header and /metrics count them."""
    t = now_ms() - 60_000
    kinds = list(VALID_HISTOGRAMS.values())
    v1 = [at(data, t + i) for i, data in enumerate(kinds)]
    answer = write(
        gateway, tenant, [WriteSeries({"__name__": "latency_seconds", "job": "v1"}, [(t, 1.0)], histograms=v1)]
    )
    assert answer.status == 204, answer.body
    v2 = [at(data, t + i) for i, data in enumerate(reversed(kinds))]
    answer = write(
        gateway,
        tenant,
        [WriteSeries({"__name__": "latency_seconds", "job": "v2"}, histograms=v2, metric_type="histogram")],
        version=2,
    )
    assert answer.status == 204, answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Histograms-Written"] == str(len(v2))
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "0"

    (found,) = stored(
        read_samples(gateway, tenant, [ReadQuery(t - 1, t + 1000, [Matcher("EQ", "__name__", "latency_seconds")])])
    )
    assert found == [
        ({"__name__": "latency_seconds", "job": "v1"}, [(t, 1.0)], [h.data for h in v1]),
        ({"__name__": "latency_seconds", "job": "v2"}, [], [h.data for h in v2]),
    ]
    (later,) = stored(read_samples(gateway, tenant, [ReadQuery(t + 2, t + 3, [Matcher("EQ", "job", "v1")])]))
    assert later == [({"__name__": "latency_seconds", "job": "v1"}, [], [v1[2].data, v1[3].data])]
    metrics = gateway.get("/metrics").body.decode()
    assert f'tsgate_native_histograms_accepted_total{{protocol="prometheus"}} {2.0 * len(kinds)}' in metrics
    assert 'kind="native_histogram"' not in metrics


def test_the_client_order_of_response_types_decides_with_histograms_too(gateway, tenant):
    """Prometheus 3's client lists STREAMED_XOR_CHUNKS then SAMPLES: histograms come as histogram
    chunks then (test_histogram_chunks_e2e.py decodes them with Prometheus's chunkenc); a client
    listing SAMPLES first, or nothing, gets them as Histogram messages."""
    t = now_ms() - 60_000
    write(gateway, tenant, [WriteSeries({"__name__": "h"}, [(t - 1, 2.0)], histograms=[at(HISTOGRAM, t)])])
    query = [ReadQuery(t - 1, t, [Matcher("EQ", "__name__", "h")])]
    streamed = post_read(gateway, tenant, query, [prometheus.STREAMED_XOR_CHUNKS, prometheus.SAMPLES])
    assert streamed.status == 200 and streamed.headers["Content-Type"] == prometheus.STREAMED_CONTENT_TYPE
    ((index, labels, samples, histograms),) = prometheus.decode_chunked_series(streamed.body)
    assert (index, labels, samples) == (0, {"__name__": "h"}, [(t - 1, 2.0)])
    (found,) = histograms
    expected = types_pb2.Histogram.FromString(at(HISTOGRAM, t).data)
    expected.reset_hint = types_pb2.Histogram.UNKNOWN  # chunks keep no hint: the first of a chunk reads as unknown
    assert to_protobuf(found).SerializeToString() == expected.SerializeToString()
    for accepted in ([prometheus.SAMPLES, prometheus.STREAMED_XOR_CHUNKS], []):
        answer = post_read(gateway, tenant, query, accepted)
        assert answer.status == 200 and answer.headers["Content-Type"] == prometheus.SAMPLES_CONTENT_TYPE
        response = remote_pb2.ReadResponse.FromString(prometheus.decompress_block(answer.body, 1 << 24))
        assert stored(response) == [[({"__name__": "h"}, [(t - 1, 2.0)], [at(HISTOGRAM, t).data])]]


def test_invalid_histograms_are_refused_and_counted_the_data_beside_them_written(start_gateway, backend_args, tenant):
    """An invalid histogram (Prometheus's bad_count_histogram case), one with a negative zero
    threshold and one of a million buckets are refused one by one, before their buckets are read;
    the 400 names each; the sample of their series and the good series beside them are written."""
    gateway = start_gateway(*backend_args, "--max-native-histogram-buckets", "160")
    t = now_ms() - 1000
    bad_count = WriteHistogram(t, histogram(count=5, timestamp=t))
    negative_threshold = WriteHistogram(t + 1, histogram(zero_threshold=-1.0, timestamp=t + 1))
    million = histogram(
        count=10**6, zero_count=0, positive=((0, 10**6),), deltas=(1,) + (0,) * (10**6 - 1), timestamp=t
    )
    answer = write(
        gateway,
        tenant,
        [
            WriteSeries({"__name__": "bad"}, [(t, 1.0)], histograms=[bad_count, negative_threshold]),
            WriteSeries({"__name__": "huge"}, histograms=[WriteHistogram(t, million)]),
            WriteSeries({"__name__": "good"}, histograms=[at(HISTOGRAM, t)]),
        ],
        version=2,
    )
    assert answer.status == 400, answer.body
    assert answer.body.startswith(b"3 of 4 native histograms rejected: series 0: invalid native histogram at ")
    assert b"3 observations found in buckets, but the count is 5" in answer.body
    assert b"the zero threshold must be a number >= 0, not -1.0" in answer.body
    assert f"series 1: invalid native histogram at {t}: 1000000 buckets, over the limit of 160".encode() in answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Histograms-Written"] == "1"
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"
    (found,) = stored(read_samples(gateway, tenant, [ReadQuery(t - 1, t + 1, [Matcher("RE", "__name__", ".+")])]))
    assert found == [({"__name__": "bad"}, [(t, 1.0)], []), ({"__name__": "good"}, [], [at(HISTOGRAM, t).data])]
    metrics = gateway.get("/metrics").body.decode()
    assert 'tsgate_native_histograms_rejected_total{protocol="prometheus",reason="invalid_histogram"} 2.0' in metrics
    assert 'tsgate_native_histograms_rejected_total{protocol="prometheus",reason="too_many_buckets"} 1.0' in metrics


def test_custom_bounds_are_held_to_the_bucket_limit(start_gateway, tenant):
    """A million custom bounds (8 MB a sample) are refused by their number, as many buckets are,
    with a 400 naming the limit; the series beside it, with 160 bounds, is written."""
    gateway = start_gateway("--max-native-histogram-buckets", "160")
    t = now_ms() - 1000
    answer = write(
        gateway,
        tenant,
        [
            WriteSeries({"__name__": "huge"}, histograms=[WriteHistogram(t, custom_bounds(10**6, t))]),
            WriteSeries({"__name__": "good"}, histograms=[WriteHistogram(t, custom_bounds(160, t))]),
        ],
        version=2,
    )
    assert answer.status == 400, answer.body
    assert answer.body.startswith(
        f"1 of 2 native histograms rejected: series 0: invalid native histogram at {t}: "
        "1000000 custom bounds, over the limit of 160".encode()
    )
    assert answer.headers["X-Prometheus-Remote-Write-Histograms-Written"] == "1"
    (found,) = stored(read_samples(gateway, tenant, [ReadQuery(t - 1, t + 1, [Matcher("RE", "__name__", ".+")])]))
    assert found == [({"__name__": "good"}, [], [custom_bounds(160, t)])]
    assert (
        'tsgate_native_histograms_rejected_total{protocol="prometheus",reason="too_many_buckets"} 1.0'
        in gateway.get("/metrics").body.decode()
    )


def test_a_too_old_histogram_is_refused_alone(start_gateway, backend_args, tenant):
    gateway = start_gateway(*backend_args, "--max-sample-age", "1d")
    t = now_ms() - 1000
    answer = write(
        gateway,
        tenant,
        [WriteSeries({"__name__": "late"}, histograms=[at(HISTOGRAM, t), at(HISTOGRAM, 1000)])],
        version=2,
    )
    assert (
        answer.status == 400
        and b"1 of 2 native histograms rejected: timestamp: 1000 ms is older than the accepted window" in answer.body
    )
    assert answer.headers["X-Prometheus-Remote-Write-Histograms-Written"] == "1"
    (found,) = stored(read_samples(gateway, tenant, [ReadQuery(0, t, [Matcher("EQ", "__name__", "late")])]))
    assert found == [({"__name__": "late"}, [], [at(HISTOGRAM, t).data])]
    assert (
        'tsgate_native_histograms_rejected_total{protocol="prometheus",reason="too_old"} 1.0'
        in gateway.get("/metrics").body.decode()
    )


def test_remote_read_of_more_histograms_than_the_query_limit_is_422(start_gateway, tenant):
    gateway = start_gateway("--max-samples-per-query", "2")
    t = now_ms() - 60_000
    assert (
        write(
            gateway, tenant, [WriteSeries({"__name__": "h"}, histograms=[at(HISTOGRAM, t + i) for i in range(3)])]
        ).status
        == 204
    )
    answer = post_read(gateway, tenant, [ReadQuery(t, t + 1, [Matcher("EQ", "__name__", "h")])], [prometheus.SAMPLES])
    assert answer.status == 200
    answer = post_read(gateway, tenant, [ReadQuery(t, t + 2, [Matcher("EQ", "__name__", "h")])], [prometheus.SAMPLES])
    assert answer.status == 422 and b"more than 2 native histograms (--max-samples-per-query)" in answer.body
