"""PromQL evaluation with Prometheus 2.42's semantics, every step of a query at once.

A query runs in two phases: ``plan`` walks the parsed expression (``promql-parser``) and lists the
selectors with the time range each needs (offsets, ``@``, ranges, subqueries and the lookback
included); the service fetches those series through the read path; then ``Evaluator`` computes
the expression over numpy arrays, off the reactor, checking the query's deadline between nodes
and at each series of a range function (a subquery's inner steps can be millions).
Before anything is read, ``estimated_samples`` counts what the evaluation will hold, series x
steps with every subquery's inner steps, so the service refuses over --query-max-samples first.
"""

import json
import math
import re
import sys
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import promql_parser
import xxhash

from gateway.query.promql.front import (
    INFO_LABELS,
    INSTANT,
    MODIFIER_LABEL,
    TRIM_SCALAR,
    TRIM_VECTOR,
    FrontError,
    QueryTimes,
    rewrite,
)
from gateway.query.promql.functions import FUNCTIONS, valid_label_name
from gateway.query.promql.range_functions import (
    GAUGE_HINT,
    KahanMean,
    compensated_sum,
    extended_samples,
    interpolated_histogram,
    quantiles,
    series_stacks,
)
from gateway.query.promql.values import (
    DELAYED_NAME_REMOVAL,
    NAME,
    RECONCILED,
    SCHEMA_LABELS,
    Guard,
    LabelsKey,
    NameToDrop,
    PromQLError,
    RangeVector,
    Scalar,
    Series,
    String,
    Vector,
    answer_labels,
    drop_metric_name,
    go_float,
    is_stale,
    labels_key,
    marked_like,
    merge_same_labels,
    mixed_schemas_warning,
    quantile_warning,
    stacked,
)
from protocols.linear_regex import BadPattern, compile_regex
from protocols.prometheus.native_histogram import (
    NO_RESET_HINT,
    RESET_HINT,
    UNKNOWN_HINT,
    HistogramMean,
    HistogramSum,
    IncompatibleBuckets,
)
from protocols.prometheus.read import Matcher

DEFAULT_SUBQUERY_STEP_MS = 60_000
_MATCH_TYPES = {"MatchOp.Equal": "EQ", "MatchOp.NotEqual": "NEQ", "MatchOp.Re": "RE", "MatchOp.NotRe": "NRE"}
_COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}
_ARITHMETIC = {"+", "-", "*", "/", "%", "^", "atan2"}  # the operators that drop __name__ (2.42 kept it for atan2)
_TRIMS = {">": ">/", "<": "</"}  # the histogram trim operators (which keep __name__), as front.py writes them
_SET_OPERATORS = {"and", "or", "unless"}


# Prometheus 3 renamed it double_exponential_smoothing; the parser knows only the new name.
promql_parser.register_extra_functions(
    [
        promql_parser.Function(
            "holt_winters",
            [promql_parser.ValueType.Matrix, promql_parser.ValueType.Scalar, promql_parser.ValueType.Scalar],
            promql_parser.ValueType.Vector,
        ),
        # front.py's wrappers of a trim operator's right operand
        promql_parser.Function(TRIM_SCALAR, [promql_parser.ValueType.Scalar], promql_parser.ValueType.Scalar),
        promql_parser.Function(TRIM_VECTOR, [promql_parser.ValueType.Vector], promql_parser.ValueType.Vector),
    ]
)


class Query(NamedTuple):
    start_ms: int
    end_ms: int
    step_ms: int
    lookback_ms: int


