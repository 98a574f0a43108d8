"""Client mistakes answer 4xx naming the problem (or graphite-web's own answer), never 500 or a
dropped connection: one test per hostile probe of issue #12, against a real ``tsgate serve`` on
the embedded store."""

import sqlite3
import time
import urllib.parse

import pytest

from protocols import prometheus
from protocols.prometheus import Matcher, ReadQuery, WriteSeries
from tests.e2e.test_graphite_ingest_e2e import send_tcp, wait_for
from tests.gatewayproc import GatewayProcess, downsample_once

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_SERIES, MAX_SAMPLES = 3, 20


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """One gateway with small query limits and a few series: a.b.c, a.b.d, wide.0-3 (carbon),
    cpu{host=a} (JSON) and many{} with 30 samples (remote write)."""
    process = GatewayProcess(
        tmp_path_factory.mktemp("client-errors"),
        "--max-series-per-query",
        str(MAX_SERIES),
        "--max-samples-per-query",
        str(MAX_SAMPLES),
    ).start()
    now = int(time.time())
    lines = [f"a.b.c 1 {now - 60}", f"a.b.d 2 {now - 60}", *(f"wide.{i} {i} {now - 60}" for i in range(4))]
    send_tcp(process.graphite_port, ("\n".join(lines) + "\n").encode())
    assert (
        process.post("/api/write", [{"metricName": "cpu", "tags": {"host": "a"}, "ts": now - 60, "value": 1.5}]).status
        == 200
    )
    many = prometheus.encode_write_request_v1(
        [WriteSeries({"__name__": "many"}, [((now - 100 + i) * 1000, float(i)) for i in range(30)])]
    )
    headers = {
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    assert process.post("/api/v1/write", many, headers=headers).status == 204
    assert wait_for(lambda: b"a.b.d" in process.get("/metrics/find?query=a.b.*").body)
    yield process
    process.stop()


def get(gateway, path: str, **params):
    return gateway.get(path + "?" + urllib.parse.urlencode(params, doseq=True))


def render(gateway, **params):
    return get(gateway, "/render", **{"format": "json", "from": "-10min", **params})


def assert_client_error(answer, status: int, *words: str):
    assert answer.status == status, (answer.status, answer.body[:300])
    message = answer.json()["error"]
    for word in words:
        assert word in message, message


BIG = "9" * 5000


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/api/write", f'[{{"metricName": "cpu", "ts": {BIG}, "value": 1}}]', "ts"),
        ("/api/write", f'[{{"metricName": "cpu", "value": {BIG}}}]', "value"),
        ("/api/put", f'[{{"metric": "cpu", "timestamp": {BIG}, "value": 1}}]', "timestamp"),
        ("/api/write", '[{"metricName": "cpu", "value": 1e999}]', "value"),
        ("/api/write", '[{"metricName": "cpu", "value": "1e999"}]', "value"),
        ("/api/write", '[{"metricName": "cpu", "value": -Infinity}]', "value"),
        ("/api/write", '[{"metricName": "cpu", "value": NaN}]', "value"),
        ("/api/write", '[{"metricName": "cpu", "value": 1, "ts": 1e999}]', "ts"),
    ],
    ids=["int-ts", "int-value", "put-int-timestamp", "1e999", "1e999-string", "bare-Infinity", "bare-NaN", "1e999-ts"],
)
def test_json_numbers_out_of_range_refuse_the_item_naming_the_field(gateway, path, body, field):
    answer = gateway.post(path, body.encode())
    assert answer.status == 400, answer.body
    (reject,) = answer.json()["rejected"]
    assert reject["field"] == field and "out of range" in reject["error"]


def test_documented_non_finite_strings_are_still_accepted(gateway):
    now = int(time.time())
    items = [
        {"metricName": "special", "tags": {"v": text}, "ts": now - 30, "value": text}
        for text in ("NaN", "+Inf", "-Inf")
    ]
    assert gateway.post("/api/write", items).json() == {"accepted": 3, "rejected": []}


@pytest.mark.parametrize(
    "path, params, field",
    [
        ("/api/query", {"metricName": "cpu", "start": BIG}, "start"),
        ("/api/query", {"metricName": "cpu", "end": BIG}, "end"),
        ("/render", {"target": "a.b.c", "from": BIG}, "from"),
        ("/render", {"target": "a.b.c", "until": BIG}, "until"),
        ("/render", {"target": "a.b.c", "from": "01/01/99999999999999999999"}, "from"),
        ("/render", {"target": "a.b.c", "from": "-99999999999y"}, "from"),
    ],
    ids=["query-start", "query-end", "render-from", "render-until", "render-date", "render-offset"],
)
def test_huge_times_are_400(gateway, path, params, field):
    answer = get(gateway, path, **params)
    assert answer.status == 400, answer.body
    assert "sys.set_int_max_str_digits" not in answer.json()["error"]


