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

    # Prometheus 3: left-open windows         # the next eval expects Prometheus 3's answer, which
    eval instant at 5m count_over_time(x[5m])  # 2.42 gives otherwise (promtool_check skips it)
      {job="api"} 5

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

from protocols.prometheus.native_histogram import CUSTOM_BUCKETS_SCHEMA, Histogram
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


def values(tokens: list[str]) -> list:
    """The values of series notation (None: no sample; a Histogram for ``{{...}}``)."""
    found: list = []
    for token in tokens:
        if token == "_":
            found.append(None)
        elif token.startswith("_x"):
            found.extend([None] * int(token[2:]))
        elif token == "stale":
            found.append(STALE)
        elif token.startswith("{{"):
            found.extend(_histograms(token))
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


# A value of series notation: a native histogram sequence (``{{a}}+{{b}}x3``) or a word.
_TOKEN = re.compile(r"\{\{.*?\}\}(?:[+-]\{\{.*?\}\})?(?:x\d+)?|\S+")
_HISTOGRAM_SEQUENCE = re.compile(r"^\{\{(.*?)\}\}(?:([+-])\{\{(.*?)\}\})?(?:x(\d+))?$")
_HISTOGRAM_FIELD = re.compile(r"(\w+):(\[[^\]]*\]|\S+)")
_HISTOGRAM_FIELDS = {
    "schema", "sum", "count", "z_bucket", "z_bucket_w", "buckets", "offset", "n_buckets", "n_offset",
    "custom_values", "counter_reset_hint",
}  # fmt: skip
_RESET_HINTS = {"unknown": 0, "reset": 1, "not_reset": 2, "gauge": 3}


def histogram(text: str) -> Histogram:
    """Prometheus's notation of a native histogram (the inside of ``{{...}}``): ``schema``,
    ``sum``, ``count``, ``z_bucket`` (zero count), ``z_bucket_w`` (zero threshold), ``buckets``
    and ``n_buckets`` (counts from bucket index ``offset`` and ``n_offset``), ``custom_values``,
    ``counter_reset_hint``."""
    fields = dict(_HISTOGRAM_FIELD.findall(text))
    if _HISTOGRAM_FIELD.sub("", text).strip() or set(fields) - _HISTOGRAM_FIELDS:
        raise FormatError(f"not a native histogram: {{{{{text}}}}}")

    def counts(key: str, offset: str) -> dict[int, float]:
        first = int(fields.get(offset, "0"))
        return {first + i: number(c) for i, c in enumerate(fields.get(key, "[]").strip("[]").split())}

    custom = tuple(number(v) for v in fields.get("custom_values", "[]").strip("[]").split())
    return Histogram(
        int(fields.get("schema", CUSTOM_BUCKETS_SCHEMA if custom else 0)),
        number(fields.get("z_bucket_w", "0")),
        number(fields.get("z_bucket", "0")),
        number(fields.get("count", "0")),
        number(fields.get("sum", "0")),
        counts("buckets", "offset"),
        counts("n_buckets", "n_offset"),
        custom,
        _RESET_HINTS[fields.get("counter_reset_hint", "unknown")],
    )


def _histograms(token: str) -> list[Histogram]:
    found = _HISTOGRAM_SEQUENCE.match(token)
    if not found:
        raise FormatError(f"not a value: {token!r}")
    first, sign, step, times = found.groups()
    value = histogram(first)
    sequence = [value]
    for _ in range(int(times or 0)):
        if step is not None:  # the sequence keeps the first one's counter reset hint
            value = value.add(histogram(step), -1.0 if sign == "-" else 1.0).copy(reset_hint=value.reset_hint)
        sequence.append(value)
    return sequence


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
    return labels(line[:end]), _TOKEN.findall(line[end:])


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
        # Prometheus's grammar builds a named series' labels with a labels.Builder, which leaves
        # out labels with an empty value (its Reset); ``{...}`` alone keeps them (labels.New).
        found = {k: v for k, v in found.items() if v}
        found["__name__"] = selector.name
    return found


@dataclass
class Load:
    line: int
    interval_ms: int
    series: list[tuple[dict[str, str], list]] = field(default_factory=list)
    with_nhcb: bool = False  # load_with_nhcb: classic histograms also as custom-bucket ones

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
    prometheus3: bool = False  # a ``# Prometheus 3:`` comment above: 2.42 answers otherwise
    error_type: str | None = None
    error_text: str | None = None
    scalar: float | None = None
    series: list[tuple[dict[str, str], list]] = field(default_factory=list)
    expects: list["Expect"] = field(default_factory=list)  # Prometheus 3's ``expect`` lines
    string: str | None = None  # ``expect string "..."``: a string answer
    range_vector: tuple[int, int, int] | None = None  # ``expect range vector``: its from, to, step

    @property
    def times_ms(self) -> list[int]:
        if self.range_vector:
            start, end, step = self.range_vector
            return list(range(start, end + 1, step))
        if not self.step_ms:
            return [self.start_ms]
        return list(range(self.start_ms, self.end_ms + 1, self.step_ms))


