"""Byte-level tests of the Graphite carbon ingest formats, including hostile input."""

import copyreg
import io
import pickle
import pickletools
import random
import struct
import time
import tracemalloc

import numpy as np
import pytest

from protocols.graphite import REJECT_REASONS, Reject
from protocols.graphite.arrays import name_and_tags
from protocols.graphite.pickle import NoGlobalsUnpickler, PickleDecoder, decode_frame
from protocols.graphite.plaintext import PlaintextDecoder, decode_datagram
from protocols.graphite.tags import check_tag, format_tagged_path, parse_path

NOW_MS = 1_700_000_123_456
TS = 1_700_000_000
TS_MS = TS * 1000


def feed_all(decoder, chunks, now_ms=NOW_MS):
    samples, rejects = [], []
    for chunk in chunks:
        more_samples, more_rejects = listed(decoder.feed(chunk, now_ms))
        samples += more_samples
        rejects += more_rejects
    return samples, rejects


def listed(decoded):
    """A decoder's arrays as (metric name, tags, timestamp ms, value) tuples, and its rejects."""
    samples, rejects = decoded
    points = zip(samples.path_index.tolist(), samples.timestamps.tolist(), samples.values.tolist())
    series = list(map(name_and_tags, samples.series))
    return [(*series[index], timestamp, value) for index, timestamp, value in points], rejects


def lines(data, max_line_length=16384):
    return feed_all(PlaintextDecoder(max_line_length), [data])


def reasons(rejects):
    return [reject.reason for reject in rejects]


def assert_well_formed(samples, rejects):
    for name, tags, timestamp_ms, value in samples:
        assert type(name) is str and name
        assert type(tags) is dict
        assert all(type(k) is str and type(v) is str for k, v in tags.items())
        assert type(timestamp_ms) is int and type(value) is float
    for reject in rejects:
        assert isinstance(reject, Reject)
        assert reject.reason in REJECT_REASONS
        assert len(reject.detail) < 300


# --- plaintext: fields, values, timestamps -------------------------------------------------


def test_plain_line():
    assert lines(b"servers.a.cpu 1.5 1700000000\n") == ([("servers.a.cpu", {}, TS_MS, 1.5)], [])


def test_separators_crlf_and_blank_lines():
    data = b"\n  \r\na 1 1700000000\r\n\tb \t 2   1700000000  \n\n"
    assert lines(data) == ([("a", {}, TS_MS, 1.0), ("b", {}, TS_MS, 2.0)], [])


@pytest.mark.parametrize("line", [b"a 1", b"a", b"a 1 2 3", b"a b c d e", b"a\r1 2 3"])
def test_field_count(line):
    assert reasons(lines(line + b"\n")[1]) == ["bad_field_count"]


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"1e3", 1000.0),
        (b"-1.5", -1.5),
        (b"+2", 2.0),
        (b"1_000", 1000.0),
        (b"0", 0.0),
        (b"-0", -0.0),
        (b"1E-3", 0.001),
    ],
)
def test_value_like_carbon_float(raw, expected):
    assert lines(b"a " + raw + b" 1700000000\n")[0][0][3] == expected


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"abc", "bad_value"),
        (b"1,5", "bad_value"),
        (b"0x10", "bad_value"),
        (b"1e999", "inf_value"),
        (b"nan", "nan_value"),
        (b"NaN", "nan_value"),
        (b"-nan", "nan_value"),
        (b"inf", "inf_value"),
        (b"-Infinity", "inf_value"),
    ],
)
def test_bad_values(raw, reason):
    assert reasons(lines(b"a " + raw + b" 1700000000\n")[1]) == [reason]


@pytest.mark.parametrize(
    "raw, expected_ms",
    [
        (b"1700000000", TS_MS),
        (b"1700000000.999", TS_MS),
        (b"1.7e9", 1_700_000_000_000),
        (b"0", 0),
        (b"-1", NOW_MS - NOW_MS % 1000),
        (b"-1.5", NOW_MS - NOW_MS % 1000),
        (b"-0.5", 0),
    ],
)
def test_timestamps(raw, expected_ms):
    assert lines(b"a 1 " + raw + b"\n")[0][0][2] == expected_ms


@pytest.mark.parametrize(
    "raw",
    [
        b"-2",
        b"-100",
        b"abc",
        b"nan",
        b"inf",
        b"-inf",
        b"1e30",
        b"1e999",
        b"1:2",
    ],
)
def test_bad_timestamps(raw):
    assert reasons(lines(b"a 1 " + raw + b"\n")[1]) == ["bad_timestamp"]


