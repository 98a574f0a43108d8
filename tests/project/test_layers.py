"""The folder tree is the architecture (docs/contributing.rst, "Layout"): each package of
gateway/ sits on a layer and imports only from itself or the layers below, so the write path,
the read path and the store can each be read without the layers above them, and no two packages
import each other. ``ingest`` and ``query`` are siblings on one layer: neither imports the other,
so writing never depends on reading. protocols/ is pure: it imports nothing of gateway/. Imports made only for type
checking (``if TYPE_CHECKING:``) name types, not code, and are not counted."""

import ast
from pathlib import Path

import pytest

from tests.gatewayproc import REPO

pytestmark = pytest.mark.fast

LAYERS = [("core",), ("store",), ("ingest", "query"), ("downsample",), ("http",), ("app",)]
LEVEL = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import outside ``if TYPE_CHECKING:`` blocks, lazy ones included."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "gateway" or len(parts) < 2 or parts[1] == "__version__":
        return None
    return parts[1]


def _sources(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def test_every_gateway_module_lives_in_a_layer_package():
    loose = [p.name for p in (REPO / "gateway").glob("*.py") if p.name != "__init__.py"]
    packages = sorted(p.name for p in (REPO / "gateway").iterdir() if (p / "__init__.py").exists())
    assert loose == [] and packages == sorted(LEVEL)


@pytest.mark.parametrize("path", _sources("gateway"), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_down_the_layers(path):
    own = path.relative_to(REPO).parts[1]
    upward = [
        f"line {line}: {module} ({_layer(module)} is not below {own})"
        for line, module in _runtime_imports(ast.parse(path.read_text()))
        if _layer(module) in LEVEL and _layer(module) != own and LEVEL[_layer(module)] >= LEVEL[own]
    ]
    assert upward == []


@pytest.mark.parametrize("path", _sources("protocols"), ids=lambda p: str(p.relative_to(REPO)))
def test_protocols_import_nothing_of_the_gateway(path):
    assert [m for _, m in _runtime_imports(ast.parse(path.read_text())) if m.startswith("gateway")] == []


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circle_inside_app():
    """The modules of app/ import each other one way, lazy imports included: one composition root
    (gateway/app/components.py) and commands built on it, no circle hidden behind a lazy import."""
    modules = {_module(path): path for path in _sources("gateway/app")}
    imports = {
        name: {
            target
            for _, imported in _runtime_imports(ast.parse(path.read_text()))
            for target in modules
            if target != name and (imported == target or imported.startswith(target + "."))
        }
        for name, path in modules.items()
    }
    finished: set[str] = set()

    def circle_from(name: str, trail: list[str]) -> list[str]:
        if name in trail:
            return [*trail[trail.index(name) :], name]
        if name in finished:
            return []
        for target in sorted(imports[name]):
            found = circle_from(target, [*trail, name])
            if found:
                return found
        finished.add(name)
        return []

    assert [circle for name in sorted(modules) if (circle := circle_from(name, []))] == []
