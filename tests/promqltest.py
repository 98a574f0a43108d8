"""The PromQL test files (tests/promql/*.test): a small ``load``/``eval`` language of our own,
after the idea of Prometheus's promql/testdata format, parsed here and run by
tests/query/test_promql_tier.py (and checked against Prometheus 2.42 by tests/promtool_check.py).

A file is a list of commands; indented lines belong to the command above them; ``#`` starts a
comment line::

    load 1m                                  # samples every minute, the first at 0
      http_requests{job="api"} 0+10x5 _ 7 stale NaN -Inf 1e308

    clear                                    # forget everything loaded so far

    eval instant at 5m sum(http_requests)    # the series the answer must hold, in any order
      {} 50

    eval_ordered instant at 5m sort_desc(x)  # ... in this order
    eval range from 0 to 10m step 1m rate(x[5m])
      {job="api"} _ 1 1x8                     # one value per step, ``_`` where none
    eval instant at 1m 1 + 1                 # a scalar answer: a value alone
      2
    eval_fail instant at 1m a + on() b       # an error, optionally its errorType and a part of
      error execution many-to-many           # its message

Values: ``a+bxn`` (a, then n additions of b: n+1 values), ``a-bxn``, ``axn`` (a, n+1 times),
``_`` (no sample), ``_xn`` (n of them), ``stale`` (a staleness marker), numbers with ``NaN``,
``Inf``, ``-Inf``. Expected values match with Prometheus's tolerance (relative 1e-6; NaN equals NaN).
"""

import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import promql_parser

from protocols.prometheus.xor import STALE_NAN_BITS

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
EPSILON = 1e-6
MIN_NORMAL = 2.2250738585072014e-308

_NUMBER = r"[+-]?(?:Inf|NaN|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
_SEQUENCE = re.compile(rf"^({_NUMBER})(?:([+-])({_NUMBER}))?x(\d+)$", re.IGNORECASE)
_EVAL = re.compile(
    r"^(eval|eval_ordered|eval_fail) +(?:instant +at +(?P<at>\S+)"
    r"|range +from +(?P<start>\S+) +to +(?P<end>\S+) +step +(?P<step>\S+)) +(?P<expr>.+)$"
)


class FormatError(Exception):
    pass


def number(text: str) -> float:
    if not re.fullmatch(_NUMBER, text, re.IGNORECASE):
        raise ValueError(text)
    return float(text)


def values(tokens: list[str]) -> list[float | None]:
    """The values of series notation (None: no sample)."""
    found: list[float | None] = []
    for token in tokens:
        if token == "_":
            found.append(None)
        elif token.startswith("_x"):
            found.extend([None] * int(token[2:]))
        elif token == "stale":
            found.append(STALE)
        elif sequence := _SEQUENCE.match(token):
            start, sign, step, times = sequence.groups()
            value, increment = number(start), 0.0 if step is None else number(step)
            found.append(value)
            for _ in range(int(times)):
                value = value + increment if sign != "-" else value - increment
                found.append(value)
        else:
            try:
                found.append(number(token))
            except ValueError:
                raise FormatError(f"not a value: {token!r}") from None
    return found


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}


