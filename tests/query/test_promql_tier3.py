"""The Prometheus 3 PromQL tier: Prometheus 3.14's own test files (``promql/promqltest/testdata`` of the
pinned module tests/prometheus3.py unpacks from the Go proxy, never committed; format:
tests/promqltest.py's parse_file_v3) run in-process as tests/query/test_promql_tier.py runs the 2.42
files: samples and native histograms stored through the ingest pipeline in a SQLite store, each
``eval`` answered by the query API's handlers, its data, errors and annotations (``warnings``,
``infos``) compared with the file's.

The cases tsgate does not pass yet are listed in tests/promql3_expected_failures.txt, one a line:
``<file>:<line> [<reason>] <expression>``. The test fails on a failing case the list lacks, and on
a listed case that passes (remove its line), so the list only shrinks."""

import re
from pathlib import Path

import orjson
import pytest
import pytest_twisted

from gateway.core.model import HistogramSample
from protocols.prometheus import types_pb2
from protocols.prometheus.native_histogram import Histogram
from tests import prometheus3
from tests.promqltest import (
    Clear,
    Eval,
    Load,
    compare,
    custom_bucket_series,
    histogram,
    parse_file_v3,
    same_value,
    values,
)
from tests.query.test_promql_tier import Runner, Undescribed

EXPECTED_FAILURES = Path(__file__).resolve().parents[1] / "promql3_expected_failures.txt"
FILE_NAMES = [
    "aggregators", "at_modifier", "collision", "duration_expression", "extended_vectors", "fill-modifier",
    "functions", "histograms", "info", "limit", "literals", "name_label_dropping", "native_histograms",
    "operators", "range_queries", "selectors", "staleness", "start_timestamps", "subquery",
    "trig_functions", "type_and_unit",
]  # fmt: skip
_LISTED = re.compile(r"^(?P<file>[\w.-]+\.test):(?P<line>\d+) \[(?P<reason>[^\]]+)\] (?P<expr>.*)$")
_POSITION = re.compile(r" \(\d+:\d+\)$")  # Prometheus's API adds where in the query; the files leave it out


def histogram_message(h: Histogram) -> bytes:
    """``h`` as the prometheus.Histogram message remote write carries (float counts)."""
    message = types_pb2.Histogram(
        sum=h.sum,
        schema=h.schema,
        zero_threshold=h.zero_threshold,
        count_float=h.count,
        zero_count_float=h.zero_count,
        reset_hint=h.reset_hint,
        custom_values=h.custom_values,
    )
    for buckets, spans, counts in (
        (h.positive, message.positive_spans, message.positive_counts),
        (h.negative, message.negative_spans, message.negative_counts),
    ):
        previous = None
        for index in sorted(buckets):
            if previous is not None and index == previous + 1:
                spans[-1].length += 1
            else:
                spans.add(offset=index if previous is None else index - previous - 1, length=1)
            counts.append(buckets[index])
            previous = index
    return message.SerializeToString()


class Runner3(Runner):
    """The 2.42 tier's runner, with native histograms loaded and Prometheus 3's expectations."""

    async def load(self, load: Load) -> None:
        """Floats and native histograms; a label with an empty value is no label, as in Prometheus."""
        floats = Load(load.line, load.interval_ms)
        histograms = []
        for all_labels, points in load.series:
            labels = {k: v for k, v in all_labels.items() if v}
            tags = {k: v for k, v in labels.items() if k != "__name__"}
            floats.series.append((labels, [p if not isinstance(p, Histogram) else None for p in points]))
            for index, point in enumerate(points):
                if isinstance(point, Histogram):
                    histograms.append(
                        HistogramSample(
                            self.tenant, labels["__name__"], tags, index * load.interval_ms, histogram_message(point)
                        )
                    )
        await super().load(floats)
        if histograms:
            result = await self.pipeline.ingest_histograms("prometheus", histograms)
            assert not result.rejected, f"line {load.line}: histograms refused: {result.rejected[:3]}"

    async def check(self, case: Eval) -> list[str]:
        try:
            status, document = await self.answer(case)
        except Exception as error:  # a 500 for the user: the case fails and says why
            return [f"internal error (HTTP 500): {type(error).__name__}: {error}"]
        if case.fails:
            if status == 200:
                return [f"expected an error, got {orjson.dumps(document['data']).decode()[:300]}"]
            return [
                f"expected an error matching {e.message or e.pattern!r}, got {document['error']!r}"
                for e in case.expects
                if e.kind == "fail" and not e.matches(document["error"])
            ]
        if status != 200:
            return [f"error {document.get('errorType')} (HTTP {status}): {document.get('error')}"]
        problems = _annotation_problems(case, document)
        if case.string is not None:
            data = document["data"]
            if data["resultType"] != "string" or data["result"][1] != case.string:
                problems.append(f"expected the string {case.string!r}, got {orjson.dumps(data).decode()[:300]}")
            return problems
        try:
            return problems + compare(case, _series(case, document["data"]))
        except Undescribed as error:
            return [*problems, str(error)]


