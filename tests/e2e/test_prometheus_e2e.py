"""A real Prometheus 2.42 remote-writes into tsgate; a second one reads back through remote read.
Both must answer the same queries the same way. Runs on both backends.

The tenant travels as ``?tenant=`` in the URLs: Debian's Prometheus 2.42 does not send the
``headers`` configured for remote write (checked: a capture shows none of them).
"""

import http.server
import struct
import threading
import time
import urllib.parse

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from gateway.app.devservices.process import free_port
from protocols.prometheus import Matcher, ReadQuery
from tests.e2e.test_exemplars_e2e import read_samples
from tests.prometheusproc import PrometheusProcess

WRITER = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs: [{targets: ["127.0.0.1:SELF_PORT"]}]
  - job_name: exporter
    static_configs: [{targets: ["127.0.0.1:EXPORTER_PORT"]}]
remote_write:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/write?tenant=TENANT
    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s}
    metadata_config: {send: true, send_interval: 2s}
    send_exemplars: true
    send_native_histograms: true
"""

READER = """
global:
  scrape_interval: 1m
remote_read:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/read?tenant=TENANT
    read_recent: true
"""

INSTANT_QUERIES = [
    "tsgate_e2e_requests_total",
    "rate(tsgate_e2e_requests_total[5s])",
    "tsgate_e2e_temperature_celsius",
    "up",
    "sum by (job) (up)",
    'prometheus_http_requests_total{handler="/metrics"}',
    'count({__name__=~"prometheus_tsdb_head_.*"})',
    'tsgate_e2e_requests_total{path=~"/a|/b"}',
    'tsgate_e2e_requests_total{path!="/a"}',
]


def configured(template: str, **values) -> str:
    for key, value in values.items():
        template = template.replace(key, str(value))
    return template


def canonical(answer: dict):
    assert answer["status"] == "success", answer
    data = answer["data"]
    return data["resultType"], sorted(
        (sorted(item["metric"].items()), item.get("value") or item.get("values")) for item in data["result"]
    )


def wait_for_first_scrape(prometheus, timeout: float = 30) -> None:
    """Prometheus applies scrape targets only after a 5 s discovery throttle."""
    deadline = time.monotonic() + timeout
    while not prometheus.api("/api/v1/query", query="tsgate_e2e_requests_total")["data"]["result"]:
        assert time.monotonic() < deadline, "the writer Prometheus never scraped the exporter"
        time.sleep(0.5)


@pytest.fixture
def exporter():
    """A small exporter whose counter and gauge change while Prometheus scrapes it; each increment of
    /a carries an exemplar (a new trace id), which Prometheus sees over OpenMetrics."""
    registry = CollectorRegistry()
    requests = Counter("tsgate_e2e_requests", "Requests served.", ["path"], registry=registry)
    temperature = Gauge("tsgate_e2e_temperature", "Room temperature.", ["room"], unit="celsius", registry=registry)
    port = free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry)
    stop = threading.Event()

    def churn():
        tick = 0
        while not stop.wait(0.3):
            tick += 1
            requests.labels("/a").inc(exemplar={"trace_id": f"{tick:016x}"})
            requests.labels("/b").inc(tick % 3)
            temperature.labels("lab").set(20 + tick % 7 + 0.25)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    yield port
    stop.set()
    server.shutdown()


def test_real_prometheus_round_trip(start_gateway, backend_args, exporter, tmp_path, tenant):
    gateway = start_gateway(*backend_args)
    values = dict(GATEWAY_PORT=gateway.port, EXPORTER_PORT=exporter, TENANT=tenant)
    writer = PrometheusProcess(tmp_path / "writer", configured(WRITER, **values)).start()
    reader = PrometheusProcess(tmp_path / "reader", configured(READER, **values)).start()
    try:
        wait_for_first_scrape(writer)
        time.sleep(6)
        at = int(time.time()) - 2
        deadline = time.monotonic() + 45
        while True:
            mismatches = []
            for query in INSTANT_QUERIES:
                expected = canonical(writer.api("/api/v1/query", query=query, time=at))
                got = canonical(reader.api("/api/v1/query", query=query, time=at))
                assert expected[1], f"{query} has no result in the writer"
                if got != expected:
                    mismatches.append((query, expected, got))
            expected = canonical(
                writer.api("/api/v1/query_range", query="tsgate_e2e_temperature_celsius", start=at - 6, end=at, step=1)
            )
            got = canonical(
                reader.api("/api/v1/query_range", query="tsgate_e2e_temperature_celsius", start=at - 6, end=at, step=1)
            )
            if got != expected:
                mismatches.append(("range", expected, got))
            if not mismatches or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert mismatches == []
        metadata = gateway.get("/api/v1/metadata?metric=tsgate_e2e_requests", headers={"X-Scope-OrgID": tenant}).json()
        assert metadata["data"]["tsgate_e2e_requests"] == [{"type": "counter", "help": "Requests served.", "unit": ""}]
        native = gateway.get(
            "/api/query?metricName=tsgate_e2e_temperature_celsius&start=1m-ago", headers={"X-Scope-OrgID": tenant}
        ).json()
        assert native and native[0]["tags"]["room"] == "lab"
        target = "seriesByTag('name=tsgate_e2e_temperature_celsius','room=lab')"
        rendered = gateway.get(f"/render?target={target}&from=-2min&format=json&tenant={tenant}").json()
        assert rendered[0]["tags"] == {
            "name": "tsgate_e2e_temperature_celsius",
            "room": "lab",
            "job": "exporter",
            "instance": f"127.0.0.1:{exporter}",
        }
        assert any(value is not None for value, _ in rendered[0]["datapoints"])
    finally:
        writer.stop()
        reader.stop()
    assert "Traceback" not in gateway.log()


def test_graphite_style_names_read_back_through_real_prometheus(start_gateway, backend_args, tmp_path, tenant):
    gateway = start_gateway(*backend_args)
    now = int(time.time())
    batch = [
        {"metricName": "servers.web-1.cpu.idle", "tags": {"dc": "x"}, "ts": now - 10 + i, "value": float(i)}
        for i in range(5)
    ]
    assert gateway.post("/api/write", batch, headers={"X-Scope-OrgID": tenant}).status == 200
    reader = PrometheusProcess(
        tmp_path / "reader", configured(READER, GATEWAY_PORT=gateway.port, TENANT=tenant)
    ).start()
    try:
        answer = reader.api("/api/v1/query", query="servers_web_1_cpu_idle", time=now - 6)
        assert answer["status"] == "success", answer
        assert [(r["metric"], r["value"][1]) for r in answer["data"]["result"]] == [
            ({"__name__": "servers_web_1_cpu_idle", "dc": "x"}, "4")
        ]
        regex = reader.api("/api/v1/query", query='{__name__=~"servers_.*", dc="x"}', time=now - 6)
        assert len(regex["data"]["result"]) == 1
    finally:
        reader.stop()


def canonical_exemplars(answer: dict) -> list:
    assert answer["status"] == "success", answer
    return sorted((sorted(item["seriesLabels"].items()), item["exemplars"]) for item in answer["data"])


def test_real_prometheus_sends_exemplars_and_both_answer_alike(gateways, exporter, tmp_path, tenant):
    """Prometheus 2.42 with exemplar storage scrapes exemplars and remote-writes them to a gateway
    on each store (send_exemplars); each one's /api/v1/query_exemplars then answers what
    Prometheus's own does."""
    config = writer_config(gateways.values(), exporter, tenant)
    writer = PrometheusProcess(tmp_path / "writer", config, "--enable-feature=exemplar-storage").start()
    try:
        query = 'rate(tsgate_e2e_requests_total{path="/a"}[1m])'
        deadline = time.monotonic() + 60
        while True:
            end = time.time() - 3
            params = {"query": query, "start": end - 30, "end": end}
            expected = canonical_exemplars(writer.api("/api/v1/query_exemplars", **params))
            got = {
                store: canonical_exemplars(
                    gateway.get(
                        "/api/v1/query_exemplars?" + urllib.parse.urlencode(params),
                        headers={"X-Scope-OrgID": tenant},
                    ).json()
                )
                for store, gateway in gateways.items()
            }
            if expected and len(expected[0][1]) >= 5 and all(answer == expected for answer in got.values()):
                break
            assert time.monotonic() < deadline, (expected, got)
            time.sleep(1)
        labels, exemplars = expected[0]
        assert dict(labels)["job"] == "exporter" and exemplars[0]["labels"]["trace_id"] and exemplars[0]["value"] == "1"
    finally:
        writer.stop()
    assert not [store for store, gateway in gateways.items() if "Traceback" in gateway.log()]


