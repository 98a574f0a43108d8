"""The documentation is one format (reStructuredText), every docs/ page the code cites exists, and
docs/performance.rst holds the table bench.report prints for docs/performance-results.json."""

import io
import re
from pathlib import Path

import docutils.core
import pytest

from bench.report import format_rst, read_json
from tests.gatewayproc import REPO

CITED = re.compile(r"\bdocs/[\w.-]*\w")


def test_docs_are_restructuredtext():
    pages = {path.name for path in (REPO / "docs").iterdir() if path.suffix not in (".json", ".png")}
    assert pages and all(name.endswith(".rst") for name in pages), sorted(pages)


@pytest.mark.parametrize(
    "page", ["README.rst", "CHANGELOG.rst", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.rst"))]
)
def test_page_is_well_formed(page):
    """A malformed table or list renders as an error box on the page (a table's border once did)."""
    warnings = io.StringIO()
    docutils.core.publish_doctree(
        (REPO / page).read_text(encoding="utf-8"),
        source_path=page,
        settings_overrides={"report_level": 2, "halt_level": 5, "warning_stream": warnings},
    )
    assert not warnings.getvalue(), warnings.getvalue()


def test_every_cited_docs_page_exists():
    sources = [REPO / "README.rst", REPO / "CHANGELOG.rst", *(REPO / ".ci").iterdir()]
    for folder in ("docs", "gateway", "protocols", "bench", "tests"):
        sources += [path for path in (REPO / folder).rglob("*") if path.suffix in (".py", ".rst", ".cfg")]
    missing = {
        f"{path.relative_to(REPO)}: {cited}"
        for path in sources
        for cited in CITED.findall(path.read_text(encoding="utf-8"))
        if not (REPO / cited).exists()
    }
    assert not missing, sorted(missing)


def test_performance_page_holds_the_report_table():
    _, figures = read_json(REPO / "docs" / "performance-results.json")
    assert format_rst(figures) in (REPO / "docs" / "performance.rst").read_text(encoding="utf-8")


def test_a_quick_bench_run_never_overwrites_the_published_figures():
    """``bench/run --quick`` is a smoke run: its figures go to a scratch directory, and only a
    full run (or an explicit ``--out docs``) writes docs/performance-results.json and the plot."""
    from bench.__main__ import parse_args

    assert parse_args([]).out == REPO / "docs"
    quick = parse_args(["--quick", "--parts", "query"]).out
    assert REPO / "docs" not in (quick, *quick.parents)
    assert parse_args(["--quick", "--out", "docs"]).out == Path("docs")
