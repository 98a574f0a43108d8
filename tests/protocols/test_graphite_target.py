"""Graphite target grammar and from/until time parsing (pure code)."""

from datetime import timedelta, timezone

import pytest

from protocols.graphite.attime import parse_at_time, parse_time_offset
from protocols.graphite.target import (
    Call,
    Literal,
    PathExpression,
    TargetSyntaxError,
    first_path_expression,
    parse_target,
)


def test_plain_path_with_globs():
    assert parse_target("servers.web*.cpu-[0-7].{user,system}.value?") == PathExpression(
        "servers.web*.cpu-[0-7].{user,system}.value?"
    )


def test_tagged_name_is_a_path():
    assert parse_target("cpu;host=web1;dc=~eu") == PathExpression("cpu;host=web1;dc=~eu")


def test_nested_call_with_positional_and_keyword_arguments():
    node = parse_target("aliasByNode(sumSeries(a.{b,c}.d, e.f), 1, -2)")
    assert node == Call(
        "aliasByNode",
        [
            Call("sumSeries", [PathExpression("a.{b,c}.d"), PathExpression("e.f")], raw="sumSeries(a.{b,c}.d, e.f)"),
            Literal(1),
            Literal(-2),
        ],
        raw="aliasByNode(sumSeries(a.{b,c}.d, e.f), 1, -2)",
    )
    node = parse_target("movingWindow(a.b, '5min', func='median', xFilesFactor=0.5)")
    assert node.args == [PathExpression("a.b"), Literal("5min")]
    assert node.kwargs == {"func": Literal("median"), "xFilesFactor": Literal(0.5)}


def test_commas_inside_braces_are_part_of_the_path():
    node = parse_target("sumSeries(host.{a,b,c}.cpu,x.y)")
    assert node.args == [PathExpression("host.{a,b,c}.cpu"), PathExpression("x.y")]


def test_numbers_booleans_none_and_inf():
    node = parse_target("f(a, 1, -2, 3.5, 1e3, -2.5E-2, true, False, TRUE, None, none, inf)")
    assert [arg.value for arg in node.args[1:]] == [
        1,
        -2,
        3.5,
        1000.0,
        -0.025,
        True,
        False,
        True,
        None,
        None,
        float("inf"),
    ]
    assert isinstance(node.args[1].value, int) and isinstance(node.args[4].value, float)


def test_number_followed_by_letters_is_a_path():
    assert parse_target("summarize(a, 1h)").args[1] == PathExpression("1h")
    assert parse_target("f(1.foo, true.x)").args == [PathExpression("1.foo"), PathExpression("true.x")]


def test_strings_keep_escapes_and_both_quotes():
    node = parse_target("""aliasSub(a.b, '(\\w+)\\.b', "x\\1 'q'")""")
    assert node.args[1] == Literal("(\\w+)\\.b")
    assert node.args[2] == Literal("x\\1 'q'")
    assert parse_target("alias(a, '')").args[1] == Literal("")
    assert parse_target("alias(a, 'it''s')").args[1] == Literal("it''s")


def test_whitespace_between_tokens():
    node = parse_target("  sumSeries ( a.b ,  c.d )  ")
    assert node.args == [PathExpression("a.b"), PathExpression("c.d")]


def test_escaped_symbols_in_paths():
    assert parse_target(r"a.b\(x\).c") == PathExpression("a.b(x).c")


def test_pipes_become_nested_calls():
    node = parse_target("a.b | scale(2) |alias('x')")
    assert node.name == "alias"
    assert node.args[0].name == "scale"
    assert node.args[0].args == [PathExpression("a.b"), Literal(2)]


def test_raw_text_of_series_by_tag():
    node = parse_target("aliasByTags(seriesByTag('name=cpu', 'host=~web.*'), 'host')")
    assert node.args[0].raw == "seriesByTag('name=cpu', 'host=~web.*')"


def test_empty_call():
    assert parse_target("countSeries()") == Call("countSeries", [], {}, "countSeries()")


@pytest.mark.parametrize(
    "target",
    [
        "sumSeries(a.b",
        "sumSeries(a.b))",
        "f(a,)",
        "f(x=1, a.b)",
        "alias(a, 'x)",
        "a.{b,}.c",
        "a..b",
        "a b",
        "f(a=1, a=2)",
        "a.b|c.d",
    ],
)
def test_syntax_errors(target):
    with pytest.raises(TargetSyntaxError):
        parse_target(target)


def test_first_path_expression():
    assert first_path_expression("sumSeries(a.b.c,d.e)") == "a.b.c"
    assert first_path_expression("scale(movingAverage(x.y,5),2)") == "x.y"
    assert first_path_expression("constantLine(1)") is None
    assert first_path_expression("alias name (x)") == "alias"


NOW = 1700000000  # 2023-11-14 22:13:20 UTC, a Tuesday
DAY = 86400
MIDNIGHT = 1699920000  # 2023-11-14 00:00 UTC


@pytest.mark.parametrize(
    "text,expected",
    [
        ("now", NOW),
        ("-1h", NOW - 3600),
        ("-5min", NOW - 300),
        ("-30s", NOW - 30),
        ("-2d", NOW - 2 * DAY),
        ("-1w", NOW - 7 * DAY),
        ("-1mon", NOW - 30 * DAY),
        ("-1y", NOW - 365 * DAY),
        ("+1h", NOW + 3600),
        ("-1d12h", NOW - DAY - 12 * 3600),
        ("1600000000", 1600000000),
        ("12:30_20230101", 1672576200),
        ("20230101", 1672531200),
        ("01/02/23", 1672617600),
        ("01/02/1999", 915235200),
        ("today", MIDNIGHT),
        ("yesterday", MIDNIGHT - DAY),
        ("tomorrow", MIDNIGHT + DAY),
        ("midnight", MIDNIGHT),
        ("noon", MIDNIGHT + 12 * 3600),
        ("teatime", MIDNIGHT + 16 * 3600),
        ("noon yesterday", MIDNIGHT - DAY + 12 * 3600),
        ("noon+1d", MIDNIGHT + DAY + 12 * 3600),
        ("midnight-1h", MIDNIGHT - 3600),
        ("3pm", MIDNIGHT + 15 * 3600),
        ("10am", MIDNIGHT + 10 * 3600),
        ("8:15pm", MIDNIGHT + 20 * 3600 + 900),
        ("monday", MIDNIGHT - DAY),
        ("tuesday", MIDNIGHT),
        ("jan5", 1672876800),
        ("Now", NOW),
    ],
)
def test_at_time_forms(text, expected):
    assert parse_at_time(text, NOW) == expected


def test_at_time_in_another_timezone():
    plus_two = timezone(timedelta(hours=2))
    assert parse_at_time("today", NOW, plus_two) == MIDNIGHT + DAY - 2 * 3600
    assert parse_at_time("-1h", NOW, plus_two) == NOW - 3600


@pytest.mark.parametrize("text", ["-1m", "foo", "13/45/23", "", "jan", "-h", "20230231"])
def test_at_time_errors(text):
    with pytest.raises(ValueError):
        parse_at_time(text, NOW)


def test_time_offsets():
    assert parse_time_offset("5min") == 300
    assert parse_time_offset("-1h") == -3600
    assert parse_time_offset("1hour") == 3600
    assert parse_time_offset("2months") == 60 * DAY
    assert parse_time_offset("") == 0
