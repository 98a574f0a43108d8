"""Graphite ``from``/``until`` time parsing, following graphite-web 1.1's attime module.

A time is a reference (``now``, ``noon``, ``yesterday``, ``HH:MM_YYYYMMDD``, ``YYYYMMDD``,
``MM/DD/YY``, ``jan1``, ``monday``, epoch seconds ...) optionally followed by an offset
(``-1h``, ``+2d``, ``-1mon``: months are 30 days and years 365, as in graphite-web).
Day references are wall-clock dates in ``tz``; offsets are added in absolute seconds.
"""

from datetime import UTC, datetime, timedelta, tzinfo

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
WEEKDAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]  # datetime.weekday() order

SECONDS = "seconds"
MINUTES = "minutes"
HOURS = "hours"
DAYS = "days"
WEEKS = "weeks"
MONTHS_UNIT = "months"
YEARS = "years"
_UNIT_SECONDS = {
    SECONDS: 1,
    MINUTES: 60,
    HOURS: 3600,
    DAYS: 86400,
    WEEKS: 604800,
    MONTHS_UNIT: 30 * 86400,
    YEARS: 365 * 86400,
}


def parse_at_time(text: str, now: int, tz: tzinfo = UTC) -> int:
    """Epoch seconds for a Graphite time expression, relative to ``now`` (epoch seconds)."""
    if not isinstance(text, str):
        raise ValueError(f"time must be a string, not {type(text).__name__}")
    spec = text.strip().lower().replace("_", "").replace(",", "").replace(" ", "")
    if not spec:
        raise ValueError("empty time")
    if spec.isdigit() and not _looks_like_yyyymmdd(spec):
        return _in_range(_int(spec, text), text)
    if "+" in spec:
        reference, offset = spec.split("+", 1)
        offset = "+" + offset
    elif "-" in spec:
        reference, offset = spec.split("-", 1)
        offset = "-" + offset
    else:
        reference, offset = spec, ""
    return _in_range(_parse_reference(reference, now, tz, text) + parse_time_offset(offset), text)


# datetime's years 1 to 9999 in epoch seconds: a time outside them is a mistake, not a range.
EARLIEST = -62_135_596_800
LATEST = 253_402_300_799


def _in_range(seconds: int, original: str) -> int:
    if not EARLIEST <= seconds <= LATEST:
        raise ValueError(f"time {original[:60]!r} is outside the years 1 to 9999")
    return seconds


def parse_time_offset(text: str) -> int:
    """Seconds in an offset such as ``-1h``, ``5min``, ``+1d12h``; no sign means positive."""
    if not text:
        return 0
    sign = 1
    rest = text
    if rest[0] in "+-":
        sign = -1 if rest[0] == "-" else 1
        rest = rest[1:]
    elif not rest[0].isdigit():
        raise ValueError(f"invalid time offset {text!r}")
    total = 0
    while rest:
        digits = 0
        while digits < len(rest) and rest[digits].isdigit():
            digits += 1
        if digits == 0:
            raise ValueError(f"invalid time offset {text!r}: expected a number")
        number = _int(rest[:digits], text)
        rest = rest[digits:]
        letters = 0
        while letters < len(rest) and rest[letters].isalpha():
            letters += 1
        total += number * _UNIT_SECONDS[unit_name(rest[:letters], text)]
        rest = rest[letters:]
    return sign * total


def unit_name(unit: str, context: str = "") -> str:
    """graphite-web's prefix matching: s, min, h, d, w, mon, y (``m`` alone is an error)."""
    for prefix, name in (
        ("s", SECONDS),
        ("min", MINUTES),
        ("h", HOURS),
        ("d", DAYS),
        ("w", WEEKS),
        ("mon", MONTHS_UNIT),
        ("y", YEARS),
    ):
        if unit.startswith(prefix):
            return name
    raise ValueError(f"invalid time unit {unit!r} in {context or unit!r}")


def _looks_like_yyyymmdd(spec: str) -> bool:
    return len(spec) == 8 and int(spec[:4]) > 1900 and int(spec[4:6]) < 13 and int(spec[6:]) < 32


def _parse_reference(reference: str, now: int, tz: tzinfo, original: str) -> int:
    if not reference or reference == "now":
        return now
    local_now = datetime.fromtimestamp(now, tz)
    rest = reference
    hour = minute = 0

    colon = rest.find(":")
    if 0 < colon < 3:
        hour, minute = _int(rest[:colon], original), _int(rest[colon + 1 : colon + 3], original)
        rest = rest[colon + 3 :]
        if rest[:2] == "am":
            rest = rest[2:]
        elif rest[:2] == "pm":
            hour = (hour + 12) % 24
            rest = rest[2:]
    index = rest.find("am")
    if 0 < index < 3:
        hour = _int(rest[:index], original)
        rest = rest[index + 2 :]
    index = rest.find("pm")
    if 0 < index < 3:
        hour = (_int(rest[:index], original) + 12) % 24
        rest = rest[index + 2 :]
    for word, word_hour in (("noon", 12), ("midnight", 0), ("teatime", 16)):
        if rest.startswith(word):
            hour, minute = word_hour, 0
            rest = rest[len(word) :]
            break

    day = local_now.replace(hour=hour, minute=minute, second=0, microsecond=0, tzinfo=None)
    if rest in ("yesterday", "today", "tomorrow"):
        day += timedelta(days={"yesterday": -1, "today": 0, "tomorrow": 1}[rest])
    elif rest.count("/") == 2:
        month, day_of_month, year = (_int(part, original) for part in rest.split("/"))
        if year < 1900:
            year += 1900
        if year < 1970:
            year += 100
        day = _date(year, month, day_of_month, hour, minute, original)
    elif len(rest) == 8 and rest.isdigit():
        day = _date(int(rest[:4]), int(rest[4:6]), int(rest[6:8]), hour, minute, original)
    elif rest[:3] in MONTHS:
        if rest[-2:].isdigit():
            day_of_month = int(rest[-2:])
        elif rest[-1:].isdigit():
            day_of_month = int(rest[-1:])
        else:
            raise ValueError(f"day of month required after month name in {original!r}")
        day = _date(day.year, MONTHS.index(rest[:3]) + 1, day_of_month, hour, minute, original)
    elif rest[:3] in WEEKDAYS:
        day -= timedelta(days=(day.weekday() - WEEKDAYS.index(rest[:3])) % 7)
    elif rest:
        raise ValueError(f"unknown day reference {reference!r} in {original!r}")
    return int(day.replace(tzinfo=tz).timestamp())


def _date(year: int, month: int, day: int, hour: int, minute: int, original: str) -> datetime:
    try:
        return datetime(year, month, day, hour, minute)
    except (ValueError, OverflowError) as error:
        raise ValueError(f"invalid date in {original!r}: {error}") from None


def _int(text: str, original: str) -> int:
    try:
        return int(text)
    except ValueError:  # also past Python's 4300-digit limit
        raise ValueError(f"invalid number {text[:20]!r} in time {original[:60]!r}") from None