@pytest.mark.parametrize(
    "params",
    [
        {"end": str(INT64_MAX)},
        {"end": "1e20"},
        {"start": str(INT64_MIN)},
        {"start": str(INT64_MIN), "end": str(INT64_MAX)},
    ],
    ids=["end-int64-max", "end-1e20", "start-int64-min", "both"],
)
def test_query_range_beyond_int64_is_clamped(gateway, params):
    answer = get(gateway, "/api/query", metricName="cpu", tag="host=a", **params)
    assert answer.status == 200, answer.body
    (found,) = answer.json()
    assert list(found["values"].values()) == [1.5]


@pytest.mark.parametrize("start, end", [(INT64_MIN, INT64_MAX), (INT64_MIN, 0), (INT64_MAX - 1, INT64_MAX)])
@pytest.mark.parametrize(
    "accepted", [[prometheus.SAMPLES], [prometheus.STREAMED_XOR_CHUNKS]], ids=["samples", "streamed"]
)
def test_remote_read_with_int64_extremes(gateway, start, end, accepted):
    query = ReadQuery(start, end, [Matcher("EQ", "__name__", "cpu")])
    body = prometheus.encode_read_request([query], accepted)
    answer = gateway.post(
        "/api/v1/read", body, headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    )
    assert answer.status == 200, answer.body
    if accepted == [prometheus.SAMPLES]:
        (result,) = prometheus.decode_read_response(answer.body, 1 << 20)
        points = [len(samples) for _, samples in result]
    else:
        points = [len(found) for _, _, found in prometheus.decode_chunked_read_response(answer.body)]
    assert points == ([1] if start < 0 < end else [])


@pytest.mark.parametrize(
    "target, problem",
    [
        ("sumSeries(" * 5000 + "a.b.c" + ")" * 5000, "nests calls deeper than 64 (--query-max-depth)"),
        ("a.b.c" + "|absolute()" * 5000, "more than 300 calls and arguments (--query-max-terms)"),
        ("a.b.c" + "|absolute()" * 65, "nests calls deeper than 64 (--query-max-depth)"),
        ("sumSeries(" * 65 + "a.b.c" + ")" * 65, "nests calls deeper than 64 (--query-max-depth)"),
        ("sumSeries(" + ",".join(["a.b.c"] * 300) + ")", "more than 300 calls and arguments (--query-max-terms)"),
    ],
    ids=["nested-5000", "piped-5000", "piped-65", "nested-65", "arguments-300"],
)
def test_deeply_nested_or_long_targets_are_400(gateway, target, problem):
    answer = gateway.post(
        "/render", urllib.parse.urlencode({"target": target, "format": "json"}).encode(), headers=FORM
    )
    assert_client_error(answer, 400, problem)


def test_nesting_up_to_the_limit_is_evaluated(gateway):
    target = "absolute(" * 64 + "a.b.c" + ")" * 64
    answer = gateway.post(
        "/render", urllib.parse.urlencode({"target": target, "format": "json", "from": "-10min"}).encode(), headers=FORM
    )
    assert answer.status == 200, answer.body
    assert [p[0] for p in answer.json()[0]["datapoints"] if p[0] is not None] == [1.0]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-5", BIG])
def test_bad_max_data_points_is_400(gateway, value):
    assert_client_error(render(gateway, target="a.b.c", maxDataPoints=value), 400, "maxDataPoints")


def test_huge_max_data_points_is_no_limit(gateway):
    answer = render(gateway, target="a.b.c", maxDataPoints="1e300")
    assert answer.status == 200 and len(answer.json()[0]["datapoints"]) == 10


@pytest.mark.parametrize(
    "query, found",
    [
        ("a.b.[z-a]", []),
        ("a.[]", []),
        ("[!]", []),
        ("a.b.[!z-a]", ["a.b.c", "a.b.d"]),
        ("a.b.[!c]", ["a.b.d"]),
        ("a.b.[]c]", ["a.b.c"]),
        ("a.b.[c-", []),
    ],
)
def test_glob_classes_follow_fnmatch_as_graphite_web(gateway, query, found):
    """graphite-web matches with fnmatch: a reversed range matches nothing, an unclosed ``[`` is a
    literal character."""
    answer = get(gateway, "/metrics/find", query=query, format="json")
    assert answer.status == 200, answer.body
    assert [node["path"] for node in answer.json()] == found
    rendered = render(gateway, target=query)
    assert rendered.status == 200, rendered.body
    assert [series["target"] for series in rendered.json()] == found