# The exposition format Prometheus 2.42 scrapes native histograms in (io.prometheus.client, metrics.proto).
PROTOBUF_EXPOSITION = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    if wire_type == 2:
        payload = _varint(len(payload)) + payload
    return _varint(number << 3 | wire_type) + payload


def native_histogram_family(name: str, observations: int) -> bytes:
    """A delimited MetricFamily holding one native histogram: schema 0, zero threshold 0.001,
    ``observations`` observations of 1.5 (bucket 1 of schema 0: (1, 2]) plus one of 0."""
    span = _field(1, 0, _varint(2)) + _field(2, 0, _varint(1))  # offset (sint32 1), length 1
    histogram = (
        _field(1, 0, _varint(observations + 1))  # sample_count
        + _field(2, 1, struct.pack("<d", 1.5 * observations))  # sample_sum
        + _field(5, 0, _varint(0))  # schema (sint32 0)
        + _field(6, 1, struct.pack("<d", 0.001))  # zero_threshold
        + _field(7, 0, _varint(1))  # zero_count
        + _field(12, 2, span)  # positive_span
        + _field(13, 2, _varint(observations * 2))  # positive_delta (sint64, zigzag)
    )
    return histogram_family(name, "Latency.", histogram)


def histogram_family(name: str, help_text: str, histogram: bytes) -> bytes:
    """A delimited MetricFamily of type HISTOGRAM holding one metric with ``histogram``."""
    family = (
        _field(1, 2, name.encode())
        + _field(2, 2, help_text.encode())
        + _field(3, 0, _varint(4))
        + _field(4, 2, _field(7, 2, histogram))
    )
    return _varint(len(family)) + family


