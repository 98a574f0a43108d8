"""The error taxonomy (gateway/core/errors.py) as each HTTP API answers it, in process: requests are
twisted.web DummyRequests rendered by the gateway's own Router, so the status, the body and the
headers are what a client would get (the e2e tests check the same answers over sockets)."""

import io
import json
import urllib.parse

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.web.test.requesthelper import DummyRequest

from gateway.app.cli import build_parser
from gateway.app.config import build_config
from gateway.app.service import Gateway
from gateway.core.errors import ClientError, LimitExceeded, Timeout
from gateway.core.model import Sample
from gateway.http.promql_api import prometheus_errors
from gateway.http.server import Router
from gateway.ingest.limits import RateLimited
from gateway.query.promql.values import PromQLError
from gateway.store import StoreUnavailable

pytestmark = pytest.mark.fast

TENANT = "errors"


async def call(router: Router, path: str, params=(), method: bytes = b"GET", body: bytes = b"", headers=None):
    """Render one request through ``router``: (status, headers, body) as sent."""
    request = DummyRequest(path.lstrip("/").encode().split(b"/"))
    request.method = method
    request.path = path.encode()
    request.uri = request.path + (b"?" + urllib.parse.urlencode(params).encode() if params else b"")
    for name, value in params:
        request.addArg(name.encode(), value.encode())
    request.content = io.BytesIO(body)
    request.body_too_large = False  # as the gateway's LimitedRequest says of a body under the limit
    request.requestHeaders.setRawHeaders(b"x-scope-orgid", [TENANT.encode()])
    for name, value in (headers or {}).items():
        request.requestHeaders.setRawHeaders(name.encode(), [value.encode()])
    finished = request.notifyFinish()
    router.render(request)
    await finished
    sent = {name.decode().lower(): values[-1].decode() for name, values in request.responseHeaders.getAllRawHeaders()}
    return request.responseCode, sent, b"".join(request.written)


# Each base class, and what every API answers for it: status, Prometheus's errorType, message, headers.
TAXONOMY = [
    (ClientError("bad input"), 400, "bad_data", "bad input", {}),
    (LimitExceeded("over the limit"), 422, "execution", "over the limit", {}),
    (RateLimited("too fast", retry_after_s=7), 429, "unavailable", "too fast", {"retry-after": "7"}),
    (
        StoreUnavailable("sqlite: locked"),
        503,
        "unavailable",
        "the store cannot take this request now, retry later: sqlite: locked",
        {"retry-after": "1"},
    ),
    (Timeout("ran too long"), 503, "timeout", "ran too long", {}),
    (RuntimeError("a bug"), 500, "internal", "internal error; see the gateway log", {}),
]


def raising(error: Exception):
    async def handler(request):
        raise error

    return handler


@pytest.mark.parametrize(("error", "status", "error_type", "message", "headers"), TAXONOMY, ids=lambda v: str(v)[:20])
@pytest_twisted.ensureDeferred
async def test_each_base_class_in_each_api_envelope(error, status, error_type, message, headers):
    """Prometheus's routes wrap their handlers in prometheus_errors; the Graphite and native
    routes answer the gateway's JSON: one mapping, two envelopes, the same status and headers."""
    router = Router()
    router.add("/api/v1/query", ("GET",), "promql_query", prometheus_errors(raising(error)))
    router.add("/render", ("GET",), "graphite_render", raising(error))
    router.add("/api/query", ("GET",), "query", raising(error))
    answered = {path: await call(router, path) for path in ("/api/v1/query", "/render", "/api/query")}
    for path, (got_status, got_headers, body) in answered.items():
        assert got_status == status, (path, body)
        assert got_headers["content-type"] == "application/json"
        assert {name: got_headers[name] for name in headers} == headers
        assert "retry-after" in got_headers or not headers
    prometheus = json.loads(answered["/api/v1/query"][2])
    assert prometheus == {"status": "error", "errorType": error_type, "error": message}
    assert json.loads(answered["/render"][2]) == json.loads(answered["/api/query"][2]) == {"error": message}


@pytest_twisted.ensureDeferred
async def test_a_failure_inside_gather_results_answers_for_its_cause():
    """gatherResults wraps the first failure in FirstError: the answer is the cause's."""

    async def handler(request):
        await defer.gatherResults([defer.fail(LimitExceeded("one of many"))], consumeErrors=True)

    router = Router()
    router.add("/api/v1/query", ("GET",), "promql_query", prometheus_errors(handler))
    status, _, body = await call(router, "/api/v1/query")
    assert status == 422 and json.loads(body)["error"] == "one of many"


