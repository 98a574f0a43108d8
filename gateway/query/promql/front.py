"""The PromQL front: Prometheus 3's experimental syntax that promql-parser 0.12 cannot read,
rewritten into text it reads, before it parses the query.

- Duration expressions (``foo[5m+1m]``, ``[29s+1s:5s+5s]``, ``offset (1h/2)``, ``step()``,
  ``range()``, ``min_of()``, ``max_of()``) in a range, a subquery's range and step and an offset
  are evaluated with the query's step and range, as Prometheus's durationVisitor does, and
  written back as literal milliseconds (an offset of 0 is left out: promql-parser refuses it).
- The ``anchored`` and ``smoothed`` modifiers are removed and recorded as a label matcher on
  their selector, ``MODIFIER_LABEL="anchored"`` (or ``"smoothed"``), which the planner and the
  evaluator read and strip. A query whose text holds that label name is refused, so the
  marker never collides with what a user wrote.

- The histogram trim operators ``h </ x`` and ``h >/ x`` are written as ``h < TRIM(x)`` and
  ``h > TRIM(x)`` (the same precedence), TRIM being ``TRIM_SCALAR`` or ``TRIM_VECTOR`` as the
  right operand is a scalar or a vector: reserved function names the evaluator reads back as
  the trim operator. A query whose text holds one is refused.

- Asked to (``info_labels``), the label selector of ``info(v, {...})`` gets the matcher
  ``MODIFIER_LABEL="info"`` too: Prometheus takes one whose matchers all match the empty value
  there (``{data=~".*"}``), promql-parser does not, so the engine asks where promql-parser
  refused one; the evaluator reads that selector's matchers without it.

Text without any of these reaches promql-parser unchanged. The tokenizer reads strings (with their
escapes), backtick strings and comments whole, so nothing inside them is rewritten.
"""

import math
import operator
import re
from typing import NamedTuple

MODIFIER_LABEL = "__tsgate_range_modifier__"
RANGE_MODIFIERS = ("anchored", "smoothed")
INFO_LABELS = "info"  # MODIFIER_LABEL's value on info()'s label selector
TRIM_SCALAR = "__tsgate_trim_scalar__"
TRIM_VECTOR = "__tsgate_trim_vector__"
_RESERVED = (MODIFIER_LABEL, TRIM_SCALAR, TRIM_VECTOR)

