"""Seeded fuzzing, bounded in time: every parser in protocols/ raises only its documented error
types on random and mutated input, and no query parameter of any GET endpoint (nor a remote read
body, nor a PromQL query, mutated or built from templates over series of extreme values and native
histograms, with hostile times, steps and timeouts) of a real ``tsgate serve`` makes it answer 5xx.

The same seed gives the same inputs on every run; each part stops early at its time budget, so
the whole file stays under a minute and a half. The PromQL part runs longer, with another seed,
outside the suite: ``TSGATE_FUZZ_PROMQL_SECONDS=600 TSGATE_FUZZ_SEED=7 pytest tests/e2e/test_fuzz.py -k promql``.
"""

import json
import math
import os
import pickle
import random
import struct
import threading
import time
import urllib.parse

import pytest

from protocols import native_json, prometheus
from protocols.graphite import REJECT_REASONS, InvalidInput
from protocols.graphite.attime import parse_at_time, parse_time_offset
from protocols.graphite.pickle import PickleDecoder
from protocols.graphite.plaintext import PlaintextDecoder, decode_datagram
from protocols.graphite.tags import parse_path
from protocols.graphite.target import TargetSyntaxError, parse_target
from protocols.prometheus import Matcher, ReadQuery, WriteSeries
from protocols.timespec import BadTime, parse_time
from tests.e2e.test_graphite_ingest_e2e import send_tcp, wait_for
from tests.e2e.test_histograms_e2e import at
from tests.gatewayproc import GatewayProcess
from tests.protocols.test_prometheus_protocol import VALID_HISTOGRAMS

SEED = int(os.environ.get("TSGATE_FUZZ_SEED", "20261123"))
PARSER_ROUNDS = 3000  # mutations of each parser's seeds
PARSER_BUDGET_S = 12
# seconds of each HTTP part: the sweep of every GET parameter with every hostile value (about
# 4,000 requests, 9 s on a quiet 2-core box) then random mixes until its time is up; random
# targets; reads
GET_BUDGET_S, TARGET_BUDGET_S, READ_BUDGET_S = 20, 12, 5
MAP_REDUCE_BUDGET_S = 8  # reduceSeries(mapSeries(...)) compositions
NOW_MS = 1_795_000_000_000