def test_bad_lines_do_not_lose_neighbours():
    data = b"a 1 1700000000\nbad\nb nan 1700000000\nc\xff 1 1\nd 4 1700000000\n"
    samples, rejects = lines(data)
    assert [s[0] for s in samples] == ["a", "d"]
    assert reasons(rejects) == ["bad_field_count", "nan_value", "bad_utf8"]


# --- plaintext: paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        b"a\x00b",
        b"a\x1bb",
        b"a\x7fb",
        b"a\x1cb",
        "a\u0085b".encode(),
        "a\u00a0b".encode(),
        "a\u200bb".encode(),
        "a\u2028b".encode(),
    ],
)
def test_control_and_invisible_characters_rejected(path):
    assert reasons(lines(path + b" 1 1\n")[1]) == ["bad_path"]


@pytest.mark.parametrize("path", [b"\xff", b"a\xc3", b"\xed\xa0\x80x", b"\xc0\xaf"])
def test_invalid_utf8(path):
    assert reasons(lines(path + b" 1 1\n")[1]) == ["bad_utf8"]


def test_reject_details_are_bounded():
    hostile = ("\U000e0001" * 3000).encode() + b" 1 1\n" + b"\x00" * 10000 + b" 1 1\n"
    samples, rejects = lines(hostile)
    assert reasons(rejects) == ["bad_path", "bad_path"]
    assert all(len(r.detail) < 300 for r in rejects)


def test_utf8_path_accepted():
    path = "métrique.ünïcode.名前"
    assert lines(path.encode() + b" 1 1\n")[0][0][0] == path


@pytest.mark.parametrize(
    "path, expected",
    [
        ("a..b", "a.b"),
        (".a.b.", "a.b"),
        ("a...b..", "a.b"),
        ("~a.b", "a.b"),
        ("~.~a", "a"),
        ("a.~b", "a.~b"),
        ("a-b_c:d", "a-b_c:d"),
    ],
)
def test_name_cleanup(path, expected):
    assert parse_path(path) == (expected, {})


@pytest.mark.parametrize("path", ["", ".", "...", "~", "~~.~", "a b", "a\tb"])
def test_paths_without_name_or_with_whitespace_rejected(path):
    with pytest.raises(ValueError) as info:
        parse_path(path)
    assert info.value.reason == "bad_path"


@pytest.mark.parametrize("path", [b".", b"...", b"~", b"~~.~"])
def test_plaintext_paths_without_name(path):
    assert reasons(lines(path + b" 1 1\n")[1]) == ["bad_path"]


# --- tags ------------------------------------------------------------------------------------


def test_tagged_path():
    assert lines(b"disk.used;host=a;dc=x=y 1 1700000000\n")[0] == [
        ("disk.used", {"host": "a", "dc": "x=y"}, TS_MS, 1.0)
    ]


def test_repeated_tag_keeps_last_and_name_tag_is_dropped():
    assert parse_path("m;a=1;a=2;name=other") == ("m", {"a": "2"})


def test_tagged_name_is_cleaned():
    assert parse_path("~a..b;t=v") == ("a.b", {"t": "v"})


@pytest.mark.parametrize(
    "path, reason",
    [
        ("m;", "bad_tag"),
        ("m;a", "bad_tag"),
        ("m;=1", "bad_tag"),
        ("m;a=", "bad_tag"),
        ("m;a!b=1", "bad_tag"),
        ("m;a^b=1", "bad_tag"),
        ("m;a=~v", "bad_tag"),
        ("m;a=1;;b=2", "bad_tag"),
        (";a=1", "bad_path"),
        ("~;a=1", "bad_path"),
        ("m;a=1 2", "bad_path"),
    ],
)
def test_bad_tags(path, reason):
    samples, rejects = lines(path.encode() + b" 1 1\n")
    if " " in path:
        assert reasons(rejects) == ["bad_field_count"]
    else:
        assert reasons(rejects) == [reason]
    with pytest.raises(ValueError) as info:
        parse_path(path)
    assert info.value.reason == reason


def test_tag_rules_allow_graphite_value_characters():
    check_tag("k", "v=1!^~")
    with pytest.raises(ValueError):
        check_tag("k", "v;w")


def test_braces_form():
    assert parse_path('cpu.load{host="a",dc="eu-1"}') == ("cpu.load", {"host": "a", "dc": "eu-1"})
    assert parse_path('m{a="x\\"y\\\\z"}') == ("m", {"a": 'x"y\\z'})
    assert parse_path('m{a="1",b="2",}') == ('m{a="1",b="2",}', {})  # carbon needs the '"}' ending
    assert parse_path('m{a="{b}"}') == ("m", {"a": "{b}"})


