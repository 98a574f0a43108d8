"""Prometheus names of OTLP metrics and attributes, by the rules of github.com/prometheus/otlptranslator
(what Prometheus 3's OTLP receiver uses): unit and type suffixes, escaping to ``[a-zA-Z0-9_:]``.

Translation strategies (Prometheus 3's ``translation_strategy``):

- ``UnderscoreEscapingWithSuffixes`` (the default): names escaped, unit and ``_total``/``_ratio`` added;
- ``UnderscoreEscapingWithoutSuffixes``: escaped, no suffix;
- ``NoUTF8EscapingWithSuffixes``: names kept as written, suffixes added;
- ``NoTranslation``: names and labels as written.
"""

import re
from functools import lru_cache
from typing import NamedTuple

UNDERSCORE_ESCAPING_WITH_SUFFIXES = "UnderscoreEscapingWithSuffixes"
UNDERSCORE_ESCAPING_WITHOUT_SUFFIXES = "UnderscoreEscapingWithoutSuffixes"
NO_UTF8_ESCAPING_WITH_SUFFIXES = "NoUTF8EscapingWithSuffixes"
NO_TRANSLATION = "NoTranslation"
STRATEGIES = (
    UNDERSCORE_ESCAPING_WITH_SUFFIXES,
    UNDERSCORE_ESCAPING_WITHOUT_SUFFIXES,
    NO_UTF8_ESCAPING_WITH_SUFFIXES,
    NO_TRANSLATION,
)

# The metric kinds naming cares about (otlptranslator.MetricType).
GAUGE = "gauge"
MONOTONIC_COUNTER = "monotonic_counter"
NON_MONOTONIC_COUNTER = "non_monotonic_counter"
HISTOGRAM = "histogram"
EXPONENTIAL_HISTOGRAM = "exponential_histogram"
SUMMARY = "summary"

_UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_NOT_METRIC_CHARS = re.compile(r"[^a-zA-Z0-9:]+")
_NOT_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9]+")


class InvalidName(ValueError):
    """A metric or attribute name with no valid Prometheus name (empty, or underscores only)."""


class Namer(NamedTuple):
    """How names are built under a translation strategy."""

    escape: bool
    suffixes: bool

    @classmethod
    def of(cls, strategy: str) -> "Namer":
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown translation strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        return cls(
            strategy.startswith("UnderscoreEscaping"),
            strategy in (UNDERSCORE_ESCAPING_WITH_SUFFIXES, NO_UTF8_ESCAPING_WITH_SUFFIXES),
        )

    def metric_name(self, name: str, unit: str, kind: str) -> str:
        return _metric_name(name, unit, kind, self.escape, self.suffixes)

    def label_name(self, name: str) -> str:
        return _label_name(name, self.escape)


def _unit_suffixes(unit: str) -> tuple[str, str]:
    """The main and the "per" unit words of an OTLP unit (``By/s``: ``bytes``, ``per_second``);
    an annotation (``{requests}``) gives none."""
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_suffix = _UNITS.get(main, main) if main and "{" not in main and "}" not in main else ""
    per_suffix = _PER_UNITS.get(per, per) if per and "{" not in per and "}" not in per else ""
    return main_suffix, f"per_{per_suffix}" if per_suffix else ""


def _clean_unit(unit: str) -> str:
    return _NOT_METRIC_CHARS.sub("_", unit).removeprefix("_")


def unit_name(unit: str) -> str:
    """The unit kept in metadata: ``seconds``, ``bytes_per_second``."""
    main, per = map(_clean_unit, _unit_suffixes(unit))
    joined = f"{main}_{per}" if main and per else main or per
    joined = joined[1:] if joined.startswith("_") else joined
    return joined[:-1] if joined.endswith("_") else joined


@lru_cache(maxsize=4096)
def _metric_name(name: str, unit: str, kind: str, escape: bool, suffixes: bool) -> str:
    if not escape:
        built = _utf8_metric_name(name, unit, kind) if suffixes else name
    elif suffixes:
        built = _normalized_name(name, unit, kind)
    else:
        built = "_".join(filter(None, re.split(r"[^a-zA-Z0-9:_]+", name)))
        built = "_" + built if built[:1].isdigit() else built
    if not built or (built != name and not built.strip("_")):
        raise InvalidName(f"metric name {name!r} has no valid Prometheus name")
    return built


def _normalized_name(name: str, unit: str, kind: str) -> str:
    tokens = [token for token in _NOT_METRIC_CHARS.split(name) if token]
    main, per = _unit_suffixes(unit)
    main, per = _clean_unit(main), _clean_unit(per)
    if main in tokens:
        main = ""
    per = "" if per == "per_" else per.removesuffix("_")
    if per in tokens:
        per = ""
    if per:
        main = main.removesuffix("_")
    tokens += [suffix for suffix in (main, per) if suffix]
    if kind == MONOTONIC_COUNTER:
        tokens = [token for token in tokens if token != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [token for token in tokens if token != "ratio"] + ["ratio"]
    built = "_".join(tokens)
    return "_" + built if built[:1].isdigit() else built


def _utf8_metric_name(name: str, unit: str, kind: str) -> str:
    """Suffixes added to a name kept as written (NoUTF8EscapingWithSuffixes)."""
    after = []
    if unit == "1" and kind == GAUGE:
        name, after = _trim(name, "ratio"), ["_ratio"]
    if kind == MONOTONIC_COUNTER:
        name, after = _trim(name, "total"), ["_total", *after]
    main, per = _unit_suffixes(unit)
    if per:
        name, after = _trim(name, per), [f"_{per}", *after]
    if main and not name.endswith(main):
        name = f"{name}_{main}"
    return name + "".join(after)


def _trim(name: str, suffix: str) -> str:
    return name[: -len(suffix) - 1] if name.endswith(suffix) and len(name) > len(suffix) + 1 else name


@lru_cache(maxsize=65536)
def _label_name(name: str, escape: bool) -> str:
    """An attribute's label name: escaped, each run of characters other than letters and digits
    (underscores included) one underscore, a reserved ``__x__`` name's underscores kept, ``key_``
    before a leading digit."""
    if not name:
        raise InvalidName("an attribute name is empty")
    if escape:
        reserved = len(name) >= 4 and name.startswith("__") and name.endswith("__")
        built = _NOT_LABEL_CHARS.sub("_", name[2:-2] if reserved else name)
        built = f"__{built}__" if reserved else built
        name = "key_" + built if built[:1].isdigit() else built
    if not name.strip("_"):
        raise InvalidName(f"attribute name {name!r} has no valid Prometheus label name")
    return name
