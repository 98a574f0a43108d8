"""Rules the suite itself keeps: no test module reads the clock when it is imported (a moment taken
at import goes stale when the module's tests run an hour later in a long, loaded run)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # the whole suite, every layer's folder
CLOCKS = {"time", "monotonic", "time_ns", "now", "utcnow", "today", "perf_counter"}


def clock_reads_at_import(tree: ast.Module) -> list[int]:
    """Lines of clock calls run when the module is imported: module and class bodies, default
    arguments and decorators, not function bodies."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for part in [*node.args.defaults, *node.args.kw_defaults, *getattr(node, "decorator_list", [])]:
                if part is not None:
                    visit(part)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCKS:
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_no_test_module_reads_the_clock_at_import():
    offenders = {
        str(path.relative_to(TESTS)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if (lines := clock_reads_at_import(ast.parse(path.read_text(), str(path))))
    }
    assert offenders == {}


def test_the_rule_sees_module_class_and_default_clocks_but_not_function_bodies():
    source = """
import time as clock
NOW = int(clock.time())
class Case:
    at = clock.monotonic()
def later(at=clock.time()):
    return clock.time()
"""
    assert clock_reads_at_import(ast.parse(source)) == [3, 5, 6]