@pytest.mark.parametrize(
    "path",
    [
        'm{a=""}',
        'm{a="x\\n"}',
        'm{a="x"b="y"}',
        'm{="x"}',
        'm{a!="x"}',
        'm{a="~x"}',
        '{a="x"}',
        'm{a="x\\"}',
        'm{a="x""}',
    ],
)
def test_bad_braces_form(path):
    with pytest.raises(ValueError):
        parse_path(path)


def test_format_tagged_path_is_graphite_canonical():
    assert format_tagged_path("m", {}) == "m"
    assert format_tagged_path("m", {"b": "2", "a": "1"}) == "m;a=1;b=2"
    # graphite sorts ";k=v" strings, so a key sorts before its own prefix when the next char < '='
    assert format_tagged_path("m", {"dc": "x", "dc2": "y", "d-c": "z"}) == "m;d-c=z;dc2=y;dc=x"


# --- plaintext: streaming, limits, close ----------------------------------------------------

STREAM = (
    b"a.b 1 1700000000\r\nc;t=v 2 -1\n\nbad line\nd\xff 1 1\n"
    b"e 3.5 1700000000.5\n" + b"f" * 40 + b" 1 1\n" + b"g 4 1700000000\n"
)


def decoded(decoder, chunks):
    """Samples and reject reasons: an over-long line's detail depends on where it was cut."""
    samples, rejects = feed_all(decoder, chunks)
    return samples, reasons(rejects)


def test_split_at_every_byte_position_gives_same_result():
    expected = decoded(PlaintextDecoder(max_line_length=30), [STREAM])
    assert len(expected[0]) == 4
    assert expected[1] == ["bad_field_count", "bad_utf8", "line_too_long"]
    for cut in range(len(STREAM) + 1):
        decoder = PlaintextDecoder(max_line_length=30)
        assert decoded(decoder, [STREAM[:cut], STREAM[cut:]]) == expected, cut
        assert decoder.finish() == []


def test_byte_by_byte():
    decoder = PlaintextDecoder(max_line_length=30)
    chunks = [STREAM[i : i + 1] for i in range(len(STREAM))]
    assert decoded(decoder, chunks) == decoded(PlaintextDecoder(max_line_length=30), [STREAM])


def test_line_length_limit_is_inclusive():
    line = b"a" * 10 + b" 1 1"
    assert lines(line + b"\n", max_line_length=len(line))[0]
    assert reasons(lines(line + b"\n", max_line_length=len(line) - 1)[1]) == ["line_too_long"]
    assert lines(line + b"\r\n", max_line_length=len(line) + 1)[0]


def test_long_line_rejected_once_and_skipped_across_feeds():
    decoder = PlaintextDecoder(max_line_length=50)
    chunks = [b"ok.1 1 1\n" + b"x" * 30, b"y" * 30, b"z" * 1000, b"w" * 10 + b"\nok.2 2 2\n"]
    samples, rejects = feed_all(decoder, chunks)
    assert [s[0] for s in samples] == ["ok.1", "ok.2"]
    assert reasons(rejects) == ["line_too_long"]
    assert len(rejects[0].detail) < 100