@dataclass
class Expect:
    """An ``expect`` line of Prometheus 3's files: ``kind`` is fail, warn, info, no_warn, no_info
    or ordered; an annotation or error matches ``message`` exactly, or ``pattern``."""

    kind: str
    message: str | None = None
    pattern: str | None = None

    def matches(self, text: str) -> bool:
        if self.message is not None:
            return text == self.message
        return self.pattern is None or re.search(self.pattern, text) is not None


def parse_file(path: Path) -> list[Load | Clear | Eval]:
    commands: list[Load | Clear | Eval] = []
    prometheus3 = False
    for number_, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        prometheus3 |= text.startswith("# Prometheus 3:")
        if not text or text.startswith("#"):
            continue
        try:
            if raw[0].isspace():
                if not commands or isinstance(commands[-1], Clear):
                    raise FormatError("an indented line outside load and eval")
                _add_line(commands[-1], text)
            else:
                commands.append(_command(number_, text))
                if isinstance(commands[-1], Eval):
                    commands[-1].prometheus3, prometheus3 = prometheus3, False
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


def same_value(want, got) -> bool:
    """An expected value (None, a float, a Histogram) against an answer's (None, a float, a
    native histogram's JSON with its numbers as floats)."""
    if want is None or got is None:
        return want is None and got is None
    if isinstance(want, Histogram):
        return isinstance(got, dict) and _same_json(want.json(float), got)
    return not isinstance(got, dict) and almost_equal(want, got)


def _same_json(want: dict, got: dict) -> bool:
    if want.keys() != got.keys() or len(want.get("buckets", [])) != len(got.get("buckets", [])):
        return False
    numbers = [(want["count"], got["count"]), (want["sum"], got["sum"])]
    for a, b in zip(want.get("buckets", []), got.get("buckets", [])):
        if a[0] != b[0]:
            return False
        numbers += list(zip(a[1:], b[1:]))
    return all(almost_equal(a, b) for a, b in numbers)


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
        points = points + [None] * (len(found or ()) - len(points))  # no value given: no sample
        if found is None:
            problems.append(f"missing {show_labels(series_labels)} {_show(points)}")
        elif len(found) != len(points) or not all(same_value(a, b) for a, b in zip(points, found)):
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


def _show(points: list) -> str:
    return " ".join(_show_value(p) for p in points)


def _show_value(value) -> str:
    if value is None:
        return "_"
    if isinstance(value, Histogram):
        value = value.json(float)
    if isinstance(value, dict):
        return "{{" + " ".join(f"{k}:{v}" for k, v in value.items()) + "}}"
    return "stale" if is_stale(value) else repr(value)


# -- Prometheus 3's format (promql/promqltest/testdata of github.com/prometheus/prometheus) ---------
# Lines need no indentation: a command's lines run to the next empty line. ``load_with_nhcb``,
# ``eval_warn``/``eval_info`` (at least one such annotation), ``expect <kind> [msg|regex: text]``,
# ``expected_fail_message``/``expected_fail_regexp``, ``expect string "..."``, ``expect range vector
# from <t> to <t> step <d>`` (an instant query answering a range vector), native histograms in
# series notation, and ``metric@st`` lines (start timestamps, which the loader leaves out).

_EVAL_V3 = re.compile(
    r"^eval(?:_(?P<mod>fail|warn|ordered|info))?\s+(?:instant\s+(?:at\s+(?P<at>\S+?))?"
    r"|range\s+from\s+(?P<start>\S+)\s+to\s+(?P<end>\S+)\s+step\s+(?P<step>\S+?))\s+(?P<expr>.+)$"
)
_COMMAND_V3 = re.compile(r"^(clear|load\w*|eval\w*)(\s|$)", re.IGNORECASE)
_EXPECT = re.compile(r"^expect\s+(ordered|fail|warn|no_warn|info|no_info)(?:\s+(regex|msg):(.+))?$")
_RANGE_VECTOR = re.compile(r"^expect range vector\s+from\s+(\S+)\s+to\s+(\S+)\s+step\s+(\S+)$")


def parse_file_v3(path: Path) -> list[Load | Clear | Eval]:
    """The commands of a Prometheus 3 test file."""
    lines = [("" if raw.strip().startswith("#") else raw.strip()) for raw in path.read_text().splitlines()]
    commands: list[Load | Clear | Eval] = []
    index = 0
    while index < len(lines):
        start = index
        index += 1
        if not lines[start]:
            continue
        if lines[start].split()[0].lower() != "clear":
            while index < len(lines) and lines[index] and not _COMMAND_V3.match(lines[index]):
                index += 1
        try:
            commands.append(_block_v3(start + 1, lines[start:index]))
        except (FormatError, ValueError) as error:
            raise FormatError(f"{path}:{start + 1}: {error}") from None
    return commands