_TOKEN = re.compile(
    r"""(?P<space>\s+)
    |(?P<comment>\#[^\n]*)
    |(?P<string>"(?:[^"\\]|\\.)*(?:"|\\?\Z)|'(?:[^'\\]|\\.)*(?:'|\\?\Z)|`[^`]*`?)
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![\w.]))
    |(?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
    |(?P<identifier>[A-Za-z_][\w:]*)  # a name starting with ":" reads as ":" and a name
    |(?P<operator>==|!=|>=|<=|=~|!~|[-+*/%^<>=@])
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_UNIT = re.compile(r"(\d+)(ms|[smhdwy])")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2, "^": 3}
# The words after which ``offset`` is a metric or label name, not the modifier.
_NOT_AN_OPERAND = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "atan2",
}
_MAX_DURATION_SECONDS = 2**63 / 1e9


class Token(NamedTuple):
    kind: str
    text: str
    start: int
    end: int


class FrontError(ValueError):
    """A duration expression or a range modifier Prometheus refuses, worded as it words it
    (a duration's ``start:end: reason`` with offsets in the text, a modifier's
    ``line:column: parse error: reason``)."""


def tokens(text: str) -> list[Token]:
    """The query's tokens, without spaces and comments."""
    return [
        Token(m.lastgroup or "other", m.group(), m.start(), m.end())
        for m in _TOKEN.finditer(text)
        if m.lastgroup not in ("space", "comment")
    ]


class QueryTimes(NamedTuple):
    """What ``step()`` and ``range()`` are for a query: 0 and 0 for an instant query."""

    step_ms: int = 0
    range_ms: int = 0


INSTANT = QueryTimes()


class _Node(NamedTuple):
    op: str  # "literal", a binary operator, "neg", "step", "range", "min_of", "max_of"
    start: int
    end: int
    value: float = 0.0
    args: tuple = ()


class _DurationParser:
    """A duration expression as Prometheus's grammar reads it (generated_parser.y's
    duration_expr and offset_duration_expr): + - below * / % below right-associative ^, a unary
    sign binding as * does."""

    def __init__(self, toks: list[Token], index: int):
        self.toks = toks
        self.index = index

    def peek(self) -> Token | None:
        return self.toks[self.index] if self.index < len(self.toks) else None

    def take(self, text: str | None = None) -> Token:
        token = self.peek()
        if token is None or (text is not None and token.text.lower() != text):
            raise _NotADuration
        self.index += 1
        return token

    def expression(self, lowest: int = 1) -> _Node:
        left = self.unary()
        while (token := self.peek()) is not None and _PRECEDENCE.get(token.text, 0) >= lowest:
            if token.kind != "operator":
                break
            self.index += 1
            precedence = _PRECEDENCE[token.text]
            right = self.expression(precedence if token.text == "^" else precedence + 1)
            left = _Node(token.text, left.start, right.end, args=(left, right))
        return left

    def unary(self) -> _Node:
        token = self.peek()
        if token is not None and token.text in ("+", "-") and token.kind == "operator":
            self.index += 1
            operand = self.expression(_PRECEDENCE["^"])
            return operand if token.text == "+" else _Node("neg", token.start, operand.end, args=(operand,))
        return self.primary()

    def primary(self) -> _Node:
        token = self.take()
        word = token.text.lower()
        if token.kind in ("number", "duration") or (token.kind == "identifier" and word in ("inf", "nan")):
            return _Node("literal", token.start, token.end, literal_seconds(token))
        if token.text == "(":
            inner = self.expression()
            close = self.take(")")
            return inner._replace(start=token.start, end=close.end)
        if token.kind == "identifier" and word in ("step", "range"):
            self.take("(")
            return _Node(word, token.start, self.take(")").end)
        if token.kind == "identifier" and word in ("min_of", "max_of"):
            self.take("(")
            left = self.expression()
            self.take(",")
            right = self.expression()
            return _Node(word, token.start, self.take(")").end, args=(left, right))
        raise _NotADuration

    def offset(self) -> _Node:
        """What follows ``offset``: a signed literal, ``step()``, ``range()``, ``min_of()``,
        ``max_of()`` or a parenthesised expression; an operator after it applies to the
        selector (``foo offset 100 + 2`` adds 2 to ``foo offset 100``)."""
        token = self.peek()
        if token is not None and token.text in ("+", "-") and token.kind == "operator":
            self.index += 1
            operand = self.primary()
            return operand if token.text == "+" else _Node("neg", token.start, operand.end, args=(operand,))
        return self.primary()


class _NotADuration(Exception):
    """The tokens are no duration expression: the text is left for promql-parser to judge."""


def literal_seconds(token: Token) -> float:
    if token.kind == "duration":
        return sum(int(amount) * _UNIT_SECONDS[unit] for amount, unit in _UNIT.findall(token.text))
    if token.kind == "identifier":
        return math.inf if token.text.lower() == "inf" else math.nan
    return float(int(token.text, 16)) if token.text[:2].lower() == "0x" else float(token.text)


def _fmod(left: float, right: float) -> float:
    return math.fmod(left, right) if not math.isinf(left) else math.nan


def _pow(left: float, right: float) -> float:
    try:
        return math.pow(left, right)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


_OPERATIONS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "%": _fmod,
    "^": _pow,
    "min_of": lambda left, right: math.nan if math.isnan(left) or math.isnan(right) else min(left, right),
    "max_of": lambda left, right: math.nan if math.isnan(left) or math.isnan(right) else max(left, right),
}


def _value(node: _Node, times: QueryTimes) -> float:
    """The expression's value in seconds, as Go's float64 arithmetic has it."""
    op = node.op
    if op == "literal":
        return node.value
    if op in ("step", "range"):
        return (times.step_ms if op == "step" else times.range_ms) / 1000
    values = [_value(arg, times) for arg in node.args]
    if op == "neg":
        return -values[0]
    if op in ("/", "%") and values[1] == 0:
        raise FrontError(f"{node.start}:{node.end}: {'division' if op == '/' else 'modulo'} by zero")
    return _OPERATIONS[op](*values)