def parser_call(function, *args):
    """``function(*args)`` of promql-parser, its Rust panics on values out of range (pyo3's
    PanicException, a BaseException) raised as ValueError."""
    try:
        return function(*args)
    except (Exception, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as error:
        raise ValueError(str(error).splitlines()[0] if str(error) else type(error).__name__) from None


def parse(text: str, times: QueryTimes = INSTANT):
    """The parsed expression, refused as Prometheus refuses it (bad_data): syntax, ``@`` times
    and offsets out of range, regular expressions RE2 does not take; and the Prometheus 3
    language tsgate does not take, named. Duration expressions are evaluated with ``times``
    (gateway/query/promql/front.py)."""
    try:
        try:
            expr = parser_call(promql_parser.parse, _raw_strings_quoted(rewrite(text, times)))
        except ValueError as error:
            if "info" not in text or _EMPTY_SELECTOR not in str(error):
                raise
            # info()'s label selector may match the empty value in Prometheus (front.py)
            expr = parser_call(promql_parser.parse, _raw_strings_quoted(rewrite(text, times, info_labels=True)))
        for node in _nodes(expr):
            _check_node(node)
    except FrontError as error:
        raise PromQLError(f'invalid parameter "query": {error}', "bad_data") from None
    except (ValueError, TypeError, OverflowError) as error:
        raise PromQLError(f'invalid parameter "query": {error}', "bad_data") from None
    _refuse_bytes_as_label_names(expr, _not_utf8_strings(text))
    return expr


_EMPTY_SELECTOR = "vector selector must contain at least one non-empty matcher"


def _refuse_bytes_as_label_names(expr, not_utf8: dict[str, bytes]) -> None:
    """A label name the query wrote as bytes that are no UTF-8 (``count_values("a\\xc5z", x)``)
    refused as Prometheus 3 refuses it: promql-parser reads ``\\xc5`` as the character U+00C5,
    where Go's strings hold the byte."""
    if not not_utf8:
        return
    for node in _nodes(expr):
        kind = type(node).__name__
        if kind == "AggregateExpr" and str(node.op) == "count_values":
            name = _string_of(node.param)
            if name in not_utf8:
                raise PromQLError(f"invalid label name {_go_quoted(not_utf8[name])}")
        elif kind == "Call" and node.func.name in ("label_replace", "label_join"):
            function = node.func.name
            names = [("destination", node.args[1])]
            if function == "label_join":
                names = [("source", arg) for arg in node.args[3:]] + names
            for role, arg in names:
                name = _string_of(arg)
                if name in not_utf8:
                    shown = not_utf8[name].decode("utf-8", errors="replace")
                    raise PromQLError(f"invalid {role} label name in {function}(): {shown}")


def _string_of(node) -> str | None:
    while type(node).__name__ == "ParenExpr":
        node = node.expr
    return node.val if type(node).__name__ == "StringLiteral" else None


_STRING = re.compile(r""""((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|`[^`]*`|\#[^\n]*""", re.DOTALL)
_ESCAPE = re.compile(r"\\(?:([0-7]{3})|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _not_utf8_strings(text: str) -> dict[str, bytes]:
    """The quoted strings of the query whose escapes make bytes that are no UTF-8, as Go reads
    them: each as promql-parser reads it (``\\xNN`` and octal escapes as characters) -> the
    bytes Go's string holds."""
    found = {}
    for literal in _STRING.finditer(text):
        body = literal.group(1) if literal.group(1) is not None else literal.group(2)
        if body is None or "\\" not in body:
            continue
        as_parsed, as_bytes, position = [], bytearray(), 0
        for escape in _ESCAPE.finditer(body):
            plain = body[position : escape.start()]
            as_parsed.append(plain)
            as_bytes += plain.encode()
            position = escape.end()
            octal, hexadecimal, short, long, other = escape.groups()
            if octal or hexadecimal:
                byte = int(octal, 8) if octal else int(hexadecimal, 16)
                as_parsed.append(chr(byte))
                as_bytes.append(byte)
            else:
                char = chr(int(short or long, 16)) if short or long else _SIMPLE_ESCAPES.get(other, other)
                as_parsed.append(char)
                as_bytes += char.encode(errors="surrogatepass")
        as_parsed.append(body[position:])
        as_bytes += body[position:].encode()
        try:
            bytes(as_bytes).decode()
        except UnicodeDecodeError:
            found["".join(as_parsed)] = bytes(as_bytes)
    return found


def _go_quoted(raw: bytes) -> str:
    """Go's strconv.Quote of bytes: a byte that starts no UTF-8 character as ``\\xNN``."""
    out, index = [], 0
    while index < len(raw):
        for size in range(1, 5):
            try:
                char = raw[index : index + size].decode()
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"\\x{raw[index]:02x}")
            index += 1
            continue
        index += size
        out.append(json.dumps(char, ensure_ascii=False)[1:-1])
    return '"' + "".join(out) + '"'


def _nodes(expr):
    yield expr
    kind = type(expr).__name__
    if kind == "MatrixSelector":
        yield expr.vector_selector
    elif kind == "SubqueryExpr":
        yield from _nodes(expr.expr)
    elif kind == "Call" and expr.func.name == "info":
        yield from expr.args[1:]
    for child in _children(expr):
        yield from _nodes(child)


def _check_node(node) -> None:
    """Reads what evaluation reads of a selector or subquery, so that what promql-parser cannot
    hand over (an ``@`` before 1970 or past year 9999, a huge offset) is a parse error here; a
    fill modifier where Prometheus 3 refuses one (a set operator), or bool on a trim operator."""
    if _fills(node) != (None, None) and str(node.op) in _SET_OPERATORS:
        raise ValueError("filling in missing series not allowed for set operators")
    if type(node).__name__ == "Call" and node.func.name == "info" and len(node.args) > 1:
        labels = node.args[1]
        if type(labels).__name__ != "VectorSelector":
            raise ValueError('expected label selectors only in call to function "info"')
        if labels.name:
            raise ValueError("expected label selectors only, got vector selector instead")
    if _is_trim(node) and node.modifier is not None and node.modifier.return_bool:
        raise ValueError("bool modifier can only be used on comparison operators")
    if type(node).__name__ not in ("VectorSelector", "MatrixSelector", "SubqueryExpr"):
        return
    for name in ("offset", "range", "step"):
        parser_call(getattr, node, name, None)
    at = parser_call(getattr, node, "at", None)
    if at is not None and not str(at.type).endswith(("Start", "End")):
        try:
            parser_call(lambda: at.at.timestamp())
        except (ValueError, OverflowError):
            raise ValueError("timestamp out of bounds for @ modifier (tsgate takes 1970 to 9999)") from None
    if type(node).__name__ == "VectorSelector":
        modifier = range_modifier(node)
        if (
            modifier not in (None, INFO_LABELS)
            and not node.name
            and all(_matches_empty(m) for m in selector_matchers(node))
        ):
            # promql-parser checked the selector with the front's marker, which matches no empty value
            raise ValueError(_EMPTY_SELECTOR)
        for matcher in node.matchers.matchers:
            if str(matcher.op) in ("MatchOp.Re", "MatchOp.NotRe"):
                try:
                    compile_regex(matcher.value, dot_nl=True)
                except BadPattern as error:
                    raise ValueError(f"error parsing regexp: {error}") from None


def _fills(node) -> tuple[float | None, float | None]:
    """A binary expression's ``fill_left()`` and ``fill_right()`` values (``fill()`` sets both),
    None where it has none."""
    modifier = node.modifier if type(node).__name__ == "BinaryExpr" else None
    fill = modifier.fill_values if modifier is not None else None
    return (None, None) if fill is None else (fill.lhs, fill.rhs)


def _is_trim(node) -> bool:
    """A binary expression front.py wrote for a trim operator (its right side wrapped)."""
    if type(node).__name__ != "BinaryExpr":
        return False
    return type(node.rhs).__name__ == "Call" and node.rhs.func.name in (TRIM_SCALAR, TRIM_VECTOR)


def _matches_empty(matcher: Matcher) -> bool:
    if matcher.type in ("EQ", "NEQ"):
        return (matcher.value == "") == (matcher.type == "EQ")
    try:
        matches = compile_regex(matcher.value, dot_nl=True).fullmatch("") is not None
    except BadPattern:
        return False  # refused below, naming the pattern
    return matches == (matcher.type == "RE")


def _raw_strings_quoted(text: str) -> str:
    """``text`` with each backtick string as the double-quoted string of the same value: PromQL
    keeps a backtick string's backslashes as they are (a regex such as \\d+), where promql-parser
    reads them as escapes and refuses \\d."""
    if "`" not in text:
        return text
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char in "\"'":
            end = index + 1
            while end < len(text) and text[end] != char:
                end += 2 if text[end] == "\\" else 1
        elif char == "#":  # a comment, to the end of the line
            end = text.find("\n", index)
            end = (len(text) if end < 0 else end) - 1
        elif char == "`" and (end := text.find("`", index + 1)) > 0:
            out.append(json.dumps(text[index + 1 : end], ensure_ascii=False))
            index = end + 1
            continue
        else:
            end = index
        out.append(text[index : end + 1])
        index = end + 1
    return "".join(out)


# The tokens of a query's text that its bounds count (strings and comments are skipped whole; an
# unterminated one runs to the end, so no text is scanned twice): brackets, argument commas,
# operators (matchers' included) and the binary keywords.
_TOKEN = re.compile(
    r"""(?P<skip>"(?:[^"\\]|\\.)*(?:"|\\?\Z)|'(?:[^'\\]|\\.)*(?:'|\\?\Z)|`[^`]*`?|\#[^\n]*)"""
    r"|(?P<open>[(\[{])|(?P<close>[)\]}])|(?P<comma>,)"
    r"|(?P<operator>==|!=|>=|<=|=~|!~|[-+*/%^<>=])"
    r"|(?P<word>(?:\d+(?:\.\d*)?|\.\d+)[eE][-+]?\d+|[\w.:@]+)",
    re.DOTALL,
)
_BINARY_KEYWORDS = {"and", "or", "unless", "atan2"}


class TextShape(NamedTuple):
    terms: int  # brackets, commas, operators and binary keywords
    depth: int  # brackets and unary operators nested around the deepest point


def text_shape(text: str) -> TextShape:
    """Counts what makes a node of the parsed tree, and how deep the tree's nesting goes, in one
    linear pass over the text, before the parser sees it. A unary ``-``/``+`` nests like a
    bracket until a binary operator or comma at its level ends its operand; binary chains
    (``a or b or ...``) are bounded by the terms."""
    terms = depth = deepest = 0
    unary = [0]  # the unary operators still open at each bracket level
    operand_expected = True
    for token in _TOKEN.finditer(text):
        kind = token.lastgroup
        if kind == "skip":
            if token.group().startswith("#"):
                continue
            operand_expected = False
        elif kind == "open":
            terms += 1
            depth += 1
            unary.append(0)
            operand_expected = True
        elif kind == "close":
            if len(unary) > 1:
                depth -= 1 + unary.pop()
            operand_expected = False
        elif kind == "word" and token.group().lower() not in _BINARY_KEYWORDS:
            operand_expected = False
        else:  # a comma, an operator or a binary keyword
            terms += 1
            if operand_expected and token.group() in "-+":
                unary[-1] += 1
                depth += 1
            else:
                depth -= unary[-1]
                unary[-1] = 0
            operand_expected = True
        deepest = max(deepest, depth)
    return TextShape(terms, deepest)


# Recently parsed texts kept (QueryText): a dashboard sends the same few texts again and again.
PARSED_ENTRIES = 256
PARSED_MAX_CHARS = 4096  # longer texts are parsed each time: the entries' memory stays bounded
# A text this short parses in at most about 0.4 ms (``a0+a1+...`` 128 characters long; a dashboard's
# selector or ``sum(rate(x{job="api"}[5m]))`` in 15-50 us): less than a hop to a thread and back.
SHORT_TEXT_CHARS = 128


class _Parsed:
    """The last PARSED_ENTRIES parsed expressions, by (bounds, text, query times). A parsed
    expression is immutable (promql-parser's nodes refuse attribute writes) and the evaluator
    only reads it, so one is shared by every query of its text, in any thread."""

    def __init__(self, entries: int):
        self.entries = entries
        self.found: OrderedDict[tuple, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple):
        with self.lock:
            expr = self.found.get(key)
            if expr is not None:
                self.found.move_to_end(key)
            return expr

    def put(self, key: tuple, expr) -> None:
        with self.lock:
            self.found[key] = expr
            self.found.move_to_end(key)
            if len(self.found) > self.entries:
                self.found.popitem(last=False)


_PARSED = _Parsed(PARSED_ENTRIES)


class QueryText(NamedTuple):
    """The bounds of a query's text (--query-max-length, --query-max-depth, --query-max-terms),
    checked in one linear pass before it is parsed. The parser's time and memory grow with the
    tree's size times its depth (``(((...)))`` 1000 deep: 82 MB, 3000: 634 MB, 10000: SIGSEGV;
    ``1+1+...``: 152 MB for 1000 terms), and a deep tree is walked recursively."""

    max_length: int = 65536
    max_terms: int = 300
    max_depth: int = 64

    def parse(self, text: str, query: Query | None = None):
        """``text`` parsed, after its bounds are checked; its duration expressions evaluated
        with the query's step and range (none: an instant query's). Texts up to PARSED_MAX_CHARS
        are kept once parsed: the next query of one is answered from memory."""
        times = _times(query)
        if len(text) > PARSED_MAX_CHARS:
            return self._parse(text, times)
        key = (self, text, times)
        expr = _PARSED.get(key)
        if expr is None:
            expr = self._parse(text, times)
            _PARSED.put(key, expr)
        return expr

    def parses_at_once(self, text: str, query: Query | None = None) -> bool:
        """Whether ``parse`` costs next to nothing, so a caller need not move it off the reactor:
        a text parsed recently, or a short one (SHORT_TEXT_CHARS)."""
        return len(text) <= SHORT_TEXT_CHARS or (
            len(text) <= PARSED_MAX_CHARS and _PARSED.get((self, text, _times(query))) is not None
        )

    def _parse(self, text: str, times: QueryTimes):
        if len(text) > self.max_length:
            raise PromQLError(
                f'invalid parameter "query": {len(text)} characters, over --query-max-length {self.max_length}',
                "bad_data",
            )
        shape = text_shape(text)
        if shape.depth > self.max_depth:
            raise PromQLError(
                f'invalid parameter "query": nested {shape.depth} deep (parentheses, calls, aggregations,'
                f" subqueries, braces, brackets and unary operators), over --query-max-depth {self.max_depth}",
                "bad_data",
            )
        if shape.terms > self.max_terms:
            raise PromQLError(
                f'invalid parameter "query": {shape.terms} operators, matchers, brackets and arguments,'
                f" over --query-max-terms {self.max_terms}",
                "bad_data",
            )
        return parse(text, times)


def _times(query: Query | None) -> QueryTimes:
    return QueryTimes(query.step_ms, query.end_ms - query.start_ms) if query else INSTANT


def _ms(delta) -> int:
    return 0 if delta is None else round(delta.total_seconds() * 1000)


def _at_ms(node, query: Query) -> int | None:
    at = getattr(node, "at", None)
    if at is None:
        return None
    kind = str(at.type)
    if kind.endswith("Start"):
        return query.start_ms
    if kind.endswith("End"):
        return query.end_ms
    return round(at.at.timestamp() * 1000)


def selector_matchers(selector) -> list[Matcher]:
    """The selector's matchers, without the front's range modifier marker."""
    matchers = [
        Matcher(_MATCH_TYPES[str(m.op)], m.name, m.value)
        for m in selector.matchers.matchers
        if m.name != MODIFIER_LABEL
    ]
    if selector.name:
        matchers.append(Matcher("EQ", NAME, selector.name))
    return matchers


def range_modifier(selector) -> str | None:
    """ "anchored" or "smoothed" where the query wrote it after the selector (front.py)."""
    return next((m.value for m in selector.matchers.matchers if m.name == MODIFIER_LABEL), None)


def selector_key(selector) -> tuple:
    return tuple(sorted((m.name, m.type, m.value) for m in selector_matchers(selector)))


def plan(expr, query: Query) -> dict[tuple, tuple[list[Matcher], int, int]]:
    """Every selector of ``expr`` with the sample range [min, max] it needs."""
    needs: dict[tuple, tuple[list[Matcher], int, int]] = {}

    def need(selector, low: int, high: int) -> None:
        need_key(selector_key(selector), selector_matchers(selector), low, high)

    def need_key(key: tuple, matchers: list[Matcher], low: int, high: int) -> None:
        if key in needs:
            _, old_low, old_high = needs[key]
            low, high = min(low, old_low), max(high, old_high)
        needs[key] = (matchers, low, high)

    def walk(node, low: int, high: int) -> None:
        kind = type(node).__name__
        if kind in ("VectorSelector", "MatrixSelector", "SubqueryExpr"):
            selector = node.vector_selector if kind == "MatrixSelector" else node
            offset, at = _ms(selector.offset), _at_ms(selector, query)
            ref_low, ref_high = (at - offset, at - offset) if at is not None else (low - offset, high - offset)
            # An anchored window also reads a lookback before it, a smoothed one (and a smoothed
            # instant selector) a lookback after it too.
            modifier = range_modifier(selector) if kind != "SubqueryExpr" else None
            before = query.lookback_ms if modifier else 0
            after = query.lookback_ms if modifier == "smoothed" else 0
            if kind == "VectorSelector":
                need(node, ref_low - query.lookback_ms, ref_high + after)
            elif kind == "MatrixSelector":
                need(selector, ref_low - _ms(node.range) - before, ref_high + after)
            else:
                walk(node.expr, ref_low - _ms(node.range), ref_high)
            return
        if kind == "Call" and node.func.name == "info":
            need_key(*_info_read(node, query, low, high))
        for child in _children(node):
            walk(child, low, high)

    walk(expr, query.start_ms, query.end_ms)
    return needs


def evaluation_steps(query: Query) -> int:
    """The steps a query is evaluated at: one for an instant query."""
    return (query.end_ms - query.start_ms) // query.step_ms + 1 if query.step_ms else 1


def estimated_samples(expr, query: Query, series_of: Callable[[tuple], int]) -> int:
    """The values evaluating ``expr`` holds, counted before anything is read: each selector's
    series (``series_of(selector_key)``) and each literal, times the steps it is evaluated at; a
    subquery's inner expression runs at every inner step of its range, so
    ``max_over_time(vector(1)[1d:1s])`` counts 86401."""
    total = 0

    def walk(node, low: int, high: int, steps: int) -> None:
        nonlocal total
        kind = type(node).__name__
        if kind in ("NumberLiteral", "StringLiteral"):
            total += steps
        elif kind == "VectorSelector":
            total += series_of(selector_key(node)) * steps
        elif kind == "MatrixSelector":
            total += series_of(selector_key(node.vector_selector)) * steps
        elif kind == "Call" and node.func.name == "info":
            total += series_of(_info_read(node, query, low, high)[0]) * steps
            walk(node.args[0], low, high, steps)
        elif kind == "SubqueryExpr":
            step = _ms(node.step) or DEFAULT_SUBQUERY_STEP_MS
            offset, at = _ms(node.offset), _at_ms(node, query)
            ref_low, ref_high = (at - offset, at - offset) if at is not None else (low - offset, high - offset)
            inner_low = ref_low - _ms(node.range)
            walk(node.expr, inner_low, ref_high, (ref_high - inner_low) // step + 1)
        else:
            for child in _children(node):
                walk(child, low, high, steps)

    walk(expr, query.start_ms, query.end_ms, evaluation_steps(query))
    return total


# The functions Prometheus 3 evaluates over anchored and smoothed windows (AnchoredSafeFunctions,
# SmoothedSafeFunctions); the error names them as it does.
_MODIFIER_FUNCTIONS = {
    "anchored": ("changes", "delta", "increase", "rate", "resets"),
    "smoothed": ("delta", "increase", "rate"),
}


def _check_range_modifier(call) -> None:
    for arg in call.args:
        if type(arg).__name__ == "MatrixSelector" and (modifier := range_modifier(arg.vector_selector)):
            allowed = _MODIFIER_FUNCTIONS[modifier]
            if call.func.name not in allowed:
                raise PromQLError(
                    f"{modifier} modifier can only be used with: {', '.join(allowed)} - not with {call.func.name}"
                )


def _children(node) -> list:
    kind = type(node).__name__
    if kind == "Call" and node.func.name == "info":
        return [node.args[0]]  # the second is no selector of its own: it filters the info series
    if kind == "Call":
        return list(node.args)
    if kind == "AggregateExpr":
        return [node.expr] + ([node.param] if node.param is not None else [])
    if kind == "BinaryExpr":
        return [node.lhs, node.rhs]
    if kind in ("ParenExpr", "UnaryExpr"):
        return [node.expr]
    return []


_IDENTIFYING = ("instance", "job")  # the labels joining a series to its info series


def _info_names(matchers: list[Matcher] | None) -> list[Matcher]:
    """The metric name matchers of the info series (effectiveInfoNameMatchers): those given if
    one is = or =~, else ``.+_info`` besides them; ``target_info`` when none is given."""
    if not matchers:
        return [Matcher("EQ", NAME, "target_info")]
    if any(m.type in ("EQ", "RE") for m in matchers):
        return matchers
    return [Matcher("RE", NAME, ".+_info"), *matchers]


def _info_read(call, query: Query, low: int, high: int) -> tuple[tuple, list[Matcher], int, int]:
    """The info series ``info()`` reads: their key, matchers, and the window (Prometheus's
    infoSelectHints: from a lookback before the start to the end, moved by the offset and
    ``@`` of the first selector of the first argument)."""
    wanted = selector_matchers(call.args[1]) if len(call.args) > 1 else []
    matchers = [m for m in wanted if m.name != NAME] + _info_names([m for m in wanted if m.name == NAME] or None)
    selector = next((n for n in _nodes(call.args[0]) if type(n).__name__ == "VectorSelector"), None)
    offset, at = (_ms(selector.offset), _at_ms(selector, query)) if selector is not None else (0, None)
    first, last = (at, at) if at is not None else (low, high)
    key = tuple(sorted((m.name, m.type, m.value) for m in matchers))
    return key, matchers, first - query.lookback_ms + 1 - offset, last - offset


def _info_signature(name: str, labels: dict) -> tuple:
    return (name, *((label, labels[label]) for label in _IDENTIFYING if labels.get(label)))


def _newest_info(info: Vector, rows: list[int]) -> np.ndarray:
    """Per step, the row of the newest sample among info series of one signature (-1: none);
    two of the same time are the error Prometheus reports."""
    stamps = np.where(info.present[rows], info.sample_ms[rows], np.iinfo(np.int64).min)  # type: ignore[index]  # _instant_floats sets sample_ms
    best = stamps.argmax(axis=0)
    newest = stamps.max(axis=0)
    if ((stamps == newest) & info.present[rows]).sum(axis=0).max() > 1:
        raise PromQLError("found duplicate series for info metric")
    return np.where(info.present[rows].any(axis=0), np.asarray(rows)[best], -1)


def _info_labels(labels: dict, infos: list[dict], data: list[Matcher]) -> dict | None:
    """The data labels the info series add to an element (None: no info series matched);
    two info series disagreeing on one are an error."""
    if not infos:
        return None
    wanted = {m.name for m in data}
    added: dict[str, str] = {}
    for info in infos:
        for name, value in info.items():
            if name == NAME or (wanted and name not in wanted):
                continue
            if added.get(name, value) != value:
                raise PromQLError(f"conflicting label: {name}")
            if name not in labels:
                added[name] = value
    return added


def _matches_value(matcher: Matcher, value: str) -> bool:
    if matcher.type in ("EQ", "NEQ"):
        return (matcher.value == value) == (matcher.type == "EQ")
    return (compile_regex(matcher.value, dot_nl=True).fullmatch(value) is not None) == (matcher.type == "RE")


def _masked(vector: Vector, at: np.ndarray) -> Vector:
    """The vector's samples at the steps ``at`` only."""
    histograms = None if vector.histograms is None else np.where(at, vector.histograms, None)  # type: ignore[call-overload]  # numpy's stubs: None in an object array
    return Vector(vector.labels, vector.values, vector.present & at, vector.sample_ms, histograms)


class Context(NamedTuple):
    """The evaluation times of one (sub)expression, and where to report a warning."""

    times_ms: np.ndarray
    warn: Callable[[str], None] = lambda message: None

    @property
    def steps(self) -> int:
        return len(self.times_ms)


class Evaluator:
    """``data``: each selector's float series; ``histograms``: each selector's native histogram
    series (values: an object array of Histogram, None for a stale marker). ``warnings``
    collects what Prometheus 3 reports as annotations (elements dropped for mixing floats and
    histograms, or incompatible buckets)."""

    def __init__(
        self,
        query: Query,
        data: dict[tuple, list[Series]],
        deadline: float,
        histograms: dict[tuple, list[Series]] | None = None,
        max_samples: int = sys.maxsize,
        cancelled: threading.Event | None = None,
        setting: str = "--query-max-samples",
        delayed_name_removal: bool = False,
    ):
        self.query = query
        self.delayed_name_removal = delayed_name_removal
        self.data = data
        self.guard = Guard(deadline, max_samples, cancelled, setting)
        self.histograms = histograms or {}
        self.warnings: list[str] = []
        # the path from the root to the node evaluated: under histogram_count/_sum/_avg, under a
        # subquery or a function that needs the buckets (see _stats_hints)
        self.under_stats_function = self.under_bucket_reader = False

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def result(self, expr, times_ms: np.ndarray):
        """The query's answer: its value, with rows of one label set merged as Prometheus does
        (after the delayed name removal, where it is on)."""
        delayed = DELAYED_NAME_REMOVAL.set(self.delayed_name_removal)
        try:
            value = self.evaluate(expr, times_ms)
        finally:
            DELAYED_NAME_REMOVAL.reset(delayed)
        if isinstance(value, RangeVector):
            value = _without_delayed_names(value)
            return extended_samples(value) if value.modifier is not None else value
        if isinstance(value, Vector):
            return merge_same_labels(value._replace(labels=[answer_labels(labels) for labels in value.labels]))
        return value

    def evaluate(self, expr, times_ms: np.ndarray):
        self.guard.check()
        ctx = Context(times_ms, self.warn)
        kind = type(expr).__name__
        if kind == "NumberLiteral":
            return Scalar(np.full(ctx.steps, float(expr.val)))
        if kind == "StringLiteral":
            return String(expr.val)
        if kind == "ParenExpr":
            return self.evaluate(expr.expr, times_ms)
        if kind == "VectorSelector":
            return self._instant(expr, ctx)
        if kind == "MatrixSelector":
            return self._range(expr, ctx)
        if kind == "SubqueryExpr":
            return self._subquery(expr, ctx)
        if kind == "AggregateExpr":
            return self._aggregate(expr, ctx)
        if kind == "UnaryExpr":
            value = self.evaluate(expr.expr, times_ms)
            if isinstance(value, Scalar):
                value = Scalar(-value.values)
            else:
                negated = value.with_values(-value.values)
                if value.histograms is not None:  # -h: every count and the sum negated (Prometheus 3)
                    negated = negated._replace(histograms=_scaled(value.histograms, np.full(ctx.steps, -1.0), "*"))
                value = negated.without_absent()
        elif kind == "Call":
            return self._call(expr, ctx)  # merged there, its label sets checked once
        elif kind == "BinaryExpr":
            value = self._binary(expr, ctx)
        else:
            raise PromQLError(f"unsupported expression {expr}", "bad_data")
        # Prometheus checks every step of these nodes' results for rows that became the same
        # label set (a dropped name, label_replace): an error where two hold a sample at one step.
        return merge_same_labels(value) if isinstance(value, Vector) else value

    def _refs(self, selector, ctx: Context) -> np.ndarray:
        at = _at_ms(selector, self.query)
        base = np.full(ctx.steps, at, dtype=np.int64) if at is not None else ctx.times_ms
        return base - _ms(selector.offset)

    def _instant(self, selector, ctx: Context) -> Vector:
        refs = self._refs(selector, ctx)
        if range_modifier(selector) == "smoothed":
            return self._smoothed(selector, ctx, refs)
        vector = self._instant_floats(self.data.get(selector_key(selector), []), ctx, refs)
        histograms = self._histogram_series(selector)
        return self._with_histograms(vector, histograms, refs, ctx) if histograms else vector

    def _histogram_series(self, selector) -> list[Series]:
        """The selector's histogram series, their hints as Prometheus 3 reads them (_stats_hints)."""
        found = self.histograms.get(selector_key(selector), [])
        if self.under_stats_function and not self.under_bucket_reader:
            return [_stats_hints(series) for series in found]
        return found

    def _instant_floats(self, found_series: list[Series], ctx: Context, refs: np.ndarray) -> Vector:
        """Each series' last sample at or before each step within the lookback, none where that
        sample is a stale marker: many series at once, as windows of the lookback's width over
        their samples laid end to end (range_functions.series_stacks)."""
        series = [found for found in found_series if len(found.timestamps)]
        lookback = RangeVector(series, refs, self.query.lookback_ms, guard=self.guard)
        lengths = np.fromiter((len(found.timestamps) for found in series), np.int64, len(series))
        labels, rows, masks, stamps = [], [], [], []
        for first, end in series_stacks(lengths, ctx.steps):
            self.guard.check()
            part = series[first:end]
            timestamps = np.concatenate([found.timestamps for found in part])
            values = np.concatenate([found.values for found in part])
            lo, hi = lookback.stacked_windows(timestamps, lengths[first:end])
            last = np.maximum(hi - 1, 0)  # inside the series wherever its window holds a sample
            found = (hi > lo) & ~is_stale(values[last])
            kept = found.any(axis=1)
            labels += [one.labels for one, keep in zip(part, kept) if keep]
            rows.append(values[last][kept])
            masks.append(found[kept])
            stamps.append(timestamps[last][kept])
        if not labels:
            return Vector.empty(ctx.steps)
        return Vector(labels, np.vstack(rows), np.vstack(masks), np.vstack(stamps))

    def _smoothed(self, selector, ctx: Context, refs: np.ndarray) -> Vector:
        """A smoothed instant selector (Prometheus 3's smoothSeries): each step's value
        interpolated between the samples around it, within the lookback on either side; past
        the last sample, the last value; before the first, none. A step whose lookbacks hold
        both floats and native histograms of the series has no value, with a warning."""
        key = selector_key(selector)
        floats = {labels_key(s.labels): s for s in self.data.get(key, [])}
        histograms = {labels_key(s.labels): s for s in self.histograms.get(key, [])}
        labels, rows, masks, histogram_rows = [], [], [], []
        for identity in dict.fromkeys([*floats, *histograms]):
            float_series, histogram_series = floats.get(identity), histograms.get(identity)
            row, present = np.zeros(ctx.steps), np.zeros(ctx.steps, dtype=bool)
            histogram_row = np.full(ctx.steps, None, dtype=object)
            mixed = np.zeros(ctx.steps, dtype=bool)
            if float_series is not None and histogram_series is not None:
                mixed = self._lookback_holds(float_series, refs, ~is_stale(float_series.values)) & (
                    self._lookback_holds(histogram_series, refs, np.not_equal(histogram_series.values, None))  # type: ignore[call-overload]  # None: a stale marker; numpy's stubs: None in an object array
                )
                if mixed.any():
                    ctx.warn(
                        "PromQL warning: encountered a mix of histograms and floats for metric name"
                        f' "{(float_series.labels).get(NAME, "")}"'
                    )
            if float_series is not None:
                row, present = self._smoothed_floats(float_series, refs)
                present &= ~mixed
            if histogram_series is not None:
                histogram_row = self._smoothed_histograms(histogram_series, refs, ctx)
                histogram_row[mixed] = None
            if present.any() or np.not_equal(histogram_row, None).any():  # type: ignore[call-overload]  # numpy's stubs: None in an object array
                labels.append((float_series or histogram_series).labels)  # type: ignore[union-attr]  # one of them is there
                rows.append(row)
                masks.append(present)
                histogram_rows.append(histogram_row)
        if not rows:
            return Vector.empty(ctx.steps)
        holding = any(np.not_equal(r, None).any() for r in histogram_rows)  # type: ignore[call-overload]  # numpy's stubs: None in an object array
        return Vector(labels, np.vstack(rows), np.vstack(masks), None, np.vstack(histogram_rows) if holding else None)

    def _lookback_holds(self, series: Series, refs: np.ndarray, kept: np.ndarray) -> np.ndarray:
        """Per step, whether a kept sample lies within a lookback either side of it."""
        ts = series.timestamps[kept]
        lookback = self.query.lookback_ms
        return np.searchsorted(ts, refs + lookback, side="right") > np.searchsorted(ts, refs - lookback, side="right")

    def _smoothed_floats(self, series: Series, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fresh = ~is_stale(series.values)
        ts, vs = series.timestamps[fresh], series.values[fresh]
        if not len(ts):
            return np.zeros(len(refs)), np.zeros(len(refs), dtype=bool)
        lookback = self.query.lookback_ms
        lo = np.searchsorted(ts, refs - lookback, side="right")
        hi = np.searchsorted(ts, refs + lookback, side="right")
        at = np.searchsorted(ts, refs, side="left")
        index = np.minimum(at, len(ts) - 1)
        exact = (at < hi) & (ts[index] == refs)
        before = np.maximum(at - 1, 0)
        between = (at > lo) & (at < hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            line = vs[before] + (vs[index] - vs[before]) * (refs - ts[before]) / (ts[index] - ts[before])
        return np.where(exact, vs[index], np.where(between, line, vs[before])), exact | (at > lo)

    def _smoothed_histograms(self, series: Series, refs: np.ndarray, ctx: Context) -> np.ndarray:
        """_smoothed_floats for native histograms, a step at a time: a counter (not both ends
        hinted gauge) restarts from nothing across a reset; past the last sample its value
        with no reset hint; exponential and custom buckets met: no value, a warning."""
        kept = np.not_equal(series.values, None)  # type: ignore[call-overload]  # None: a stale marker; numpy's stubs: None in an object array
        ts, hs = series.timestamps[kept], series.values[kept]
        out = np.full(len(refs), None, dtype=object)
        lookback = self.query.lookback_ms
        lo = np.searchsorted(ts, refs - lookback, side="right")
        hi = np.searchsorted(ts, refs + lookback, side="right")
        at = np.searchsorted(ts, refs, side="left")
        for step in np.flatnonzero((at > lo) | ((at < hi) & (ts[np.minimum(at, len(ts) - 1)] == refs))):
            i, ref = int(at[step]), int(refs[step])
            if i < hi[step] and ts[i] == ref:
                out[step] = hs[i]
            elif i < hi[step]:
                previous, following = hs[i - 1], hs[i]
                counter = not previous.reset_hint == following.reset_hint == GAUGE_HINT
                try:
                    if previous.custom != following.custom:
                        raise IncompatibleBuckets
                    out[step] = interpolated_histogram(previous, ts[i - 1], following, ts[i], ref, counter, ctx.warn)
                except IncompatibleBuckets:
                    ctx.warn(mixed_schemas_warning(series.labels))
            else:
                out[step] = hs[i - 1].copy(reset_hint=0)
        return out

    def _with_histograms(
        self, vector: Vector, histogram_series: list[Series], refs: np.ndarray, ctx: Context
    ) -> Vector:
        """``vector`` with each step's latest native histogram of ``histogram_series`` (same
        lookback and staleness as floats); where a series holds both, the newer sample wins."""
        row_of = {labels_key(labels): row for row, labels in enumerate(vector.labels)}
        labels = list(vector.labels)
        values, present = list(vector.values), list(vector.present)
        stamps = (
            list(vector.sample_ms)
            if vector.sample_ms is not None
            else [np.zeros(ctx.steps, dtype=np.int64)] * len(labels)
        )
        histograms = [np.full(ctx.steps, None, dtype=object) for _ in labels]
        for series in histogram_series:
            index = np.searchsorted(series.timestamps, refs, side="right") - 1
            found = index >= 0
            index = np.maximum(index, 0)
            sample_ms, samples = series.timestamps[index], series.values[index]
            found &= (sample_ms > refs - self.query.lookback_ms) & np.not_equal(samples, None)  # type: ignore[call-overload]  # None: a stale marker; numpy's stubs: None in an object array
            if not found.any():
                continue
            row = row_of.get(labels_key(series.labels))
            if row is None:
                row = len(labels)
                labels.append(series.labels)
                values.append(np.zeros(ctx.steps))
                present.append(np.zeros(ctx.steps, dtype=bool))
                stamps.append(sample_ms)
                histograms.append(np.full(ctx.steps, None, dtype=object))
            else:
                found &= ~present[row] | (sample_ms > stamps[row])
                present[row] = present[row] & ~found
                stamps[row] = np.where(found, sample_ms, stamps[row])
            histograms[row] = np.where(found, samples, histograms[row])
        if len(labels) == len(vector.labels) and not any(h.any() for h in histograms if h is not None):
            return vector
        return Vector(
            labels, np.vstack(values), np.vstack(present), np.vstack(stamps), np.vstack(histograms)
        ).without_absent()

    def _range(self, node, ctx: Context) -> RangeVector:
        selector = node.vector_selector
        series = _without_stale_markers(self.data.get(selector_key(selector), []))
        histograms = []
        for found in self._histogram_series(selector):
            kept = np.not_equal(found.values, None)  # type: ignore[call-overload]  # None: a stale marker; numpy's stubs: None in an object array
            histograms.append(Series(found.labels, found.timestamps[kept], found.values[kept]))
        return RangeVector(
            series,
            self._refs(selector, ctx),
            _ms(node.range),
            tuple(histograms),
            self.guard,
            range_modifier(selector),
            self.query.lookback_ms,
        )

    def _subquery(self, node, ctx: Context) -> RangeVector:
        step = _ms(node.step) or DEFAULT_SUBQUERY_STEP_MS
        range_ms = _ms(node.range)
        refs = self._refs(node, ctx)
        first, last = int(refs.min()) - range_ms, int(refs.max())
        start = step * (first // step)
        if start <= first:  # left-open, as a range selector's window (Prometheus 3)
            start += step
        inner_times = np.arange(start, last + 1, step, dtype=np.int64)
        if not len(inner_times):  # no inner step in any window (changes(x[1h])[1s:1d]): no samples
            return RangeVector([], refs, range_ms, (), self.guard)
        outer = self.under_bucket_reader
        self.under_bucket_reader = True
        try:
            inner = self.evaluate(node.expr, inner_times)
        finally:
            self.under_bucket_reader = outer
        if not isinstance(inner, Vector):
            raise PromQLError("subquery is only allowed on instant vector", "bad_data")
        series = [
            Series(labels, inner_times[present], values[present])
            for labels, values, present in zip(inner.labels, inner.values, inner.present)
            if present.any()
        ]
        histograms = [
            Series(labels, inner_times[holds], np.array([_hint_unknown(h) for h in row[holds]], dtype=object))
            for labels, row, holds in zip(
                inner.labels, inner.histograms if inner.histograms is not None else [], inner.histogram_present
            )
            if holds.any()
        ]
        return RangeVector(series, refs, range_ms, tuple(histograms), self.guard)

    def _call(self, call, ctx: Context):
        name = call.func.name
        if name in ("start", "end", "range", "step"):
            return Scalar(np.full(ctx.steps, self._query_constant(name)))
        if name == "info":
            return merge_same_labels(self._info(call, ctx))
        function = FUNCTIONS.get(name)
        if function is None:
            raise PromQLError(f"function {name!r} is not supported", "bad_data")
        _check_range_modifier(call)
        outer = self.under_stats_function, self.under_bucket_reader
        self.under_stats_function |= name in _STATS_FUNCTIONS
        self.under_bucket_reader |= name in _BUCKET_FUNCTIONS
        try:
            args = [self.evaluate(arg, ctx.times_ms) for arg in call.args]
        finally:
            self.under_stats_function, self.under_bucket_reader = outer
        value = function(ctx, args, call)
        if not isinstance(value, Vector):
            return value
        if any(isinstance(arg, RangeVector) for arg in args) and _refuse_same_labels(value):
            return value  # no two rows of one label set: nothing to merge
        return merge_same_labels(value)

    def _info(self, call, ctx: Context) -> Vector:
        """Prometheus 3's experimental ``info(v, {labels})``: each element of ``v`` gains the
        data labels of the info series (``target_info`` unless the second argument names
        others) with its ``instance`` and ``job``, the newest one at each step; elements that
        are info series themselves pass as they are."""
        base = self.evaluate(call.args[0], ctx.times_ms)
        wanted = selector_matchers(call.args[1]) if len(call.args) > 1 else []
        names = _info_names([m for m in wanted if m.name == NAME] if wanted else None)
        data = [m for m in wanted if m.name != NAME]
        info = self._info_vector(call, ctx, base.labels, names)
        by_signature: dict[tuple, list[int]] = defaultdict(list)
        for row, labels in enumerate(info.labels):
            by_signature[_info_signature(labels.get(NAME, ""), labels)].append(row)
        newest = {signature: _newest_info(info, rows) for signature, rows in by_signature.items()}
        info_names = sorted({labels.get(NAME, "") for labels in info.labels})
        keep_bare = all(_matches_value(m, "") for m in data)
        parts = []
        for row, labels in enumerate(base.labels):
            part = base.take(np.array([row]))
            if all(_matches_value(m, labels.get(NAME, "")) for m in names):
                parts.append(part)
                continue
            chosen = np.array([newest.get(_info_signature(n, labels), np.full(ctx.steps, -1)) for n in info_names])
            combos, step_combo = np.unique(chosen.reshape(len(info_names), ctx.steps).T, axis=0, return_inverse=True)
            for index, combo in enumerate(combos):
                added = _info_labels(labels, [info.labels[i] for i in combo if i >= 0], data)
                if added is None and not keep_bare:
                    continue
                at = step_combo.reshape(-1) == index
                parts.append(_masked(part, at)._replace(labels=[{**labels, **(added or {})}]))
        out = Vector.empty(ctx.steps)
        for part in parts:
            out = stacked(out, part)
        return out.without_absent()

    def _info_vector(self, call, ctx: Context, base_labels: list[dict], names: list[Matcher]) -> Vector:
        """The info series at each step (the newest sample within the lookback, read from the
        window Prometheus reads them from), of those whose identifying labels some element of
        the base has."""
        key, _, first, last = _info_read(call, self.query, int(ctx.times_ms[0]), int(ctx.times_ms[-1]))
        identifying: dict[str, set[str]] = defaultdict(set)
        for labels in base_labels:
            if not all(_matches_value(m, labels.get(NAME, "")) for m in names):
                for name in _IDENTIFYING:
                    if labels.get(name):
                        identifying[name].add(labels[name])
        if not identifying:
            return Vector.empty(ctx.steps)

        def wanted(series: Series) -> bool:
            return all(series.labels.get(name) in values for name, values in identifying.items())

        for series in self.histograms.get(key, []):
            inside = (series.timestamps >= first) & (series.timestamps <= last)
            if wanted(series) and inside.any():
                raise PromQLError("info sample should be float")
        windowed = []
        for series in self.data.get(key, []):
            if wanted(series):
                inside = (series.timestamps >= first) & (series.timestamps <= last)
                windowed.append(series._replace(timestamps=series.timestamps[inside], values=series.values[inside]))
        return self._instant_floats(windowed, ctx, ctx.times_ms)

    def _query_constant(self, name: str) -> float:
        """start(), end(), range() and step() in seconds: the query's, whatever subquery they
        are in; step() of an instant query is 0."""
        query = self.query
        if name == "start":
            return query.start_ms / 1000
        if name == "end":
            return query.end_ms / 1000
        if name == "range":
            return (query.end_ms - query.start_ms) / 1000
        return query.step_ms / 1000 if query.end_ms != query.start_ms else 0.0

    # -- aggregations -----------------------------------------------------------------------

    def _aggregate(self, node, ctx: Context):
        op = str(node.op)
        vector = self.evaluate(node.expr, ctx.times_ms)
        # Any: the parser gives a parameter to every aggregation that uses one.
        param: Any = self.evaluate(node.param, ctx.times_ms) if node.param is not None else None
        modifier = node.modifier
        grouping = list(modifier.labels) if modifier is not None else []
        without = modifier is not None and str(modifier.type).endswith("Without")
        if op == "count_values":
            if not valid_label_name(param.value):
                raise PromQLError(f"invalid label name {json.dumps(param.value, ensure_ascii=False)}")
            return _count_values(vector, param.value, grouping, without, ctx)
        group_of, group_labels = _groups(vector.labels, grouping, without)
        if op == "quantile" and (warning := quantile_warning(param.values)):
            self.warn(warning)
        if op in ("topk", "bottomk", "min", "max", "stddev", "stdvar", "quantile") and vector.histogram_present.any():
            self.warn(f"PromQL info: ignored histogram in {op} aggregation")
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return self._selecting(op, vector, param.values, group_of)
        count = len(group_labels)
        counted = vector.sampled if op in ("count", "group") else vector.present
        counts = _group_sums(counted, group_of, count)
        present = counts > 0
        with np.errstate(all="ignore"):
            if op == "sum":
                result = _kahan_sum(vector, group_of, count)
            elif op == "avg":
                result = _running_mean(vector, group_of, count)
            elif op == "count":
                result = counts
            elif op == "group":
                result = np.ones((count, ctx.steps))
            elif op in ("min", "max"):
                result = np.full((count, ctx.steps), np.nan)
                (np.fmin if op == "min" else np.fmax).at(
                    result, group_of, np.where(vector.present, vector.values, np.nan)
                )
            elif op in ("stddev", "stdvar"):
                result = _running_variance(vector, group_of, count)
                if op == "stddev":
                    result = np.sqrt(result)
            elif op == "quantile":
                result = np.full((count, ctx.steps), np.nan)
                for group in range(count):
                    rows = np.flatnonzero(group_of == group)
                    padded = np.where(vector.present[rows], vector.values[rows], np.inf).T
                    result[group] = quantiles(padded, counts[group], param.values)
            else:
                raise PromQLError(f"aggregation {op!r} is not supported", "bad_data")
        if op in ("sum", "avg") and vector.histograms is not None:
            histograms, mixed = _aggregate_histograms(vector, group_of, count, op, ctx)
            return Vector(group_labels, result, present & ~mixed, None, histograms).without_absent()
        return Vector(group_labels, result, present).without_absent()

    def _selecting(self, op: str, vector: Vector, k: np.ndarray, group_of: np.ndarray) -> Vector:
        """The aggregations that keep some of each group's series: topk, bottomk, limitk,
        limit_ratio (k a ratio)."""
        if op == "limit_ratio":
            if np.isnan(k).any():
                raise PromQLError("Ratio value is NaN")
            if (np.abs(k) > 1).any():
                beyond = k[np.argmax(np.abs(k))]
                self.warn(
                    f"PromQL warning: ratio value should be between -1 and 1, got {go_float(beyond)},"
                    f" capping to {go_float(np.clip(beyond, -1, 1))}"
                )
            return _limit(vector, group_of, lambda rows, groups: _sampled(rows.labels, k))
        _check_k(k)
        if op == "limitk":
            return _limit(vector, group_of, lambda rows, groups: _first_k(rows.sampled, groups, k))
        return _top(vector, k, group_of, op)

    # -- binary operators -------------------------------------------------------------------

    def _binary(self, node, ctx: Context):
        op, right = str(node.op), node.rhs
        modifier = node.modifier
        return_bool = bool(modifier is not None and modifier.return_bool)
        if _is_trim(node):
            op, right = _TRIMS[op], right.args[0]
        outer = self.under_bucket_reader
        self.under_bucket_reader |= op in _TRIMS.values()  # a trim reads the buckets
        try:
            lhs = self.evaluate(node.lhs, ctx.times_ms)
        finally:
            self.under_bucket_reader = outer
        rhs = self.evaluate(right, ctx.times_ms)
        if op in _COMPARISONS and not return_bool and isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            raise PromQLError("comparisons between scalars must use BOOL modifier", "bad_data")
        if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            value, keep = _operate(op, lhs.values, rhs.values)
            return Scalar(np.asarray(keep, dtype=np.float64) if op in _COMPARISONS else value)
        if (isinstance(lhs, Scalar) or isinstance(rhs, Scalar)) and _fills(node) != (None, None):
            raise PromQLError("filling in missing series only allowed between instant vectors", "bad_data")
        if isinstance(lhs, Scalar) or isinstance(rhs, Scalar):
            everywhere, nowhere = np.ones(ctx.steps, dtype=bool), np.zeros(ctx.steps, dtype=bool)
            left = (everywhere, nowhere) if isinstance(lhs, Scalar) else (lhs.present, lhs.histogram_present)
            right = (everywhere, nowhere) if isinstance(rhs, Scalar) else (rhs.present, rhs.histogram_present)
            _note_incompatible(op, ctx, *left, *right)
            return _vector_scalar(op, lhs, rhs, return_bool)
        if op in _SET_OPERATORS:
            return _set_operation(op, lhs, rhs, modifier)
        return _vector_vector(op, lhs, rhs, modifier, return_bool, ctx, _fills(node))


_STATS_FUNCTIONS = {"histogram_count", "histogram_sum", "histogram_avg"}
_BUCKET_FUNCTIONS = {"histogram_quantile", "histogram_quantiles", "histogram_fraction"}


def _stats_hints(series: Series) -> Series:
    """A series read for histogram_count/_sum/_avg alone (no subquery or bucket-reading
    function on the way): Prometheus 3 reads it with its HistogramStatsIterator, which tells a
    sample without a counter reset hint whether it reset the counter since the sample before
    (so sum/avg of such samples may warn of conflicting hints where they would not otherwise)."""
    hinted = series.values.copy()
    previous = None
    for index, histogram in enumerate(series.values):
        if histogram is None:  # a stale marker
            continue
        if histogram.reset_hint == UNKNOWN_HINT and previous is not None:
            hint = RESET_HINT if histogram.detect_reset(previous) else NO_RESET_HINT
            hinted[index] = histogram.copy(reset_hint=hint)
        previous = histogram
    return series._replace(values=hinted)


def _hint_unknown(histogram):
    """A subquery's histogram sample without a (no) counter reset hint, as Prometheus 3 gives
    it: the subquery may miss the sample that reset the counter, or return it many times."""
    if histogram.reset_hint in (RESET_HINT, NO_RESET_HINT):
        return histogram.copy(reset_hint=UNKNOWN_HINT)
    return histogram


def _without_delayed_names(matrix: RangeVector) -> RangeVector:
    """A subquery's answer after the delayed name removal: series that became one label set are
    the error Prometheus gives where they overlap, one series where they do not."""
    if not any(isinstance(series.labels, NameToDrop) for series in matrix.series):
        return matrix
    merged: dict[LabelsKey, list[Series]] = {}
    for series in matrix.series:
        labels = answer_labels(series.labels)
        merged.setdefault(labels_key(labels), []).append(series._replace(labels=labels))
    series_list = []
    for parts in merged.values():
        timestamps = np.concatenate([part.timestamps for part in parts])
        order = np.argsort(timestamps, kind="stable")
        if len(np.unique(timestamps)) < len(timestamps):
            raise PromQLError("vector cannot contain metrics with the same labelset")
        values = np.concatenate([part.values for part in parts])
        series_list.append(Series(parts[0].labels, timestamps[order], values[order]))
    return matrix._replace(series=series_list)


def _without_stale_markers(found: list[Series]) -> list[Series]:
    """The series without their stale markers (a range selector's windows hold samples only),
    the markers found in all the series' values at once: most series have none."""
    if not found:
        return found
    stale = is_stale(np.concatenate([series.values for series in found]))
    if not stale.any():
        return found
    bounds = np.cumsum([0, *(len(series.values) for series in found)])
    marked = set(np.searchsorted(bounds, np.flatnonzero(stale), side="right") - 1)
    kept = []
    for at, series in enumerate(found):
        if at in marked:
            fresh = ~stale[bounds[at] : bounds[at + 1]]
            series = Series(series.labels, series.timestamps[fresh], series.values[fresh])
        kept.append(series)
    return kept


def _refuse_same_labels(vector: Vector) -> bool:
    """A range function's result, as Prometheus 2.42 checks it: two of its series with the same
    label set (series that differed only by their dropped name) are an error, at whatever steps
    they hold samples. True when no two rows have the same label set (most results)."""
    keys = [labels_key(labels) for labels in vector.labels]
    if len(set(keys)) == len(keys):
        return True
    for rows in (vector.present.any(axis=1), vector.histogram_present.any(axis=1)):
        keys = [labels_key(labels) for labels, kept in zip(vector.labels, rows) if kept]  # type: ignore[arg-type]  # any(axis=1) of a 2-d array is an array
        if len(set(keys)) < len(keys):
            raise PromQLError("vector cannot contain metrics with the same labelset")
    return False


def _operate(op: str, left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, Any]:
    """Value and keep flag of ``left op right`` (the keep flag matters for comparisons only: an
    array for them, True otherwise)."""
    with np.errstate(all="ignore"):
        if op == "+":
            return left + right, True
        if op == "-":
            return left - right, True
        if op == "*":
            return left * right, True
        if op == "/":
            return np.true_divide(left, right), True
        if op == "%":
            return np.fmod(left, right), True
        if op == "^":
            return np.power(left, right), True
        if op == "atan2":
            return np.arctan2(left, right), True
        if op in _TRIMS.values():  # a trim of floats: no result
            return left, np.zeros(np.shape(left), dtype=bool)
        comparison = {
            "==": np.equal,
            "!=": np.not_equal,
            ">": np.greater,
            "<": np.less,
            ">=": np.greater_equal,
            "<=": np.less_equal,
        }[op]
        keep = comparison(left, right)
        return left, keep


# The binary operators Prometheus 3 applies to native histograms, by the sides' sample types;
# any other drops the element with an info annotation.
_HISTOGRAM_OPERATORS = {
    ("float", "histogram"): {"*"},
    ("histogram", "float"): {"*", "/", *_TRIMS.values()},
    ("histogram", "histogram"): {"+", "-", "==", "!="},
}


def _note_incompatible(op: str, ctx: Context, left_float, left_histogram, right_float, right_histogram) -> None:
    """Prometheus 3's info when ``op`` meets sample types it does not take (``float <
    histogram``): the masks say where each side holds a float or a histogram."""
    sides = {"float": (left_float, right_float), "histogram": (left_histogram, right_histogram)}
    for (left, right), allowed in _HISTOGRAM_OPERATORS.items():
        if op not in allowed and (sides[left][0] & sides[right][1]).any():
            ctx.warn(
                f'PromQL info: incompatible sample types encountered for binary operator "{op}": {left} {op} {right}'
            )


def _vector_scalar(op: str, lhs, rhs, return_bool: bool) -> Vector:
    vector, scalar, swapped = (lhs, rhs, False) if isinstance(lhs, Vector) else (rhs, lhs, True)
    scalar_values = np.broadcast_to(scalar.values, vector.values.shape)
    left, right = (scalar_values, vector.values) if swapped else (vector.values, scalar_values)
    value, keep = _operate(op, left, right)
    if op in _COMPARISONS:
        if return_bool:
            return vector.with_values(keep.astype(np.float64))
        return Vector(vector.labels, vector.values, vector.present & keep, vector.sample_ms).without_absent()
    result = vector.with_values(np.asarray(value, dtype=np.float64), keep, drop_name=op in _ARITHMETIC)
    if vector.histograms is not None and (op == "*" or (op in ("/", *_TRIMS.values()) and not swapped)):
        result = result._replace(histograms=_scaled(vector.histograms, scalar.values, op)).without_absent()
    return result


def _scaled(histograms: np.ndarray, factors: np.ndarray, op: str) -> np.ndarray:
    """``histogram * scalar`` (either side) and ``histogram / scalar``, step by step."""
    out = np.full(histograms.shape, None, dtype=object)
    for row, step in zip(*np.nonzero(np.not_equal(histograms, None))):  # type: ignore[call-overload]  # numpy's stubs: None in an object array
        out[row, step] = _times_or_over(histograms[row, step], op, factors[step])
    return out


def _times_or_over(histogram, op: str, factor: float):
    """``histogram * factor``, ``histogram / factor``, or the histogram trimmed at ``factor``."""
    if op in _TRIMS.values():
        return histogram.trimmed(factor, upper=op == "</")
    return histogram.scale(factor) if op == "*" else histogram.divided(factor)


def _aggregate_histograms(
    vector: Vector, group_of: np.ndarray, count: int, op: str, ctx: Context
) -> tuple[np.ndarray, np.ndarray]:
    """sum/avg of each group's histograms per step, and the mask of (group, step) elements that
    mix floats and histograms: Prometheus drops those (3.x with a warning, as here)."""
    holds = vector.histogram_present
    has_float = np.zeros((count, ctx.steps), dtype=bool)
    np.logical_or.at(has_float, group_of, vector.present)
    totals = np.full((count, ctx.steps), None, dtype=object)
    counts = np.zeros((count, ctx.steps))
    broken = np.zeros((count, ctx.steps), dtype=bool)
    hints = np.zeros((count, ctx.steps), dtype=np.int64)  # bit 1: a counter reset said, bit 2: none said
    for row, step in zip(*np.nonzero(holds)):
        group, histogram = group_of[row], vector.histograms[row, step]  # type: ignore[index]  # holds marks histograms, so they are there
        counts[group, step] += 1
        hints[group, step] |= {RESET_HINT: 1, NO_RESET_HINT: 2}.get(histogram.reset_hint, 0)
        if broken[group, step]:
            continue
        if totals[group, step] is None:
            totals[group, step] = (HistogramMean if op == "avg" else HistogramSum.of)(histogram)
            continue
        try:
            totals[group, step].add(histogram, on_reconcile=lambda: ctx.warn(f"{RECONCILED} aggregation"))
        except IncompatibleBuckets:
            broken[group, step] = True
            ctx.warn(mixed_schemas_warning(vector.labels[row]))
    mixed = has_float & (counts > 0)
    if mixed.any():
        ctx.warn("PromQL warning: encountered a mix of histograms and floats for aggregation")
    if (hints == 3).any():
        ctx.warn("PromQL warning: conflicting counter resets during histogram aggregation")
    for group, step in zip(*np.nonzero((counts > 0) & ~mixed & ~broken)):
        totals[group, step] = totals[group, step].result()
    totals[mixed | broken] = None
    return totals, mixed


def _signature(labels: dict, modifier, include_name: bool = False, without: frozenset = frozenset((NAME,))) -> tuple:
    """The labels a series is matched on; ``without``: the schema labels left out unless
    ``on()`` names them (the name; for set operators its type and unit too)."""
    matching = modifier.matching if modifier is not None else None
    if matching is not None and str(matching.type).endswith("Include"):
        return tuple((name, labels.get(name, "")) for name in sorted(matching.labels))
    ignored = set(matching.labels) if matching is not None else set()
    if not include_name:
        ignored |= without
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ignored))


def _set_operation(op: str, lhs: Vector, rhs: Vector, modifier) -> Vector:
    """and/or/unless, on floats and histograms alike."""
    steps = lhs.values.shape[1] if lhs.labels else rhs.values.shape[1]
    right_present: dict[tuple, np.ndarray] = {}
    for labels, present in zip(rhs.labels, rhs.sampled):
        key = _signature(labels, modifier, without=SCHEMA_LABELS)
        right_present[key] = right_present.get(key, np.zeros(steps, dtype=bool)) | present
    none = np.zeros(steps, dtype=bool)
    if op in ("and", "unless"):
        if not lhs.labels:
            return Vector.empty(steps)
        masks = np.vstack(
            [right_present.get(_signature(labels, modifier, without=SCHEMA_LABELS), none) for labels in lhs.labels]
        )
        keep = masks if op == "and" else ~masks
        histograms = None if lhs.histograms is None else np.where(keep, lhs.histograms, None)  # type: ignore[call-overload]  # numpy's stubs: None in an object array
        return Vector(lhs.labels, lhs.values, lhs.present & keep, lhs.sample_ms, histograms).without_absent()
    left_present: dict[tuple, np.ndarray] = {}
    for labels, present in zip(lhs.labels, lhs.sampled):
        key = _signature(labels, modifier, without=SCHEMA_LABELS)
        left_present[key] = left_present.get(key, np.zeros(steps, dtype=bool)) | present
    labels = list(lhs.labels) + list(rhs.labels)  # type: ignore[assignment]  # the loop's labels above were one label set
    if not labels:
        return Vector.empty(steps)
    right_kept = (
        np.vstack(
            [
                ~left_present.get(_signature(right_labels, modifier, without=SCHEMA_LABELS), none)
                for right_labels in rhs.labels
            ]
        )
        if rhs.labels
        else np.zeros((0, steps), dtype=bool)
    )
    right = Vector(
        rhs.labels,
        rhs.values,
        rhs.present & right_kept,
        None,
        None if rhs.histograms is None else np.where(right_kept, rhs.histograms, None),  # type: ignore[call-overload]  # numpy's stubs: None in an object array
    )
    left = Vector(lhs.labels, lhs.values, lhs.present, None, lhs.histograms)
    return merge_same_labels(stacked(left, right).without_absent())


def _vector_vector(
    op: str, lhs: Vector, rhs: Vector, modifier, return_bool: bool, ctx: Context, fills: tuple = (None, None)
) -> Vector:
    """``lhs op rhs`` matched series by series. ``fills``: the fill_left() and fill_right()
    values; as in Prometheus 3's VectorBinop, the right one stands in for a missing partner of
    the "many" side (the left one without group_right), the left one for a missing partner of
    the "one" side."""
    card = str(modifier.card) if modifier is not None else "VectorMatchCardinality.OneToOne"
    if card.endswith("OneToMany"):
        many, one, swapped = rhs, lhs, True
    else:
        many, one, swapped = lhs, rhs, False
    fill_many, fill_one = fills
    steps = many.values.shape[1]
    if (not many.labels and not one.labels) or ((not many.labels or not one.labels) and fills == (None, None)):
        return Vector.empty(steps)
    one_to_one = not (card.endswith("ManyToOne") or card.endswith("OneToMany"))
    include = list(modifier.group_labels or []) if modifier is not None and not one_to_one else []
    by_signature: dict[tuple, list[int]] = defaultdict(list)
    for index, labels in enumerate(one.labels):
        by_signature[_signature(labels, modifier)].append(index)
    for indexes in by_signature.values():
        if len(indexes) > 1 and (one.present[indexes].sum(axis=0) > 1).any():
            side = "left" if swapped else "right"
            raise PromQLError(
                f"found duplicate series for the match group on the {side} hand-side of the operation; many-to-many matching not allowed: matching labels must be unique on one side"
            )
    drop_name = op in _ARITHMETIC or return_bool
    results = _Rows(steps)
    many_seen: dict[tuple, np.ndarray] = {}
    many_present: dict[tuple, np.ndarray] = {}  # by signature: where a "many" series is present

    def add_filled(labels: dict, partner: dict, side: Vector, row: int, alone: np.ndarray, fill: float, left: bool):
        value, present, histograms = _filled(op, ctx, side, row, alone, fill, left, return_bool)
        results.add(
            _result_labels(labels, partner, modifier, one_to_one, include, drop_name), value, present, histograms
        )

    for index, labels in enumerate(many.labels):
        signature = _signature(labels, modifier)
        partners = by_signature.get(signature, [])
        many_present[signature] = many.sampled[index] | many_present.get(signature, False)
        if fill_one is not None:
            alone = many.sampled[index] & ~one.sampled[partners].any(axis=0) if partners else many.sampled[index]
            if alone.any():
                matched = dict((k, v) for k, v in signature if v)
                add_filled(labels, matched, many, index, alone, fill_one, not swapped)
        if not partners:
            continue
        if one_to_one:
            seen = many_seen.get(signature)
            if seen is not None and (seen & many.present[index]).any():
                raise PromQLError(
                    "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                )
            many_seen[signature] = many.present[index] | (seen if seen is not None else False)
        other_values = np.where(one.present[partners], one.values[partners], 0.0).sum(axis=0)
        other_present = one.present[partners].any(axis=0)
        mine = (many.present[index], many.histogram_present[index])
        theirs = (other_present, one.histogram_present[partners].any(axis=0))
        _note_incompatible(op, ctx, *(theirs + mine if swapped else mine + theirs))
        partner_labels = one.labels[partners[0]]
        left, right = (other_values, many.values[index]) if swapped else (many.values[index], other_values)
        value, keep = _operate(op, left, right)
        present = many.present[index] & other_present
        if op in _TRIMS.values():
            present = present & keep
        if op in _COMPARISONS:
            if return_bool:
                value = keep.astype(np.float64)
            else:
                present = present & keep
                value = many.values[index] if swapped else left
        value = np.asarray(value, dtype=np.float64)
        histograms = _histogram_pairs(op, ctx, many, index, one, partners, swapped, return_bool, value, present)
        result_labels = _result_labels(labels, partner_labels, modifier, one_to_one, include, drop_name)
        results.add(result_labels, value, present, histograms)
    if fill_many is not None:
        for index, labels in enumerate(one.labels):
            signature = _signature(labels, modifier)
            alone = one.sampled[index] & ~many_present.get(signature, np.zeros(steps, dtype=bool))
            if alone.any():
                matched = dict((k, v) for k, v in signature if v)
                add_filled(matched, labels, one, index, alone, fill_many, swapped)
    return results.vector()


class _Rows:
    """The result rows of a vector-vector operation, by label set: rows of one label set merge
    where their steps do not overlap, else they are the error Prometheus reports."""

    def __init__(self, steps: int):
        self.steps = steps
        self.rows: dict[LabelsKey, tuple[dict, np.ndarray, np.ndarray, np.ndarray]] = {}

    def add(self, labels: dict, value: np.ndarray, present: np.ndarray, histograms: np.ndarray) -> None:
        key = labels_key(labels)
        if key in self.rows:
            old_labels, old_values, old_present, old_histograms = self.rows[key]
            if ((old_present | np.not_equal(old_histograms, None)) & (present | np.not_equal(histograms, None))).any():  # type: ignore[call-overload]  # numpy's stubs: None in an object array
                raise PromQLError("multiple matches for labels: grouping labels must ensure unique matches")
            value = np.where(present, value, old_values)
            present = present | old_present
            histograms = np.where(np.not_equal(histograms, None), histograms, old_histograms)  # type: ignore[call-overload]  # numpy's stubs: None in an object array
        self.rows[key] = (labels, value, present, histograms)

    def vector(self) -> Vector:
        if not self.rows:
            return Vector.empty(self.steps)
        labels, values, present, histograms = zip(*self.rows.values())
        held = np.vstack(histograms)
        return Vector(
            list(labels),
            np.vstack(values),
            np.vstack(present),
            None,
            held if np.not_equal(held, None).any() else None,  # type: ignore[call-overload]  # numpy's stubs: None in an object array
        ).without_absent()


def _filled(
    op: str, ctx: Context, side: Vector, row: int, alone: np.ndarray, fill: float, left: bool, return_bool: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Value, presence and histograms of ``side``'s row ``row`` where ``alone`` (its partner
    missing) operated with the float ``fill`` in the partner's place (Prometheus 3's fill
    modifiers); ``left``: the row is the query's left operand."""
    steps = len(alone)
    values, filled = side.values[row], np.full(steps, fill)
    present = side.present[row] & alone
    held = np.where(alone, side.histograms[row], None) if side.histograms is not None else np.full(steps, None)
    mine, theirs = (present, np.not_equal(held, None)), (alone, np.zeros(steps, dtype=bool))  # type: ignore[call-overload]  # numpy's stubs: None in an object array
    _note_incompatible(op, ctx, *(mine + theirs if left else theirs + mine))
    histograms = np.full(steps, None, dtype=object)
    if op == "*" or (op in ("/", *_TRIMS.values()) and left):
        for step in np.flatnonzero(mine[1]):
            histograms[step] = _times_or_over(held[step], op, fill)
    left_values, right_values = (values, filled) if left else (filled, values)
    value, keep = _operate(op, left_values, right_values)
    if op in _COMPARISONS:
        if return_bool:
            value = keep.astype(np.float64)
        else:
            value, present = left_values, present & keep
    elif op in _TRIMS.values():
        present = present & keep
    return np.asarray(value, dtype=np.float64), present, histograms


def _histogram_pairs(op, ctx, many, index, one, partners, swapped, return_bool, value, present) -> np.ndarray:
    """The histogram results of one matched pair, where both sides hold a histogram (Prometheus
    3: ``+`` and ``-`` add and subtract, ``==`` and ``!=`` compare, the left side kept; with
    ``bool`` a float in ``value``/``present``); None elsewhere."""
    steps = len(value)
    out = np.full(steps, None, dtype=object)
    if many.histograms is None and one.histograms is None:
        return out
    theirs = np.full(steps, None, dtype=object)
    for partner in partners:
        if one.histograms is not None:
            theirs = np.where(np.not_equal(theirs, None), theirs, one.histograms[partner])  # type: ignore[call-overload]  # numpy's stubs: None in an object array
    mine = many.histograms[index] if many.histograms is not None else np.full(steps, None, dtype=object)
    if op in ("*", "/", *_TRIMS.values()):  # a histogram times a float (either side), divided or trimmed by one (left)
        floats = np.where(one.present[partners], one.values[partners], 0.0).sum(axis=0)
        float_present = one.present[partners].any(axis=0)
        sides = [(mine, floats, float_present, swapped), (theirs, many.values[index], many.present[index], not swapped)]
        for histograms, factors, factor_present, histogram_right in sides:
            if op != "*" and histogram_right:
                continue
            for step in np.flatnonzero(np.not_equal(histograms, None) & factor_present):  # type: ignore[call-overload]  # numpy's stubs: None in an object array
                out[step] = _times_or_over(histograms[step], op, factors[step])
        return out
    if op not in ("+", "-", "==", "!="):
        return out
    for step in np.flatnonzero(np.not_equal(mine, None) & np.not_equal(theirs, None)):  # type: ignore[call-overload]  # numpy's stubs: None in an object array
        left, right = (theirs[step], mine[step]) if swapped else (mine[step], theirs[step])
        reconciled = f"PromQL info: mismatched custom buckets were reconciled during {'addition' if op == '+' else 'subtraction'}"
        try:
            if op == "+":
                out[step] = left.add(right, on_reconcile=lambda: ctx.warn(reconciled))
            elif op == "-":
                out[step] = left.sub(right, lambda: ctx.warn(reconciled)).copy(reset_hint=GAUGE_HINT)
            else:
                kept = (left.json(float) == right.json(float)) == (op == "==")
                if return_bool:
                    value[step], present[step] = float(kept), True
                elif kept:
                    out[step] = left
        except IncompatibleBuckets:
            ctx.warn(mixed_schemas_warning(many.labels[index]))
    return out


def _result_labels(
    labels: dict, partner: dict, modifier, one_to_one: bool, include: list[str], drop_name: bool
) -> dict:
    named = drop_metric_name(labels) if drop_name else labels
    result = dict(named)
    matching = modifier.matching if modifier is not None else None
    if one_to_one and matching is not None:
        names = set(matching.labels)
        if str(matching.type).endswith("Include"):
            result = {k: v for k, v in result.items() if k in names}
        else:
            result = {k: v for k, v in result.items() if k not in names}
    for name in include:
        if partner.get(name, ""):
            result = {**result, name: partner[name]}
        else:
            result = {k: v for k, v in result.items() if k != name}
    return marked_like(named, result)


# -- aggregation helpers --------------------------------------------------------------------


def _group_labels(labels: dict, grouping: list[str], without: bool) -> dict:
    if without:
        dropped = set(grouping) | {NAME}
        return {k: v for k, v in labels.items() if k not in dropped}
    return {k: labels[k] for k in grouping if labels.get(k, "")}


def _groups(all_labels: list[dict], grouping: list[str], without: bool) -> tuple[np.ndarray, list[dict]]:
    """Each row's group and each group's labels, in order of first appearance. With ``by`` a
    group is the tuple of its labels' values ("" for an absent one, as _group_labels leaves it
    out), so its labels are built once a group, not once a row; without either (``sum(x)``)
    every row is in the one group, without labels."""
    if not grouping and not without:
        marked: dict = next((labels for labels in all_labels if isinstance(labels, NameToDrop)), {})
        return np.zeros(len(all_labels), dtype=np.int64), [marked_like(marked, {})] if all_labels else []
    index_of: dict = {}
    group_labels: list[dict] = []
    group_of = []
    for labels in all_labels:
        if without:
            group = _group_labels(labels, grouping, without)
            key: Any = labels_key(group)
        else:
            key = tuple([labels.get(name, "") for name in grouping])
        index = index_of.get(key)
        if index is None:
            index = index_of[key] = len(group_labels)
            group_labels.append(group if without else _group_labels(labels, grouping, without))
        group_of.append(index)
        if isinstance(labels, NameToDrop):
            group_labels[index] = marked_like(labels, group_labels[index])
    return np.array(group_of, dtype=np.int64), group_labels


def _group_sums(rows: np.ndarray, group_of: np.ndarray, count: int) -> np.ndarray:
    """The sum of each group's rows (``group_of`` gives a row's group): rows sorted by group and
    summed a run at a time, as np.add.at does it several times slower."""
    if count <= 1:
        return rows.sum(axis=0, dtype=np.float64)[np.newaxis][:count]
    order = np.argsort(group_of, kind="stable")
    starts = np.searchsorted(group_of[order], np.arange(count))
    return np.add.reduceat(rows[order].astype(np.float64), starts, axis=0)


def _ranks(group_of: np.ndarray) -> list[np.ndarray]:
    """The rows of every group in input order, rank by rank: the r-th array holds each group's
    r-th row (at most one per group), so a running update is vectorised across groups and steps
    while each group still sees its rows in Prometheus's order."""
    order = np.argsort(group_of, kind="stable")
    ordered = group_of[order]
    rank = np.empty(len(group_of), dtype=np.int64)
    rank[order] = np.arange(len(order)) - np.searchsorted(ordered, ordered, side="left")
    return [np.flatnonzero(rank == r) for r in range(int(rank.max()) + 1)] if len(rank) else []


def _kahan_sum(vector: Vector, group_of: np.ndarray, count: int) -> np.ndarray:
    """sum as Prometheus 3 adds: each group's rows in input order with Neumaier's compensation
    (compensated_sum, all steps at once); a group of one row is that row."""
    values = np.where(vector.present, vector.values, 0.0)
    if count == len(group_of):
        result = np.zeros_like(values)
        result[group_of] = values
        return result
    if count == 1:
        return compensated_sum(values, axis=0)[np.newaxis]
    result = np.zeros((count, values.shape[1]))
    order = np.argsort(group_of, kind="stable")
    bounds = np.searchsorted(group_of[order], np.arange(count + 1))
    for group in range(count):
        result[group] = compensated_sum(values[order[bounds[group] : bounds[group + 1]]], axis=0)
    return result


def _running_mean(vector: Vector, group_of: np.ndarray, count: int) -> np.ndarray:
    """avg as Prometheus 3 computes it (KahanMean), each group's rows in input order."""
    mean = KahanMean((count, vector.values.shape[1]))
    for rows in _ranks(group_of):
        mean.add(group_of[rows], vector.values[rows], vector.present[rows])
    return mean.result()


def _running_variance(vector: Vector, group_of: np.ndarray, count: int) -> np.ndarray:
    """stdvar as Prometheus 3 computes it: Welford's running update (identical values give
    exactly 0; a group whose first value is NaN or infinite gives NaN)."""
    steps = vector.values.shape[1]
    mean, squares, seen = np.zeros((count, steps)), np.zeros((count, steps)), np.zeros((count, steps))
    for rows in _ranks(group_of):
        groups, values, present = group_of[rows], vector.values[rows], vector.present[rows]
        n = seen[groups] + present
        old_mean = mean[groups]
        delta = values - old_mean
        new_mean = np.where(n == 1, values, old_mean + delta / n)
        added = np.where(n == 1, np.where(np.isfinite(values), 0.0, np.nan), delta * (values - new_mean))
        mean[groups] = np.where(present, new_mean, old_mean)
        squares[groups] = np.where(present, squares[groups] + added, squares[groups])
        seen[groups] = n
    return squares / seen


def _check_k(k_values: np.ndarray) -> None:
    """topk/bottomk/limitk's k, checked as Prometheus 3 does (unless every k is under 1, which
    gives nothing): not NaN, inside int64."""
    if not k_values.max() < 1:
        if np.isnan(k_values).any():
            raise PromQLError("Parameter value is NaN")
        if k_values.min() <= -(2.0**63):
            raise PromQLError(f"Scalar value {go_float(k_values.min())} underflows int64")
        if k_values.max() >= 2.0**63:
            raise PromQLError(f"Scalar value {go_float(k_values.max())} overflows int64")


def _top(vector: Vector, k_values: np.ndarray, group_of: np.ndarray, op: str) -> Vector:
    if not vector.labels:
        return vector
    present = np.zeros_like(vector.present)
    ranking = np.zeros(len(vector.labels), dtype=np.int64)
    largest = op == "topk"
    for group in np.unique(group_of):
        rows = np.flatnonzero(group_of == group)
        values = vector.values[rows]
        nan = np.isnan(values)
        key = np.where(nan, -np.inf if largest else np.inf, values)
        key = -key if largest else key
        rank_key = np.where(vector.present[rows], np.where(nan, 1, 0), 2)
        for step in range(values.shape[1]):
            k = k_values[step]
            if not k >= 1:
                continue
            order = np.lexsort((key[:, step], rank_key[:, step]))
            chosen = [row for row in order[: int(min(k, len(rows)))] if vector.present[rows[row], step]]
            present[rows[chosen], step] = True
            if len(k_values) == 1:
                ranking[rows[chosen]] = np.arange(len(chosen))
    chosen_vector = Vector(vector.labels, vector.values, present, vector.sample_ms)
    if len(k_values) != 1:
        return chosen_vector.without_absent()
    # An instant query answers each group's rows in rank order (topk descending, bottomk
    # ascending, NaN last), the groups in the order they first appear (their numbers), as
    # Prometheus does.
    order = np.flatnonzero(present[:, 0])
    order = order[np.lexsort((ranking[order], group_of[order]))]
    return Vector(
        [vector.labels[row] for row in order.tolist()],
        vector.values[order],
        present[order],
        None if vector.sample_ms is None else vector.sample_ms[order],
    )


def _limit(vector: Vector, group_of: np.ndarray, chosen) -> Vector:
    """limitk/limit_ratio: the rows ``chosen(rows, their groups)`` keeps at each step, the rows
    in Prometheus's input order (series sorted by their label sets)."""
    order = np.array(sorted(range(len(vector.labels)), key=lambda row: sorted(vector.labels[row].items())), dtype=int)
    ordered = vector.take(order)
    kept = ordered.sampled & chosen(ordered, group_of[order])
    histograms = None if ordered.histograms is None else np.where(kept, ordered.histograms, None)  # type: ignore[call-overload]  # numpy's stubs: None in an object array
    return ordered._replace(present=ordered.present & kept, histograms=histograms).without_absent()


def _first_k(present: np.ndarray, group_of: np.ndarray, k_values: np.ndarray) -> np.ndarray:
    """The first k present rows of each group at each step (rows in order, k per step)."""
    seen = np.zeros_like(present, dtype=np.int64)
    for group in np.unique(group_of):
        rows = np.flatnonzero(group_of == group)
        seen[rows] = np.cumsum(present[rows], axis=0)
    return seen <= np.floor(k_values)[None, :]


def _sampled(labels: list[dict], ratios: np.ndarray) -> np.ndarray:
    """limit_ratio's choice (Prometheus's HashRatioSampler): a series' offset in [0, 1) is the
    xxHash64 of its label set as Prometheus 3 lays it out, over 2^64 - 1; a ratio r >= 0 keeps
    offsets under r, a ratio r < 0 keeps offsets at or above 1 + r."""
    offsets = np.array([_label_set_hash(series) / float(2**64 - 1) for series in labels])[:, None]
    ratios = np.clip(ratios, -1.0, 1.0)[None, :]
    return np.where(ratios >= 0, offsets < ratios, offsets >= 1 + ratios)


def _label_set_hash(labels: dict[str, str]) -> int:
    """Prometheus 3's Labels.Hash(): xxHash64 of each name and value, sorted by name, each
    after its length (one byte below 255, else 255 and three bytes little-endian)."""
    data = bytearray()
    for name, value in sorted(labels.items()):
        for text in (name.encode(), value.encode()):
            data += bytes([len(text)]) if len(text) < 255 else b"\xff" + len(text).to_bytes(3, "little")
            data += text
    return xxhash.xxh64_intdigest(bytes(data))


def _count_values(vector: Vector, label: str, grouping: list[str], without: bool, ctx: Context) -> Vector:
    """count_values: a float sample's value as Prometheus writes it, a histogram sample's as
    Prometheus's FloatHistogram.String."""
    counts: dict[LabelsKey, tuple[dict, np.ndarray]] = {}
    histograms = vector.histograms if vector.histograms is not None else np.full(vector.values.shape, None)
    for labels, values, present, row_histograms in zip(vector.labels, vector.values, vector.present, histograms):
        base = _group_labels(labels, grouping, without)
        for step in np.flatnonzero(present | np.not_equal(row_histograms, None)):  # type: ignore[call-overload]  # numpy's stubs: None in an object array
            histogram = row_histograms[step]
            text = format_value(values[step]) if histogram is None else histogram.text(go_float)
            result = {**base, label: text}
            key = labels_key(result)
            if key not in counts:
                counts[key] = (result, np.zeros(ctx.steps))
            counts[key][1][step] += 1
    if not counts:
        return Vector.empty(ctx.steps)
    labels, rows = zip(*counts.values())
    values = np.vstack(rows)
    return Vector(list(labels), values, values > 0)


def format_value(value: float) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 64), as Prometheus writes sample values."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    if "e" in text or "E" in text:
        text = np.format_float_positional(value, unique=True, trim="-")
    elif text.endswith(".0"):
        text = text[:-2]
    return text
