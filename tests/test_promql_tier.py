"""The data-driven PromQL tier: every tests/promql/*.test file (format: tests/promqltest.py) run
in-process through the same path as an HTTP query, without a server: samples stored through
the ingest pipeline in a SQLite store, each ``eval`` answered by the query API's handlers
(parameters, PromQLService, the engine, the JSON encoders, the error envelope). Expected answers
are Prometheus 2.42's (tests/promql/promtool_check.py confirms them with promtool)."""

from pathlib import Path

import orjson
import pytest
import pytest_twisted
from twisted.web.test.requesthelper import DummyRequest

from gateway.http.promql_api import PromQLAPI
from gateway.ingest import IngestPipeline
from gateway.metadata_cache import KnownSeries
from gateway.model import Limits, Sample
from gateway.promql.service import PromQLService
from gateway.query import QueryPlanner
from tests.promqltest import Clear, Eval, Load, compare, parse_file, show_labels

FILES = sorted((Path(__file__).parent / "promql").glob("*.test"))
DAY_MS = 86_400_000
NOW_MS = 6 * DAY_MS  # the store's "now": every sample of the files is inside the raw retention
LOOKBACK_MS = 5 * 60_000
MIN_CASES = 600


class Runner:
    """Loads a file's samples into a tenant of the store and answers its evals as the HTTP API does."""

    def __init__(self, store):
        self.store = store
        self.pipeline = IngestPipeline(store, Limits(), KnownSeries(100_000), 10_000_000, clock=lambda: NOW_MS)
        planner = QueryPlanner(store, max_series=10_000)
        planner.reader.clock = lambda: NOW_MS
        self.api = PromQLAPI(PromQLService(store, planner, 50_000_000, LOOKBACK_MS, 60_000, 10 * 60_000))
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
        response = await PromQLAPI._guarded(handler)(request)
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
        got = _series(case, document["data"])
        return got if isinstance(got, list) and got and isinstance(got[0], str) else compare(case, got)


def _check_error(case: Eval, status: int, document: dict) -> list[str]:
    if status == 200:
        return [f"expected an error, got {orjson.dumps(document['data']).decode()[:300]}"]
    problems = []
    if case.error_type and document["errorType"] != case.error_type:
        problems.append(f"expected errorType {case.error_type}, got {document['errorType']} (HTTP {status})")
    if case.error_text and case.error_text not in document["error"]:
        problems.append(f"expected an error saying {case.error_text!r}, got {document['error']!r}")
    return problems


def _value(text: str) -> float:
    return float(text)


def _series(case: Eval, data: dict) -> list:
    """The answer as (labels, one value per step or None) pairs, or a list of problems."""
    kind, result = data["resultType"], data["result"]
    if kind == "scalar":
        return [({}, [_value(result[1])])]
    if kind == "vector" and not case.step_ms:
        if any("histogram" in sample for sample in result):
            return ["a native histogram in the answer"]
        return [(sample["metric"], [_value(sample["value"][1])]) for sample in result]
    if kind == "matrix" and case.step_ms:
        index = {ms: i for i, ms in enumerate(case.times_ms)}
        got = []
        for series in result:
            points: list[float | None] = [None] * len(index)
            for t, v in series.get("values", []):
                points[index[round(t * 1000)]] = _value(v)
            got.append((series["metric"], points))
        return got
    return [f"a {kind} answer, not what the case can describe"]


def cases() -> list[Eval]:
    return [c for path in FILES for c in parse_file(path) if isinstance(c, Eval)]


def test_the_tier_has_enough_cases():
    assert len(cases()) >= MIN_CASES


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
@pytest_twisted.ensureDeferred
async def test_promql_file(sqlite_store, path):
    runner = Runner(sqlite_store)
    failures = []
    for command in parse_file(path):
        if isinstance(command, Clear):
            runner.clear()
        elif isinstance(command, Load):
            await runner.load(command)
        else:
            problems = await runner.check(command)
            if problems:
                where = f"{path.relative_to(Path(__file__).parent)}:{command.line}"
                failures.append(f"{where}: {command.expr}\n      " + "\n      ".join(problems))
    assert not failures, f"{len(failures)} case(s) failed:\n" + "\n".join(failures)


def test_failures_name_the_case(tmp_path):
    """A wrong expectation is reported with file:line, the expression, expected and got."""
    case = parse_file(_written(tmp_path, "eval instant at 1m vector(1)\n  {} 2\n"))[0]
    (problem,) = compare(case, [({}, [1.0])])
    assert problem == "{}: expected 2.0, got 1.0"
    assert show_labels({"__name__": "m", "b": "2", "a": "1"}) == 'm{a="1", b="2"}'


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "case.test"
    path.write_text(text)
    return path
