"""Graphite render output formats, byte for byte as graphite-web 1.1 writes them."""

import pickle

import pytest

from gateway.query.graphite.series import TimeSeries
from protocols.graphite import render_formats
from protocols.graphite.render_formats import (
    apply_max_data_points,
    encode_csv,
    encode_functions_json,
    encode_json,
    encode_msgpack,
    encode_pickle,
    encode_raw,
)

NAN = float("nan")
INF = float("inf")


def example():
    return [
        TimeSeries("a.b", 100, 140, 10, [1.0, None, NAN, INF]),
        TimeSeries("c;host=x", 100, 140, 10, [2, 3.5, None, -INF]),
    ]


def test_json():
    assert encode_json(example()) == (
        b'[{"target": "a.b", "tags": {"name": "a.b"}, "datapoints": [[1.0, 100], [null, 110], [null, 120], '
        b'[1e9999, 130]]}, {"target": "c;host=x", "tags": {"host": "x", "name": "c"}, "datapoints": '
        b"[[2, 100], [3.5, 110], [null, 120], [-1e9999, 130]]}]"
    )


def test_json_of_finite_series_is_what_pythons_json_writes():
    """The orjson path writes the bytes graphite-web's json.dumps writes, for everyday numbers."""
    import json
    import random

    rng = random.Random(7)
    values = [
        rng.choice([None, NAN, round(rng.uniform(-1e6, 1e6), rng.randint(0, 6)), rng.randint(-9, 9), 0.1 + 0.2, -0.0])
        for _ in range(500)
    ]
    series = [
        TimeSeries('x.é"y', 1000, 1000 + 10 * 500, 10, values, tags={"k": "v,w"}),
        TimeSeries("z", 0, 30, 10, [1.5, None, 2]),
    ]
    expected = json.dumps(
        [{"target": s.name, "tags": dict(s.tags), "datapoints": s.datapoints()} for s in series]
    ).replace("NaN,", "null,")
    assert encode_json(series) == expected.encode()
    assert json.loads(encode_json(series, jsonp="cb")[3:-1]) == json.loads(expected)


def test_json_without_null_points_drops_empty_series():
    series = example() + [TimeSeries("empty", 100, 120, 10, [None, None])]
    assert encode_json(series, no_null_points=True) == (
        b'[{"target": "a.b", "tags": {"name": "a.b"}, "datapoints": [[1.0, 100], [1e9999, 130]]}, '
        b'{"target": "c;host=x", "tags": {"host": "x", "name": "c"}, "datapoints": '
        b"[[2, 100], [3.5, 110], [-1e9999, 130]]}]"
    )


def test_json_empty_pretty_and_jsonp():
    assert encode_json([]) == b"[]"
    assert encode_json([TimeSeries("a", 100, 120, 10, [])]) == b"[]"
    assert (
        encode_json([TimeSeries("a", 100, 110, 10, [1.0])], jsonp="cb")
        == b'cb([{"target": "a", "tags": {"name": "a"}, "datapoints": [[1.0, 100]]}])'
    )
    assert encode_json([TimeSeries("a", 100, 110, 10, [1.0])], pretty=True).startswith(b'[\n  {\n    "target": "a"')


def test_csv():
    assert encode_csv(example()[:1]) == (
        b"a.b,1970-01-01 00:01:40,1.0\r\n"
        b"a.b,1970-01-01 00:01:50,\r\n"
        b"a.b,1970-01-01 00:02:00,nan\r\n"
        b"a.b,1970-01-01 00:02:10,inf\r\n"
    )


def test_raw():
    assert encode_raw(example()) == b"a.b,100,140,10|1.0,None,nan,inf\nc;host=x,100,140,10|2,3.5,None,-inf\n"


def test_pickle():
    series = example()[:1]
    series[0].pathExpression = "a.*"
    loaded = pickle.loads(encode_pickle(series))
    assert loaded[0]["values"][:2] == [1.0, None]
    del loaded[0]["values"]
    assert loaded == [
        {
            "name": "a.b",
            "start": 100,
            "end": 140,
            "step": 10,
            "pathExpression": "a.*",
            "valuesPerPoint": 1,
            "consolidationFunc": "average",
            "xFilesFactor": 0.0,
        }
    ]


def test_msgpack_only_with_the_package():
    if render_formats.MSGPACK_AVAILABLE:
        assert encode_msgpack(example())
    else:
        with pytest.raises(RuntimeError):
            encode_msgpack(example())


def test_max_data_points_consolidates_with_a_nudged_start():
    series = TimeSeries("a", 0, 600, 60, [float(v) for v in range(1, 11)])
    apply_max_data_points([series], 5)
    # two values per point; start nudged to 120 and one raw value dropped, as graphite-web does
    assert series.datapoints() == [(2.5, 120), (4.5, 240), (6.5, 360), (8.5, 480), (10.0, 600)]


def test_max_data_points_uses_the_consolidation_function_and_x_files_factor():
    series = TimeSeries("a", 0, 480, 60, [1.0, 2.0, 3.0, None, 5.0, None, 7.0, 8.0], consolidation_func="max")
    apply_max_data_points([series], 4)
    assert series.datapoints() == [(3.0, 120), (5.0, 240), (7.0, 360), (8.0, 480)]
    series = TimeSeries("a", 0, 480, 60, [1.0, 2.0, 3.0, None, 5.0, None, 7.0, 8.0], x_files_factor=0.6)
    apply_max_data_points([series], 4)
    # the trailing lone 8.0 counts as 1 of 2 values: below 0.6
    assert series.datapoints() == [(2.5, 120), (None, 240), (None, 360), (None, 480)]


def test_max_data_points_of_one_and_when_not_needed():
    series = TimeSeries("a", 0, 240, 60, [1.0, 2.0, None, 6.0])
    apply_max_data_points([series], 1)
    assert series.datapoints() == [(3.0, 0)]
    series = TimeSeries("a", 0, 240, 60, [1.0, 2.0, None, 6.0])
    apply_max_data_points([series], 10)
    assert series.datapoints() == [(1.0, 0), (2.0, 60), (None, 120), (6.0, 180)]


def test_json_after_max_data_points():
    series = TimeSeries("a", 0, 240, 60, [1.0, 2.0, 3.0, 4.0])
    apply_max_data_points([series], 2)
    assert encode_json([series]) == b'[{"target": "a", "tags": {"name": "a"}, "datapoints": [[2.5, 120], [4.0, 240]]}]'


def test_functions_json_writes_infinity_like_graphite_web():
    # only "Infinity," is rewritten, so a default closing its object stays Infinity as in graphite-web
    assert encode_functions_json({"f": [INF, {"default": INF}]}) == b'{"f": [1e9999, {"default": Infinity}]}'
