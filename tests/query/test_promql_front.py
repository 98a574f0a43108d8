"""The PromQL front (gateway/query/promql/front.py): Prometheus 3's duration expressions and range
modifiers rewritten into text promql-parser reads, tested on plain query text."""

from pathlib import Path

import promql_parser
import pytest

from gateway.query.promql.engine import Query, QueryText
from gateway.query.promql.front import QueryTimes, rewrite
from gateway.query.promql.values import PromQLError
from tests import prometheus3
from tests.promqltest import Eval, parse_file, parse_file_v3

RANGE_QUERY = QueryTimes(step_ms=5000, range_ms=10_000)


@pytest.mark.parametrize(
    "text, rewritten",
    [
        ("changes(http_requests[26m+4m])", "changes(http_requests[1800000ms])"),
        ("x[60*30]", "x[1800000ms]"),
        ("x[24m+((1.5*2m)+2m)]", "x[1740000ms]"),
        ("x[-5m+35m]", "x[1800000ms]"),  # a sign binds tighter than + and -
        ("x[30m1s-30m1s % 1m]", "x[1800000ms]"),
        ("x[2^3]", "x[8000ms]"),
        ("x[-2^2+8]", "x[4000ms]"),  # but looser than ^
        ("x[2^1^3]", "x[2000ms]"),  # ^ is right-associative
        ("x[1+(STep()-5)*2]", "x[1000ms]"),  # step() in seconds, its name in any case
        ("x[max_of(min_of(step()+1,1h),1ms)]", "x[6000ms]"),
        ("x[range()]", "x[10000ms]"),
        ("x[1.0005]", "x[1.0005]"),  # a literal is promql-parser's
        ("x[29s+1s:5s+5s]", "x[30000ms:10000ms]"),
        ("x[29s+1s:]", "x[30000ms:]"),
        ("x[5m:step()]", "x[5m:5000ms]"),
        ("x offset (100 + 2)", "x offset 102000ms"),
        ("x offset (-2 ^ 2)", "x offset -4000ms"),
        ("x offset -(min_of(step(), 2s)-5)+8000", "x offset 3000ms+8000"),
        ("x offset step()*0", "x offset 5000ms*0"),  # an operator after the offset is the selector's
        ("x offset -step()*2", "x offset -5000ms*2"),
        ("x offset (5m)", "x offset 300000ms"),
        ("x offset (step() - 5)", "x "),  # 0: no offset (promql-parser refuses offset 0)
        ("x[1m:20*500ms] offset (1h/2)", "x[1m:10000ms] offset 1800000ms"),
        ("rate(x[1m+1m] @ start())", "rate(x[120000ms] @ start())"),
    ],
)
def test_duration_expressions_become_milliseconds(text, rewritten):
    assert rewrite(text, RANGE_QUERY) == rewritten


@pytest.mark.parametrize(
    "text",
    [
        'x{a="[1+1]"}[5m]',
        'x{a="\\"[1+1]"}',  # an escaped quote does not end the string
        "x{a=`[1+1]\\`}",  # nor does a backslash end a backtick string
        "x # [1+1] offset (1+1)\n",
        "offset offset 5m",  # a metric named offset
        "sum by (offset) (x)",
        "x offset 100 + 2",
        "x offset -2 ^ 2",
        "x[5m:]",
        "step() + range() + start() + end() + min_of(1, 2)",  # functions outside durations: the engine's
        'x{"offset"="(1+1)"} offset 1m',
        "x[1+",  # not a duration expression: promql-parser says what is wrong
    ],
)
def test_text_without_duration_expressions_is_unchanged(text):
    assert rewrite(text, RANGE_QUERY) == text


def test_an_instant_query_has_step_and_range_0():
    assert rewrite("x offset range()") == "x "
    assert rewrite("x[step()+1s]") == "x[1000ms]"


