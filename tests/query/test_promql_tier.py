"""The data-driven PromQL tier: every tests/promql/*.test file (format: tests/promqltest.py) run
in-process through the same path as an HTTP query, without a server: samples stored through
the ingest pipeline in a SQLite store, each ``eval`` answered by the query API's handlers
(parameters, PromQLService, the engine, the JSON encoders, the error envelope). Expected answers
are Prometheus 2.42's (tests/promtool_check.py confirms them with promtool)."""

import math
from pathlib import Path

import orjson
import pytest
import pytest_twisted
from twisted.web.test.requesthelper import DummyRequest

from gateway.core.model import Limits, Sample
from gateway.http.promql_api import PromQLAPI, prometheus_errors
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.planner import QueryPlanner
from gateway.query.promql.service import PromQLService
from tests import promtool_check
from tests.promqltest import Clear, Eval, Load, compare, is_stale, parse_file, values

FILES = sorted((Path(__file__).resolve().parents[1] / "promql").glob("*.test"))
DAY_MS = 86_400_000
NOW_MS = 6 * DAY_MS  # the store's "now": every sample of the files is inside the raw retention
LOOKBACK_MS = 5 * 60_000
MIN_CASES = 600


class Runner:
    """Loads a file's samples into a tenant of the store and answers its evals as the HTTP API does."""

    def __init__(self, store, delayed_name_removal: bool = False):
        self.store = store
        self.pipeline = IngestPipeline(store, Limits(), KnownSeries(100_000), 10_000_000, clock=lambda: NOW_MS)
        planner = QueryPlanner(store, max_series=10_000, clock=lambda: NOW_MS)
        service = PromQLService(
            store, planner, 50_000_000, LOOKBACK_MS, 60_000, delayed_name_removal=delayed_name_removal
        )
        self.api = PromQLAPI(service)
        self.generation = 0

    @property
    def tenant(self) -> str:
        return f"tier-{self.generation}"

    def clear(self) -> None:
        self.generation += 1

    async def load(self, load: Load) -> None:
        samples = []
        for labels, ts, value in load.samples():
            tags = {k: v for k, v in labels.items() if k != "__name__"}
            samples.append(Sample(self.tenant, labels["__name__"], tags, ts, value))
        result = await self.pipeline.ingest("prometheus", samples)
        assert not result.rejected, f"line {load.line}: samples refused: {result.rejected[:3]}"

    async def answer(self, case: Eval) -> tuple[int, dict]:
        if case.step_ms:
            handler = self.api.query_range
            params = {"start": case.start_ms, "end": case.end_ms, "step": case.step_ms}
        else:
            handler, params = self.api.query, {"time": case.start_ms}
        request = DummyRequest([b""])
        request.args = {b"query": [case.expr.encode()]}
        request.args.update({name.encode(): [repr(ms / 1000).encode()] for name, ms in params.items()})
        request.requestHeaders.setRawHeaders(b"x-scope-orgid", [self.tenant.encode()])
        response = await prometheus_errors(handler)(request)
        return response.status, orjson.loads(response.body)

    async def check(self, case: Eval) -> list[str]:
        """What is wrong with the answer to ``case`` (empty: nothing)."""
        try:
            status, document = await self.answer(case)
        except Exception as error:  # a 500 for the user: the case fails and says why
            return [f"internal error (HTTP 500): {type(error).__name__}: {error}"]
        if case.fails:
            return _check_error(case, status, document)
        if status != 200:
            return [f"error {document.get('errorType')} (HTTP {status}): {document.get('error')}"]
        try:
            return compare(case, _series(case, document["data"]))
        except Undescribed as error:
            return [str(error)]


def _check_error(case: Eval, status: int, document: dict) -> list[str]:
    if status == 200:
        return [f"expected an error, got {orjson.dumps(document['data']).decode()[:300]}"]
    problems = []
    if case.error_type and document["errorType"] != case.error_type:
        problems.append(f"expected errorType {case.error_type}, got {document['errorType']} (HTTP {status})")
    if case.error_text and case.error_text not in document["error"]:
        problems.append(f"expected an error saying {case.error_text!r}, got {document['error']!r}")
    return problems