@pytest.mark.parametrize(
    "target",
    ["aliasByNode(a.b.c, inf)", "aliasByNode(a.b.c, 1, inf)", "groupByNode(a.b.*, inf)", "aliasByTags(a.b.c, inf)"],
)
def test_non_finite_node_is_400(gateway, target):
    assert_client_error(render(gateway, target=target), 400, "nodeOrTag")


@pytest.mark.parametrize("value", ["inf", "nan", BIG])
def test_non_finite_position_on_find_is_400(gateway, value):
    assert_client_error(
        get(gateway, "/metrics/find", query="a.b.*", format="nodelist", position=value), 400, "position"
    )


def test_map_series_alone_is_400(gateway):
    """graphite-web fails with a 500 (AttributeError) here; lists of series only feed reduceSeries."""
    assert_client_error(render(gateway, target="mapSeries(a.b.*, 1)"), 400, "reduceSeries")
    reduced = render(gateway, target="reduceSeries(mapSeries(a.b.*, 1), 'sumSeries', 2, 'c', 'd')")
    assert reduced.status == 200, reduced.body


def test_vertical_line_without_a_label_answers_as_graphite_web(gateway):
    """graphite-web 1.1.8 answers a series named None (target null, tag name "None") with one point."""
    at = int(time.time()) // 60 * 60 - 120
    answer = render(gateway, target=f"verticalLine('{at}')")
    assert answer.status == 200, answer.body
    assert answer.json() == [{"target": None, "tags": {"name": "None"}, "datapoints": [[1.0, at]]}]


@pytest.mark.parametrize(
    "target, status",
    [
        ("identity(1)", 400),  # a number where a string (the name) goes
        ("sinFunction(1.5)", 400),
        ("aliasByMetric(alias(a.b.c, 2))", 400),
        ("integralByInterval(a.b.c, '[z-a]')", 400),  # not an interval
        ("smartSummarize(a.b.c, '1min', 'sum', 'fortnight')", 400),
        ("scaleToSeconds(a.b.c, inf)", 400),
        ("add(a.b.c, inf)", 400),
        ("nPercentile(a.b.c, 1e300)", 400),
        ("averageOutsidePercentile(a.b.*, -1e300)", 400),
        ("time('t', 0)", 400),
        ("sinFunction('s', 1, -100)", 400),
        ("stdev(a.b.c, -1)", 400),
        ("log(a.b.c, 1)", 400),
        ("exponentialMovingAverage(a.b.c, -1)", 400),
        ("asPercent(a.b.*, 'name')", 400),
        ("asPercent(a.b.*, mapSeries(a.b.*, 1), 0)", 400),
        ("countSeries(None)", 400),
        ("groupByNode(a.b.*, 1, 'sumSeriesLists')", 400),
        ("aliasQuery(a.b.c, 'c', 'd', 'no placeholder')", 400),
        ("useSeriesAbove(a.b.*, 0, '(', 'x')", 400),
        ("timeShift(a.b.c, '99999999y', alignDst=true)", 400),
        ("timeShift(a.b.c, '99999999y')", 400),
        ("timeStack(a.b.c, '1min', 0, 9223372036854775807)", 422),
        ("hitcount(a.b.c, '99999999y')", 400),
        ("timeShift(a.b.c, '')", 200),
        ("exp(scale(a.b.c, 1000))", 200),  # e**1000 is +inf
        ("cactiStyle(scale(a.b.c, inf), 'si')", 200),
        ("aliasSub(verticalLine('-5min'), 'None', 'x')", 200),
        ("sumSeries(verticalLine('-5min'), a.b.c)", 200),
        ("substr(a.b.c, None)", 200),
        ("timeStack(a.b.c, None, None)", 200),
        ("averageOutsidePercentile(nothing.here, 50)", 200),
    ],
)
def test_function_arguments_that_used_to_fail_inside_a_function(gateway, target, status):
    """Bad arguments are a 400 naming the function or argument; values graphite-web's code
    cannot handle get an answer; nothing is an internal error."""
    answer = render(gateway, target=target)
    assert answer.status == status, answer.body[:300]
    if status != 200:
        assert "internal error" not in answer.json()["error"]


def test_regexes_nested_too_deeply_are_400(gateway):
    """Python's re compiles nested groups recursively: 1000 of them are a RecursionError."""
    deep = "(" * 1000
    assert_client_error(get(gateway, "/tags", filter=deep), 400, "regex")
    assert_client_error(get(gateway, "/tags/findSeries", expr=f"name=~{deep}"), 400, "regex")
    assert_client_error(render(gateway, target=f"grep(a.b.*, '{deep}')"), 400, "regular expression")
    query = ReadQuery(0, 1, [Matcher("RE", "__name__", deep)])
    body = prometheus.encode_read_request([query], [prometheus.SAMPLES])
    answer = gateway.post(
        "/api/v1/read", body, headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    )
    assert answer.status == 400 and b"regular expression" in answer.body


