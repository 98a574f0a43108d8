"""Regexes and globs that come from clients, compiled with RE2.

Python's ``re`` backtracks: a 27-character pattern like ``(a+)+$`` against a long name takes
seconds and would freeze the whole server. RE2 matches in time linear in the text, whatever the
pattern; it has no backreferences or lookarounds, so such patterns are refused (BadPattern).
"""

import functools

import re2

MAX_MEM = 8 << 20  # bytes RE2 may use for one compiled pattern (its default); larger ones are refused
CACHE_SIZE = 512


class BadPattern(ValueError):
    """A pattern RE2 cannot compile; the client's mistake."""


@functools.lru_cache(maxsize=CACHE_SIZE)
def compile_regex(pattern: str, dot_nl: bool = False):
    """A compiled RE2 pattern with Python's ``re`` API (match, search, fullmatch, sub).

    ``dot_nl``: "." also matches a newline (Prometheus, and globs).
    """
    if not isinstance(pattern, str):
        raise BadPattern(f"regular expression {pattern!r} is not a string")
    options = re2.Options()
    options.dot_nl = dot_nl
    options.max_mem = MAX_MEM
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0].decode("utf-8", "replace") if error.args and isinstance(error.args[0], bytes) else error
        raise BadPattern(f"invalid regular expression {pattern!r} (RE2 syntax): {reason}") from None


escape = re2.escape
