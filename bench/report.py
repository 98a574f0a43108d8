"""One figure type for every benchmark part, so `python -m bench` prints one table and one JSON."""

import json
from pathlib import Path
from typing import NamedTuple


class Figure(NamedTuple):
    """One measured number, and how it compares with the reference measured in the same run."""

    section: str  # ingest, receive, query, memory
    name: str  # what was measured, e.g. "remote write 500/request, tsgate 2 workers"
    value: float
    unit: str  # samples/s, lines/s, lines/cpu-s, ms p50, ms p99, MiB
    reference: str = ""  # the name of the figure it is compared with, if any
    ratio: float | None = None  # value / reference value
    note: str = ""


def _cells(f: Figure) -> tuple[str, ...]:
    ratio = "" if f.ratio is None else f"{f.ratio:.2f}"
    value = f"{f.value:,.0f}" if abs(f.value) >= 100 else f"{f.value:.3g}"
    return (f.section, f.name, value, f.unit, ratio, f.reference, f.note)


HEADER = ("section", "measured", "value", "unit", "ratio", "reference", "note")


def format_table(figures: list[Figure]) -> str:
    """A plain-text table, one line per figure, grouped by section in the given order."""
    rows = [HEADER, *map(_cells, figures)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json(figures: list[Figure], path: Path, context: dict) -> None:
    """Figures plus the run's context (date, box load, versions) for docs/performance.rst."""
    path.write_text(json.dumps({"context": context, "figures": [f._asdict() for f in figures]}, indent=2) + "\n")


def read_json(path: Path) -> tuple[dict, list[Figure]]:
    data = json.loads(path.read_text())
    return data["context"], [Figure(**item) for item in data["figures"]]


def format_rst(figures: list[Figure]) -> str:
    """The same table as a reStructuredText list table, for docs/performance.rst."""
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in [HEADER, *map(_cells, figures)]:
        for i, cell in enumerate(row):
            bullet = "   * -" if i == 0 else "     -"
            lines.append(f"{bullet} {cell}" if cell else bullet)
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    context, figures = read_json(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/performance-results.json"))
    print(format_rst(figures))
