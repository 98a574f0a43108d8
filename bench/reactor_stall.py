"""Does a large remote-write request stall the gateway? /healthz latency while such requests arrive
back to back, and their throughput.

The request is the heavy case of issue 23: --series series of --labels labels each (150,000 x 64:
1.7 MB snappy, 22.8 MB decoded, inside both body limits), one sample a series, remote write 2.0
(or --v1). The series are the same in every request (new timestamps), so the first request
also indexes them and the later ones show the steady cost. One connection sends --requests of
them back to back while another asks GET /healthz every --probe-ms; the table gives the
requests' times and the probe's latencies. The gateway runs on SQLite in a temporary directory,
or with --cassandra HOST:PORT on a fresh keyspace of that Cassandra (dropped at the end).

With --json the requests are native JSON writes (POST /api/write) of --series items with
--labels tags each instead (default 30,000 x 10: 7 MB, under --max-body-bytes). With --otlp they
are OTLP/HTTP protobuf export requests (POST /otlp/v1/metrics) of one cumulative sum of --series
data points with a start time and five attributes each, as bench.otlp sends (default 40,000:
5.3 MB), and with --otlp-json the same requests in OTLP's JSON encoding.

    python -m bench.reactor_stall                          # 150,000 x 64, v2, 4 requests
    python -m bench.reactor_stall --series 30000 --v1      # a quicker look
    python -m bench.reactor_stall --json                   # 30,000 x 10, native JSON
    python -m bench.reactor_stall --otlp --requests 3      # 40,000 counter points, OTLP protobuf
    python -m bench.reactor_stall --otlp-json --requests 3 # the same in OTLP JSON
    python -m bench.reactor_stall --series 20000 --v1 --cassandra 127.0.0.1:9142
"""

import argparse
import contextlib
import http.client
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from bench.common import connect, exit_with, fresh_keyspace, post_until_accepted, tree_cpu_s, tsgate_service
from bench.otlp import otlp_body
from gateway.app.config import parse_hostport
from protocols.prometheus import WriteSeries, encode_write_request_v1, encode_write_request_v2
from protocols.prometheus.write import V2_CONTENT_TYPE


def request_body(series: int, labels: int, timestamp_ms: int, v1: bool) -> bytes:
    """One sample of each series; the series differ in one label, the others repeat (as
    Kubernetes pods' labels do), so the body is as small as issue 23's."""
    common = {f"label_{i:02d}": f"value_{i}" for i in range(labels - 2)}
    batch = [
        WriteSeries({"__name__": "stall_probe", "series": str(n), **common}, [(timestamp_ms, float(n))])
        for n in range(series)
    ]
    return encode_write_request_v1(batch) if v1 else encode_write_request_v2(batch)


def json_body(series: int, labels: int, timestamp_ms: int) -> bytes:
    """The same series as a native JSON write: an item a series, ``labels - 1`` tags."""
    common = {f"label_{i:02d}": f"value_{i}" for i in range(labels - 2)}
    items = [
        {"metricName": "stall_probe", "tags": {"series": str(n), **common}, "ts": timestamp_ms, "value": float(n)}
        for n in range(series)
    ]
    return json.dumps(items).encode()


def otlp_json_body(protobuf_body: bytes) -> bytes:
    """An OTLP protobuf request in OTLP's JSON encoding (it carries no trace or span ids, the
    one place where OTLP JSON and protobuf's JSON mapping differ)."""
    return json_format.MessageToJson(ExportMetricsServiceRequest.FromString(protobuf_body), indent=None).encode()