def test_endless_line_does_not_grow_memory():
    decoder = PlaintextDecoder(max_line_length=1024)
    chunk = b"a" * (1 << 20)
    assert reasons(listed(decoder.feed(chunk, NOW_MS))[1]) == ["line_too_long"]
    tracemalloc.start()
    try:
        for _ in range(100):  # 100 MiB without a newline
            assert listed(decoder.feed(chunk, NOW_MS)) == ([], [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert listed(decoder.feed(b"tail\nm 1 1\n", NOW_MS)) == ([("m", {}, 1000, 1.0)], [])


def test_finish_rejects_unterminated_line():
    decoder = PlaintextDecoder()
    assert listed(decoder.feed(b"a 1 1\nb 2 17000", NOW_MS)) == ([("a", {}, 1000, 1.0)], [])
    assert reasons(decoder.finish()) == ["truncated_line"]
    assert decoder.finish() == []


def test_finish_ignores_blank_tail_and_discarded_line():
    decoder = PlaintextDecoder(max_line_length=10)
    decoder.feed(b"a 1 1\n \r", NOW_MS)
    assert decoder.finish() == []
    decoder.feed(b"x" * 20, NOW_MS)
    assert decoder.finish() == []


def test_datagram_decodes_last_line_without_newline():
    samples, rejects = listed(decode_datagram(b"a 1 1\r\nbad\nb 2 2", NOW_MS))
    assert samples == [("a", {}, 1000, 1.0), ("b", {}, 2000, 2.0)]
    assert reasons(rejects) == ["bad_field_count"]


def test_datagram_line_limit():
    samples, rejects = listed(decode_datagram(b"a" * 100 + b" 1 1\nb 2 2", NOW_MS, max_line_length=50))
    assert [s[0] for s in samples] == ["b"] and reasons(rejects) == ["line_too_long"]


def test_plaintext_fuzz():
    rng = random.Random(20240601)
    alphabet = b'ab.;=~{}"\\ \t\r\n0123456789-+eE.naif\x00\xff\xc3'
    for _ in range(2000):
        size = rng.randrange(0, 200)
        if rng.random() < 0.5:
            data = bytes(rng.choice(alphabet) for _ in range(size))
        else:
            data = rng.randbytes(size)
        decoder = PlaintextDecoder(max_line_length=rng.choice([8, 64, 16384]))
        cut = rng.randrange(0, len(data) + 1)
        samples, rejects = feed_all(decoder, [data[:cut], data[cut:]])
        rejects += decoder.finish()
        assert_well_formed(samples, rejects)
        assert_well_formed(*listed(decode_datagram(data, NOW_MS)))


# --- arrays: a buffer decoded in bulk ---------------------------------------------------------


def assert_arrays(samples, paths, series, path_index, timestamps, values):
    """The decoder's exact arrays, dtypes included (NaN compared as NaN)."""
    assert samples.paths == paths
    assert list(map(name_and_tags, samples.series)) == series
    assert samples.path_index.dtype == np.intp and samples.path_index.tolist() == path_index
    assert samples.timestamps.dtype == np.int64 and samples.timestamps.tolist() == timestamps
    assert samples.values.dtype == np.float64
    np.testing.assert_array_equal(samples.values, np.array(values, dtype=np.float64))


def test_arrays_mixed_good_and_bad_lines_with_tags_and_repeated_paths():
    data = (
        b"a.b 1 1700000000\n"
        b"c;dc=x;host=h 2.5 1700000010\n"
        b"a.b 3 1700000020\n"  # the same path again: the same table entry
        b"bad line\n"
        b"a.b nan 1700000030\n"
        b"d -inf 1700000040\n"
        b"e 1e400 1700000050\n"  # float() overflows to inf: refused as inf
        b"f 4 1e30\n"
        b"g 5 -2\n"
        b"h;=v 6 1700000060\n"
        b"c;host=h;dc=x 7 -1\n"  # another spelling of a series already in the table
        b"\n"
        b"a.b 8 1700000070.9\n"
        b"i 9 17"  # partial: kept for the next read
    )
    decoder = PlaintextDecoder()
    samples, rejects = decoder.feed(data, NOW_MS)
    assert_arrays(
        samples,
        ["a.b", "c;dc=x;host=h", "d", "e", "f", "g", "c;host=h;dc=x"],
        [
            ("a.b", {}),
            ("c", {"dc": "x", "host": "h"}),
            ("d", {}),
            ("e", {}),
            ("f", {}),
            ("g", {}),
            ("c", {"host": "h", "dc": "x"}),
        ],
        [0, 1, 0, 6, 0],
        [TS_MS, TS_MS + 10_000, TS_MS + 20_000, NOW_MS - NOW_MS % 1000, TS_MS + 70_000],
        [1.0, 2.5, 3.0, 7.0, 8.0],
    )
    assert rejects == [
        Reject("bad_field_count", "b'bad line'"),
        Reject("nan_value", "b'nan'"),
        Reject("inf_value", "b'-inf'"),
        Reject("inf_value", "b'1e400'"),
        Reject("bad_timestamp", "out of range: b'1e30'"),
        Reject("bad_timestamp", "negative: b'-2'"),
        Reject("bad_tag", "empty tag name"),
    ]
    samples, rejects = decoder.feed(b"00000000\n", NOW_MS)
    assert_arrays(samples, ["i"], [("i", {})], [0], [TS_MS], [9.0])
    assert rejects == [] and samples.series == ["i"]  # a buffer of plain paths: their texts


def test_arrays_huge_timestamps_at_the_int64_millisecond_edge():
    """Floats are 2 apart near MAX_TIMESTAMP_S (9223372036854775): the largest below it is
    stored, the next (what "9223372036854775" itself parses to) is out of range."""
    data = b"a 1 9223372036854774\na 2 9223372036854775\na 3 9.3e15\na 4 inf\na 5 0.5\n"
    samples, rejects = decode_datagram(data, NOW_MS)
    assert_arrays(samples, ["a"], [("a", {})], [0, 0], [9_223_372_036_854_774_000, 0], [1.0, 5.0])
    assert reasons(rejects) == ["bad_timestamp"] * 3
    assert rejects[0].detail == "out of range: b'9223372036854775'"


@pytest.mark.parametrize(
    "path, series",
    [
        (b"a..b", ("a.b", {})),
        (b".a", ("a", {})),
        (b"~a.b", ("a.b", {})),
        (b"a.b.", ("a.b", {})),
        (b"a{x=1}", ("a{x=1}", {})),
        (b'a{x="1"}', ("a", {"x": "1"})),
        ("é.b".encode(), ("é.b", {})),
    ],
)
def test_arrays_paths_that_are_not_plain_parse_as_one_by_one(path, series):
    """A buffer of plain paths is recognized at once; one other path makes every path of the
    buffer go through parse_path, with the same series as alone."""
    samples, rejects = decode_datagram(b"plain.path 1 1700000000\n" + path + b" 2 1700000000", NOW_MS)
    assert rejects == [] and list(map(name_and_tags, samples.series)) == [("plain.path", {}), series]
    assert samples.paths == ["plain.path", path.decode()]


def test_arrays_bad_paths_refused_with_their_line_only():
    data = b"a 1 1700000000\n\xff.b 2 1700000000\na 3 1700000000\nc\x01d 4 1700000000\n"
    samples, rejects = decode_datagram(data, NOW_MS)
    assert_arrays(samples, ["a"], [("a", {})], [0, 0], [TS_MS, TS_MS], [1.0, 3.0])
    assert reasons(rejects) == ["bad_utf8", "bad_path"]


def test_arrays_pickle_items_with_repeated_paths_and_bad_items():
    items = [
        ("a.b", (1700000000, 1)),
        (b"a.b", (1700000010, 2.5)),  # bytes and text: two entries of one series
        ("a.b", (1700000020, "3")),
        ("a\nb", (1700000000, 4)),  # a newline in a path: refused, not split
        ("c;t=v", (1700000000, float("nan"))),
        ["d", [-1, 5]],
        ("e", (1700000000,)),
    ]
    samples, rejects = decode_frame(pickle.dumps(items, protocol=4), NOW_MS)
    assert_arrays(
        samples,
        ["a.b", "a.b", "c;t=v", "d"],
        [("a.b", {}), ("a.b", {}), ("c", {"t": "v"}), ("d", {})],
        [0, 1, 0, 3],
        [TS_MS, TS_MS + 10_000, TS_MS + 20_000, NOW_MS - NOW_MS % 1000],
        [1.0, 2.5, 3.0, 5.0],
    )
    assert reasons(rejects) == ["bad_path", "nan_value", "bad_pickle_item"]


# --- pickle: happy path ----------------------------------------------------------------------


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


ITEMS = [("a.b", (1700000000, 1.5)), ("c;t=v", (1700000000.7, 2)), ("d", (-1, True))]
EXPECTED = [("a.b", {}, TS_MS, 1.5), ("c", {"t": "v"}, TS_MS, 2.0), ("d", {}, NOW_MS - NOW_MS % 1000, 1.0)]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_protocols(protocol):
    data = frame(pickle.dumps(ITEMS, protocol=protocol))
    assert feed_all(PickleDecoder(), [data]) == (EXPECTED, [])


def test_pickle_lists_bytes_paths_and_text_numbers():
    payload = pickle.dumps(
        [["a.b", [1700000000, 1.5]], (b"b", ("1700000000", "2.5")), (b"c", (b"1700000000", b"3"))], protocol=3
    )
    assert listed(decode_frame(payload, NOW_MS)) == (
        [("a.b", {}, TS_MS, 1.5), ("b", {}, TS_MS, 2.5), ("c", {}, TS_MS, 3.0)],
        [],
    )


def test_python2_style_pickle():
    # protocol 2 as Python 2 writes it: SHORT_BINSTRING path (decoded as UTF-8), BININT, BINFLOAT
    payload = (
        b"\x80\x02]q\x00U\x05a.\xc3\xa9bq\x01J"
        + struct.pack("<i", TS)
        + b"G"
        + struct.pack(">d", 3.25)
        + b"\x86q\x02\x86q\x03a."
    )
    assert listed(decode_frame(payload, NOW_MS)) == ([("a.éb", {}, TS_MS, 3.25)], [])


def test_many_frames_split_at_every_byte_position():
    data = frame(pickle.dumps(ITEMS[:1], protocol=2)) + frame(b"garbage") + frame(pickle.dumps(ITEMS[1:], protocol=4))
    expected = feed_all(PickleDecoder(), [data])
    assert expected[0] == EXPECTED and reasons(expected[1]) == ["bad_pickle"]
    for cut in range(len(data) + 1):
        decoder = PickleDecoder()
        assert feed_all(decoder, [data[:cut], data[cut:]]) == expected, cut
        assert decoder.finish() == []


def test_bad_items_do_not_lose_neighbours():
    payload = pickle.dumps(
        [
            ("ok.1", (1, 1)),
            ("a", (1, 2), 3),
            "a.b",
            ("a", (1,)),
            ("a", 5),
            (7, (1, 1)),
            (b"\xff", (1, 1)),
            ("a", (1, float("nan"))),
            ("a", (1, float("inf"))),
            ("a", (1, None)),
            ("a", (1, "x")),
            ("a", (None, 1)),
            ("a", (-7, 1)),
            ("a", (1, 10**400)),
            ("a;b", (1, 1)),
            ("a b", (1, 1)),
            ("a\n", (1, 1)),
            ("\udc80", (1, 1)),
            ("", (1, 1)),
            ("ok.2", [2, 2]),
        ],
        protocol=3,
    )
    samples, rejects = listed(decode_frame(payload, NOW_MS))
    assert [s[0] for s in samples] == ["ok.1", "ok.2"]
    assert reasons(rejects) == [
        "bad_pickle_item",
        "bad_pickle_item",
        "bad_pickle_item",
        "bad_pickle_item",
        "bad_path",
        "bad_utf8",
        "nan_value",
        "inf_value",
        "bad_value",
        "bad_value",
        "bad_timestamp",
        "bad_timestamp",
        "bad_value",
        "bad_tag",
        "bad_path",
        "bad_path",
        "bad_path",
        "bad_path",
    ]


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps("a.b", protocol=2),
        pickle.dumps(5, protocol=2),
        pickle.dumps(None, protocol=2),
    ],
)
def test_payload_must_be_a_list(payload):
    assert reasons(listed(decode_frame(payload, NOW_MS))[1]) == ["bad_pickle"]