def _annotation_problems(case: Eval, document: dict) -> list[str]:
    """Prometheus 3's rules: each ``expect warn|info`` line matches an annotation of its kind and,
    once there is such a line, every annotation of that kind matches one; ``no_warn``/``no_info``:
    none of that kind."""
    problems = []
    for kind, key in (("warn", "warnings"), ("info", "infos")):
        found = [_POSITION.sub("", text) for text in document.get(key, [])]
        expected = [e for e in case.expects if e.kind == kind]
        if expected and not found:
            problems.append(f"expected {kind} annotations, got none")
        elif expected:
            problems += [
                f"no {kind} annotation matches {e.message or e.pattern!r}: {found}"
                for e in expected
                if not any(e.matches(t) for t in found)
            ]
            problems += [
                f"unexpected {kind} annotation {t!r}" for t in found if not any(e.matches(t) for e in expected)
            ]
        if found and any(e.kind == f"no_{kind}" for e in case.expects):
            problems.append(f"unexpected {kind} annotations: {found}")
    return problems


def _point(value: str | dict) -> float | dict:
    if isinstance(value, dict):
        return {k: v if k != "buckets" else [[b[0], *map(float, b[1:])] for b in v] for k, v in value.items()} | {
            "count": float(value["count"]),
            "sum": float(value["sum"]),
        }
    return float(value)


def _series(case: Eval, data: dict) -> list[tuple[dict[str, str], list]]:
    """The answer as (labels, one value per expected time or None) pairs; a native histogram as
    its JSON with numbers as floats."""
    kind, result = data["resultType"], data["result"]
    if kind == "scalar":
        return [({}, [float(result[1])])]
    if kind == "vector" and not case.step_ms and not case.range_vector:
        return [(s["metric"], [_point(s["value"][1] if "value" in s else s["histogram"][1])]) for s in result]
    if kind == "matrix" and (case.step_ms or case.range_vector):
        index = {ms: i for i, ms in enumerate(case.times_ms)}
        got = []
        for series in result:
            points: list = [None] * len(index)
            for t, v in [*series.get("values", []), *series.get("histograms", [])]:
                at = index.get(round(t * 1000))
                if at is None:
                    raise Undescribed(f"a point at {t}s, not one of the expected times")
                points[at] = _point(v)
            got.append((series["metric"], points))
        return got
    raise Undescribed(f"a {kind} answer, which the case does not describe")