@pytest_twisted.ensureDeferred
async def test_a_query_cancelled_for_a_gone_client_is_answered_without_an_error_logged(caplog):
    """PromQLError's ``canceled`` (the client went away mid-query) had no status: answering it
    raised KeyError, which the server logged as an internal error with its traceback."""
    router = Router()
    cancelled = PromQLError("query cancelled: the client went away", "canceled")
    router.add("/api/v1/query", ("GET",), "promql_query", prometheus_errors(raising(cancelled)))
    status, _, body = await call(router, "/api/v1/query")
    assert status == 499 and json.loads(body)["errorType"] == "canceled"
    assert not [record for record in caplog.records if record.levelname == "ERROR"]


@pytest_twisted.async_yield_fixture
async def gateway(tmp_path):
    """The gateway's router on a SQLite store, built as ``tsgate serve`` builds it (no ports, no executors)."""
    flags = ["serve", "--data-dir", str(tmp_path), "--query-executors", "0", "--max-series-per-query", "2"]
    config = build_config(build_parser().parse_args(flags))
    built = Gateway(config)
    await built.components.start_store()
    now_ms = built.pipeline.clock()
    samples = [Sample(TENANT, f"srv.{host}.cpu", {}, now_ms - 60_000, 1.0) for host in "abc"]
    assert not (await built.pipeline.ingest("graphite", samples)).rejected
    yield built.site.resource
    built.graphs.close()
    await built.store.close()


@pytest_twisted.ensureDeferred
async def test_prometheus_query_api_answers_in_its_envelope(gateway):
    status, _, body = await call(gateway, "/api/v1/query", [("query", "sum(")])
    assert status == 400 and json.loads(body)["errorType"] == "bad_data" and json.loads(body)["status"] == "error"
    status, _, body = await call(gateway, "/api/v1/series", [("match[]", '{__name__=~"srv.*"}')])
    assert status == 422 and json.loads(body)["errorType"] == "execution", body
    assert "--max-series-per-query" in json.loads(body)["error"]
    status, _, body = await call(gateway, "/api/v1/query", [("query", 'up{a=~"("}')])
    assert status == 400 and json.loads(body)["errorType"] == "bad_data", body
    status, _, body = await call(gateway, "/api/v1/label/job/nothing")
    assert status == 404 and json.loads(body) == {
        "status": "error",
        "errorType": "not_found",
        "error": "no such endpoint: /api/v1/label/job/nothing",
    }


@pytest_twisted.ensureDeferred
async def test_prometheus_remote_write_answers_the_status_its_decoder_names(gateway):
    """protocols/ cannot import gateway's bases: its ProtocolError carries the status."""
    headers = {"content-type": "text/plain"}
    status, _, body = await call(gateway, "/api/v1/write", method=b"POST", body=b"x", headers=headers)
    assert status == 415 and "error" in json.loads(body), body


@pytest_twisted.ensureDeferred
async def test_graphite_api_answers_the_gateway_json(gateway):
    status, _, body = await call(gateway, "/render", [("target", "srv.a.cpu"), ("format", "png"), ("width", "x")])
    assert status == 400 and json.loads(body)["field"] == "width" and "errorType" not in json.loads(body)
    status, _, body = await call(gateway, "/render", [("target", "srv.*.cpu"), ("format", "json")])
    assert status == 422 and json.loads(body) == {"error": "srv.*.cpu matches 3 series, over the limit of 2"}
    status, _, body = await call(gateway, "/tags/findSeries", [("expr", "name")])
    assert status == 400 and json.loads(body)["field"] == "expr", body


@pytest_twisted.ensureDeferred
async def test_native_api_answers_the_gateway_json(gateway):
    status, _, body = await call(gateway, "/api/write", method=b"POST", body=b"not json")
    assert status == 400 and "errorType" not in json.loads(body), body
    status, _, body = await call(gateway, "/api/query", [("metricName", "srv.a.cpu"), ("start", "yesterday-ish")])
    assert status == 400 and json.loads(body)["field"] == "start", body
    status, headers, body = await call(gateway, "/api/query", method=b"DELETE")
    assert status == 405 and headers["allow"] == "GET" and json.loads(body)["allow"] == ["GET"], body
