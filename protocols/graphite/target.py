"""Parser for Graphite render target expressions (graphite-web 1.1 grammar) into a small AST.

A target is a path expression (``servers.web*.cpu.{user,system}``, ``cpu;host=a``) or a function
call whose arguments are strings, numbers, booleans, ``None``, ``inf``, path expressions or
further calls, positional first then ``name=value``. ``a.b|sumSeries()|alias('x')`` pipes are
rewritten into nested calls, as graphite-web evaluates them. Templates are not supported.
"""

import re
from dataclasses import dataclass, field
from typing import NoReturn

SYMBOLS = "(){},.'\"\\|"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE]-?\d+)?")
_KEYWORD = re.compile(r"(true|false|none|inf)(?![A-Za-z0-9_$])", re.IGNORECASE)


class TargetSyntaxError(ValueError):
    """The target is not a valid Graphite expression; the message says where."""


@dataclass
class PathExpression:
    path: str


@dataclass
class Literal:
    """A string, number, boolean, None or inf argument."""

    value: object


@dataclass
class Call:
    name: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    raw: str = ""  # the call's source text, graphite-web's pathExpression for seriesByTag


# The defaults of the bounds below (the gateway's --query-max-depth and --query-max-terms): real
# targets nest a handful of calls deep and have a few dozen arguments.
MAX_NESTING = 64
MAX_TERMS = 300


class TargetTooDeep(TargetSyntaxError):
    """The target nests calls deeper than the parser takes; it stops there, so a hostile target
    costs no more than a real one."""


class TargetTooLong(TargetSyntaxError):
    """The target has more calls and arguments than the parser takes; it stops there."""


def parse_target(text: str, max_depth: int = MAX_NESTING, max_terms: int = MAX_TERMS):
    """Parse a whole target; trailing text is an error (graphite-web silently ignores it). Calls
    nested (or piped) deeper than ``max_depth``, or more than ``max_terms`` calls and arguments,
    are refused as soon as the parser reaches them."""
    parser = _Parser(text, max_depth, max_terms)
    try:
        node = parser.expression()
    except RecursionError:  # a --query-max-depth set past what Python's stack holds
        raise TargetTooDeep("target nests calls too deep to parse") from None
    parser.skip_space()
    if parser.pos != len(text):
        parser.fail("unexpected text")
    if _nesting(node) > max_depth:
        raise TargetTooDeep(f"target nests calls deeper than {max_depth}")
    return node


def _nesting(root) -> int:
    """How deep calls nest in a parsed target (without recursion: the tree may be deep)."""
    deepest, stack = 0, [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Call):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in [*node.args, *node.kwargs.values()])
    return deepest


def first_path_expression(name: str) -> str | None:
    """The first path expression in a series name such as ``sumSeries(a.b.c,d.e)`` (-> ``a.b.c``).

    graphite-web uses this to pick nodes out of names produced by functions; the name need not be
    a complete expression, so parse errors just mean "none found".
    """
    try:
        node = _Parser(name, max_terms=len(name)).expression()  # a name holds as many terms as it has
    except TargetSyntaxError:
        return None
    while isinstance(node, Call):
        if not node.args:
            return None
        node = node.args[0]
    return node.path if isinstance(node, PathExpression) else None