def serve_histograms(family) -> tuple[http.server.ThreadingHTTPServer, int]:
    """An exporter of ``family(scrape number)`` over the protobuf exposition format; its port."""
    scrapes = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            scrapes.append(1)
            body = family(len(scrapes))
            self.send_response(200)
            self.send_header("Content-Type", PROTOBUF_EXPOSITION)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def writer_config(gateways, exporter_port: int, tenant: str) -> str:
    """WRITER scraping the exporter and remote-writing ``tenant`` to each gateway."""
    scraping, sending = WRITER.split("remote_write:\n")
    config = configured(scraping, EXPORTER_PORT=exporter_port) + "remote_write:\n"
    return config + "".join(configured(sending, GATEWAY_PORT=gateway.port, TENANT=tenant) for gateway in gateways)


def histogram_writer(gateways, exporter_port: int, tmp_path, tenant: str) -> PrometheusProcess:
    """A Prometheus with native histograms on, scraping the exporter and remote-writing to each gateway."""
    config = writer_config(gateways, exporter_port, tenant)
    return PrometheusProcess(tmp_path / "writer", config, "--enable-feature=native-histograms").start()


def received_histograms(gateway, tenant: str, name: str, at_least: int, timeout: float):
    """tsgate's remote-read answer for ``name`` once it holds ``at_least`` native histograms."""
    query = ReadQuery(0, int(time.time() * 1000) + 600_000, [Matcher("EQ", "__name__", name)])
    deadline = time.monotonic() + timeout
    while True:
        (result,) = read_samples(gateway, tenant, [query]).results
        if sum(len(series.histograms) for series in result.timeseries) >= at_least:
            return result
        assert time.monotonic() < deadline, f"tsgate never received {at_least} native histograms"
        time.sleep(1)