@pytest.mark.parametrize(
    "text, error",
    [
        ("x[1h/0]", "2:6: division by zero"),
        ("x[1h % (1-1)]", "2:12: modulo by zero"),
        ("x[5m-5m]", "2:7: duration must be greater than 0"),
        ("x[-5m]", "2:5: duration must be greater than 0"),
        ("x[range()]", "2:9: duration must be greater than 0"),
        ("x offset (Inf*1)", "9:16: duration is NaN or infinite"),
        ("x offset (1e300*1)", "9:18: duration is out of range"),
    ],
)
def test_duration_errors_as_prometheus_words_them(text, error):
    with pytest.raises(PromQLError) as raised:
        QueryText().parse(text, Query(0, 0, 0, 300_000))
    assert (raised.value.args[0], raised.value.error_type) == (f'invalid parameter "query": {error}', "bad_data")


def test_a_text_parsed_again_is_the_same_expression_for_the_same_bounds_and_times():
    """A dashboard's texts are parsed once (QueryText keeps them): the same text, bounds and query
    times give the same (immutable) expression; other times or bounds parse again, and the
    bounds are checked for each (a text kept under loose bounds is refused under tight ones)."""
    text = 'sum(rate(cache_test_total{job="api"}[step()*5]))'
    hour = Query(0, 3_600_000, 60_000, 300_000)
    first = QueryText().parse(text, hour)
    assert QueryText().parse(text, hour) is first
    with pytest.raises(AttributeError):
        first.op = None  # what makes sharing it safe
    other_step = QueryText().parse(text, Query(0, 3_600_000, 30_000, 300_000))
    assert other_step is not first and other_step.expr.args[0].range.total_seconds() == 150
    with pytest.raises(PromQLError, match="over --query-max-length 10"):
        QueryText(max_length=10).parse(text, hour)


def test_short_and_recently_parsed_texts_parse_at_once_others_in_a_thread():
    """``parses_at_once`` says which texts cost next to nothing to parse (PromQLService parses
    those without a thread hop): short ones, and longer ones parsed recently; a text that is
    refused stays refused (errors are not kept)."""
    text_of = QueryText()
    long_text = "+".join(f"parses_at_once_{i}" for i in range(12))
    assert text_of.parses_at_once("up")
    assert not text_of.parses_at_once(long_text)
    text_of.parse(long_text)
    assert text_of.parses_at_once(long_text)
    assert not text_of.parses_at_once(long_text, Query(0, 60_000, 15_000, 300_000))  # other times
    huge = "+".join(["x"] * 2500)  # over what is kept
    with pytest.raises(PromQLError):
        text_of.parse(huge)
    assert not text_of.parses_at_once(huge)
    for _ in range(2):
        with pytest.raises(PromQLError, match="unclosed"):
            text_of.parse("sum(x")


def test_the_parsed_query_holds_the_evaluated_durations():
    expr = QueryText().parse("rate(x[step()*3] offset (1m/2))", Query(0, 60_000, 20_000, 300_000))
    selector = expr.args[0]
    assert selector.range.total_seconds() == 60 and selector.vector_selector.offset.total_seconds() == 30


def _parsed_by_promql_parser(text: str) -> bool:
    try:
        promql_parser.parse(text)
    except BaseException:  # a Rust panic is a BaseException
        return False
    return True


def test_what_promql_parser_reads_reaches_it_unchanged():
    """Every expression of the 2.42 and 3.14 tiers that promql-parser reads as written."""
    files = [
        *[(path, parse_file) for path in sorted((Path(__file__).resolve().parents[1] / "promql").glob("*.test"))],
        *[(path, parse_file_v3) for path in sorted(_testdata3().glob("*.test"))],
    ]
    expressions = {c.expr for path, read in files for c in read(path) if isinstance(c, Eval)}
    readable = [text for text in expressions if _parsed_by_promql_parser(text)]
    assert len(readable) > 2000
    assert [text for text in readable if rewrite(text, RANGE_QUERY) != text] == []


def _testdata3() -> Path:
    return prometheus3.module_source() / "promql" / "promqltest" / "testdata"


M = "__tsgate_range_modifier__"