def test_python3_bytes_need_protocol_3():
    # below protocol 3, Python 3 pickles bytes as a call to _codecs.encode: a global
    payload = pickle.dumps([(b"a", (1, 1))], protocol=2)
    assert reasons(listed(decode_frame(payload, NOW_MS))[1]) == ["bad_pickle"]


def test_empty_list_and_tuple_payload():
    assert listed(decode_frame(pickle.dumps([], protocol=2), NOW_MS)) == ([], [])
    assert listed(decode_frame(pickle.dumps((), protocol=2), NOW_MS)) == ([], [])


# --- pickle: framing limits ------------------------------------------------------------------


def test_oversized_frame_is_skipped_exactly():
    good = frame(pickle.dumps(ITEMS, protocol=2))
    junk = bytes(range(256)) * 20
    data = good + struct.pack(">I", len(junk)) + junk + good
    whole = feed_all(PickleDecoder(max_frame_bytes=1000), [data])
    assert whole[0] == EXPECTED * 2 and reasons(whole[1]) == ["frame_too_large"]
    decoder = PickleDecoder(max_frame_bytes=1000)
    assert feed_all(decoder, [data[i : i + 1] for i in range(len(data))]) == whole
    assert decoder.finish() == []


def test_oversized_frame_is_not_buffered():
    decoder = PickleDecoder(max_frame_bytes=1024)
    chunk = b"\x00" * (1 << 20)
    header = struct.pack(">I", 100 << 20)
    assert reasons(listed(decoder.feed(header, NOW_MS))[1]) == ["frame_too_large"]
    tracemalloc.start()
    try:
        for _ in range(100):
            assert listed(decoder.feed(chunk, NOW_MS)) == ([], [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert feed_all(decoder, [frame(pickle.dumps(ITEMS, protocol=2))]) == (EXPECTED, [])


def test_declared_length_at_the_limit_is_accepted():
    payload = pickle.dumps(ITEMS, protocol=2)
    assert feed_all(PickleDecoder(max_frame_bytes=len(payload)), [frame(payload)]) == (EXPECTED, [])
    rejected = feed_all(PickleDecoder(max_frame_bytes=len(payload) - 1), [frame(payload)])
    detail = f"{len(payload)} bytes, limit {len(payload) - 1}"
    assert rejected == ([], [Reject("frame_too_large", detail)])


def test_huge_declared_length():
    decoder = PickleDecoder()
    assert reasons(listed(decoder.feed(b"\xff\xff\xff\xff" + b"x" * 100, NOW_MS))[1]) == ["frame_too_large"]
    assert decoder.finish() == []  # counted once, when the header arrived


def test_truncated_frame_on_close():
    data = frame(pickle.dumps(ITEMS, protocol=2))
    decoder = PickleDecoder()
    assert listed(decoder.feed(data[:-1], NOW_MS)) == ([], [])
    assert reasons(decoder.finish()) == ["truncated_frame"]
    decoder.feed(b"\x00\x00", NOW_MS)
    assert reasons(decoder.finish()) == ["truncated_frame"]
    assert decoder.finish() == []


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b".",
        b"\x80\x02",
        b"\x80\x02]",
        b"\x80\x02].junk",
        b"\x80\x02]q",
        b"\x80\x02]X\xff\xff\xff\x7fab.",
        b"\x80\x09].",
        b"\x80\x02]T\xff\xff\xff\xffabc.",
        b"\x80\x02]h\x05.",
        b"(lp-1\n.",
        b"(lpxyz\n.",
        b"\x80\x02]]a" + b"e" * 5 + b".",
        b"L" + b"9" * 5000 + b"\n.",
        b"\x80\x02)a.",
    ],
)
def test_malformed_pickles(payload):
    samples, rejects = listed(decode_frame(payload, NOW_MS))
    assert samples == [] and reasons(rejects) == ["bad_pickle"]


