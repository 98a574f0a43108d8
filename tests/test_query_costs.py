"""Costs counted before they are paid (issue 21, item 2): what a hostile query would spend is
bounded before the work is done, on the real services over a SQLite store (and Cassandra where
the store enumerates slots)."""

import time

import pytest

from protocols.linear_regex import BadPattern, compile_regex
from protocols.prometheus import Matcher

LONG_VALUE = "x" * 2048


@pytest.mark.parametrize("pattern", ["(.*){1000}", "((.*)|(.*)){1000}", "((.*)|(.*)|(.*)){1000}"])
def test_a_capturing_regex_matches_long_values_on_the_dfa(pattern):
    """Groups made RE2 fall back to its NFA: 107-412 ms a 2 KB value, so 100 values took 10-41 s."""
    matcher = Matcher("RE", "v", pattern)
    began = time.monotonic()
    assert all(matcher.matches(f"{LONG_VALUE}{i}") for i in range(100))
    assert time.monotonic() - began < 2


def test_a_regex_too_large_for_the_dfa_is_refused():
    with pytest.raises(BadPattern, match="too complex"):
        compile_regex("((.*)|(.*)|(.*)|(.*)|(.*)|(.*)|(.*)|(.*)){1000}")


def test_substitutions_keep_their_groups():
    assert compile_regex("a(b)c", capture=True).sub(r"\1!", "abc") == "b!"
    assert compile_regex("a(b)c").fullmatch("abc") is not None