def duration_ms(node: _Node, times: QueryTimes, negative_allowed: bool) -> int:
    """The expression's value in whole milliseconds, truncated as Prometheus truncates it."""
    seconds = _value(node, times)
    where = f"{node.start}:{node.end}"
    if math.isnan(seconds) or math.isinf(seconds):
        raise FrontError(f"{where}: duration is NaN or infinite")
    if seconds <= 0 and not negative_allowed:
        raise FrontError(f"{where}: duration must be greater than 0")
    if abs(seconds) > _MAX_DURATION_SECONDS:
        raise FrontError(f"{where}: duration is out of range")
    return int(seconds * 1000)


def _ends_operand(token: Token | None) -> bool:
    if token is None:
        return False
    if token.kind == "identifier":
        return token.text.lower() not in _NOT_AN_OPERAND
    return token.kind in ("number", "duration", "string") or token.text in (")", "]", "}")


def _position(text: str, offset: int) -> str:
    """``line:column`` of a text offset, as Prometheus's parse errors say where."""
    return f"{text.count(chr(10), 0, offset) + 1}:{offset - text.rfind(chr(10), 0, offset)}"


class _Selector:
    """The selector the text has just read (a name, braces, a range, offsets, ``@``): where a
    modifier's matcher goes, and the modifier it already carries."""

    def __init__(self, name: Token | None):
        self.name = name
        self.close_brace: int | None = None  # the token index of its "}", if it has braces
        self.modifier: str | None = None


_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_SUBQUERY = object()  # the last operand read is a subquery
_OTHER = object()  # the last operand read is neither a selector nor a subquery


def rewrite(text: str, times: QueryTimes = INSTANT, info_labels: bool = False) -> str:
    """``text`` with its duration expressions evaluated, its range modifiers recorded as
    matchers, its trim operators written as comparisons, and with ``info_labels`` info()'s label
    selector marked (the module's docstring); ``text`` itself when it has none of these."""
    if MODIFIER_LABEL in text:
        raise FrontError(f"the label name {MODIFIER_LABEL} is reserved")
    if (reserved := next((name for name in (TRIM_SCALAR, TRIM_VECTOR) if name in text), None)) is not None:
        raise FrontError(f"the function name {reserved} is reserved")
    try:
        return _rewritten(text, times, info_labels)
    except RecursionError:
        raise FrontError("a duration expression nested too deeply") from None


def _rewritten(text: str, times: QueryTimes, info_labels: bool) -> str:
    toks = tokens(text)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) in the text
    _rewrite_trims(toks, edits)
    if info_labels:
        _mark_info_labels(toks, edits)
    braces = 0
    grouping = 0  # depth inside a by/without/on/ignoring/group_x label list
    last: _Selector | object = _OTHER
    index = 0
    while index < len(toks):
        token, word = toks[index], toks[index].text.lower()
        previous = toks[index - 1] if index else None
        following = toks[index + 1] if index + 1 < len(toks) else None
        if grouping:
            grouping += {"(": 1, ")": -1}.get(token.text, 0) if token.kind == "other" else 0
        elif token.kind == "other" and token.text == "{":
            if braces == 0 and not (isinstance(last, _Selector) and last.name is previous):
                last = _Selector(None)  # braces without a name before them
            braces += 1
        elif token.kind == "other" and token.text == "}":
            braces = max(0, braces - 1)
            if braces == 0 and isinstance(last, _Selector):
                last.close_brace = index
        elif braces:
            pass
        elif token.kind == "other" and token.text == "[":
            index, subquery = _rewrite_brackets(toks, index + 1, times, edits)
            if subquery:
                last = _SUBQUERY
            continue
        elif token.kind == "identifier" and word == "offset" and _ends_operand(previous):
            index = _rewrite_offset(toks, index, times, edits)
            continue
        elif token.text == "@" and _ends_operand(previous):
            index = _skip_at(toks, index + 1)
            continue
        elif token.kind == "identifier" and word in RANGE_MODIFIERS and _ends_operand(previous):
            _apply_modifier(text, toks, token, word, last, edits)
        elif token.kind == "identifier" and word in _GROUPING and following is not None and following.text == "(":
            grouping = 1
            index += 2
            last = _OTHER
            continue
        elif (
            token.kind == "identifier" and word not in _NOT_AN_OPERAND and (following is None or following.text != "(")
        ):
            last = _Selector(token)
        else:
            last = _OTHER
        index += 1
    if not edits:
        return text
    out, position = [], 0
    for start, end, replacement in sorted(edits):
        out += [text[position:start], replacement]
        position = end
    return "".join([*out, text[position:]])