class Undescribed(Exception):
    """An answer the file format has no words for (a range vector, a string, a native histogram)."""


def _series(case: Eval, data: dict) -> list[tuple[dict[str, str], list[float | None]]]:
    """The answer as (labels, one value per step or None) pairs; values arrive as Prometheus
    writes them ("NaN", "+Inf", shortest decimal), which float() reads back exactly."""
    kind, result = data["resultType"], data["result"]
    if kind == "scalar":
        return [({}, [float(result[1])])]
    if kind == "vector" and not case.step_ms:
        if any("histogram" in sample for sample in result):
            raise Undescribed("a native histogram in the answer")
        return [(sample["metric"], [float(sample["value"][1])]) for sample in result]
    if kind == "matrix" and case.step_ms:
        index = {ms: i for i, ms in enumerate(case.times_ms)}
        got = []
        for series in result:
            points: list[float | None] = [None] * len(index)
            for t, v in series.get("values", []):
                points[index[round(t * 1000)]] = float(v)
            got.append((series["metric"], points))
        return got
    raise Undescribed(f"a {kind} answer, which the case cannot describe")


async def failures(store, path: Path) -> list[str]:
    """Each failing case of the file: file:line, the expression, what differs."""
    runner = Runner(store)
    found = []
    for command in parse_file(path):
        if isinstance(command, Clear):
            runner.clear()
        elif isinstance(command, Load):
            await runner.load(command)
        else:
            problems = await runner.check(command)
            if problems:
                where = f"{path.relative_to(path.parent.parent)}:{command.line}"
                found.append(f"{where}: {command.expr}\n      " + "\n      ".join(problems))
    return found


def test_the_tier_has_enough_cases():
    cases = [c for path in FILES for c in parse_file(path) if isinstance(c, Eval)]
    assert len(cases) >= MIN_CASES


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
@pytest_twisted.ensureDeferred
async def test_promql_file(sqlite_store, path):
    found = await failures(sqlite_store, path)
    assert not found, f"{len(found)} case(s) failed:\n" + "\n".join(found)


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_expectations_are_prometheus_answers(path):
    """Prometheus 2.42 itself (promtool) gives every expectation of the file."""
    disagreements = promtool_check.check(path)
    assert not disagreements, "\n".join(disagreements)


def test_series_notation():
    found = values("0+10x3 1 _ 3 stale _x2 5x2 -1-0.5x2 NaN Inf -Inf 1e308".split())
    assert is_stale(found[7]) and math.isnan(found[16])
    assert found[:7] + found[8:16] == [0, 10, 20, 30, 1, None, 3, None, None, 5, 5, 5, -1, -1.5, -2]
    assert found[17:] == [math.inf, -math.inf, 1e308]


@pytest_twisted.ensureDeferred
async def test_failures_name_the_file_line_expression_expected_and_got(sqlite_store, tmp_path):
    (tmp_path / "cases").mkdir()
    path = tmp_path / "cases" / "wrong.test"
    path.write_text(
        'load 1m\n  m{a="1"} 0+1x5\n\neval instant at 2m m * 2\n  {a="1"} 5\n\n'
        'eval_fail instant at 2m m\n\neval_ordered instant at 0 sort_desc(m or vector(9))\n  m{a="1"} 0\n  {} 9\n'
    )
    assert await failures(sqlite_store, path) == [
        'cases/wrong.test:4: m * 2\n      {a="1"}: expected 5.0, got 4.0',
        'cases/wrong.test:7: m\n      expected an error, got {"resultType":"vector","result":[{"metric":{"a":"1",'
        '"__name__":"m"},"value":[120.0,"2"]}]}',
        'cases/wrong.test:9: sort_desc(m or vector(9))\n      order: expected m{a="1"}, {}; got {}, m{a="1"}',
    ]