def listed() -> dict[str, tuple[str, str]]:
    """The expected failures: ``file:line`` -> (reason, expression)."""
    found = {}
    for number, line in enumerate(EXPECTED_FAILURES.read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        entry = _LISTED.match(line)
        assert entry, f"{EXPECTED_FAILURES.name}:{number}: not '<file>:<line> [<reason>] <expression>'"
        found[f"{entry['file']}:{entry['line']}"] = (entry["reason"], entry["expr"])
    return found


async def file_failures(store, path: Path) -> dict[str, tuple[str, list[str]]]:
    """Each failing case of the file: ``file:line`` -> (its expression, what differs)."""
    runner = Runner3(store, delayed_name_removal=True)  # as promqltest's engine runs every file
    found = {}
    for command in parse_file_v3(path):
        if isinstance(command, Clear):
            runner.clear()
        elif isinstance(command, Load):
            await runner.load(command)
        else:
            problems = await runner.check(command)
            if problems:
                found[f"{path.name}:{command.line}"] = (command.expr, problems)
    return found


@pytest.fixture(scope="module")
def testdata() -> Path:
    return prometheus3.module_source() / "promql" / "promqltest" / "testdata"


def test_the_pinned_version_has_these_files(testdata):
    assert sorted(p.stem for p in testdata.glob("*.test")) == sorted(FILE_NAMES)


@pytest.mark.parametrize("name", FILE_NAMES)
@pytest_twisted.ensureDeferred
async def test_prometheus3_file(sqlite_store, testdata, name):
    """Every case of the file passes but the listed ones, which fail."""
    failing = await file_failures(sqlite_store, testdata / f"{name}.test")
    expected = {key: entry for key, entry in listed().items() if key.startswith(f"{name}.test:")}
    unexpected = [
        f"{key}: {expr}\n      " + "\n      ".join(problems)
        for key, (expr, problems) in failing.items()
        if key not in expected
    ]
    passing = [f"{key} [{reason}] {expr}" for key, (reason, expr) in expected.items() if key not in failing]
    wrong_expr = [
        f"{key}: listed as {expected[key][1]!r}, the file has {expr!r}"
        for key, (expr, _) in failing.items()
        if key in expected and expected[key][1] != expr
    ]
    assert not (unexpected or passing or wrong_expr), (
        f"{len(unexpected)} case(s) fail and are not in {EXPECTED_FAILURES.name}:\n"
        + "\n".join(unexpected)
        + f"\n{len(passing)} listed case(s) pass now (remove their lines):\n"
        + "\n".join(passing)
        + "\n"
        + "\n".join(wrong_expr)
    )


def test_histogram_notation():
    h = histogram(
        "schema:1 sum:3 count:22 z_bucket:2 z_bucket_w:0.5 buckets:[5 10 7] offset:1 n_buckets:[1] counter_reset_hint:gauge"
    )
    assert (h.schema, h.sum, h.count, h.zero_count, h.zero_threshold, h.reset_hint) == (1, 3, 22, 2, 0.5, 3)
    assert h.positive == {1: 5, 2: 10, 3: 7} and h.negative == {0: 1}
    assert histogram("custom_values:[5 10] buckets:[1 2]").schema == -53
    sequence = values(["{{sum:1 count:1 buckets:[1]}}+{{sum:2 count:2 buckets:[2]}}x2", "_", "{{}}x1"])
    assert [p.count if p else None for p in sequence] == [1, 3, 5, None, 0, 0]
    assert same_value(sequence[1], {"count": 3.0, "sum": 3.0, "buckets": [[0, 0.5, 1.0, 3.0]]})
    gappy = histogram("schema:0 sum:9 count:9 buckets:[1 0 2] offset:-2 n_buckets:[3 4] n_offset:5")
    for h in (sequence[2], gappy):
        assert Histogram.from_proto(types_pb2.Histogram.FromString(histogram_message(h))) == h


def test_classic_histograms_load_with_nhcb_as_custom_buckets():
    series = [
        ({"__name__": "x_bucket", "le": "0.5", "a": "1"}, [1.0, 2.0]),
        ({"__name__": "x_bucket", "le": "+Inf", "a": "1"}, [3.0, 2.0]),
        ({"__name__": "x_sum", "a": "1"}, [4.5, None]),
        ({"__name__": "y", "a": "1"}, [7.0]),
    ]
    ((labels, points),) = custom_bucket_series(series)
    assert labels == {"__name__": "x", "a": "1"}
    assert points[0] == histogram("schema:-53 custom_values:[0.5] buckets:[1 2] count:3 sum:4.5")
    assert points[1] == histogram("schema:-53 custom_values:[0.5] buckets:[2] count:2 sum:0")
