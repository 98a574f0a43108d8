"""No single request stalls the server: hostile regexes and globs, render and query budgets, pickle
frames that explode into samples. Each probe runs against a real gateway while /healthz requests
are sent concurrently; /healthz must keep answering fast (p99 under 100 ms)."""

import pickle
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from protocols import prometheus
from protocols.prometheus import Matcher, ReadQuery
from tests.gatewayproc import REPO, GatewayProcess, metric_value

# Catastrophic backtracking for Python's re (seconds to hours against A_NAME), linear for RE2.
PROBE_27 = "^" + "(a+)+" * 5 + "$"
PROBE_40 = "^" + "(a+)+" * 7 + "(a)$"
A_NAME = "a" * 40 + "b"
GLOB_PROBE = "*a" * 12 + "*b"  # against a name of 40 "a" and no "b"
HEALTHZ_P99_S = 0.1


# A gateway (tsgate serve, one process) that prints its collector's state once it serves, and stops.
SERVE_AND_REPORT_COLLECTOR = """
import gc, sys
from twisted.internet import reactor
from gateway.app import cli

def report():
    print(gc.get_threshold(), gc.get_freeze_count() > 0)
    reactor.stop()

reactor.callWhenRunning(reactor.callLater, 0.5, report)
sys.exit(cli.main(["serve", "--http", "127.0.0.1:0", "--graphite", "", "--pickle", "", "--query-executors", "0",
                   "--data-dir", sys.argv[1], "--log-level", "warning"]))
"""