class _Parser:
    def __init__(self, text: str, max_depth: int = MAX_NESTING, max_terms: int = MAX_TERMS):
        self.text = text
        self.pos = 0
        self.depth = 0
        self.max_depth = max_depth
        self.terms = 0
        self.max_terms = max_terms

    def count_term(self) -> None:
        """One more call or argument."""
        self.terms += 1
        if self.terms > self.max_terms:
            raise TargetTooLong(f"target has more than {self.max_terms} calls and arguments")

    def fail(self, message: str) -> NoReturn:
        raise TargetSyntaxError(f"{message} at position {self.pos} in target {self.text!r}")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def expression(self):
        self.skip_space()
        node = self.call_or_path()
        while True:
            mark = self.pos
            self.skip_space()
            if self.peek() != "|":
                self.pos = mark
                return node
            self.pos += 1
            self.skip_space()
            piped = self.call_or_path()
            if not isinstance(piped, Call):
                self.fail("a pipe must be followed by a function call")
            piped.args.insert(0, node)
            node = piped

    def call_or_path(self):
        start = self.pos
        match = _IDENTIFIER.match(self.text, self.pos)
        if match:
            self.pos = match.end()
            self.skip_space()
            if self.peek() == "(":
                self.pos += 1
                return self.call_arguments(match.group(), start)
            self.pos = start
        return self.path_expression()

    def call_arguments(self, name: str, start: int) -> Call:
        self.depth += 1
        if self.depth > self.max_depth:
            raise TargetTooDeep(f"target nests calls deeper than {self.max_depth}")
        self.count_term()
        call = self._call_arguments(name, start)
        self.depth -= 1
        return call

    def _call_arguments(self, name: str, start: int) -> Call:
        call = Call(name)
        self.skip_space()
        if self.peek() == ")":
            self.pos += 1
            call.raw = self.text[start : self.pos]
            return call
        while True:
            self.skip_space()
            keyword = self.keyword_name()
            if keyword is not None:
                if keyword in call.kwargs:
                    self.fail(f"repeated keyword argument {keyword!r}")
                call.kwargs[keyword] = self.argument()
            elif call.kwargs:
                self.fail("positional argument after keyword argument")
            else:
                call.args.append(self.argument())
            self.skip_space()
            char = self.peek()
            self.pos += 1
            if char == ")":
                call.raw = self.text[start : self.pos]
                return call
            if char != ",":
                self.pos -= 1
                self.fail(f"expected ',' or ')' in call to {name}")

    def keyword_name(self) -> str | None:
        """``name=`` starts a keyword argument (path characters include '=', so look ahead)."""
        match = _IDENTIFIER.match(self.text, self.pos)
        if not match:
            return None
        after = match.end()
        while after < len(self.text) and self.text[after].isspace():
            after += 1
        if after < len(self.text) and self.text[after] == "=":
            self.pos = after + 1
            return match.group()
        return None

    def followed_by_end_of_argument(self, position: int) -> bool:
        while position < len(self.text) and self.text[position].isspace():
            position += 1
        return position == len(self.text) or self.text[position] in ",)"

    def argument(self):
        self.count_term()
        self.skip_space()
        char = self.peek()
        if char in ("'", '"'):
            return Literal(self.string())
        match = _NUMBER.match(self.text, self.pos)
        if match and self.followed_by_end_of_argument(match.end()):
            self.pos = match.end()
            number = match.group()
            if "e" in number or "E" in number or "." in number:
                return Literal(float(number))
            try:
                return Literal(int(number))
            except ValueError:  # past Python's 4300-digit limit
                self.fail(f"number {number[:20]}... is too long")
        match = _KEYWORD.match(self.text, self.pos)
        if match and self.followed_by_end_of_argument(match.end()):
            self.pos = match.end()
            word = match.group().lower()
            return Literal({"true": True, "false": False, "none": None, "inf": float("inf")}[word])
        return self.expression()

    def string(self) -> str:
        """Quoted text; backslash escapes are kept verbatim, as graphite-web passes them on."""
        quote = self.text[self.pos]
        start = self.pos
        self.pos += 1
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\":
                self.pos += 2
            elif char == quote and self.text[self.pos + 1 : self.pos + 2] == quote:
                self.pos += 2
            elif char == quote:
                self.pos += 1
                return self.text[start + 1 : self.pos - 1]
            elif char in "\r\n":
                break
            else:
                self.pos += 1
        self.pos = start
        self.fail("unterminated string")

    def path_expression(self) -> PathExpression:
        elements = [self.path_element()]
        while self.peek() == ".":
            self.pos += 1
            elements.append(self.path_element())
        return PathExpression(".".join(elements))

    def path_element(self) -> str:
        parts = []
        while True:
            char = self.peek()
            if char == "{":
                parts.append(self.brace_alternatives())
            elif char == "\\" and self.pos + 1 < len(self.text) and self.text[self.pos + 1] in SYMBOLS + "=":
                parts.append(self.text[self.pos + 1])
                self.pos += 2
            elif char and char not in SYMBOLS and not char.isspace():
                parts.append(char)
                self.pos += 1
            else:
                break
        if not parts:
            self.fail("expected a metric path or a function call")
        return "".join(parts)

    def brace_alternatives(self) -> str:
        start = self.pos
        self.pos += 1
        while True:
            char = self.peek()
            if char == "}" and self.text[self.pos - 1] not in "{,":
                self.pos += 1
                return self.text[start : self.pos]
            if char == "," and self.text[self.pos - 1] not in "{,":
                self.pos += 1
            elif char and char not in SYMBOLS and not char.isspace():
                self.pos += 1
            else:
                self.fail("bad {a,b} alternatives in path")