def _skip_at(toks: list[Token], index: int) -> int:
    """The index after ``@``'s timestamp: a signed number, ``start()`` or ``end()``."""
    if index < len(toks) and toks[index].text in ("+", "-"):
        index += 1
    if index < len(toks) and toks[index].text.lower() in ("start", "end"):
        return min(index + 3, len(toks))
    return index + 1


def _apply_modifier(text: str, toks: list[Token], keyword: Token, modifier: str, last, edits: list) -> None:
    """Records ``anchored``/``smoothed`` as a matcher on the selector it follows and removes the
    word; refused where Prometheus refuses it."""
    where = _position(text, keyword.start)
    if last is _SUBQUERY:
        raise FrontError(f"{where}: parse error: {modifier} modifier is not supported for subqueries")
    if not isinstance(last, _Selector):
        raise FrontError(f"{where}: parse error: {modifier} modifier not implemented")
    if last.modifier is not None and last.modifier != modifier:
        raise FrontError(f"{where}: parse error: anchored and smoothed modifiers cannot be used together")
    edits.append((keyword.start, keyword.end, ""))
    if last.modifier is not None:
        return
    last.modifier = modifier
    matcher = f'{MODIFIER_LABEL}="{modifier}"'
    if last.close_brace is None:
        assert last.name is not None
        edits.append((last.name.end, last.name.end, "{" + matcher + "}"))
        return
    before = toks[last.close_brace - 1]
    separator = "" if before.text in ("{", ",") else ","
    edits.append((toks[last.close_brace].start, toks[last.close_brace].start, separator + matcher))


def _rewrite_brackets(toks: list[Token], index: int, times: QueryTimes, edits: list) -> tuple[int, bool]:
    """A range ``[d]`` or a subquery's ``[d:d]``: each side that is an expression, not a literal,
    written as milliseconds. The index after what was read, and whether it was a subquery."""
    for terminators in ((":", "]"), ("]",)):
        subquery = terminators == ("]",)
        if subquery and index < len(toks) and toks[index].text == "]":
            return index + 1, True  # a subquery with its default step
        parser = _DurationParser(toks, index)
        try:
            node = parser.expression()
            after = parser.peek()
            if after is None or after.text not in terminators:
                raise _NotADuration
        except _NotADuration:
            return index, False
        if parser.index - index > 1:  # not a single literal
            edits.append((node.start, node.end, f"{duration_ms(node, times, negative_allowed=False)}ms"))
        index = parser.index + 1
        if after.text == "]":
            return index, subquery
    return index, True


def _rewrite_offset(toks: list[Token], index: int, times: QueryTimes, edits: list) -> int:
    """``offset <duration expression>`` written as ``offset <ms>ms``, or left out when 0."""
    parser = _DurationParser(toks, index + 1)
    try:
        node = parser.offset()
    except _NotADuration:
        return index + 1
    consumed = parser.index - index - 1
    if node.op == "literal" and consumed == 1 or node.op == "neg" and node.args[0].op == "literal" and consumed == 2:
        return parser.index  # a signed literal, which promql-parser reads
    milliseconds = duration_ms(node, times, negative_allowed=True)
    if milliseconds:
        edits.append((node.start, node.end, f"{milliseconds}ms"))
    else:
        edits.append((toks[index].start, node.end, ""))
    return parser.index