@pytest.fixture
def native_exporter():
    """Serves one native histogram, one more observation a scrape."""
    server, port = serve_histograms(lambda scrape: native_histogram_family("tsgate_e2e_latency_seconds", scrape))
    yield port
    server.shutdown()


def test_real_prometheus_sends_native_histograms_and_reads_agree(gateways, native_exporter, tmp_path, tenant):
    """Prometheus 2.42 with native histograms scrapes one and remote-writes it to a gateway on each
    store (send_native_histograms); each one's remote read gives it back with the count and sum
    Prometheus's own query API shows at the same timestamp, and the exporter's buckets."""
    writer = histogram_writer(gateways.values(), native_exporter, tmp_path, tenant)
    try:
        for store, gateway in gateways.items():
            result = received_histograms(gateway, tenant, "tsgate_e2e_latency_seconds", 3, 60)
            histograms = [h for series in result.timeseries for h in series.histograms]
            (series,) = result.timeseries
            assert {label.name: label.value for label in series.labels}["job"] == "exporter" and not series.samples
            for histogram in histograms:
                at = histogram.timestamp / 1000
                (own,) = writer.api("/api/v1/query", query="tsgate_e2e_latency_seconds", time=at)["data"]["result"]
                assert (
                    own["histogram"][1]["count"] == str(histogram.count_int)
                    and float(own["histogram"][1]["sum"]) == histogram.sum
                ), store
                observations = histogram.count_int - 1
                assert (histogram.schema, histogram.zero_threshold, histogram.zero_count_int) == (0, 0.001, 1)
                assert [(s.offset, s.length) for s in histogram.positive_spans] == [(1, 1)] and list(
                    histogram.positive_deltas
                ) == [observations]
                for function in ("histogram_count", "histogram_sum"):
                    params = {"query": f"{function}(tsgate_e2e_latency_seconds)", "time": at}
                    expected = writer.api("/api/v1/query", **params)["data"]["result"]
                    got = gateway.get(
                        "/api/v1/query?" + urllib.parse.urlencode(params), headers={"X-Scope-OrgID": tenant}
                    ).json()["data"]["result"]
                    assert expected and got == expected, (store, function, got, expected)
    finally:
        writer.stop()
    assert not [store for store, gateway in gateways.items() if "Traceback" in gateway.log()]


def _packed(values: list[int]) -> bytes:
    """Packed sint64s (zigzag varints)."""
    return b"".join(_varint(v << 1 if v >= 0 else (-v << 1) - 1) for v in values)


def _spans(spans: list[tuple[int, int]], number: int) -> bytes:
    return b"".join(
        _field(
            number,
            2,
            _field(1, 0, _varint(offset << 1 if offset >= 0 else (-offset << 1) - 1)) + _field(2, 0, _varint(length)),
        )
        for offset, length in spans
    )


def restarting_histogram_family(name: str, scrape: int) -> bytes:
    """A delimited MetricFamily with a schema 1 native histogram that restarts every 8 scrapes:
    at m = 1..8, m in the zero bucket (threshold 0.01), m, 2m, 3m in buckets 0-2 and m in bucket 5
    (offset 2 after them), 2m in negative bucket 1; count 10m, sum 4.5m."""
    m = (scrape - 1) % 8 + 1
    positive = [m, 2 * m, 3 * m, m]
    histogram = (
        _field(1, 0, _varint(10 * m))
        + _field(2, 1, struct.pack("<d", 4.5 * m))
        + _field(5, 0, _varint(2))  # schema (sint32 1)
        + _field(6, 1, struct.pack("<d", 0.01))
        + _field(7, 0, _varint(m))
        + _spans([(1, 1)], 9)
        + _field(10, 2, _packed([2 * m]))
        + _spans([(0, 3), (2, 1)], 12)
        + _field(13, 2, _packed([b - a for a, b in zip([0] + positive, positive)]))
    )
    return histogram_family(name, "Sizes.", histogram)


@pytest.fixture
def restarting_exporter():
    """Serves the histogram of restarting_histogram_family, one scrape further each time."""
    server, port = serve_histograms(lambda scrape: restarting_histogram_family("tsgate_e2e_size_bytes", scrape))
    yield port
    server.shutdown()