# --- pickle: hostile payloads ----------------------------------------------------------------

CALLS = []


def record_call(*args):
    CALLS.append(args)
    return [("pwned", (1, 1))]


class Evil:
    def __reduce__(self):
        return record_call, ("reduce",)


EXEC_BODY = b"\x8c\x08builtins\x8c\x04exec\x93\x8c\x04pass\x85R."
HOSTILE = {
    "p0 GLOBAL os.system": b"cos\nsystem\n(S'true'\ntR.",
    "p0 INST os.system": b"(S'true'\nios\nsystem\n.",
    "p1 OBJ os.system": b"(cos\nsystem\nS'true'\no.",
    "p2 GLOBAL builtins.eval": b"\x80\x02cbuiltins\neval\nX\x03\x00\x00\x001+1\x85R.",
    "p2 GLOBAL test module": b"\x80\x02ctest_graphite_protocol\nrecord_call\n)R.",
    "p2 NEWOBJ": b"\x80\x02cbuiltins\nobject\n)\x81.",
    "p4 STACK_GLOBAL subprocess": (b"\x80\x04\x8c\nsubprocess\x8c\x0ccheck_output\x93]\x8c\x04true\x85R."),
    "p5 STACK_GLOBAL builtins.exec": (b"\x80\x05\x95" + struct.pack("<Q", len(EXEC_BODY)) + EXEC_BODY),
    "p2 REDUCE without global": b"\x80\x02])R.",
    "p2 BUILD on a list": b"\x80\x02]]b.",
    "p2 EXT1": b"\x80\x02\x82\xf0)R.",
    "p0 PERSID": b"Pfoo\n.",
    "p2 BINPERSID": b"\x80\x02X\x03\x00\x00\x00fooQ.",
    "p5 NEXT_BUFFER": b"\x80\x05\x97.",
    "p2 dict": b"\x80\x02}.",
    "p4 frozenset": b"\x80\x04(\x91.",
    "p5 bytearray": b"\x80\x05\x96\x01\x00\x00\x00\x00\x00\x00\x00a.",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_opcodes_rejected(name):
    data = frame(HOSTILE[name]) + frame(pickle.dumps(ITEMS, protocol=2))
    samples, rejects = feed_all(PickleDecoder(), [data])
    assert samples == EXPECTED and reasons(rejects) == ["bad_pickle"]
    assert "not allowed" in rejects[0].detail
    assert CALLS == []


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_reduce_objects_rejected(protocol):
    for obj in (Evil(), [Evil()], [("a.b", (1, Evil()))]):
        payload = pickle.dumps(obj, protocol=protocol)
        assert reasons(listed(decode_frame(payload, NOW_MS))[1]) == ["bad_pickle"]
    assert CALLS == []


@pytest.mark.parametrize(
    "payload",
    [
        HOSTILE["p0 GLOBAL os.system"],
        HOSTILE["p2 GLOBAL test module"],
        HOSTILE["p4 STACK_GLOBAL subprocess"],
        HOSTILE["p5 STACK_GLOBAL builtins.exec"],
        HOSTILE["p0 INST os.system"],
        HOSTILE["p1 OBJ os.system"],
        pickle.dumps(Evil(), protocol=2),
        pickle.dumps(Evil(), protocol=5),
    ],
)
def test_second_gate_refuses_every_global(payload):
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        NoGlobalsUnpickler(io.BytesIO(payload)).load()
    assert CALLS == []


def test_second_gate_refuses_registered_extension():
    copyreg.add_extension("test_graphite_protocol", "record_call", 240)
    try:
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            NoGlobalsUnpickler(io.BytesIO(HOSTILE["p2 EXT1"])).load()
        assert reasons(listed(decode_frame(HOSTILE["p2 EXT1"], NOW_MS))[1]) == ["bad_pickle"]
    finally:
        copyreg.remove_extension("test_graphite_protocol", "record_call", 240)
    assert CALLS == []


@pytest.mark.parametrize(
    "payload",
    [
        b"\x80\x02]r" + (1 << 27).to_bytes(4, "little") + b".",  # LONG_BINPUT: 2 GiB memo in CPython
        b"\x80\x02]r\xff\xff\xff\xff.",
        b"(lp134217728\n.",  # PUT, protocol 0
        b"\x80\x05\x8e" + (1 << 62).to_bytes(8, "little") + b".",  # BINBYTES8 with a huge count
        b"\x80\x04\x8d" + (1 << 40).to_bytes(8, "little") + b".",  # BINUNICODE8 likewise
    ],
)
def test_memory_bombs_rejected_fast(payload):
    started = time.perf_counter()
    assert reasons(listed(decode_frame(payload, NOW_MS))[1]) == ["bad_pickle"]
    assert time.perf_counter() - started < 0.5


def test_deeply_nested_lists_and_tuples():
    depth = 300_000
    nested_lists = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    nested_tuples = b"\x80\x02]N" + b"\x85" * depth + b"a."
    for payload in (nested_lists, nested_tuples):
        assert len(payload) < 1 << 20
        samples, rejects = feed_all(PickleDecoder(), [frame(payload)])
        assert samples == [] and reasons(rejects) == ["bad_pickle_item"]


def test_self_referencing_lists():
    # L = []; L.append((L, L)): the datapoint L is a list of one item
    payload = b"\x80\x02]q\x00h\x00h\x00\x86a."
    assert reasons(listed(decode_frame(payload, NOW_MS))[1]) == ["bad_pickle_item"]
    # L = []; L.append((L, (1, 1))): the path L is not text
    payload = b"\x80\x02]q\x00h\x00K\x01K\x01\x86\x86a."
    assert reasons(listed(decode_frame(payload, NOW_MS))[1]) == ["bad_path"]


def test_huge_ints_and_strings_within_a_frame():
    payload = pickle.dumps(
        [("a" * 500_000, (1, 1)), ("b", (10**1000, 1)), ("c", (1, 2**5000)), ("d", ("9" * 100_000, 1))], protocol=4
    )
    samples, rejects = listed(decode_frame(payload, NOW_MS))
    assert [s[0] for s in samples] == ["a" * 500_000]
    assert reasons(rejects) == ["bad_timestamp", "bad_value", "bad_timestamp"]
    assert max(len(r.detail) for r in rejects) < 200


def test_pickle_fuzz():
    rng = random.Random(1337)
    seeds = [pickle.dumps(ITEMS, protocol=p) for p in range(6)] + list(HOSTILE.values())
    for _ in range(2000):
        if rng.random() < 0.3:
            data = rng.randbytes(rng.randrange(0, 300))
        else:
            payload = bytearray(rng.choice(seeds))
            for _ in range(rng.randrange(1, 6)):
                payload[rng.randrange(len(payload))] = rng.randrange(256)
            data = frame(bytes(payload)) if rng.random() < 0.8 else bytes(payload)
        decoder = PickleDecoder(max_frame_bytes=rng.choice([16, 4096]))
        cut = rng.randrange(0, len(data) + 1)
        samples, rejects = feed_all(decoder, [data[:cut], data[cut:]])
        rejects += decoder.finish()
        assert_well_formed(samples, rejects)
        assert_well_formed(*listed(decode_frame(data, NOW_MS)))
    assert CALLS == []


# --- pickle: frames bounded in samples, not only bytes -----------------------------------------


def dup_frame(copies: int) -> bytes:
    """One item, then DUP ``copies`` times, in one list: a byte a sample."""
    item = pickle.dumps(("a.b", (1700000000, 1.5)), protocol=2)[2:-1]
    return b"\x80\x02(" + item + b"2" * copies + b"l."


def test_pickle_frame_of_dup_opcodes_is_one_reject_and_the_good_frames_stay():
    data = frame(pickle.dumps(ITEMS, protocol=2)) + frame(dup_frame(1_000_000)) + frame(pickle.dumps(ITEMS, protocol=2))
    started = time.perf_counter()
    samples, rejects = feed_all(PickleDecoder(), [data])
    assert time.perf_counter() - started < 0.5
    assert samples == EXPECTED * 2 and reasons(rejects) == ["too_many_items"]
    assert rejects[0].detail == "1000001 items in 1000035 bytes, at most one per 8 bytes"


def test_pickle_items_as_small_as_a_pickler_writes_them_are_kept():
    items = [("a", (i % 200, 1)) for i in range(10_000)]
    payload = pickletools.optimize(pickle.dumps(items, protocol=2))
    assert len(payload) < 8 * len(items) + 64
    samples, rejects = listed(decode_frame(payload, NOW_MS))
    assert len(samples) == 10_000 and rejects == []