# What ends a trim operator's right operand at its own nesting level: an operator binding as
# loosely as the comparisons or more loosely, a closing bracket or an argument's comma.
_ENDS_COMPARISON_OPERAND = {"==", "!=", ">=", "<=", ">", "<", "and", "or", "unless", ")", "]", "}", ","}
_BINARY_MODIFIERS = {"bool", "on", "ignoring", "group_left", "group_right", "fill", "fill_left", "fill_right"}
_MODIFIERS_WITH_LABELS = {"on", "ignoring", "fill", "fill_left", "fill_right"}  # else a metric of that name
# The words of a scalar expression: a vector's operand names something else (or opens braces).
_SCALAR_WORDS = {"inf", "nan", "time", "pi", "bool"}


def _rewrite_trims(toks: list[Token], edits: list) -> None:
    """``>/`` and ``</`` (the two characters adjacent, as Prometheus's lexer reads them) written
    as a comparison of the same precedence with its right operand wrapped in TRIM_SCALAR() or
    TRIM_VECTOR() (the module's docstring)."""
    for index in range(len(toks) - 1):
        token, slash = toks[index], toks[index + 1]
        if token.text not in ("<", ">") or slash.text != "/" or slash.start != token.end:
            continue
        edits.append((slash.start, slash.end, ""))
        first = index + 2
        while first < len(toks) and toks[first].text.lower() in _BINARY_MODIFIERS:
            following = toks[first + 1].text if first + 1 < len(toks) else ""
            if toks[first].text.lower() in _MODIFIERS_WITH_LABELS and following != "(":
                break
            first += 1
            if first < len(toks) and toks[first].text == "(":
                first = _after_group(toks, first)
        last = _operand_end(toks, first)
        if last <= first:
            continue  # no operand: promql-parser says what is missing
        wrapper = TRIM_VECTOR if _is_vector(toks[first:last]) else TRIM_SCALAR
        edits.append((toks[first].start, toks[first].start, wrapper + "("))
        edits.append((toks[last - 1].end, toks[last - 1].end, ")"))


def _after_group(toks: list[Token], index: int) -> int:
    """The index after the bracket group opening at ``index``."""
    depth = 0
    while index < len(toks):
        depth += (
            {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(toks[index].text, 0)
            if toks[index].kind == "other"
            else 0
        )
        index += 1
        if depth <= 0:
            break
    return index


def _operand_end(toks: list[Token], index: int) -> int:
    """The index after the operand of a comparison-precedence operator starting at ``index``."""
    while index < len(toks):
        token = toks[index]
        if token.text.lower() in _ENDS_COMPARISON_OPERAND and token.kind != "string":
            break
        index = _after_group(toks, index) if token.kind == "other" and token.text in "([{" else index + 1
    return index


def _is_vector(toks: list[Token]) -> bool:
    """Whether an operand is a vector: outside ``scalar(...)``, it names a selector or a vector
    function, or opens braces."""
    index = 0
    while index < len(toks):
        token, word = toks[index], toks[index].text.lower()
        if token.kind == "identifier" and word == "scalar" and index + 1 < len(toks) and toks[index + 1].text == "(":
            index = _after_group(toks, index + 1)
            continue
        if token.text == "{" and token.kind == "other" or token.kind == "identifier" and word not in _SCALAR_WORDS:
            return True
        index += 1
    return False


def _mark_info_labels(toks: list[Token], edits: list) -> None:
    """``info(v, {...})``'s label selector with the matcher MODIFIER_LABEL="info" added."""
    for index in range(len(toks) - 1):
        if toks[index].text != "info" or toks[index].kind != "identifier" or toks[index + 1].text != "(":
            continue
        depth, comma = 0, index + 1
        while comma < len(toks):
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(toks[comma].text, 0)
            if depth <= 0 or depth == 1 and toks[comma].text == ",":
                break
            comma += 1
        if depth != 1 or comma + 1 >= len(toks) or toks[comma + 1].text != "{":
            continue
        close = _after_group(toks, comma + 1) - 1
        if close < len(toks) and toks[close].text == "}":
            separator = "" if toks[close - 1].text in ("{", ",") else ","
            edits.append((toks[close].start, toks[close].start, f'{separator}{MODIFIER_LABEL}="{INFO_LABELS}"'))