def _block_v3(line: int, block: list[str]) -> Load | Clear | Eval:
    head, body = block[0], block[1:]
    word = head.split()[0].lower()
    if word == "clear":
        return Clear(line)
    if word in ("load", "load_with_nhcb"):
        load = Load(line, duration_ms(head.split()[1]), with_nhcb=word == "load_with_nhcb")
        for text in body:
            if text.split()[0].endswith("@st"):
                continue  # a start-timestamp line: the loader has no start timestamps
            load.series.append(_series_line(text))
        if load.with_nhcb:
            load.series += custom_bucket_series(load.series)
        return load
    found = _EVAL_V3.match(head)
    if not found:
        raise FormatError(f"not a command: {head!r}")
    if found["step"] is None:
        at = duration_ms(found["at"] or "0")
        case = Eval(line, found["expr"], at, at, 0)
    else:
        case = Eval(line, found["expr"], *(duration_ms(found[k]) for k in ("start", "end", "step")))
    modifier = found["mod"]
    case.ordered, case.fails = modifier == "ordered", modifier == "fail"
    if modifier in ("warn", "info"):
        case.expects.append(Expect(modifier))
    for text in body:
        _eval_line_v3(case, text)
    return case


def _eval_line_v3(case: Eval, text: str) -> None:
    if text.startswith("expected_fail_message"):
        case.expects.append(Expect("fail", message=text.removeprefix("expected_fail_message").strip()))
    elif text.startswith("expected_fail_regexp"):
        case.expects.append(Expect("fail", pattern=text.removeprefix("expected_fail_regexp").strip()))
    elif range_vector := _RANGE_VECTOR.match(text):
        case.range_vector = tuple(duration_ms(t) for t in range_vector.groups())  # type: ignore[assignment]
        case.start_ms = case.end_ms = case.range_vector[1]
    elif text.startswith("expect string"):
        quoted = text.removeprefix("expect string").strip()
        case.string = quoted[1:-1].encode().decode("unicode_escape") if quoted[0] == '"' else quoted[1:-1]
    elif text.split(" ")[0] == "expect":
        expect = _EXPECT.match(text)
        if not expect:
            raise FormatError(f"not an expect line: {text!r}")
        kind, how, what = expect.groups()
        if kind == "ordered":
            case.ordered = True
        elif kind == "fail":
            case.fails = True
        what = None if what is None else what.strip()
        case.expects.append(Expect(kind, what if how == "msg" else None, what if how == "regex" else None))
    elif re.fullmatch(_NUMBER, text, re.IGNORECASE):
        case.scalar = number(text)
    else:
        series_labels, points = _series_line(text)
        case.series.append((series_labels, points))


def custom_bucket_series(series: list[tuple[dict[str, str], list]]) -> list[tuple[dict[str, str], list]]:
    """The classic histograms among ``series`` (``x_bucket{le=...}``, ``x_count``, ``x_sum``) as
    native histograms with custom buckets, series ``x`` (Prometheus's convertnhcb, as
    ``load_with_nhcb`` loads them): at each position the finite ``le`` bounds, the counts
    between them, the count (``x_count`` or the +Inf bucket's) and the sum (``x_sum``, else 0).
    A position whose buckets are not cumulative, or whose count is not the +Inf bucket's, has none."""
    families: dict[tuple, dict] = {}
    for labels_, points in series:
        name = labels_.get("__name__", "")
        suffix = next((s for s in ("_bucket", "_count", "_sum") if name.endswith(s)), None)
        if suffix is None or (suffix == "_bucket" and "le" not in labels_):
            continue
        if suffix == "_bucket":
            try:
                le = float(labels_["le"])
            except ValueError:
                continue
            if math.isnan(le):
                continue
        base = {k: v for k, v in labels_.items() if k != "le"} | {"__name__": name[: -len(suffix)]}
        family = families.setdefault(tuple(sorted(base.items())), {"labels": base, "at": {}})
        for index, value in enumerate(points):
            if value is None or isinstance(value, Histogram):
                continue
            at = family["at"].setdefault(index, {"buckets": {}, "count": None, "sum": 0.0})
            if suffix == "_bucket":
                at["buckets"].setdefault(le, value)
            else:
                at[suffix[1:]] = value
    converted = []
    for family in families.values():
        points: list = []
        for index, at in sorted(family["at"].items()):
            bounds = sorted(at["buckets"])
            counts = [at["buckets"][b] for b in bounds]
            count = at["count"] if at["count"] is not None else (counts[-1] if counts else 0.0)
            if not bounds or bounds[-1] != math.inf:
                bounds, counts = [*bounds, math.inf], [*counts, count]
            if any(b < a for a, b in zip(counts, counts[1:])) or counts[-1] != count or min(counts) < 0:
                continue
            deltas = {i: c - (counts[i - 1] if i else 0.0) for i, c in enumerate(counts)}
            points += [None] * (index - len(points))
            points.append(
                Histogram(
                    CUSTOM_BUCKETS_SCHEMA,
                    0.0,
                    0.0,
                    count,
                    at["sum"],
                    {i: d for i, d in deltas.items() if d},
                    {},
                    tuple(bounds[:-1]),
                )
            )
        if any(p is not None for p in points):
            converted.append((family["labels"], points))
    return converted
