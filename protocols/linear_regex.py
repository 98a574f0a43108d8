"""Regexes and globs that come from clients, compiled with RE2.

Python's ``re`` backtracks: a 27-character pattern like ``(a+)+$`` against a long name takes
seconds and would freeze the whole server. RE2 matches in time linear in the text, whatever the
pattern; it has no backreferences or lookarounds, so such patterns are refused (BadPattern).

Linear is not cheap when a pattern captures: RE2 then falls back from its DFA to an NFA that
tracks every group (``(.*){1000}`` took 61-107 ms per 2 KB value). Matching never needs the
groups, so patterns compile with ``never_capture`` unless a caller substitutes with them
(``label_replace``, ``aliasSub``). The DFA needs memory for its states: with RE2's default
8 MiB budget, ``((.*)|(.*)|(.*)){1000}`` still ran out and fell back (114 ms a value); MAX_MEM
gives it room, and a pattern whose program is over MAX_PROGRAM_SIZE instructions (more than a
DFA fits in that budget) is refused. docs/security.rst.
"""

import functools

import re2

MAX_MEM = 32 << 20  # bytes RE2 may use for one compiled pattern and its DFA
MAX_PROGRAM_SIZE = 60_000  # instructions; ``(.*){1000}`` is 8003, six alternatives of it 54004
CACHE_SIZE = 512


class BadPattern(ValueError):
    """A pattern RE2 cannot compile; the client's mistake."""


@functools.lru_cache(maxsize=CACHE_SIZE)
def compile_regex(pattern: str, dot_nl: bool = False, capture: bool = False):
    """A compiled RE2 pattern with Python's ``re`` API (match, search, fullmatch, sub).

    ``dot_nl``: "." also matches a newline (Prometheus, and globs). ``capture``: keep the groups
    (for substitutions); without it the match is found by the DFA and has no groups.
    """
    if not isinstance(pattern, str):
        raise BadPattern(f"regular expression {pattern!r} is not a string")
    options = re2.Options()
    options.dot_nl = dot_nl
    options.max_mem = MAX_MEM
    options.never_capture = not capture
    options.log_errors = False
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0].decode("utf-8", "replace") if error.args and isinstance(error.args[0], bytes) else error
        raise BadPattern(f"invalid regular expression {pattern!r} (RE2 syntax): {reason}") from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise BadPattern(
            f"regular expression {pattern[:100]!r} is too complex: {compiled.programsize} RE2 instructions,"
            f" over {MAX_PROGRAM_SIZE}"
        )
    return compiled


escape = re2.escape