def test_url_over_16_kib_is_414_with_a_message(gateway):
    answer = gateway.get("/render?target=a.b.c&pad=" + "x" * 17_000)
    assert_client_error(answer, 414, "POST")
    assert gateway.get("/healthz").status == 200


def test_header_over_16_kib_is_431(gateway):
    assert_client_error(gateway.get("/healthz", headers={"X-Pad": "x" * 17_000}), 431, "header")


def test_render_over_the_series_limit_is_422(gateway):
    assert_client_error(render(gateway, target="wide.*"), 422, f"limit of {MAX_SERIES}")
    assert_client_error(render(gateway, target="sumSeries(wide.*)"), 422, f"limit of {MAX_SERIES}")


@pytest.mark.parametrize(
    "accepted",
    [[prometheus.SAMPLES], [prometheus.STREAMED_XOR_CHUNKS, prometheus.SAMPLES]],
    ids=["samples", "streamed"],
)
def test_remote_read_over_the_samples_limit_is_422(gateway, accepted):
    now_ms = int(time.time() * 1000)
    body = prometheus.encode_read_request(
        [ReadQuery(now_ms - 3_600_000, now_ms, [Matcher("EQ", "__name__", "many")])], accepted
    )
    answer = gateway.post(
        "/api/v1/read", body, headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    )
    assert answer.status == 422, answer.body
    assert b"--max-samples-per-query" in answer.body


def test_refused_carbon_samples_are_logged(gateway):
    """Samples the pipeline refuses (outside the time window) are logged, as decoder refusals are."""
    now = int(time.time())
    send_tcp(gateway.graphite_port, f"refused.old 1 1000\nrefused.future 1 {now + 86_400}\n".encode())
    assert wait_for(lambda: "refused.future" in gateway.log() and "refused.old" in gateway.log(), timeout=10), (
        gateway.log()[-2000:]
    )
    assert "too_old" in gateway.log() and "too_new" in gateway.log()


def test_an_error_that_is_not_the_targets_fault_is_a_logged_500(start_gateway, tmp_path):
    """A stored block that cannot be decoded is the gateway's problem, not a wrong target: 500
    with the traceback in the log."""
    data = ("--data-dir", str(tmp_path / "data"))
    gateway = start_gateway(*data)
    slot_start = (int(time.time()) // 3600 - 2) * 3600
    send_tcp(gateway.graphite_port, "".join(f"broken.block {i} {slot_start + 60 * i}\n" for i in range(5)).encode())
    assert wait_for(lambda: b"broken.block" in render(gateway, target="broken.block", **{"from": "-3h"}).body)
    assert "rolled up" in downsample_once(*data)
    with sqlite3.connect(tmp_path / "data" / "tsgate.db") as database:
        assert database.execute("UPDATE data_blocks SET block = x'00'").rowcount == 1
    answer = render(gateway, target="sumSeries(broken.block)", **{"from": "-3h"})
    assert answer.status == 500 and answer.json() == {"error": "internal error; see the gateway log"}
    assert "BadBlock" in gateway.log()


def test_nothing_above_was_a_500(gateway):
    """Run last in this module: the gateway logged no internal error for any probe."""
    assert "internal error" not in gateway.log() and "error answering" not in gateway.log()


@pytest.mark.parametrize("callback", ["a\r\nX-Injected: 1(", "alert(1)//", "cb[0]", "1cb", "cb;x", "<script>", "a..b"])
@pytest.mark.parametrize("path", ["/render?target=a.b.c&format=json&from=-10min", "/metrics/find?query=a.*"])
def test_a_jsonp_callback_that_is_not_a_javascript_name_is_400(gateway, path, callback):
    answer = gateway.get(f"{path}&jsonp={urllib.parse.quote(callback)}")
    assert_client_error(answer, 400, "jsonp", "JavaScript name")
    assert "X-Injected" not in answer.headers


@pytest.mark.parametrize("callback", ["cb", "jQuery_123", "$.ns.cb_2"])
def test_a_jsonp_callback_that_is_a_javascript_name_path_wraps_the_answer(gateway, callback):
    for path in ("/render?target=a.b.c&format=json&from=-10min", "/metrics/find?query=a.*"):
        answer = gateway.get(f"{path}&jsonp={urllib.parse.quote(callback)}")
        assert answer.status == 200 and answer.headers["Content-Type"] == "text/javascript", answer.body
        assert answer.body.startswith(callback.encode() + b"(") and answer.body.endswith(b")"), answer.body