def test_a_serving_gateway_runs_the_collector_with_raised_thresholds(tmp_path):
    """After start-up the gateway's objects are frozen and the young generation is 10,000 objects:
    full collector passes, which hold the GIL tens of ms during large writes, are rare (issue 23)."""
    result = subprocess.run(
        [sys.executable, "-c", SERVE_AND_REPORT_COLLECTOR, str(tmp_path / "data")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (0, "(10000, 10, 10) True\n"), result.stderr


def test_probes_have_the_lengths_of_the_issue():
    assert (len(PROBE_27), len(PROBE_40)) == (27, 40)


@pytest.fixture(scope="module")
def hostile_gateway(tmp_path_factory):
    """One embedded-store gateway holding series whose names make backtracking regexes explode."""
    gateway = GatewayProcess(tmp_path_factory.mktemp("reactor")).start()
    now = int(time.time())
    lines = (
        f"hostile.{A_NAME} 1 {now - 60}\nhostile.{'a' * 40}.x 1 {now - 60}\n"
        f"probe;host={A_NAME} 1 {now - 60}\nprobe;host=aaa 2 {now - 60}\n"
    )
    with socket.create_connection(("127.0.0.1", gateway.graphite_port), timeout=10) as connection:
        connection.sendall(lines.encode())
    deadline = time.monotonic() + 30
    while (
        gateway.get("/metrics/find?query=hostile.*").json() == []
        or len(gateway.get("/tags/findSeries?expr=name=probe").json()) < 2
    ):
        assert time.monotonic() < deadline, gateway.log()
        time.sleep(0.1)
    yield gateway
    gateway.stop()


def healthz_while(gateway, hostile, minimum: int = 60, clients: int = 4):
    """Run ``hostile()`` and, concurrently, /healthz requests until it is done (at least
    ``minimum`` of them); its answer, how long it took, and the /healthz latencies in seconds."""
    done = threading.Event()
    latencies = []

    def probe():
        while not done.is_set() or len(latencies) < minimum:
            started = time.perf_counter()
            assert gateway.get("/healthz", timeout=30).status == 200
            latencies.append(time.perf_counter() - started)

    with ThreadPoolExecutor(clients + 1) as pool:
        probes = [pool.submit(probe) for _ in range(clients)]
        started = time.perf_counter()
        try:
            answer = hostile()
        finally:
            elapsed = time.perf_counter() - started
            done.set()
        for future in probes:
            future.result()
    return answer, elapsed, latencies


def p99(latencies) -> float:
    return statistics.quantiles(latencies, n=100)[98]


def healthz_slow(gateway, latencies, during: str) -> str | None:
    """Why /healthz was too slow while the hostile request ran, or None: its p99 must stay under
    100 ms. On a loaded test machine /healthz alone is slower than on an idle one: its p99
    measured now (a few ms when idle) is added."""
    _, _, alone = healthz_while(gateway, lambda: None)
    if p99(latencies) < HEALTHZ_P99_S + p99(alone):
        return None
    return f"/healthz p99 {p99(latencies) * 1000:.0f} ms {during} ({p99(alone) * 1000:.0f} ms alone)"


def assert_healthz_fast(gateway, latencies, during: str) -> None:
    slow = healthz_slow(gateway, latencies, during)
    assert slow is None, slow


def assert_fast(gateway, hostile, budget_s: float = 1.0):
    """The hostile request is answered within ``budget_s``, /healthz p99 under 100 ms meanwhile.
    Most of these requests take a few ms, so the probes mostly measure the machine: one pause of
    the test machine (CI saw a single 130 ms one) fails the p99. A stall the request causes happens
    every time, so a slow /healthz is measured once more before it fails the test."""
    for attempt in range(2):
        answer, elapsed, latencies = healthz_while(gateway, hostile)
        assert elapsed < budget_s, f"the hostile request took {elapsed:.2f} s"
        slow = healthz_slow(gateway, latencies, "while it ran")
        if slow is None:
            return answer
        print(f"attempt {attempt + 1}: {slow}")
    raise AssertionError(slow)


def remote_read(gateway, pattern):
    now_ms = int(time.time() * 1000)
    query = ReadQuery(now_ms - 3_600_000, now_ms, [Matcher("EQ", "__name__", "probe"), Matcher("RE", "host", pattern)])
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    return gateway.post("/api/v1/read", prometheus.encode_read_request([query]), headers=headers)


def get(gateway, path, **params):
    return lambda: gateway.get(path + "?" + urllib.parse.urlencode(params), timeout=60)


@pytest.mark.parametrize("pattern", [PROBE_27, PROBE_40], ids=["27-chars", "40-chars"])
def test_remote_read_regex_matcher_is_linear(hostile_gateway, pattern):
    answer = assert_fast(hostile_gateway, lambda: remote_read(hostile_gateway, pattern))
    assert answer.status == 200, answer.body
    assert prometheus.decode_read_response(answer.body, 1 << 20) == [[]]


def test_remote_read_regex_that_re2_cannot_compile_is_400(hostile_gateway):
    answer = remote_read(hostile_gateway, r"(a)\1")
    assert answer.status == 400 and repr(r"(a)\1") in answer.json()["error"], answer.body


@pytest.mark.parametrize("pattern", [PROBE_27, PROBE_40], ids=["27-chars", "40-chars"])
def test_series_by_tag_regex_is_linear(hostile_gateway, pattern):
    target = f"seriesByTag('name=probe','host=~{pattern}')"
    answer = assert_fast(
        hostile_gateway, get(hostile_gateway, "/render", target=target, format="json", **{"from": "-1h"})
    )
    assert answer.status == 200 and answer.json() == [], answer.body
    answer = assert_fast(
        hostile_gateway, get(hostile_gateway, "/tags/findSeries", expr=["name=probe", f"host=~{pattern}"])
    )
    assert answer.status == 200 and answer.json() == [], answer.body


@pytest.mark.parametrize("pattern", [PROBE_27, PROBE_40], ids=["27-chars", "40-chars"])
def test_tag_filter_is_linear(hostile_gateway, pattern):
    answer = assert_fast(hostile_gateway, get(hostile_gateway, "/tags/host", filter=pattern))
    assert answer.status == 200 and answer.json() == {"tag": "host", "values": []}, answer.body
    answer = assert_fast(hostile_gateway, get(hostile_gateway, "/tags", filter=pattern))
    assert answer.status == 200 and answer.json() == [], answer.body


@pytest.mark.parametrize("pattern", [PROBE_27, PROBE_40], ids=["27-chars", "40-chars"])
def test_autocomplete_regex_is_linear(hostile_gateway, pattern):
    expressions = ["name=probe", f"host=~{pattern}"]
    answer = assert_fast(
        hostile_gateway, get(hostile_gateway, "/tags/autoComplete/values", tag="host", expr=expressions)
    )
    assert answer.status == 200 and answer.json() == [], answer.body
    answer = assert_fast(hostile_gateway, get(hostile_gateway, "/tags/autoComplete/tags", expr=expressions))
    assert answer.status == 200 and answer.json() == [], answer.body


@pytest.mark.parametrize("pattern", [PROBE_27, PROBE_40], ids=["27-chars", "40-chars"])
@pytest.mark.parametrize("function", ["grep", "exclude"])
def test_grep_and_exclude_are_linear(hostile_gateway, pattern, function):
    target = f"{function}(hostile.*,'{pattern}')"
    answer = assert_fast(
        hostile_gateway, get(hostile_gateway, "/render", target=target, format="json", **{"from": "-1h"})
    )
    assert answer.status == 200, answer.body
    assert [series["target"] for series in answer.json()] == ([] if function == "grep" else [f"hostile.{A_NAME}"])


def test_regex_functions_refuse_backreferences_with_400(hostile_gateway):
    for target in [r"grep(hostile.*,'(a)\1')", r"aliasSub(hostile.*,'(a)\1','x')", r"aliasSub(hostile.*,'(a)','\2')"]:
        answer = hostile_gateway.get("/render?" + urllib.parse.urlencode({"target": target, "from": "-1h"}))
        assert answer.status == 400, (target, answer.body)


def test_find_glob_is_linear(hostile_gateway):
    answer = assert_fast(hostile_gateway, get(hostile_gateway, "/metrics/find", query=f"hostile.{GLOB_PROBE}"))
    assert answer.status == 200 and [node["id"] for node in answer.json()] == [f"hostile.{A_NAME}"], answer.body
    answer = assert_fast(
        hostile_gateway,
        get(hostile_gateway, "/render", target=f"hostile.{GLOB_PROBE}.x", format="json", **{"from": "-1h"}),
    )
    assert answer.status == 200 and answer.json() == [], answer.body


def render(gateway, target, since, **params):
    return get(gateway, "/render", target=target, format="json", **{"from": since}, **params)


@pytest.mark.parametrize(
    "target",
    [
        "time('t',1)",
        "summarize(hostile.*,'1s')",
        "sinFunction('s',1,1)",
        "randomWalk('r',1)",
        "hitcount(time('t',60),'1s')",
    ],
)
def test_render_over_the_points_budget_is_422_before_the_work(hostile_gateway, target):
    answer = assert_fast(hostile_gateway, render(hostile_gateway, target, "-1y"))
    assert answer.status == 422 and "--max-points-per-query" in answer.json()["error"], answer.body


def test_render_reading_over_the_points_budget_is_422(start_gateway):
    gateway = start_gateway("--max-points-per-query", "1000")
    now = int(time.time())
    with socket.create_connection(("127.0.0.1", gateway.graphite_port), timeout=10) as connection:
        connection.sendall(f"budget.a 1 {now - 60}\nbudget.b 2 {now - 60}\n".encode())
    deadline = time.monotonic() + 30
    while len(gateway.get("/metrics/find?query=budget.*").json()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert render(gateway, "budget.*", "-5h")().status == 200  # 2 series x 300 points
    answer = render(gateway, "budget.*", "-1d")()  # 2 x 1440
    assert answer.status == 422 and "reading budget.*" in answer.json()["error"], answer.body
    for target in ["hitcount(budget.a,'1s')", "sinFunction('s',1,1)", "smartSummarize(budget.a,'1s')"]:
        answer = render(gateway, target, "-1h")()
        assert answer.status == 422 and "--max-points-per-query" in answer.json()["error"], (target, answer.body)


@pytest.mark.parametrize(
    "target",
    [
        "hitcount(time('t',60),'1s')",
        "sinFunction('s',1,1)",
        "smartSummarize(sinFunction('s',1,1),'2s')",
        "movingAverage(time('t',1),100)",
    ],
)
@pytest.mark.parametrize("max_data_points", ["", "1000"])
def test_heavy_render_under_the_budget_keeps_healthz_fast(hostile_gateway, target, max_data_points):
    """Thirty days of 1 s points (2.6 million) are computed and encoded off the reactor."""
    params = {"maxDataPoints": max_data_points} if max_data_points else {}
    answer, elapsed, latencies = healthz_while(hostile_gateway, render(hostile_gateway, target, "-30d", **params))
    assert answer.status == 200, answer.body
    assert len(answer.json()[0]["datapoints"]) >= (999 if max_data_points else 1_290_000)
    assert_healthz_fast(hostile_gateway, latencies, f"during a {elapsed:.1f} s render")


def write_samples(gateway, metric: str, series: int, per_series: int, tenant: str = "default"):
    """``series`` x ``per_series`` samples one second apart, ending a minute ago, by /api/write."""
    end = int(time.time()) - 60
    for index in range(series):
        for first in range(0, per_series, 50_000):
            items = [
                {"metricName": metric, "tags": {"s": str(index)}, "ts": end - per_series + offset, "value": offset}
                for offset in range(first, min(per_series, first + 50_000))
            ]
            answer = gateway.post("/api/write", items, headers={"X-Scope-OrgID": tenant}, timeout=120)
            assert answer.status == 200, answer.body


def test_api_query_over_the_points_budget_is_422(start_gateway):
    gateway = start_gateway("--max-points-per-query", "1000")
    write_samples(gateway, "budgeted", 2, 600)
    query = get(gateway, "/api/query", metricName="budgeted", start="1h-ago")
    answer = query()
    assert answer.status == 422 and "--max-points-per-query" in answer.json()["error"], answer.body
    answer = get(gateway, "/api/query", metricName="budgeted", tag="s=1", start="1h-ago")()
    assert answer.status == 200 and len(answer.json()[0]["values"]) == 600, answer.body


@pytest.fixture(scope="module")
def many_samples(hostile_gateway):
    """720,000 samples in 8 series of 90,000, one second apart: the issue's /api/query probe."""
    write_samples(hostile_gateway, "many", 8, 90_000)
    return hostile_gateway


def test_api_query_of_720k_samples_keeps_healthz_fast(many_samples):
    hostile_gateway = many_samples
    answer, elapsed, latencies = healthz_while(
        hostile_gateway, get(hostile_gateway, "/api/query", metricName="many", start="2d-ago")
    )
    assert answer.status == 200 and sum(len(series["values"]) for series in answer.json()) == 720_000
    assert_healthz_fast(hostile_gateway, latencies, f"during a {elapsed:.1f} s query")


def pickle_frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_pickle_frame_of_dup_opcodes_is_refused_and_legal_large_frames_keep_healthz_fast(hostile_gateway):
    now = int(time.time())
    item = pickle.dumps((f"dup{now}.a", (now - 30, 1.5)), protocol=2)[2:-1]
    dup = b"\x80\x02(" + item + b"2" * 1_000_000 + b"l."
    legal = [
        pickle.dumps(
            [(f"big{now}.s{i % 50}", (now - 86_400 + i // 50, float(i))) for i in range(first, first + 18_000)],
            protocol=2,
        )
        for first in range(0, 18_000, 18_000)
    ]
    good = pickle.dumps([(f"dup{now}.b", (now - 30, 2.5))], protocol=2)

    def send():
        with socket.create_connection(("127.0.0.1", hostile_gateway.pickle_port), timeout=30) as connection:
            for payload in [good, dup, *legal, good.replace(b".b", b".c")]:
                connection.sendall(pickle_frame(payload))
        deadline = time.monotonic() + 60
        while not get(hostile_gateway, "/api/query", metricName=f"dup{now}.c", start="1h-ago")().json():
            assert time.monotonic() < deadline
            time.sleep(0.05)

    _, elapsed, latencies = healthz_while(hostile_gateway, send)
    assert_healthz_fast(hostile_gateway, latencies, f"while decoding for {elapsed:.1f} s")
    rejected = 'tsgate_samples_rejected_total{protocol="graphite_pickle",reason="too_many_items"}'
    assert metric_value(hostile_gateway, rejected) == 1
    assert [
        len(series["values"])
        for series in get(hostile_gateway, "/api/query", metricName=f"dup{now}.a", start="1h-ago")().json()
    ] == []
    assert get(hostile_gateway, "/api/query", metricName=f"dup{now}.b", start="1h-ago")().json()[0]["values"]
    deadline = time.monotonic() + 60
    while len(get(hostile_gateway, "/metrics/find", query=f"big{now}.*")().json()) < 50:
        assert time.monotonic() < deadline, "the legal frames were not all stored"
        time.sleep(0.1)


@pytest.mark.parametrize("response_type", [prometheus.SAMPLES, prometheus.STREAMED_XOR_CHUNKS])
def test_remote_read_of_720k_samples_keeps_healthz_fast(many_samples, response_type):
    now_ms = int(time.time() * 1000)
    query = ReadQuery(now_ms - 2 * 86_400_000, now_ms, [Matcher("EQ", "__name__", "many")])
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    body = prometheus.encode_read_request([query], [response_type])
    answer, elapsed, latencies = healthz_while(
        many_samples, lambda: many_samples.post("/api/v1/read", body, headers=headers, timeout=120)
    )
    assert answer.status == 200, answer.body
    assert_healthz_fast(many_samples, latencies, f"during a {elapsed:.1f} s remote read")


def test_streamed_read_of_40k_native_histograms_keeps_healthz_fast(hostile_gateway):
    """Histogram chunks are encoded in pure Python (tens of microseconds a histogram): a large
    streamed read is encoded off the reactor."""
    from protocols.prometheus import WriteHistogram, WriteSeries, types_pb2

    now_ms = int(time.time() * 1000)
    start = now_ms - 10_001 * 1000
    for series in range(4):
        histograms = []
        for i in range(10_000):
            message = types_pb2.Histogram(
                count_int=20 * (i + 1),
                sum=1.5 * i,
                schema=3,
                positive_deltas=[i + 1] + [0] * 19,
                timestamp=start + i * 1000,
            )
            message.positive_spans.add(offset=0, length=20)
            histograms.append(WriteHistogram(message.timestamp, message.SerializeToString()))
        for first in range(0, 10_000, 2_500):
            body = prometheus.encode_write_request_v1(
                [
                    WriteSeries(
                        {"__name__": "many_histograms", "s": str(series)}, histograms=histograms[first : first + 2_500]
                    )
                ]
            )
            answer = hostile_gateway.post(
                "/api/v1/write", body, headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
            )
            assert answer.status == 204, answer.body
    query = ReadQuery(start, now_ms, [Matcher("EQ", "__name__", "many_histograms")])
    body = prometheus.encode_read_request([query], [prometheus.STREAMED_XOR_CHUNKS])
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    answer, elapsed, latencies = healthz_while(
        hostile_gateway, lambda: hostile_gateway.post("/api/v1/read", body, headers=headers, timeout=120)
    )
    assert answer.status == 200, answer.body
    assert sum(len(found) for *_, found in prometheus.decode_chunked_series(answer.body)) == 40_000
    assert_healthz_fast(hostile_gateway, latencies, f"during a {elapsed:.1f} s streamed read of histograms")