def duration_ms(text: str) -> int:
    """A Prometheus duration (``1h30m``, ``0``), negative with a leading ``-``."""
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text)
    if body == "0":
        return 0
    parts = re.findall(r"(\d+)(ms|[smhdwy])", body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise FormatError(f"not a duration: {text!r}")
    return sign * sum(int(n) * _UNITS_MS[u] for n, u in parts)


def series_end(text: str) -> int:
    """Where ``metric{label="value"}`` (or ``metric``, ``{...}``) at the start of ``text`` ends."""
    depth, quoted, escaped = 0, False, False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted:
            escaped = char == "\\"
            quoted = char != '"'
        elif char == '"':
            quoted = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
        elif char.isspace() and depth == 0:
            return index
    return len(text)


def split_series(line: str) -> tuple[dict[str, str], list[str]]:
    """``metric{label="value"} rest...`` as its labels and the words after it."""
    end = series_end(line)
    return labels(line[:end]), line[end:].split()


def labels(text: str) -> dict[str, str]:
    """The labels of ``metric{a="b"}`` or ``{a="b"}``, by Prometheus's own selector syntax."""
    if text == "{}":
        return {}
    try:
        selector = promql_parser.parse(text)
    except ValueError as error:
        raise FormatError(f"not a series: {text!r}: {error}") from None
    if type(selector).__name__ != "VectorSelector":
        raise FormatError(f"not a series: {text!r}")
    found = {m.name: m.value for m in selector.matchers.matchers if str(m.op) == "MatchOp.Equal"}
    if selector.name:
        found["__name__"] = selector.name
    return found


@dataclass
class Load:
    line: int
    interval_ms: int
    series: list[tuple[dict[str, str], list[float | None]]] = field(default_factory=list)

    def samples(self):
        """(labels, timestamp ms, value) of every sample."""
        for series_labels, points in self.series:
            for index, value in enumerate(points):
                if value is not None:
                    yield series_labels, index * self.interval_ms, value


@dataclass
class Clear:
    line: int


@dataclass
class Eval:
    line: int
    expr: str
    start_ms: int
    end_ms: int
    step_ms: int  # 0: an instant query at start_ms
    ordered: bool = False
    fails: bool = False
    error_type: str | None = None
    error_text: str | None = None
    scalar: float | None = None
    series: list[tuple[dict[str, str], list[float | None]]] = field(default_factory=list)

    @property
    def times_ms(self) -> list[int]:
        if not self.step_ms:
            return [self.start_ms]
        return list(range(self.start_ms, self.end_ms + 1, self.step_ms))


def parse_file(path: Path) -> list[Load | Clear | Eval]:
    commands: list[Load | Clear | Eval] = []
    for number_, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        try:
            if raw[0].isspace():
                if not commands or isinstance(commands[-1], Clear):
                    raise FormatError("an indented line outside load and eval")
                _add_line(commands[-1], text)
            else:
                commands.append(_command(number_, text))
        except FormatError as error:
            raise FormatError(f"{path}:{number_}: {error}") from None
    return commands


def _command(line: int, text: str) -> Load | Clear | Eval:
    if text == "clear":
        return Clear(line)
    words = text.split()
    if words[0] == "load" and len(words) == 2:
        return Load(line, duration_ms(words[1]))
    found = _EVAL.match(text)
    if not found:
        raise FormatError(f"not a command: {text!r}")
    command = found.group(1)
    if found["at"] is not None:
        start = end = duration_ms(found["at"])
        step = 0
    else:
        start, end, step = duration_ms(found["start"]), duration_ms(found["end"]), duration_ms(found["step"])
        if step <= 0 or end < start:
            raise FormatError("a range needs start <= end and a positive step")
    return Eval(line, found["expr"], start, end, step, ordered=command == "eval_ordered", fails=command == "eval_fail")


def _add_line(command: Load | Eval, text: str) -> None:
    if isinstance(command, Load):
        series_labels, points = _series_line(text)
        if "__name__" not in series_labels:
            raise FormatError("a loaded series needs a metric name")
        command.series.append((series_labels, points))
        return
    if command.fails:
        kind, _, message = text.partition(" ")
        if kind != "error" or command.error_type is not None:
            raise FormatError("eval_fail takes one line: error [<errorType> [<part of the message>]]")
        command.error_type, _, rest = message.strip().partition(" ")
        command.error_type = command.error_type or None
        command.error_text = rest.strip() or None
        return
    if re.fullmatch(_NUMBER, text, re.IGNORECASE):
        if command.series or command.scalar is not None or command.step_ms:
            raise FormatError("a scalar answer is one value alone")
        command.scalar = number(text)
        return
    if command.scalar is not None:
        raise FormatError("a scalar answer is one value alone")
    series_labels, points = _series_line(text)
    if not command.step_ms and len(points) != 1:
        raise FormatError("an instant answer has one value per series")
    if command.step_ms and len(points) != len(command.times_ms):
        raise FormatError(f"{len(points)} values for {len(command.times_ms)} steps")
    if any(series_labels == known for known, _ in command.series):
        raise FormatError("the same series twice")
    command.series.append((series_labels, points))


def _series_line(text: str) -> tuple[dict[str, str], list[float | None]]:
    series_labels, words = split_series(text)
    return series_labels, values(words)


def almost_equal(a: float, b: float) -> bool:
    """Prometheus's test comparison: NaN equals NaN, else a relative difference under 1e-6."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    total = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or total < MIN_NORMAL:
        return diff < EPSILON * MIN_NORMAL
    return diff / min(total, 1.7976931348623157e308) < EPSILON


def show_labels(series_labels: dict[str, str]) -> str:
    name = series_labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(series_labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def compare(case: Eval, got: list[tuple[dict[str, str], list[float | None]]]) -> list[str]:
    """What differs between the case's expected series and ``got`` (label sets, one value per
    step or None), empty when they match."""
    problems = []
    want = case.series if case.scalar is None else [({}, [case.scalar])]
    got_by_key = {tuple(sorted(s.items())): points for s, points in got}
    for series_labels, points in want:
        found = got_by_key.get(tuple(sorted(series_labels.items())))
        if found is None:
            problems.append(f"missing {show_labels(series_labels)} {_show(points)}")
        elif len(found) != len(points) or not all(
            (a is None and b is None) or (a is not None and b is not None and almost_equal(a, b))
            for a, b in zip(points, found)
        ):
            problems.append(f"{show_labels(series_labels)}: expected {_show(points)}, got {_show(found)}")
    wanted = {tuple(sorted(s.items())) for s, _ in want}
    problems += [f"unexpected {show_labels(s)} {_show(p)}" for s, p in got if tuple(sorted(s.items())) not in wanted]
    if case.ordered and not problems:
        order = [tuple(sorted(s.items())) for s, _ in got]
        expected = [tuple(sorted(s.items())) for s, _ in want]
        if order != expected:
            problems.append(
                "order: expected "
                + ", ".join(show_labels(dict(k)) for k in expected)
                + "; got "
                + ", ".join(show_labels(dict(k)) for k in order)
            )
    return problems


def is_stale(value: float) -> bool:
    return struct.pack("<d", value) == struct.pack("<d", STALE)


def _show(points: list[float | None]) -> str:
    return " ".join("_" if p is None else "stale" if is_stale(p) else repr(p) for p in points)