HOSTILE_TEXT = [
    "",
    " ",
    "0",
    "-1",
    "1e20",
    "-1e20",
    "1e999",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "Infinity",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "9" * 5000,
    "0x10",
    "1.5",
    "-0",
    "\x00",
    "\u00e9\u00e8",
    "\U0001f600",
    "\u202e",
    "\ufeff",
    "a" * 3000,
    "[z-a]",
    "a.[]",
    "[!]",
    "{",
    "}",
    "{a,",
    "*",
    "**",
    "?",
    "[",
    "]",
    "\\",
    "'",
    '"',
    "(",
    ")",
    "a.b.c",
    "a.b.*",
    ";",
    "=",
    "a=b",
    "a=~",
    "a=~(",
    "a!=",
    "name=",
    "now",
    "-1h",
    "+1h",
    "01/01/99999999999999999999",
    "12:00_20261122",
    "-99999999999y",
    "1d2h3min",
    "teatime",
    "sumSeries(" * 300,
    ")" * 300,
    "(" * 1000,
    "%",
    "%00",
    "%ff",
    "true",
    "false",
    "None",
    ",",
    ".",
    "..",
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four random edits: flips, inserts, deletes, duplications, truncation, splices."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(7)
        position = rng.randrange(len(data) + 1)
        if choice == 0 and data:
            data[min(position, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif choice == 1:
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif choice == 2:
            del data[position : position + rng.randint(1, 16)]
        elif choice == 3:
            data[position:position] = data[position : position + rng.randint(1, 64)] * rng.randint(2, 50)
        elif choice == 4:
            del data[position:]
        elif choice == 5:
            data[position:position] = rng.choice(HOSTILE_TEXT).encode()
        else:
            data[position:position] = rng.choice([b"\n", b" ", b"\r\n", b"\x00", b"\xff", b"(", b")", b"'", b","])
    return bytes(data)


def inputs(rng: random.Random, seeds: list[bytes]):
    """The seeds, then PARSER_ROUNDS mutations of them and some plain random bytes."""
    yield from seeds
    for round_ in range(PARSER_ROUNDS):
        if round_ % 10 == 0:
            yield bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        else:
            yield mutate(rng, rng.choice(seeds))


def _plaintext(data: bytes, rng: random.Random):
    decoder = PlaintextDecoder(max_line_length=512)
    rejects = []
    cut = rng.randint(0, len(data))
    for part in (data[:cut], data[cut:]):
        rejects += decoder.feed(part, NOW_MS)[1]
    rejects += decoder.finish()
    rejects += decode_datagram(data, NOW_MS, 512)[1]
    assert {reject.reason for reject in rejects} <= REJECT_REASONS


def _pickle(data: bytes, rng: random.Random):
    decoder = PickleDecoder(max_frame_bytes=4096)
    cut = rng.randint(0, len(data))
    rejects = decoder.feed(data[:cut], NOW_MS)[1] + decoder.feed(data[cut:], NOW_MS)[1] + decoder.finish()
    assert {reject.reason for reject in rejects} <= REJECT_REASONS


def _frame(payload) -> bytes:
    body = pickle.dumps(payload, protocol=2)
    return struct.pack("!L", len(body)) + body


def _text(call, *args):
    def parse(data: bytes, rng: random.Random):
        return call(data.decode("utf-8", "replace"), *args)

    return parse


def _native(decode):
    def parse(data: bytes, rng: random.Random):
        decode(data, NOW_MS)

    return parse


def _remote_write(data: bytes, rng: random.Random):
    content_type = rng.choice([None, prometheus.V1_CONTENT_TYPE, prometheus.V2_CONTENT_TYPE])
    if rng.random() < 0.5:  # reach the protobuf decoder, not only snappy's
        data = prometheus.compress_block(data)
    prometheus.decode_write_request(data, content_type, "snappy", 1 << 20)


def _remote_read(data: bytes, rng: random.Random):
    if rng.random() < 0.5:
        data = prometheus.compress_block(data)
    request = prometheus.decode_read_request(data, 1 << 20)
    prometheus.negotiate_response_type(request.accepted_response_types)


def _read_request_raw(queries, accepted=()) -> bytes:
    return bytes(prometheus.decompress_block(prometheus.encode_read_request(queries, accepted), 1 << 20))


NOW_S = NOW_MS // 1000
TARGET_SEEDS = [
    "a.b.c",
    "sumSeries(a.*.c, b.{x,y}.[a-z]?)",
    "alias(scale(a.b, -1.5e3), 'x y')",
    'a.b|absolute()|alias("z")',
    "seriesByTag('name=cpu', 'host=~web.*')",
    "movingAverage(a.b, windowSize='5min', xFilesFactor=0.5)",
    "aliasByNode(a.b.c, 1, -1)",
    "cpu;host=a",
    "f(true, false, None, inf, 1, 2.5, 'q')",
]
PARSERS = {
    "plaintext": (_plaintext, (), [f"a.b.c 1.5 {NOW_S}\nx;t=v -2 -1\nbad\n".encode(), f"a 1 {NOW_S}\r\n\n\n".encode()]),
    "pickle": (
        _pickle,
        (),
        [_frame([("a.b", (NOW_S, 1.5)), ("c;t=v", (NOW_S, "2"))]) * 2, _frame([("a", [NOW_S, None])])],
    ),
    "target": (_text(parse_target), (TargetSyntaxError,), [t.encode() for t in TARGET_SEEDS]),
    "attime": (
        _text(parse_at_time, NOW_S),
        (ValueError,),
        [b"now-1h", b"12:00_20261122", b"01/01/99", b"jan1+2d", b"1795000000", b"monday-3w"],
    ),
    "time_offset": (_text(parse_time_offset), (ValueError,), [b"-1h", b"+2d12h", b"5min", b"-1mon"]),
    "timespec": (
        _text(parse_time, NOW_MS),
        (BadTime,),
        [b"now", b"5m-ago", b"2026-11-22T12:00:00Z", b"1795000000", b"1795000000000.5"],
    ),
    "tags": (_text(parse_path), (InvalidInput,), [b"cpu;host=a;dc=x", b'cpu{host="a", dc="b\\"c"}', b"a.b..c"]),
    "native_write": (
        _native(native_json.decode_write_batch),
        (native_json.BadRequest,),
        [
            json.dumps(
                [
                    {"metricName": "cpu", "tags": {"h": "a"}, "ts": NOW_S, "value": 1.5},
                    {"metricName": "m", "ts": "2026-11-22T12:00:00Z", "value": "NaN"},
                ]
            ).encode(),
        ],
    ),
    "native_single": (
        _native(native_json.decode_write_single),
        (native_json.BadRequest,),
        [b'{"metricName": "cpu", "ts": 1e3, "value": "+Inf"}'],
    ),
    "native_put": (
        _native(native_json.decode_put),
        (native_json.BadRequest,),
        [b'[{"metric": "m", "tags": {}, "timestamp": 1795000000000, "value": 2}]'],
    ),
    "remote_write": (
        _remote_write,
        (prometheus.RemoteWriteError,),
        [
            bytes(
                prometheus.decompress_block(
                    prometheus.encode_write_request_v1([WriteSeries({"__name__": "m", "a": "b"}, [(NOW_MS, 1.0)])]),
                    1 << 20,
                )
            ),
            bytes(
                prometheus.decompress_block(
                    prometheus.encode_write_request_v2([WriteSeries({"__name__": "m"}, [(NOW_MS, 2.0)])]), 1 << 20
                )
            ),
            prometheus.encode_write_request_v1([WriteSeries({"__name__": "m"}, [(NOW_MS, 1.0)])]),
        ],
    ),
    "remote_read": (
        _remote_read,
        (prometheus.RemoteReadError,),
        [
            _read_request_raw(
                [ReadQuery(0, NOW_MS, [Matcher("EQ", "__name__", "m"), Matcher("RE", "a", "b.*")])],
                [prometheus.STREAMED_XOR_CHUNKS],
            ),
            prometheus.encode_read_request(
                [ReadQuery(-(2**63), 2**63 - 1, [Matcher("NRE", "x", "")])], [prometheus.SAMPLES]
            ),
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parsers_raise_only_their_documented_errors(name):
    parse, allowed, seeds = PARSERS[name]
    rng = random.Random(f"{SEED}-{name}")
    deadline = time.monotonic() + PARSER_BUDGET_S / len(PARSERS)
    for data in inputs(rng, seeds):
        try:
            parse(data, rng)
        except allowed:
            pass
        except Exception as error:
            raise AssertionError(f"{name} raised {error!r} on {data[:300]!r}") from error
        if time.monotonic() > deadline:
            break


# HTTP: every GET endpoint and its parameters, and remote read bodies.

ENDPOINTS = {
    "/render": [
        "target",
        "from",
        "until",
        "format",
        "maxDataPoints",
        "xFilesFactor",
        "tz",
        "noNullPoints",
        "jsonp",
        "tenant",
    ],
    "/metrics/find": ["query", "format", "leavesOnly", "position", "wildcards", "jsonp", "tenant"],
    "/metrics/expand": ["query", "leavesOnly", "groupByExpr", "jsonp"],
    "/metrics/index.json": ["jsonp", "tenant"],
    "/tags": ["filter", "limit", "jsonp"],
    "/tags/host": ["filter", "jsonp"],
    "/tags/findSeries": ["expr", "expr[]", "jsonp"],
    "/tags/autoComplete/tags": ["tagPrefix", "limit", "expr"],
    "/tags/autoComplete/values": ["tag", "valuePrefix", "limit", "expr"],
    "/functions": ["grouped", "group", "pretty"],
    "/functions/sumSeries": ["pretty"],
    "/version": [],
    "/api/query": ["metricName", "tag", "start", "end", "granularity", "aggregator", "tenant"],
    "/api/metadata/tenants": [],
    "/api/metadata/metricNames": ["tenant"],
    "/api/metadata/tagKeys": ["metricName", "tenant"],
    "/api/metadata/tagValues": ["metricName", "tagKey", "tenant"],
    "/api/v1/metadata": ["metric", "tenant"],
    "/healthz": [],
    "/metrics": [],
    "/": [],
    "/admin/status": [],
    "/ui/session": [],
}
BASE_PARAMS = {
    "/render": {"target": "a.b.*", "from": "-10min", "format": "json"},
    "/metrics/find": {"query": "a.*"},
    "/metrics/expand": {"query": "a.b.*"},
    "/tags/findSeries": {"expr": "name=cpu"},
    "/tags/autoComplete/values": {"tag": "host"},
    "/api/query": {"metricName": "cpu"},
    "/api/metadata/tagKeys": {"metricName": "cpu"},
    "/api/metadata/tagValues": {"metricName": "cpu", "tagKey": "host"},
    "/api/v1/metadata": {"metric": "cpu"},
}
# Argument values by graphite-web parameter type (from /functions), hostile ones included.
ARGUMENTS = {
    "seriesList": ["a.b.*", "a.b.c", "cpu;host=a", "seriesByTag('name=cpu')", "nothing.here", "[z-a]"],
    "seriesLists": ["a.b.*", "mapSeries(a.b.*, 1)"],
    "integer": ["0", "1", "-1", "2", "100", "-100", "inf", "1e20", "'x'", "9223372036854775807"],
    "node": ["0", "1", "-1", "99", "-99", "inf", "'host'", "1.5"],
    "float": ["0", "-1.5", "1e300", "-1e300", "inf", "1e-300", "'x'"],
    "boolean": ["true", "false", "0", "1", "'x'"],
    "string": ["'x'", "''", "'a.b.c'", "'%s'", "'\\\\1'", "'[z-a]'", "1"],
    "interval": ["'1min'", "'-5min'", "'0s'", "'1s'", "'99999999y'", "'x'", "'1'", "''", "5"],
    "intOrInterval": ["'1min'", "2", "0", "-3", "'0s'", "'99999999y'"],
    "intOrInf": ["1", "0", "-1", "inf"],
    "date": ["'-5min'", "'12:00_20261122'", "'now'", "'x'", "''"],
    "tag": ["'host'", "'name'", "''", "1"],
    "aggFunc": ["'sum'", "'avg'", "'x'", "'median'", "'multiply'", "'diff'"],
}
ANY_ARGUMENT = [value for values in ARGUMENTS.values() for value in values] + ["None", "a.b.*"]
# Functions whose cost grows with the range or a step argument (time('t', 1), sinFunction ...)
# are bounded by the render budget (another part of issue #12); here they run over minutes only.
RANGES = [("-10min", "now"), ("-1h", "-50min")]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    process = GatewayProcess(
        tmp_path_factory.mktemp("fuzz"),
        "--max-series-per-query",
        "50",
        "--max-samples-per-query",
        "5000",
        "--query-timeout",
        f"{QUERY_TIMEOUT_S}s",
    ).start()
    now = int(time.time())
    lines = [f"a.b.{name} {i} {now - 60 * i}" for i, name in enumerate("cdef")] + [
        f"cpu;host=web{i} {i} {now - 60}" for i in range(3)
    ]
    send_tcp(process.graphite_port, ("\n".join(lines) + "\n").encode())
    items = [{"metricName": "cpu", "tags": {"host": f"h{i}"}, "ts": now - 60 * i, "value": float(i)} for i in range(5)]
    assert process.post("/api/write", items).status == 200
    assert wait_for(lambda: b"a.b.f" in process.get("/metrics/find?query=a.b.*").body)
    yield process
    process.stop()


def _argument(rng: random.Random, param: dict) -> str:
    options = param.get("options")
    if options and rng.random() < 0.5:
        option = rng.choice(options)
        return json.dumps(option) if isinstance(option, str) else str(option)
    return rng.choice(ARGUMENTS.get(param["type"], ANY_ARGUMENT))


def random_target(rng: random.Random, catalog: dict, depth: int = 0) -> str:
    """A call of a random catalog function with arguments drawn by parameter type (sometimes of
    another type, sometimes too many or too few), nesting further calls for series arguments."""
    name = rng.choice(sorted(catalog))
    arguments = []
    for param in catalog[name]["params"]:
        if not param.get("required") and rng.random() < 0.5:
            break
        if param["type"] in ("seriesList", "seriesLists") and depth < 2 and rng.random() < 0.3:
            arguments.append(random_target(rng, catalog, depth + 1))
        else:
            arguments.append(_argument(rng, param) if rng.random() < 0.9 else rng.choice(ANY_ARGUMENT))
        if param.get("multiple") and rng.random() < 0.3:
            arguments.append(_argument(rng, param))
    if rng.random() < 0.1:
        arguments = arguments[:-1] if rng.random() < 0.5 else arguments + [rng.choice(ANY_ARGUMENT)]
    return f"{name}({', '.join(arguments)})"


MAP_SOURCES = [
    "a.b.*",
    "a.*.*",
    "a.b.{c,d}",
    "seriesByTag('name=cpu')",
    "nothing.here",
    "time('t', 60)",
    "aliasSub(a.b.*, 'b', '%s')" % ("9" * 5000),
    "aliasByNode(a.b.*, 2)",
    "group(a.b.c, a.b.c)",
    "sumSeries(a.b.*)",
]
MAP_NODES = ["0", "1", "2", "-1", "-99", "99", "99999999999999999999", "'host'", "'name'", "''", "1.5", "inf"]
MATCHERS = ["'c'", "'d'", "'e'", "'b'", "'a'", "'t'", "'web1'", "''", "'9'", "1"]
REDUCE_FUNCTIONS = ["sumSeries", "diffSeries", "asPercent", "divideSeries", "group", "sortByName", "mapSeries"]
REDUCE_OUTER = ["{}", "sortByName({}, true)", "aliasByNode({}, 0, 2)", "sumSeries({})", "highest({})", "mapSeries({})"]


def random_map_reduce_target(rng: random.Random, catalog: dict, depth: int = 0) -> str:
    """reduceSeries over mapSeries with odd nodes, matchers and reduce functions, nested and wrapped."""
    source = rng.choice(MAP_SOURCES)
    if depth < 1 and rng.random() < 0.3:
        source = random_map_reduce_target(rng, catalog, depth + 1)
    mapped = f"mapSeries({source}, {', '.join(rng.sample(MAP_NODES, rng.randint(0, 2)))})"
    if rng.random() < 0.1:
        mapped = mapped.replace(", )", ")")
    function = rng.choice(REDUCE_FUNCTIONS if rng.random() < 0.7 else sorted(catalog))
    matchers = rng.sample(MATCHERS, rng.randint(0, 3))
    arguments = [mapped, repr(function), rng.choice(MAP_NODES), *matchers]
    reduced = f"reduceSeries({', '.join(arguments)})"
    return rng.choice(REDUCE_OUTER).format(reduced)


def test_no_get_parameter_gets_a_5xx(gateway):
    rng = random.Random(SEED)
    deadline = time.monotonic() + GET_BUDGET_S
    failures, sent = [], 0

    def check(path: str, params: dict):
        nonlocal sent
        query = urllib.parse.urlencode(params, doseq=True)
        answer = gateway.get(f"{path}?{query}" if query else path, timeout=20)
        sent += 1
        if answer.status >= 500:
            failures.append(f"GET {path}?{query} -> {answer.status} {answer.body[:200]!r}")

    # every parameter with every hostile value, value by value (a loaded machine may not finish)
    sweep = [(path, name, value) for value in HOSTILE_TEXT for path, names in ENDPOINTS.items() for name in names]
    for path, name, value in sweep:
        if time.monotonic() > deadline:
            break
        check(path, {**BASE_PARAMS.get(path, {}), name: value})
    while time.monotonic() < deadline:  # then random mixes of several hostile parameters
        path = rng.choice(sorted(ENDPOINTS))
        params = dict(BASE_PARAMS.get(path, {}))
        for name in rng.sample(ENDPOINTS[path], min(len(ENDPOINTS[path]), rng.randint(1, 3))):
            params[name] = mutate(rng, rng.choice(HOSTILE_TEXT).encode()).decode("utf-8", "replace")
        check(path, params)
    assert not failures, f"{len(failures)} of {sent} requests answered 5xx:\n" + "\n".join(failures[:30])


def test_random_render_targets_get_no_5xx(gateway):
    rng = random.Random(SEED + 1)
    catalog = gateway.get("/functions").json()
    deadline = time.monotonic() + TARGET_BUDGET_S
    failures, sent = [], 0
    while time.monotonic() < deadline:
        start, end = rng.choice(RANGES)
        params = {
            "target": random_target(rng, catalog),
            "from": start,
            "until": end,
            "format": rng.choice(["json", "csv", "raw", "pickle"]),
        }
        if rng.random() < 0.2:
            params["maxDataPoints"] = rng.choice(["1", "2", "3", "7", "0"])
        answer = gateway.post(
            "/render",
            urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            timeout=20,
        )
        sent += 1
        if answer.status >= 500:
            failures.append(f"POST /render {params} -> {answer.status} {answer.body[:200]!r}")
    assert sent > 50
    assert not failures, f"{len(failures)} of {sent} targets answered 5xx:\n" + "\n".join(failures[:30])


def test_map_reduce_compositions_get_no_5xx(gateway):
    """Groups missing a matcher, nodes out of range, reduce functions that take no series lists,
    lists of lists where a series is due: an answer or a 400, as graphite-web would fail with a 500."""
    rng = random.Random(SEED + 3)
    catalog = gateway.get("/functions").json()
    deadline = time.monotonic() + MAP_REDUCE_BUDGET_S
    failures, statuses = [], []
    while time.monotonic() < deadline:
        params = {"target": random_map_reduce_target(rng, catalog), "from": "-10min", "format": "json"}
        answer = gateway.post(
            "/render",
            urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            timeout=20,
        )
        statuses.append(answer.status)
        if answer.status >= 500:
            failures.append(f"POST /render {params} -> {answer.status} {answer.body[:200]!r}")
    assert len(statuses) > 30 and statuses.count(200) > 5 and statuses.count(400) > 5, statuses
    assert not failures, f"{len(failures)} of {len(statuses)} targets answered 5xx:\n" + "\n".join(failures[:30])


def test_hostile_remote_reads_get_no_5xx(gateway):
    rng = random.Random(SEED + 2)
    times = [-(2**63), 2**63 - 1, 0, -1, NOW_MS, int(time.time() * 1000), 10**18]
    values = ["", "cpu", ".*", "web.+", "(", "[z-a]", "\\", "a" * 1000, "\U0001f600", "x|", "(?i)CPU"]
    deadline = time.monotonic() + READ_BUDGET_S
    failures = []
    while time.monotonic() < deadline:
        matchers = [
            Matcher(
                rng.choice(["EQ", "NEQ", "RE", "NRE"]), rng.choice(["__name__", "host", "", "x"]), rng.choice(values)
            )
            for _ in range(rng.randint(0, 3))
        ]
        query = ReadQuery(rng.choice(times), rng.choice(times), matchers)
        accepted = rng.choice(
            [
                [],
                [prometheus.SAMPLES],
                [prometheus.STREAMED_XOR_CHUNKS],
                [prometheus.STREAMED_XOR_CHUNKS, prometheus.SAMPLES],
            ]
        )
        body = prometheus.encode_read_request([query], accepted)
        if rng.random() < 0.3:
            body = mutate(rng, body)
        answer = gateway.post(
            "/api/v1/read",
            body,
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
            timeout=20,
        )
        if answer.status >= 500:
            failures.append(f"remote read {query} {accepted} -> {answer.status} {answer.body[:200]!r}")
    assert not failures, "\n".join(failures[:30])


# PromQL: mutated valid queries and hostile parameters over series with extreme values.

PROMQL_TENANT = "promql-fuzz"
EXTREME_VALUES = [1e308, -1e308, math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1.5, -2.0]
PROMQL_NUMBERS = ["0", "1", "-1", "0.5", "2", "1e308", "-1e308", "NaN", "Inf", "-Inf", "1e-320", "100000", "0x10"]
PROMQL_DURATIONS = ["1s", "15s", "1m", "5m", "1h", "1d", "0s", "1ms"]
PROMQL_SELECTORS = [
    "x",
    'x{k="a"}',
    'x{k=~"a|b"}',
    'x{k!~"c.*"}',
    "c_total",
    "h_bucket",
    "nh",
    '{__name__=~"x|nh"}',
    '{__name__=~".+"}',
    "nope",
]
PROMQL_TEMPLATES = [
    "{v}",
    "{f}({v})",
    "{r}({s}[{d}])",
    "{r}({v}[1m:{sd}])",
    "{a}({v})",
    "{a} by (k) ({v})",
    "{a} without (k) ({v})",
    "topk({n}, {v})",
    "bottomk({n}, {v})",
    "quantile({n}, {v})",
    'count_values("v", {v})',
    "{v} {op} {v}",
    "{v} {op} {n}",
    "{n} {op} {v}",
    "{v} {op} on(k) group_left {v}",
    "{v} {op} ignoring(k) group_right {v}",
    "{v} {cmp} {n}",
    "{v} {cmp} bool {v}",
    "{v} and {v}",
    "{v} or {v}",
    "{v} unless on() {v}",
    "histogram_quantile({n}, {v})",
    "histogram_fraction({n}, {n}, {v})",
    "{s} @ {t}",
    "{s} offset {d}",
    "{s} offset -{d}",
    "clamp({v}, {n}, {n})",
    "clamp_min({v}, {n})",
    "round({v}, {n})",
    'label_replace({v}, "a", "$1", "k", "(.*)")',
    'label_join({v}, "a", "-", "k", "__name__")',
    "predict_linear({s}[{d}], {n})",
    "holt_winters({s}[{d}], {n}, {n})",
    "quantile_over_time({n}, {s}[{d}])",
    "absent({v})",
    "absent_over_time({s}[{d}])",
    "scalar({v})",
    "vector({n})",
    "sort_desc({v})",
    "timestamp({v})",
    "-{v}",
    "({v})",
]
PROMQL_FUNCTIONS = [
    "abs", "ceil", "floor", "exp", "sqrt", "ln", "log2", "log10", "sgn", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "deg", "rad", "histogram_count", "histogram_sum",
    "histogram_avg", "histogram_stddev", "histogram_stdvar", "year", "month", "day_of_week", "hour", "minute",
]  # fmt: skip
PROMQL_RANGE_FUNCTIONS = [
    "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets", "avg_over_time",
    "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "stddev_over_time",
    "stdvar_over_time", "last_over_time", "present_over_time",
]  # fmt: skip
PROMQL_AGGREGATIONS = ["sum", "avg", "min", "max", "count", "group", "stddev", "stdvar"]
PROMQL_TIMES = ["0", "-1", "1e10", "9999999999", "nan", "inf", "-1e300", "1.5", "2026-01-01T00:00:00Z", "x"]
PROMQL_BUDGET_S = float(os.environ.get("TSGATE_FUZZ_PROMQL_SECONDS", "25"))
QUERY_TIMEOUT_S = 5  # the fuzzed gateway's --query-timeout: no answer may come later than it + 1 s


def random_promql(rng: random.Random, depth: int = 0) -> str:
    """A query from a template, its holes filled with selectors, extreme numbers, durations,
    functions and (two levels deep at most) other random queries."""
    template = rng.choice(PROMQL_TEMPLATES)
    nested = depth < 2 and rng.random() < 0.3
    fields = {
        "s": lambda: rng.choice(PROMQL_SELECTORS),
        "v": lambda: random_promql(rng, depth + 1) if nested else rng.choice(PROMQL_SELECTORS),
        "n": lambda: rng.choice(PROMQL_NUMBERS) if not nested or rng.random() < 0.8 else random_promql(rng, depth + 1),
        "d": lambda: rng.choice(PROMQL_DURATIONS),
        "sd": lambda: rng.choice(["1s", "15s", "1m", ""]),
        "t": lambda: rng.choice(["start()", "end()", "0", "1e9", "9.99e10", str(int(time.time())), "-1e308"]),
        "f": lambda: rng.choice(PROMQL_FUNCTIONS),
        "r": lambda: rng.choice(PROMQL_RANGE_FUNCTIONS),
        "a": lambda: rng.choice(PROMQL_AGGREGATIONS),
        "op": lambda: rng.choice(["+", "-", "*", "/", "%", "^", "atan2"]),
        "cmp": lambda: rng.choice(["==", "!=", ">", "<", ">=", "<="]),
    }
    out, rest = [], template
    while "{" in rest:
        before, _, after = rest.partition("{")
        name, _, rest = after.partition("}")
        out.append(before + fields[name]())
    return "".join(out) + rest


@pytest.fixture(scope="module")
def promql_series(gateway):
    """Floats of every extreme kind, a counter that resets, classic buckets and native histograms
    of every valid shape, over the last 10 minutes (a tenant of their own)."""
    now = int(time.time()) * 1000
    times = [now - 600_000 + i * 15_000 for i in range(41)]
    series = [
        WriteSeries(
            {"__name__": "x", "k": key},
            [(t, EXTREME_VALUES[(i + shift) % len(EXTREME_VALUES)]) for i, t in enumerate(times)],
        )
        for shift, key in enumerate("abcdef")
    ]
    series.append(WriteSeries({"__name__": "c_total"}, [(t, float(i % 13)) for i, t in enumerate(times)]))
    series += [
        WriteSeries({"__name__": "h_bucket", "le": le}, [(t, count * i) for i, t in enumerate(times)])
        for le, count in (("0.1", 1.0), ("1", 1e308), ("+Inf", math.inf))
    ]
    kinds = [
        VALID_HISTOGRAMS[kind]
        for kind in ("integer", "float", "empty", "negative only", "custom buckets", "schema -4", "schema 8")
    ]
    series += [
        WriteSeries({"__name__": "nh", "k": str(n)}, histograms=[at(data, t) for t in times])
        for n, data in enumerate(kinds)
    ]
    answer = gateway.post(
        "/api/v1/write",
        prometheus.encode_write_request_v1(series),
        headers={
            "X-Scope-OrgID": PROMQL_TENANT,
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
        },
    )
    assert answer.status == 204, answer.body
    return now


def test_random_promql_queries_and_parameters_get_no_5xx(gateway, promql_series):
    rng = random.Random(SEED + 3)
    deadline = time.monotonic() + PROMQL_BUDGET_S
    headers = {"X-Scope-OrgID": PROMQL_TENANT}
    failures, sent, answered = [], 0, 0
    now = promql_series / 1000
    healthz = HealthzProbe(gateway)
    while time.monotonic() < deadline:
        query = random_promql(rng)
        if rng.random() < 0.15:
            query = mutate(rng, query.encode()).decode("utf-8", "replace")
        if rng.random() < 0.5:
            params = {"query": query, "time": str(now) if rng.random() < 0.8 else rng.choice(PROMQL_TIMES)}
            path = "/api/v1/query"
        else:
            start = now - rng.choice([60, 600, 3600])
            params = {"query": query, "start": str(start), "end": str(now), "step": rng.choice(["15", "60", "1m", "7"])}
            if rng.random() < 0.2:
                params[rng.choice(["start", "end", "step"])] = rng.choice(PROMQL_TIMES)
            path = "/api/v1/query_range"
        if rng.random() < 0.1:
            params["timeout"] = rng.choice(["nan", "inf", "1e300", "-1", "0", "1ms", "x", "30s"])
        asked = time.monotonic()
        answer = gateway.get(f"{path}?{urllib.parse.urlencode(params)}", headers=headers, timeout=30)
        took = time.monotonic() - asked
        sent += 1
        answered += answer.status == 200
        # a timeout of 1 ms or less answers 503 timeout, as Prometheus does
        timed_out = answer.status == 503 and params.get("timeout") in ("-1", "0", "1ms")
        if answer.status >= 500 and not timed_out:
            failures.append(f"GET {path} {params} -> {answer.status} {answer.body[:200]!r}")
        if took > QUERY_TIMEOUT_S + 1:
            failures.append(f"GET {path} {params} -> {answer.status} after {took:.1f} s")
    slowest = healthz.stop()
    print(f"{sent} PromQL requests, {answered} answered 200; /healthz slowest {slowest * 1000:.0f} ms")
    assert sent > 100 and answered > sent // 5, (sent, answered)
    assert not failures, f"{len(failures)} of {sent} PromQL requests failed:\n" + "\n".join(failures[:30])
    assert slowest < 2, f"/healthz took {slowest:.1f} s while the fuzz ran: the gateway froze"


class HealthzProbe:
    """Asks /healthz every 50 ms in a thread until stopped; the slowest answer, in seconds."""

    def __init__(self, gateway):
        self.gateway, self.slowest, self.stopping = gateway, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.05):
            asked = time.monotonic()
            assert self.gateway.get("/healthz", timeout=30).status == 200
            self.slowest = max(self.slowest, time.monotonic() - asked)

    def stop(self) -> float:
        self.stopping.set()
        self.thread.join()
        return self.slowest
