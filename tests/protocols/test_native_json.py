"""The native JSON wire format and time arguments, byte for byte."""

import json
import math

import pytest

from gateway.core import samples
from gateway.query.planner import SeriesResult
from protocols import native_json
from protocols.timespec import BadTime, format_iso, parse_time

NOW = 1_700_000_000_000


def test_write_single_seed_000_body():
    body = b'{"tenant": "t-1", "metricName": "cpu_idle", "tags": {"os": "linux"}, "ts": 1598205180, "value": 491}'
    decoded, errors = native_json.decode_write_single(body, NOW)
    assert errors == []
    assert decoded == [(0, native_json.DecodedItem("t-1", "cpu_idle", {"os": "linux"}, 1598205180000, 491.0))]


@pytest.mark.parametrize(
    "ts, expected",
    [
        (1598205180, 1598205180000),
        (1598205180.25, 1598205180250),
        (1598205180123, 1598205180123),
        ('"2020-08-23T17:53:00Z"', 1598205180000),
        ('"2020-08-23T17:53:00.5+00:00"', 1598205180500),
    ],
)
def test_timestamp_forms(ts, expected):
    body = f'{{"metricName": "m", "ts": {ts}, "value": 1}}'.encode()
    decoded, _ = native_json.decode_write_single(body, NOW)
    assert decoded[0][1].timestamp_ms == expected


def test_missing_timestamp_is_arrival_time():
    decoded, _ = native_json.decode_write_single(b'{"metricName": "m", "value": 1}', NOW)
    assert decoded[0][1].timestamp_ms == NOW


@pytest.mark.parametrize(
    "raw, expected", [('"NaN"', math.nan), ('"+Inf"', math.inf), ('"-Inf"', -math.inf), ('"2.5"', 2.5), ("1e3", 1000.0)]
)
def test_value_forms(raw, expected):
    decoded, _ = native_json.decode_write_single(f'{{"metricName": "m", "value": {raw}}}'.encode(), NOW)
    value = decoded[0][1].value
    assert value == expected or (math.isnan(value) and math.isnan(expected))


def test_batch_reports_each_bad_item_and_keeps_the_good_ones():
    body = json.dumps(
        [
            {"metricName": "ok", "value": 1},
            {"metricName": "m", "value": True},
            "not an object",
            {"value": 1},
            {"metricName": "m"},
            {"metricName": "m", "value": 1, "tags": ["a"]},
            {"metricName": "m", "value": 1, "ts": "yesterday-ish"},
            {"metricName": "ok2", "value": 2, "tenant": "t"},
        ]
    ).encode()
    decoded, errors = native_json.decode_write_batch(body, NOW)
    assert [index for index, _ in decoded] == [0, 7]
    assert [(e.index, e.field) for e in errors] == [
        (1, "value"),
        (2, ""),
        (3, "metricName"),
        (4, "value"),
        (5, "tags"),
        (6, "ts"),
    ]


def test_put_accepts_object_or_array():
    one = b'{"metric": "sys.cpu", "tags": {"host": "a"}, "timestamp": 1356998400, "value": 18}'
    decoded, errors = native_json.decode_put(one, NOW)
    assert errors == [] and decoded[0][1] == native_json.DecodedItem(
        None, "sys.cpu", {"host": "a"}, 1356998400000, 18.0
    )
    decoded, _ = native_json.decode_put(b"[" + one + b"," + one + b"]", NOW)
    assert len(decoded) == 2


@pytest.mark.parametrize(
    "decoder, body",
    [
        (native_json.decode_write_single, b"{not json"),
        (native_json.decode_write_single, b"[]"),
        (native_json.decode_write_batch, b"{}"),
        (native_json.decode_put, b'"text"'),
        (native_json.decode_write_batch, b"\xff\xfe"),
        (native_json.decode_write_batch, b"[" * 100_000),
    ],
)
def test_unusable_bodies(decoder, body):
    with pytest.raises(native_json.BadRequest):
        decoder(body, NOW)


ITEM_A = native_json.DecodedItem(None, "a", {}, NOW, 1.0)
ITEM_B = native_json.DecodedItem(None, "b", {"h": "x"}, NOW, 2.5)


@pytest.mark.parametrize(
    "body, items",
    [
        (b'[{"metricName": "a", "value": 1},{"metricName": "b", "tags": {"h": "x"}, "value": 2.5}]', [ITEM_A, ITEM_B]),
        (
            b' \n[ {"metricName":"a","value":1} ,\r\n\t{"metricName":"b","tags":{"h":"x"},"value":"2.5"} ]\n ',
            [ITEM_A, ITEM_B],
        ),
        (b"[]", []),
        (b" [ ] ", []),
        (json.dumps([{"metricName": "a", "value": 1}]).encode("utf-16"), [ITEM_A]),
    ],
)
def test_an_array_read_an_item_at_a_time_decodes_as_a_whole_parse_would(body, items):
    """Arrays are parsed item by item (so that a large body decodes in slices): whitespace
    anywhere json allows it, empty arrays and the encodings json.loads detects still work."""
    decoded, errors = native_json.decode_write_batch(body, NOW)
    assert errors == [] and [item for _, item in decoded] == items


@pytest.mark.parametrize(
    "body", [b"[1,]", b"[1 2]", b"[1] x", b"[", b'[{"metricName": "a", "value": 1},', b"[1,,2]", b"[\xff]"]
)
def test_a_malformed_array_read_an_item_at_a_time_is_a_bad_request(body):
    with pytest.raises(native_json.BadRequest, match="not valid JSON|not UTF-8"):
        native_json.decode_write_batch(body, NOW)


def test_a_large_array_decodes_in_bounded_steps():
    """The gateway runs the decoder in slices on the reactor: it yields every ITEMS_PER_STEP items,
    while parsing and while checking them."""
    items = [{"metricName": "m", "tags": {"n": str(n)}, "value": n} for n in range(2000)]
    steps = native_json.decode_write_batch_steps(json.dumps(items).encode(), NOW)
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            decoded, errors = done.value
            break
        yields += 1
    assert errors == [] and len(decoded) == 2000
    assert yields >= 2 * 2000 // native_json.ITEMS_PER_STEP - 2


def test_query_results_seed_000_shape():
    points = [(1598205180000, 1.0), (1598205180500, math.nan), (1598205181000, -math.inf)]
    results = [SeriesResult("t-1", "cpu", {"host": "a"}, samples.from_points(points))]
    document = json.loads(native_json.encode_query_results(results))
    assert document == [
        {
            "tenant": "t-1",
            "metricName": "cpu",
            "tags": {"host": "a"},
            "values": {"2020-08-23T17:53:00Z": 1.0, "2020-08-23T17:53:00.500Z": "NaN", "2020-08-23T17:53:01Z": "-Inf"},
        }
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", NOW),
        ("5m-ago", NOW - 300_000),
        ("2h-ago", NOW - 7_200_000),
        ("1700000000", NOW),
        ("1700000000000", NOW),
        ("2023-11-14T22:13:20Z", NOW),
        ("2023-11-14T23:13:20+01:00", NOW),
        ("2023-11-14T22:13:20", NOW),
    ],
)
def test_parse_time(text, expected):
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "soon", "5x-ago", "nan", "inf", "2023-13-01"])
def test_parse_time_rejects(text):
    with pytest.raises(BadTime):
        parse_time(text, NOW)


def test_format_iso():
    assert format_iso(0) == "1970-01-01T00:00:00Z"
    assert format_iso(1) == "1970-01-01T00:00:00.001Z"
    assert format_iso(-1000) == "1969-12-31T23:59:59Z"
