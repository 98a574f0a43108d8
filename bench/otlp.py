"""OTLP ingest CPU per sample beside tsgate's own remote write of the same samples (issue 37's
target: within 1.5x), on SQLite and, with --cassandra HOST:PORT, on Cassandra.

One gateway process (``--workers 1``) takes, over keep-alive connections, --repeats runs of
--rounds requests of --series samples each, the two protocols in turn (the lowest CPU of each
is kept: a shared box's load weighs on both alike): OTLP/HTTP protobuf ExportMetricsServiceRequests (one resource with
``service.name`` and ``service.instance.id``, one metric of --series data points with five
attributes) and the remote write 1.0 requests of the very series and values the OTLP ones
become (``job``, ``instance``, the five labels), each protocol on its own series, rounds 10 s
apart. Every body is encoded before any clock starts; each protocol's series are written once
untimed first (known series, as a steady sender's), and the gateway is idle before each timed
run. "us/smp" is the gateway's CPU microseconds per acknowledged sample; "ratio" OTLP's over
remote write's. --kind counter sends monotonic sums with a start time (every point carries a created
timestamp, as remote write 1.0 cannot) instead of gauges.

    python -m bench.otlp                       # SQLite, gauges and counters
    python -m bench.otlp --cassandra 127.0.0.1:9142
"""

import argparse
import http.client
import shutil
import tempfile
import time
from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from bench.common import (
    BenchError,
    connect,
    exit_with,
    fresh_keyspace,
    post_until_accepted,
    tree_cpu_s,
    tsgate_service,
    wait_until_idle,
)
from protocols.prometheus import WriteSeries, encode_write_request_v1

ROUND_MS = 10_000
LABELS = ("pod", "namespace", "node", "zone", "path")


def _attributes(series: int) -> dict[str, str]:
    return {name: f"{name}-{series % (7 + i) if name != 'pod' else series}" for i, name in enumerate(LABELS)}


def otlp_body(metric: str, kind: str, series: int, round_: int, start_ms: int) -> bytes:
    timestamp_ns = (start_ms + round_ * ROUND_MS) * 1_000_000
    points = [
        m.NumberDataPoint(
            as_double=float(round_ + index),
            time_unix_nano=timestamp_ns,
            start_time_unix_nano=start_ms * 1_000_000 if kind == "counter" else 0,
            attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in _attributes(index).items()],
        )
        for index in range(series)
    ]
    if kind == "counter":
        data = {"sum": m.Sum(aggregation_temporality=2, is_monotonic=True, data_points=points)}
    else:
        data = {"gauge": m.Gauge(data_points=points)}
    resource = Resource(
        attributes=[
            KeyValue(key="service.name", value=AnyValue(string_value="bench")),
            KeyValue(key="service.instance.id", value=AnyValue(string_value="i1")),
        ]
    )
    request = ExportMetricsServiceRequest(
        resource_metrics=[
            m.ResourceMetrics(
                resource=resource, scope_metrics=[m.ScopeMetrics(metrics=[m.Metric(name=metric, **data)])]
            )
        ]
    )
    return request.SerializeToString()


def remote_write_body(metric: str, kind: str, series: int, round_: int, start_ms: int) -> bytes:
    name = f"{metric}_total" if kind == "counter" else metric
    timestamp = start_ms + round_ * ROUND_MS
    written = [
        WriteSeries(
            {"__name__": name, "instance": "i1", "job": "bench", **_attributes(index)},
            [(timestamp, float(round_ + index))],
        )
        for index in range(series)
    ]
    return encode_write_request_v1(written)


def post_all(service, path: str, headers: dict, bodies: list[bytes]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=120)
    try:
        for body in bodies:
            post_until_accepted(connection, path, body, headers, 200 if "otlp" in path else 204)
    finally:
        connection.close()


def cpu_per_sample(service, path: str, headers: dict, bodies: list[bytes], series: int) -> float:
    """CPU microseconds per sample the gateway spent on ``bodies``, from idle."""
    wait_until_idle(service.pid)
    before = tree_cpu_s(service.pid)
    post_all(service, path, headers, bodies)
    return (tree_cpu_s(service.pid) - before) * 1e6 / (series * len(bodies))


REMOTE_WRITE = "/api/v1/write"
OTLP = "/otlp/v1/metrics"
HEADERS = {
    REMOTE_WRITE: {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": "bench"},
    OTLP: {"Content-Type": "application/x-protobuf", "X-Scope-OrgID": "bench"},
}


def run(store_args: list[str], workdir: Path, series: int, rounds: int, repeats: int, kinds: list[str]) -> list[tuple]:
    """Per kind: the lowest CPU per sample of ``repeats`` runs of each protocol, the two taken
    in turn (a shared box's load then weighs on both alike)."""
    service = tsgate_service("tsgate", [*store_args, "--workers", "1"], workdir / "tsgate.log")
    service.start()
    rows = []
    try:
        wait_until_idle(service.pid)
        total = 1 + rounds * repeats
        start_ms = int(time.time() * 1000) - (total + 6) * ROUND_MS
        for kind in kinds:
            bodies = {
                REMOTE_WRITE: [remote_write_body(f"rw_{kind}", kind, series, r, start_ms) for r in range(total)],
                OTLP: [otlp_body(f"otlp_{kind}", kind, series, r, start_ms) for r in range(total)],
            }
            figures: dict = {REMOTE_WRITE: [], OTLP: []}
            for path, sent in bodies.items():  # the series, known from now on
                post_all(service, path, HEADERS[path], sent[:1])
            for repeat in range(repeats):
                for path, sent in bodies.items():
                    part = sent[1 + repeat * rounds : 1 + (repeat + 1) * rounds]
                    figures[path].append(cpu_per_sample(service, path, HEADERS[path], part, series))
            rw, otlp = min(figures[REMOTE_WRITE]), min(figures[OTLP])
            rows.append((kind, series, rounds * series, rw, otlp, otlp / rw))
    finally:
        service.stop()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="also measure on this Cassandra")
    parser.add_argument("--series", type=int, default=2000, help="samples a request (default 2000)")
    parser.add_argument("--rounds", type=int, default=30, help="requests a timed run (default 30)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs a protocol, the lowest kept (default 3)")
    parser.add_argument("--kind", action="append", choices=("gauge", "counter"), help="default: both")
    args = parser.parse_args(argv)
    kinds = args.kind or ["gauge", "counter"]
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-otlp-"))
    results = []
    try:
        results += [
            ("sqlite", *row)
            for row in run(
                ["--data-dir", str(workdir / "data")], workdir, args.series, args.rounds, args.repeats, kinds
            )
        ]
        if args.cassandra:
            host, _, port = args.cassandra.rpartition(":")
            cluster = connect(host, int(port))
            try:
                with fresh_keyspace(cluster.connect(), host, int(port), "tsgate_bench_otlp") as store_url:
                    rows = run(["--store", store_url], workdir, args.series, args.rounds, args.repeats, kinds)
                    results += [("cassandra", *row) for row in rows]
            finally:
                cluster.shutdown()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'store':<10} {'kind':<8} {'series':>6} {'samples':>8} {'rw us/smp':>10} {'otlp us/smp':>12} {'ratio':>6}")
    for store, kind, series, samples, rw, otlp, ratio in results:
        print(f"{store:<10} {kind:<8} {series:>6} {samples:>8} {rw:>10.2f} {otlp:>12.2f} {ratio:>6.2f}")
    if not results:
        raise BenchError("nothing measured")
    return 0


if __name__ == "__main__":
    exit_with(main)
