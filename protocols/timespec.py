"""Time arguments of the native API: ISO-8601, epoch seconds or milliseconds, and relative forms.

A bare number below 1e11 is epoch seconds (fractions allowed), otherwise epoch milliseconds:
1e11 seconds is the year 5138, while 1e11 milliseconds is March 1973, so real data never sits
on the wrong side. Relative forms: ``now``, ``<n><unit>-ago`` with units ms, s, m, h, d, w, y
(a year is 365 days), as OpenTSDB writes them.
"""

import datetime
import re

EPOCH_MS_THRESHOLD = 100_000_000_000

UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}
_RELATIVE_RE = re.compile(r"(\d{1,18})(ms|s|m|h|d|w|y)-ago")  # 18 digits: int64, never Python's digit limit
_DURATION_RE = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


class BadTime(ValueError):
    pass


def epoch_to_ms(number: float) -> int:
    """Apply the seconds-or-milliseconds rule to a numeric timestamp."""
    if abs(number) < EPOCH_MS_THRESHOLD:
        return round(number * 1000)
    return int(number)


def parse_time(text: str, now_ms: int) -> int:
    """Milliseconds since the epoch for any accepted form; BadTime names what was expected."""
    text = text.strip()
    if text == "now":
        return now_ms
    relative = _RELATIVE_RE.fullmatch(text)
    if relative:
        return now_ms - int(relative.group(1)) * UNIT_MS[relative.group(2)]
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if number != number or number in (float("inf"), float("-inf")):
            raise BadTime(f"{text!r} is not a time")
        return epoch_to_ms(number)
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadTime(
            f"{text!r} is not a time: use ISO-8601, epoch seconds or milliseconds, 'now' or e.g. '5m-ago'"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    delta = parsed - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return delta // datetime.timedelta(milliseconds=1)


def parse_duration(text: str) -> int:
    """``10m``, ``7d``, ``1h30m`` -> milliseconds (settings and store URL options)."""
    text = str(text).strip()
    position, total = 0, 0
    for match in _DURATION_RE.finditer(text):
        if match.start() != position:
            break
        total += int(match.group(1)) * UNIT_MS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise ValueError(f"{text!r} is not a duration (e.g. 30s, 10m, 7d, 1h30m)")
    return total


def format_iso(timestamp_ms: int) -> str:
    """ISO-8601 UTC with a ``Z``; milliseconds only when they are not zero (the native API's form)."""
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=timestamp_ms)
    if timestamp_ms % 1000:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{timestamp_ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
