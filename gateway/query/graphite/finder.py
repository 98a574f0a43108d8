"""Graphite path globs resolved through the path tree (graphite_paths), level by level.

A query like ``a.*.c`` reads only the directories it walks through: a literal level costs
nothing until the last one, a glob level lists the children of each directory reached so far.
So ``a.*.c`` reads the children of ``a`` and then of each ``a.X``, and ``*.*.leaf`` reads the first
two levels of the tree, never the list of every metric. docs/graphite.rst has the figures.
"""

from typing import NamedTuple

from twisted.internet.defer import gatherResults

from gateway.core.errors import LimitExceeded
from gateway.store import Store
from protocols.linear_regex import BadPattern, compile_regex, escape

GLOB_CHARACTERS = set("*?[{")


class Node(NamedTuple):
    path: str
    is_leaf: bool


class TooManyNodes(LimitExceeded, ValueError):
    """A glob that walks through more directories than allowed; narrow it."""


def _translate(pattern: str) -> str:
    """One path component's glob as a regex: * ? [a-z] [!a-z] {a,b} (alternatives may hold globs)."""
    out, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = _class_end(pattern, index)
            if end == -1:
                out.append(escape(char))
            else:
                out.append(_class(pattern[index + 1 : end]))
                index = end
        elif char == "{":
            end = pattern.find("}", index + 1)
            if end == -1:
                out.append(escape(char))
            else:
                alternatives = pattern[index + 1 : end].split(",")
                out.append("(?:" + "|".join(_translate(a) for a in alternatives) + ")")
                index = end
        else:
            out.append(escape(char))
        index += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """Where the ``[...]`` class opened at ``start`` ends, by fnmatch's rules (which graphite-web
    uses): a ``]`` right after ``[`` or ``[!`` belongs to the class; -1 when it never closes
    (``a.[]``, ``[!]``), and then the ``[`` is a literal character."""
    end = start + 1
    if pattern[end : end + 1] == "!":
        end += 1
    if pattern[end : end + 1] == "]":
        end += 1
    return pattern.find("]", end)


NOTHING = r"[^\x00-\x{10FFFF}]"  # a class no character is in (RE2 has no (?!) lookahead)


def _class(body: str) -> str:
    """A class body as a regex, as fnmatch makes it: a reversed range (``z-a``) matches nothing."""
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    items, index = [], 0
    while index < len(body):
        if index + 2 < len(body) and body[index + 1] == "-":
            low, high = body[index], body[index + 2]
            if low <= high:
                items.append(f"{escape(low)}-{escape(high)}")
            index += 3
        else:
            items.append(escape(body[index]))
            index += 1
    if not items:
        return "." if negate else NOTHING
    return "[" + ("^" if negate else "") + "".join(items) + "]"


def component_matcher(pattern: str):
    """A predicate for one path component, or None when the component is a literal; BadPattern for
    a glob that is no regex (``[z-a]``)."""
    if not GLOB_CHARACTERS & set(pattern):
        return None
    try:
        regex = compile_regex(_translate(pattern), dot_nl=True)
    except BadPattern as error:
        raise BadPattern(f"glob {pattern!r} is not valid: {error}") from None
    return lambda name: regex.fullmatch(name) is not None


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


class Finder:
    def __init__(self, store: Store, max_nodes: int = 100_000):
        self.store = store
        self.max_nodes = max_nodes

    async def _children(self, tenant: str, parents: list[str]):
        reads = [self.store.list_path_children(tenant, parent) for parent in parents]
        return zip(parents, await gatherResults(reads, consumeErrors=True))

    async def find(self, tenant: str, query: str) -> list[Node]:
        """Every node matching the query, sorted by path; a node both leaf and branch appears twice."""
        components = query.split(".")
        frontier = [""]
        for depth, pattern in enumerate(components):
            last = depth == len(components) - 1
            matcher = component_matcher(pattern)
            if matcher is None and not last:
                frontier = [_join(parent, pattern) for parent in frontier]
                continue
            matches = [
                (parent, child)
                for parent, children in await self._children(tenant, frontier)
                for child in children
                if (child.name == pattern if matcher is None else matcher(child.name))
            ]
            if len(matches) > self.max_nodes:
                raise TooManyNodes(f"{query!r} walks through more than {self.max_nodes} paths; narrow it")
            if last:
                nodes = []
                for parent, child in matches:
                    path = _join(parent, child.name)
                    if child.is_branch:
                        nodes.append(Node(path, False))
                    if child.is_leaf:
                        nodes.append(Node(path, True))
                return sorted(nodes)
            frontier = [_join(parent, child.name) for parent, child in matches if child.is_branch]
            if not frontier:
                return []
        return []

    async def leaves(self, tenant: str, query: str) -> list[str]:
        return [node.path for node in await self.find(tenant, query) if node.is_leaf]

    async def all_leaves(self, tenant: str) -> list[str]:
        """Every leaf path of the tenant, sorted: the whole tree, level by level, each level's
        directories listed as concurrently as ``find`` lists them (within the store's bound on calls)."""
        leaves, frontier = [], [""]
        while frontier:
            next_frontier = []
            for parent, children in await self._children(tenant, frontier):
                for child in children:
                    path = _join(parent, child.name)
                    if child.is_leaf:
                        leaves.append(path)
                    if child.is_branch:
                        next_frontier.append(path)
            frontier = next_frontier
        return sorted(leaves)