HISTOGRAM_QUERIES = [
    "tsgate_e2e_size_bytes",
    "histogram_count(tsgate_e2e_size_bytes)",
    "histogram_sum(tsgate_e2e_size_bytes)",
    "sum by (job) (tsgate_e2e_size_bytes)",
    "histogram_count(sum(tsgate_e2e_size_bytes))",
    "count(tsgate_e2e_size_bytes)",
]
# Left out, 2.42 answering otherwise than Prometheus 3, which tsgate follows (docs/promql.rst;
# Prometheus 3.14's own test files, tests/query/test_promql_tier3.py, check them): range selectors and
# every function of a range (left-open windows: a sample exactly a range before the evaluation
# time, as 1 s scrapes give, is out; 3.x's extrapolation to the counter's zero point),
# histogram_quantile and histogram_fraction (exponential interpolation inside exponential
# buckets), irate/idelta of histograms (2.42 answers the float 0) and histogram * scalar (2.42
# answers the histogram unchanged); histogram_avg/stddev/stdvar are not in 2.42
# (test_promql_histograms.py checks them against Prometheus 3's formulas).


def _numbers(value, exact: bool):
    """The JSON with its number strings as floats: exact (tsgate's side), or approximate to 1e-9
    relative (Prometheus's side: rates are sums of products whose rounding depends on the order
    of operations, and 2.42's bucket bounds come from a table that is off by an ulp here and there)."""
    if isinstance(value, list):
        return [_numbers(item, exact) for item in value]
    if isinstance(value, dict):
        return {key: _numbers(item, exact) for key, item in value.items()}
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return number if exact else pytest.approx(number, rel=1e-9, abs=1e-12, nan_ok=True)
    return value


def test_real_prometheus_and_tsgate_agree_on_promql_over_native_histograms(
    gateways, restarting_exporter, tmp_path, tenant
):
    """Prometheus 2.42 scrapes a native histogram that restarts every 8 scrapes and remote-writes
    it to a gateway on each store; at the timestamps of the last samples each received, its PromQL
    answers (histogram JSON, counts, sums) equal Prometheus's own where 2.42 and 3 agree."""
    writer = histogram_writer(gateways.values(), restarting_exporter, tmp_path, tenant)
    try:
        for store, gateway in gateways.items():
            result = received_histograms(gateway, tenant, "tsgate_e2e_size_bytes", 20, 90)
            histograms = [h for series in result.timeseries for h in series.histograms]
            compared = 0
            for histogram in histograms[-3:]:
                for text in HISTOGRAM_QUERIES:
                    params = {"query": text, "time": histogram.timestamp / 1000}
                    expected = writer.api("/api/v1/query", **params)
                    got = gateway.get(
                        "/api/v1/query?" + urllib.parse.urlencode(params), headers={"X-Scope-OrgID": tenant}
                    ).json()
                    assert expected["status"] == "success" and expected["data"]["result"], (text, expected)
                    assert _numbers(got["data"], True) == _numbers(expected["data"], False), (
                        f"{store}: {text}\n{got}\n{expected}"
                    )
                    compared += 1
            assert compared == 3 * len(HISTOGRAM_QUERIES)
            end = histograms[-1].timestamp / 1000
            for text in ("tsgate_e2e_size_bytes", "histogram_count(tsgate_e2e_size_bytes)"):
                params = {"query": text, "start": end - 8, "end": end, "step": 0.5}
                expected = writer.api("/api/v1/query_range", **params)
                got = gateway.get(
                    "/api/v1/query_range?" + urllib.parse.urlencode(params), headers={"X-Scope-OrgID": tenant}
                ).json()
                result = expected["data"]["result"][0]
                assert expected["status"] == "success" and len(result.get("histograms") or result["values"]) == 17
                assert _numbers(got["data"], True) == _numbers(expected["data"], False), (
                    f"{store}: {text}\n{got}\n{expected}"
                )
    finally:
        writer.stop()
    assert not [store for store, gateway in gateways.items() if "Traceback" in gateway.log()]