class Prober(threading.Thread):
    """GET /healthz every ``interval_s`` on its own keep-alive connection; latencies in seconds."""

    def __init__(self, port: int, interval_s: float):
        super().__init__(daemon=True)
        self.port, self.interval_s = port, interval_s
        self.latencies: list[tuple[float, float]] = []  # (when it was sent, how long the answer took)
        self.stop = threading.Event()

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        while not self.stop.is_set():
            started = time.perf_counter()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            self.latencies.append((started, time.perf_counter() - started))
            self.stop.wait(self.interval_s)
        connection.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, help="series a request (150,000; 30,000 with --json)")
    parser.add_argument("--labels", type=int, help="labels a series, __name__ included (64; 10 with --json)")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--probe-ms", type=float, default=10)
    parser.add_argument("--v1", action="store_true", help="remote write 1.0 instead of 2.0")
    parser.add_argument("--json", action="store_true", help="native JSON writes instead of remote write")
    parser.add_argument("--otlp", action="store_true", help="OTLP/HTTP protobuf counters instead of remote write")
    parser.add_argument("--otlp-json", action="store_true", help="OTLP/HTTP JSON counters instead of remote write")
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="a fresh keyspace of this Cassandra, not SQLite")
    args = parser.parse_args(argv)
    otlp = args.otlp or args.otlp_json
    args.series = args.series or (40_000 if otlp else 30_000 if args.json else 150_000)
    args.labels = args.labels or (8 if otlp else 10 if args.json else 64)
    now_ms = int(time.time() * 1000)
    if otlp:
        start_ms = now_ms - 60_000
        bodies = [otlp_body("stall_probe", "counter", args.series, i, start_ms) for i in range(args.requests)]
        content_type, form = "application/x-protobuf", "OTLP protobuf"
        if args.otlp_json:
            bodies = [otlp_json_body(body) for body in bodies]
            content_type, form = "application/json", "OTLP JSON"
        path, headers, accepted = "/otlp/v1/metrics", {"Content-Type": content_type}, 200
    elif args.json:
        bodies = [json_body(args.series, args.labels, now_ms - 60_000 + i) for i in range(args.requests)]
        path, headers, accepted, form = "/api/write", {"Content-Type": "application/json"}, 200, "JSON"
    else:
        bodies = [request_body(args.series, args.labels, now_ms - 60_000 + i, args.v1) for i in range(args.requests)]
        content_type = "application/x-protobuf" if args.v1 else V2_CONTENT_TYPE
        path, headers, accepted = "/api/v1/write", {"Content-Encoding": "snappy", "Content-Type": content_type}, 204
        form = "snappy"
    print(
        f"{args.requests} requests of {args.series} series x {args.labels} labels, {len(bodies[0]) / 1e6:.2f} MB {form}"
    )
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-stall-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        store = ["--data-dir", str(workdir / "data")]
        if args.cassandra:
            host, port = parse_hostport(args.cassandra)
            cluster = connect(host, port)
            stack.callback(cluster.shutdown)
            keyspace = f"tsgate_bench_stall_{os.getpid()}"
            store = ["--store", stack.enter_context(fresh_keyspace(cluster.connect(), host, port, keyspace))]
        service = tsgate_service(
            f"tsgate ({'cassandra' if args.cassandra else 'sqlite'})",
            store,
            workdir / "tsgate.log",
            ["--max-inflight-samples", str(10 * args.series), "--metadata-cache-size", str(2 * args.series)],
        )
        stack.callback(service.stop)
        service.start()
        measure(args, service, bodies, path, headers, accepted)
    return 0


def measure(args: argparse.Namespace, service, bodies: list[bytes], path: str, headers: dict, accepted: int) -> None:
    """Send the requests while the prober asks /healthz; print the table, and the gateway's CPU."""
    port = service.port
    prober = Prober(port, args.probe_ms / 1000)
    prober.start()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    spans, cpu = [], []
    for body in bodies:
        started, cpu_before = time.perf_counter(), tree_cpu_s(service.pid)
        post_until_accepted(connection, path, body, headers, accepted)
        spans.append((started, time.perf_counter()))
        cpu.append(tree_cpu_s(service.pid) - cpu_before)
    prober.stop.set()
    prober.join()
    times = [end - start for start, end in spans]
    print(f"request times (s): {', '.join(f'{t:.2f}' for t in times)}")
    print(f"gateway CPU a request (s, the prober's requests included): {', '.join(f'{c:.2f}' for c in cpu)}")
    steady = times[1:] or times
    print(f"samples/s after the first request: {args.series * len(steady) / sum(steady):,.0f}")
    phases = [("first request (new series)", spans[:1]), ("later requests (known series)", spans[1:])]
    for name, phase in phases:
        latencies = [took for sent, took in prober.latencies if any(start <= sent < end for start, end in phase)]
        if not latencies:
            continue
        print(
            f"/healthz during the {name}, {len(latencies)} probes: p50 {statistics.median(latencies) * 1000:.1f}"
            f" ms, p99 {percentile(latencies, 0.99) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
        )


if __name__ == "__main__":
    exit_with(main)