@pytest.mark.parametrize(
    "text, rewritten",
    [
        ("increase(x[1m] anchored)", f'increase(x{{{M}="anchored"}}[1m] )'),
        ('rate(x{a="b"}[5m] SMOOTHED)', f'rate(x{{a="b",{M}="smoothed"}}[5m] )'),
        ('rate({__name__="x",}[5m] smoothed)', f'rate({{__name__="x",{M}="smoothed"}}[5m] )'),
        ("rate(x{}[5m] anchored)", f'rate(x{{{M}="anchored"}}[5m] )'),
        ("x offset -100 smoothed + 0", f'x{{{M}="smoothed"}} offset -100  + 0'),
        ("x @ start() smoothed", f'x{{{M}="smoothed"}} @ start() '),
        ("rate(x[1m+1m] offset (1m/2) anchored)", f'rate(x{{{M}="anchored"}}[120000ms] offset 30000ms )'),
        ("x + on(a) group_left(b) y smoothed", f'x + on(a) group_left(b) y{{{M}="smoothed"}} '),
        ("x anchored anchored", f'x{{{M}="anchored"}}  '),
    ],
)
def test_range_modifiers_become_a_matcher_on_their_selector(text, rewritten):
    assert rewrite(text, RANGE_QUERY) == rewritten


@pytest.mark.parametrize(
    "text",
    ['x{a="anchored"}', "sum(anchored)", "anchored", "sum by (smoothed) (x)", "x # smoothed\n", 'x{"smoothed"="1"}'],
)
def test_the_words_elsewhere_are_left_alone(text):
    assert rewrite(text, RANGE_QUERY) == text


S, V = "__tsgate_trim_scalar__", "__tsgate_trim_vector__"


@pytest.mark.parametrize(
    "text, rewritten",
    [
        ("h </ +Inf", f"h < {S}(+Inf)"),
        ("h >/ on (label) f", f"h > on (label) {V}(f)"),
        ("h >/ 1 > 2", f"h > {S}(1) > 2"),  # left-associative at the comparisons' precedence
        ("h >/ 1 + x * 2 and y", f"h > {V}(1 + x * 2) and y"),  # + and * bind tighter, and looser
        ("sum(h >/ scalar(x) + time()) by (a)", f"sum(h > {S}(scalar(x) + time())) by (a)"),
        ('h </ {__name__="f"}', f'h < {V}({{__name__="f"}})'),
        ("a >/ b </ (1)", f"a > {V}(b) < {S}((1))"),
        ("h >/ fill_left(0) fill", f"h > fill_left(0) {V}(fill)"),  # a metric named fill
        ('x{a=">/"} > / 2', 'x{a=">/"} > / 2'),  # not adjacent, or in a string: no trim operator
    ],
)
def test_trim_operators_become_a_comparison_with_a_reserved_wrapper(text, rewritten):
    assert rewrite(text) == rewritten


@pytest.mark.parametrize("name", [S, V])
def test_the_trim_wrappers_are_reserved(name):
    with pytest.raises(PromQLError, match=f"the function name {name} is reserved"):
        QueryText().parse(f"x > {name}(1)")


@pytest.mark.parametrize(
    "text, rewritten",
    [
        ('info(x, {data=~".*"})', f'info(x, {{data=~".*",{M}="info"}})'),
        ('sum(info(rate(x[5m]), {a="}",}))', f'sum(info(rate(x[5m]), {{a="}}",{M}="info"}}))'),
        ("info(x)", "info(x)"),
        ('info{a="b"} + info', 'info{a="b"} + info'),  # a metric named info
    ],
)
def test_info_label_selectors_are_marked_when_asked(text, rewritten):
    assert rewrite(text, info_labels=True) == rewritten


def test_an_info_label_selector_matching_the_empty_value_parses():
    """promql-parser refuses it (as any selector); Prometheus takes it in info()."""
    QueryText().parse('info(x, {data=~".*"})')
    with pytest.raises(PromQLError, match="at least one non-empty matcher"):
        QueryText().parse('info(x, {data=~".*"}) + {a=~".*"}')
