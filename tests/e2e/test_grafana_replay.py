r"""Grafana's Graphite data source, replayed request for request against a real gateway.

Data goes in through the carbon plaintext port (untagged paths and tagged ``name;k=v`` series),
then every request below is shaped exactly as Grafana sends it:

* Panels (``public/app/plugins/datasource/graphite/datasource.ts``, ``query`` and
  ``buildGraphiteParams``): ``POST /render`` with ``Content-Type:
  application/x-www-form-urlencoded`` and a body of ``key=encodeURIComponent(value)`` pairs
  joined by ``&``: one ``target=`` per visible query (refIds A, B, ... in one request),
  ``format=json``, ``maxDataPoints``, and ``from``/``until`` from ``translateTime``, which turns
  ``now-1h`` into ``-1h`` (``m`` -> ``min``) and absolute times into epoch seconds.
* Grafana's backend (``pkg/tsdb/graphite``, ``createGraphiteRequest``): the same POST with the
  body built by Go's ``url.Values.Encode`` (spaces as ``+``), epoch-second ``from``/``until``,
  and, in the versions that run several refIds through one render call, each target wrapped as
  ``aliasSub(<target>, "(^.*$)", "\1 <refId>")`` so answers can be matched back to queries.
* The health check (``pkg/tsdb/graphite/healthcheck.go``): ``target=constantLine(100)``,
  ``maxDataPoints=100``, last hour; the frontend's older "Save & test" ran ``/metrics/find``
  with ``query=*`` (``testDatasource``).
* Metric browsing: ``GET /metrics/find?query=...&from=..&until=..`` (``metricFindQuery``) and,
  through the backend's resource handler (``resource_handler.go``, ``handleMetricsFind``),
  ``POST /metrics/find`` with the raw form body ``query=...``; answers are read as treejson
  (``text``, ``expandable``).
* Tags (``getTagsAutoComplete`` / ``getTagValuesAutoComplete``): ``GET
  /tags/autoComplete/tags`` and ``/tags/autoComplete/values`` with ``expr`` repeated once per
  expression, ``tag``, ``tagPrefix``/``valuePrefix`` and ``limit=10000`` for template variables
  (``tags(...)``, ``tag_values(...)``); ``GET /tags`` and ``GET /tags/<tag>``.
* ``GET /version`` (``getVersion``: must parse as a semantic version; 1.1 turns on tags and
  ``/functions``) and ``GET /functions`` (``getFuncDefs``), which Grafana reads as text and
  parses after replacing ``Infinity`` with ``1e9999`` because graphite-web writes an infinite
  default as a bare ``Infinity``.

Each backend (SQLite; Cassandra with Redis) gets one gateway and one data set for the module, in
a tenant of its own: the carbon listener writes into it (``--graphite-tenant``) and every request
names it with ``X-Scope-OrgID``, the header Grafana adds when configured for a multi-tenant
backend. The health check also runs on the plain ``gateway`` fixture (default tenant).
"""

import json
import math
import re
import socket
import time
import urllib.parse
import uuid

import pytest

from tests.gatewayproc import GatewayProcess

URI_COMPONENT_SAFE = "-_.!~*'()"  # what JavaScript's encodeURIComponent leaves alone
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
STEP = 60
POINTS = 60
HOSTS = {"web1": 1, "web2": 2, "db1": 3}  # servers.<host>.cpu holds i * factor at base + i * 60
MEM = {"web1": 10.0, "web2": 20.0, "db1": 30.0}
STORAGE_SCHEMAS = (
    "[fast]\npattern = ^fast\\.\nretentions = 10s:6h,1m:7d\n\n[default]\npattern = .*\nretentions = 60s:1d\n"
)


# -- request shapes ------------------------------------------------------------------------------


def js_form(pairs) -> bytes:
    """The body of datasource.ts: ``key + '=' + encodeURIComponent(value)`` joined by ``&``."""
    return "&".join(f"{key}={urllib.parse.quote(str(value), safe=URI_COMPONENT_SAFE)}" for key, value in pairs).encode()


def go_form(pairs) -> bytes:
    """The body of pkg/tsdb/graphite: Go's url.Values.Encode (keys sorted, spaces as '+')."""
    return urllib.parse.urlencode(sorted(pairs, key=lambda pair: pair[0])).encode()


def refid(target: str, ref: str) -> str:
    return f'aliasSub({target}, "(^.*$)", "\\1 {ref}")'


def send_carbon(port: int, lines: list[str]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(("\n".join(lines) + "\n").encode())


class Grafana:
    """A gateway seen through Grafana's eyes: every request carries the tenant header."""

    def __init__(self, gateway: GatewayProcess, tenant: str, base: int):
        self.gateway = gateway
        self.tenant = tenant
        self.base = base  # epoch seconds of the first sample, a multiple of 360

    def headers(self, extra=None) -> dict:
        return {"X-Scope-OrgID": self.tenant, **(extra or {})}

    def get(self, path: str, params=None):
        query = "?" + urllib.parse.urlencode(params, doseq=True) if params else ""
        return self.gateway.get(path + query, headers=self.headers())

    def post_form(self, path: str, body: bytes):
        return self.gateway.post(path, body, headers=self.headers(FORM))

    def render(self, pairs, encode=js_form):
        answer = self.post_form("/render", encode(pairs))
        assert answer.status == 200, answer.body
        assert answer.headers["Content-Type"].startswith("application/json")
        return answer.json()


def by_target(series_list) -> dict:
    return {series["target"]: series for series in series_list}


def values(series) -> list:
    return [value for value, _ in series["datapoints"]]


# -- the data set --------------------------------------------------------------------------------


def carbon_lines(base: int) -> list[str]:
    lines = []
    for i in range(POINTS):
        t = base + i * STEP
        for host, factor in HOSTS.items():
            lines.append(f"servers.{host}.cpu {i * factor} {t}")
            lines.append(f"servers.{host}.mem {MEM[host]} {t}")
        lines.append(f"disk.used;host=web1;dc=eu {i * 2} {t}")
        lines.append(f"disk.used;dc=us;host=db1 {i * 3} {t}")
        lines.append(f"net.rx;host=web1;dc=eu 5 {t}")
    # Bucketing: two samples in one 60 s bucket (the later one wins), one in the next.
    lines += [f"servers.web1.load 1 {base + 5}", f"servers.web1.load 2 {base + 50}", f"servers.web1.load 3 {base + 65}"]
    # A 10 s step from storage-schemas.conf.
    lines += [f"fast.x 1 {base + 3}", f"fast.x 2 {base + 7}", f"fast.x 3 {base + 12}"]
    return lines


EXPECTED_COUNTS = {
    **{f"servers.{host}.{metric}": POINTS for host in HOSTS for metric in ("cpu", "mem")},
    "servers.web1.load": 2,
    "disk.used;dc=eu;host=web1": POINTS,
    "disk.used;dc=us;host=db1": POINTS,
    "net.rx;dc=eu;host=web1": POINTS,
}


def wait_until_readable(grafana: Grafana, timeout: float = 60) -> None:
    pairs = [
        ("target", "servers.*.*"),
        ("target", "seriesByTag('name=~(disk|net)\\..*')"),
        ("from", grafana.base - STEP),
        ("until", grafana.base + POINTS * STEP),
        ("format", "json"),
    ]
    deadline = time.monotonic() + timeout
    while True:
        answer = grafana.post_form("/render", js_form(pairs))
        counts = {}
        if answer.status == 200:
            counts = {s["target"]: sum(v is not None for v in values(s)) for s in answer.json()}
        if counts == EXPECTED_COUNTS:
            return
        assert time.monotonic() < deadline, (
            f"data not readable after {timeout}s: {answer.status} {counts}\n{grafana.gateway.log()[-3000:]}"
        )
        time.sleep(0.3)


@pytest.fixture(scope="module", params=["sqlite", "cassandra"])
def grafana(request, tmp_path_factory):
    """One gateway per backend for the module, fed once through the carbon plaintext port."""
    workdir = tmp_path_factory.mktemp(f"grafana-{request.param}")
    schemas = workdir / "storage-schemas.conf"
    schemas.write_text(STORAGE_SCHEMAS)
    tenant = f"grafana-{uuid.uuid4().hex[:10]}"
    args = ["--graphite-tenant", tenant, "--graphite-storage-schemas", str(schemas)]
    if request.param == "cassandra":
        args += [
            "--store",
            request.getfixturevalue("cassandra_url"),
            "--redis",
            request.getfixturevalue("redis_server").url,
        ]
    gateway = GatewayProcess(workdir, *args).start()
    try:
        now = int(time.time())
        base = now - now % 360 - 2 * 3600  # samples end well before now; 360 s aligned (see test_consolidation)
        send_carbon(gateway.graphite_port, carbon_lines(base))
        view = Grafana(gateway, tenant, base)
        wait_until_readable(view)
        yield view
    finally:
        assert gateway.stop() == 0, gateway.log()[-3000:]


# -- /render -------------------------------------------------------------------------------------


def test_render_glob_with_refid_alias_and_epoch_range(grafana):
    base = grafana.base
    series = grafana.render(
        [
            ("target", refid("servers.*.cpu", "A")),
            ("from", base - STEP),
            ("until", base + (POINTS - 1) * STEP),
            ("format", "json"),
            ("maxDataPoints", 1000),
        ]
    )
    assert [s["target"] for s in series] == ["servers.db1.cpu A", "servers.web1.cpu A", "servers.web2.cpu A"]
    for host, factor in HOSTS.items():
        found = by_target(series)[f"servers.{host}.cpu A"]
        assert found["tags"] == {"name": f"servers.{host}.cpu"}
        assert found["datapoints"] == [[float(i * factor), base + i * STEP] for i in range(POINTS)]


@pytest.mark.parametrize("encode", [js_form, go_form], ids=["frontend", "backend"])
def test_consolidation_to_max_data_points(grafana, encode):
    """graphite-web's json view: 60 points at 60 s into maxDataPoints=10 -> 6 values per point,
    start nudged to a multiple of 360 s (dropping 5 values), averages per band."""
    base = grafana.base
    series = grafana.render(
        [
            ("target", refid("servers.web1.cpu", "A")),
            ("from", base - STEP),
            ("until", base + (POINTS - 1) * STEP),
            ("format", "json"),
            ("maxDataPoints", 10),
        ],
        encode,
    )
    (web1,) = series
    assert web1["target"] == "servers.web1.cpu A"
    raw = list(range(5, POINTS))  # the nudge drops values 0..4
    bands = [raw[k : k + 6] for k in range(0, len(raw), 6)]
    expected = [[sum(band) / len(band), base + 360 * (k + 1)] for k, band in enumerate(bands)]
    assert web1["datapoints"] == expected
    assert len(web1["datapoints"]) <= 10


def test_consolidate_by_max(grafana):
    base = grafana.base
    (web1,) = grafana.render(
        [
            ("target", refid("consolidateBy(servers.web1.cpu, 'max')", "A")),
            ("from", base - STEP),
            ("until", base + (POINTS - 1) * STEP),
            ("format", "json"),
            ("maxDataPoints", 10),
        ]
    )
    assert values(web1) == [10.0, 16.0, 22.0, 28.0, 34.0, 40.0, 46.0, 52.0, 58.0, 59.0]


def test_relative_range_as_translated_by_grafana(grafana):
    """A dashboard on "Last 3 hours": Grafana sends from=-3h&until=now."""
    series = grafana.render(
        [
            ("target", refid("servers.web1.cpu", "A")),
            ("from", "-3h"),
            ("until", "now"),
            ("format", "json"),
            ("maxDataPoints", 2000),
        ]
    )
    (web1,) = series
    stamps = [t for _, t in web1["datapoints"]]
    assert all(b - a == STEP for a, b in zip(stamps, stamps[1:]))
    present = {t: v for v, t in web1["datapoints"] if v is not None}
    assert present == {grafana.base + i * STEP: float(i) for i in range(POINTS)}
    last_hour = grafana.render(
        [("target", refid("servers.web1.cpu", "A")), ("from", "-1h"), ("until", "now"), ("format", "json")]
    )
    assert by_target(last_hour)["servers.web1.cpu A"]["datapoints"][-1][1] >= time.time() - 2 * STEP


def test_two_refids_with_functions_in_one_request(grafana):
    base = grafana.base
    pairs = [
        ("target", refid("aliasByNode(servers.*.cpu, 1)", "A")),
        ("target", refid("sumSeries(servers.*.mem)", "B")),
        ("from", base),
        ("until", base + (POINTS - 1) * STEP),
        ("format", "json"),
        ("maxDataPoints", 1000),
    ]
    for encode in (js_form, go_form):
        series = by_target(grafana.render(pairs, encode))
        assert set(series) == {"db1 A", "web1 A", "web2 A", "sumSeries(servers.*.mem) B"}
        assert values(series["web2 A"]) == [float(2 * i) for i in range(1, POINTS)]
        assert values(series["sumSeries(servers.*.mem) B"]) == [sum(MEM.values())] * (POINTS - 1)


def test_nested_functions(grafana):
    base = grafana.base
    series = by_target(
        grafana.render(
            [
                ("target", refid("alias(scale(averageSeries(servers.{web1,web2}.cpu), 2), 'avg x2')", "A")),
                ("target", refid("highestMax(servers.*.cpu, 1)", "B")),
                ("from", base - STEP),
                ("until", base + (POINTS - 1) * STEP),
                ("format", "json"),
                ("maxDataPoints", 1000),
            ]
        )
    )
    assert values(series["avg x2 A"]) == [3.0 * i for i in range(POINTS)]
    assert list(series) == ["avg x2 A", "servers.db1.cpu B"]


def test_series_by_tag(grafana):
    base = grafana.base
    series = grafana.render(
        [
            ("target", refid("seriesByTag('name=disk.used', 'dc=~e.*')", "A")),
            ("target", refid("aliasByTags(seriesByTag('name=disk.used'), 'host')", "B")),
            ("target", refid("scale(seriesByTag('host=web1', 'name!=disk.used'), 2)", "C")),
            ("from", base - STEP),
            ("until", base + (POINTS - 1) * STEP),
            ("format", "json"),
            ("maxDataPoints", 1000),
        ]
    )
    found = by_target(series)
    # Fetched series are sorted by name: disk.used;dc=eu;host=web1 comes before disk.used;dc=us;host=db1.
    assert list(found) == ["disk.used;dc=eu;host=web1 A", "web1 B", "db1 B", "scale(net.rx;dc=eu;host=web1,2) C"]
    assert found["disk.used;dc=eu;host=web1 A"]["tags"] == {"dc": "eu", "host": "web1", "name": "disk.used"}
    assert values(found["disk.used;dc=eu;host=web1 A"]) == [float(2 * i) for i in range(POINTS)]
    assert values(found["db1 B"]) == [float(3 * i) for i in range(POINTS)]
    assert values(found["scale(net.rx;dc=eu;host=web1,2) C"]) == [10.0] * POINTS


def test_bucketing_last_sample_wins_and_storage_schemas_step(grafana):
    base = grafana.base
    series = by_target(
        grafana.render(
            [
                ("target", "servers.web1.load"),
                ("target", "fast.x"),
                ("from", base - 10),
                ("until", base + 60),
                ("format", "json"),
            ]
        )
    )
    # 60 s default step: [base, base+60) holds 1 and 2 (2 is later, it wins); base+60 holds 3.
    assert series["servers.web1.load"]["datapoints"] == [[2.0, base], [3.0, base + 60]]
    # fast.* has a 10 s step: [base, base+10) -> 2, [base+10, base+20) -> 3, then nothing.
    assert series["fast.x"]["datapoints"][:3] == [[2.0, base], [3.0, base + 10], [None, base + 20]]
    assert all(t - base == 10 * k for k, (_, t) in enumerate(series["fast.x"]["datapoints"]))


def test_other_render_formats_ignore_max_data_points(grafana):
    base = grafana.base
    body = js_form(
        [
            ("target", "servers.web1.cpu"),
            ("from", base - STEP),
            ("until", base + (POINTS - 1) * STEP),
            ("format", "raw"),
            ("maxDataPoints", 10),
        ]
    )
    answer = grafana.post_form("/render", body)
    assert answer.status == 200
    header, data = answer.body.decode().strip().split("|")
    assert header == f"servers.web1.cpu,{base},{base + POINTS * STEP},{STEP}"
    assert data.split(",") == [repr(float(i)) for i in range(POINTS)]


def test_health_check(gateway):
    """Grafana's "Save & test" on the plain gateway fixture (default tenant, no data needed)."""
    now = int(time.time())
    for body in (
        js_form([("target", "constantLine(100)"), ("format", "json"), ("from", "-5min"), ("until", "now")]),
        go_form(
            [
                ("target", "constantLine(100)"),
                ("format", "json"),
                ("from", now - 3600),
                ("until", now),
                ("maxDataPoints", 100),
            ]
        ),
    ):
        answer = gateway.post("/render", body, headers=FORM)
        assert answer.status == 200, answer.body
        (series,) = answer.json()
        assert series["datapoints"] and all(value == 100 for value, _ in series["datapoints"])
    find = gateway.get("/metrics/find?query=*")
    assert find.status == 200 and isinstance(find.json(), list)


# -- /metrics/find -------------------------------------------------------------------------------


TREEJSON_KEYS = {"text", "id", "leaf", "expandable", "allowChildren", "context"}


def test_metrics_find_post_raw_form_body(grafana):
    now = int(time.time())
    answer = grafana.post_form("/metrics/find", f"query=servers.*&from={now - 3600}&until={now}".encode())
    assert answer.status == 200, answer.body
    nodes = answer.json()
    assert all(set(node) == TREEJSON_KEYS for node in nodes)
    assert [(n["text"], n["id"], n["leaf"], n["expandable"], n["allowChildren"]) for n in nodes] == [
        ("db1", "servers.db1", 0, 1, 1),
        ("web1", "servers.web1", 0, 1, 1),
        ("web2", "servers.web2", 0, 1, 1),
    ]
    backend = grafana.post_form("/metrics/find", go_form([("query", "servers.web1.*")]))
    assert [(n["text"], n["id"], n["leaf"], n["expandable"], n["allowChildren"]) for n in backend.json()] == [
        ("cpu", "servers.web1.cpu", 1, 0, 0),
        ("load", "servers.web1.load", 1, 0, 0),
        ("mem", "servers.web1.mem", 1, 0, 0),
    ]


def test_metrics_find_get(grafana):
    now = int(time.time())
    root = grafana.get("/metrics/find", {"query": "*", "from": now - 3600, "until": now}).json()
    # Tagged series live in the tag index, not in the tree (as in graphite-web).
    assert [(n["text"], n["expandable"]) for n in root] == [("fast", 1), ("servers", 1)]
    # treejson as graphite-web builds it: one entry per node name, id = the query's parent part
    # + the name (so globbed parents stay globbed); /metrics/expand gives the real paths.
    leaves = grafana.get("/metrics/find", {"query": "servers.{web1,db1}.c*"}).json()
    assert [(n["text"], n["id"], n["leaf"]) for n in leaves] == [("cpu", "servers.{web1,db1}.cpu", 1)]
    ranged = grafana.get("/metrics/find", {"query": "servers.web[12].*"}).json()
    assert [n["id"] for n in ranged] == ["servers.web[12].cpu", "servers.web[12].load", "servers.web[12].mem"]
    expanded = grafana.get("/metrics/expand", {"query": "servers.{web1,db1}.c*"}).json()
    assert expanded == {"results": ["servers.db1.cpu", "servers.web1.cpu"]}
    assert grafana.get("/metrics/find", {"query": "servers.nothing.*"}).json() == []
    # The template variable editor's "query" flavour: Grafana reads text and expandable only.
    assert [n["text"] for n in grafana.get("/metrics/find", {"query": "servers.*.cpu"}).json()] == ["cpu"]


def test_metrics_find_other_formats(grafana):
    completer = grafana.get("/metrics/find", {"query": "servers.web1.", "format": "completer"}).json()
    assert [m["path"] for m in completer["metrics"]] == ["servers.web1.cpu", "servers.web1.load", "servers.web1.mem"]
    plain = grafana.get("/metrics/find", {"query": "servers.*", "format": "json"}).json()
    assert plain == [{"path": f"servers.{h}", "is_leaf": False} for h in ("db1", "web1", "web2")]


def test_metrics_expand_and_index(grafana):
    expand = grafana.get("/metrics/expand", {"query": ["servers.*.cpu", "servers.web1.*"]}).json()
    assert expand == {
        "results": ["servers.db1.cpu", "servers.web1.cpu", "servers.web1.load", "servers.web1.mem", "servers.web2.cpu"]
    }
    grouped = grafana.get("/metrics/expand", {"query": "servers.*", "groupByExpr": 1}).json()
    assert grouped == {"results": {"servers.*": ["servers.db1", "servers.web1", "servers.web2"]}}
    leaves_only = grafana.get("/metrics/expand", {"query": "servers.*", "leavesOnly": 1}).json()
    assert leaves_only == {"results": []}
    index = grafana.get("/metrics/index.json").json()
    assert index == sorted(
        ["fast.x", "servers.web1.load", *(f"servers.{h}.{m}" for h in HOSTS for m in ("cpu", "mem"))]
    )


# -- tags ----------------------------------------------------------------------------------------


def test_tags_autocomplete_as_grafana_sends_it(grafana):
    tags = grafana.get("/tags/autoComplete/tags", {"expr": ["name=disk.used"], "limit": 10000}).json()
    assert tags == ["dc", "host"]
    assert grafana.get(
        "/tags/autoComplete/tags", {"expr": ["name=disk.used"], "tagPrefix": "h", "limit": 10000}
    ).json() == ["host"]
    assert grafana.get("/tags/autoComplete/tags", {"expr": ["name=~.*", "dc=eu"], "limit": 10000}).json() == ["host"]
    assert grafana.get("/tags/autoComplete/tags", {"limit": 10000}).json() == ["dc", "host", "name"]
    # The tag editor's value list for `host` once `name=disk.used` and `dc=eu` are chosen.
    values_ = grafana.get(
        "/tags/autoComplete/values", {"expr": ["name=disk.used", "dc=eu"], "tag": "host", "limit": 10000}
    ).json()
    assert values_ == ["web1"]
    assert grafana.get(
        "/tags/autoComplete/values", {"expr": ["name=disk.used"], "tag": "host", "valuePrefix": "d"}
    ).json() == ["db1"]
    names = grafana.get("/tags/autoComplete/values", {"expr": ["host=web1"], "tag": "name", "limit": 10000}).json()
    assert names == ["disk.used", "net.rx"]
    assert grafana.get("/tags/autoComplete/values", {"tag": "dc", "limit": 10000}).json() == ["eu", "us"]
    assert len(grafana.get("/tags/autoComplete/values", {"tag": "dc", "limit": 1}).json()) == 1
    # Some Grafana versions serialise the list as expr[]=...
    assert grafana.get("/tags/autoComplete/values", {"expr[]": ["name=disk.used"], "tag": "dc"}).json() == ["eu", "us"]


def test_tags_list_details_and_find_series(grafana):
    assert grafana.get("/tags").json() == [{"tag": "dc"}, {"tag": "host"}, {"tag": "name"}]
    assert grafana.get("/tags", {"filter": "^h"}).json() == [{"tag": "host"}]
    host = grafana.get("/tags/host").json()
    assert host == {"tag": "host", "values": [{"value": "db1", "count": 1}, {"value": "web1", "count": 2}]}
    names = {v["value"]: v["count"] for v in grafana.get("/tags/name").json()["values"]}
    assert names["disk.used"] == 2 and names["net.rx"] == 1
    found = grafana.get("/tags/findSeries", {"expr": ["host=web1"]}).json()
    assert found == ["disk.used;dc=eu;host=web1", "net.rx;dc=eu;host=web1"]
    assert grafana.get("/tags/findSeries", {"expr": ["host=web1", "name=net.rx"]}).json() == ["net.rx;dc=eu;host=web1"]
    assert grafana.get("/tags/findSeries", {"expr": ["dc!=eu", "name=~disk"]}).json() == ["disk.used;dc=us;host=db1"]


# -- /functions and /version ---------------------------------------------------------------------


def _no_bare_constants(constant):
    raise ValueError(f"JSON.parse would fail on {constant}")


def grafana_parse_functions(text: str) -> dict:
    """datasource.ts getFuncDefs: the body as text, Infinity -> 1e9999, then JSON.parse (which,
    unlike Python's json module, knows no NaN or Infinity)."""
    return json.loads(text.replace("Infinity", "1e9999"), parse_constant=_no_bare_constants)


PARAM_TYPES = {
    "aggFunc",
    "aggOrSeriesFunc",
    "any",
    "boolean",
    "date",
    "float",
    "integer",
    "interval",
    "intOrInterval",
    "intOrInf",
    "node",
    "nodeOrTag",
    "seriesList",
    "seriesLists",
    "string",
    "tag",
}


def test_functions_as_grafana_parses_them(grafana):
    answer = grafana.get("/functions")
    assert answer.status == 200
    functions = grafana_parse_functions(answer.body.decode())
    assert len(functions) > 100
    for name, definition in functions.items():
        assert definition["name"] == name
        assert isinstance(definition["group"], str) and definition["group"]
        assert isinstance(definition["description"], str)
        for param in definition["params"]:
            assert isinstance(param["name"], str) and param["name"], (name, param)
            assert param["type"] in PARAM_TYPES, (name, param)
            assert isinstance(param.get("required", False), bool)
            assert isinstance(param.get("multiple", False), bool)
            assert isinstance(param.get("options", []), list)

    def shape(name):
        return [
            (p["name"], p["type"], p.get("required", False), p.get("multiple", False))
            for p in functions[name]["params"]
        ]

    assert shape("sumSeries") == [("seriesLists", "seriesList", True, True)]
    assert shape("aliasByNode") == [("seriesList", "seriesList", True, False), ("nodes", "nodeOrTag", True, True)]
    assert shape("seriesByTag") == [("tagExpressions", "string", True, True)]
    assert shape("aliasSub") == [
        ("seriesList", "seriesList", True, False),
        ("search", "string", True, False),
        ("replace", "string", True, False),
    ]
    assert functions["keepLastValue"]["params"][1]["default"] == math.inf  # written Infinity, read 1e9999
    assert functions["sumSeries"]["group"] == "Combine" and functions["aliasByNode"]["group"] == "Alias"
    grouped = grafana_parse_functions(grafana.get("/functions", {"grouped": "true"}).body.decode())
    assert "sumSeries" in grouped["Combine"]
    assert grafana_parse_functions(grafana.get("/functions/aliasByNode").body.decode())["name"] == "aliasByNode"


def test_version(grafana):
    answer = grafana.get("/version")
    assert answer.status == 200
    version = answer.body.decode()
    assert version == "1.1.8"
    match = re.match(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z\.]+))?", version)  # Grafana's SemVersion
    assert match and (int(match[1]), int(match[2])) >= (1, 1)


# -- mistakes ------------------------------------------------------------------------------------


BAD_RENDERS = {
    "unknown function": ([("target", "noSuchFunction(servers.*.cpu)")], "unknown function"),
    "bad from": ([("target", "servers.*.cpu"), ("from", "yesterdayish")], "from/until"),
    "bad until": ([("target", "servers.*.cpu"), ("until", "-1fortnight")], "from/until"),
    "from after until": ([("target", "servers.*.cpu"), ("from", "now"), ("until", "-1h")], "before"),
    "unknown format": ([("target", "servers.*.cpu"), ("format", "gif")], "format"),
    "syntax error": ([("target", "sumSeries(servers.*.cpu")], "target"),
    "bad tag expression": ([("target", "seriesByTag('host')")], "tag expression"),
    "tag expression matching everything": ([("target", "seriesByTag('host!=x')")], "non-empty"),
    "bad tag regex": ([("target", "seriesByTag('host=~(')")], "regex"),
    "wrong argument type": ([("target", "scale(servers.*.cpu, 'x')")], "scale"),
    "missing argument": ([("target", "aliasSub(servers.*.cpu)")], "aliasSub"),
    "bad option": ([("target", "consolidateBy(servers.*.cpu, 'median')")], "consolidateBy"),
    "bad maxDataPoints": ([("target", "servers.*.cpu"), ("maxDataPoints", "lots")], "maxDataPoints"),
    "bad tz": ([("target", "servers.*.cpu"), ("tz", "Mars/Olympus")], "time zone"),
}


@pytest.mark.parametrize("case", sorted(BAD_RENDERS))
def test_bad_render_is_a_400_with_a_message(grafana, case):
    pairs, words = BAD_RENDERS[case]
    answer = grafana.post_form("/render", js_form([*pairs, ("format", "json")] if case != "unknown format" else pairs))
    assert answer.status == 400, answer.body
    assert words.lower() in answer.json()["error"].lower()


def test_other_bad_requests_are_4xx(grafana):
    assert grafana.post_form("/metrics/find", b"").status == 400
    assert grafana.get("/metrics/find", {"query": "*", "format": "bogus"}).status == 400
    assert grafana.get("/tags/autoComplete/values", {"expr": "name=disk.used"}).status == 400  # no tag
    assert grafana.get("/tags/autoComplete/tags", {"limit": "many"}).status == 400
    assert grafana.get("/tags/findSeries").status == 400
    assert grafana.get("/functions/noSuchFunction").status == 404
    assert grafana.gateway.request("DELETE", "/render").status == 405


# Client mistakes that once answered 500 or never answered (an interval <= 0 looped forever).
NEVER_500 = [
    pytest.param("/render", {"target": "movingAverage(servers.*.cpu, 'xyz')"}, id="movingAverage-bad-interval"),
    pytest.param("/render", {"target": "summarize(servers.*.cpu, '0min')"}, id="summarize-zero-interval"),
    pytest.param("/render", {"target": "hitcount(servers.*.cpu, 0)"}, id="hitcount-zero"),
    pytest.param("/tags/autoComplete/tags", {"expr": "nonsense"}, id="autocomplete-tags-bad-expr"),
    pytest.param("/tags", {"filter": "("}, id="tags-bad-filter"),
    pytest.param(
        "/metrics/find", {"query": "servers.*", "format": "nodelist", "position": "x"}, id="nodelist-bad-position"
    ),
    pytest.param("/render", {"target": "summarize(servers.*.cpu, 'xyz')"}, id="summarize-bad-interval"),
    pytest.param("/tags/autoComplete/values", {"tag": "host", "expr": "nonsense"}, id="autocomplete-values-bad-expr"),
    pytest.param("/tags/findSeries", {"expr": "host=~("}, id="find-series-bad-regex"),
    pytest.param("/render", {"target": "smartSummarize(servers.*.cpu, '-1h')"}, id="smartSummarize-negative-interval"),
    pytest.param("/render", {"target": "summarize(servers.*.cpu, '-1h')"}, id="summarize-negative-interval"),
]


def test_linear_regression_from_epoch_answers_from_roll_ups(grafana):
    """A source range reaching back to 1970 once meant 28M raw buckets a series on the reactor;
    past raw retention it now reads the coarsest roll-up and answers at once."""
    answer = grafana.post_form(
        "/render", js_form([("target", "linearRegression(servers.*.cpu, 0)"), ("from", "-3h"), ("format", "json")])
    )
    assert answer.status == 200, answer.body


@pytest.mark.parametrize("path, params", NEVER_500)
def test_bad_arguments_are_400_never_500(grafana, path, params):
    answer = grafana.post_form(
        path, js_form([*params.items(), ("from", "-3h"), ("format", "json")] if path == "/render" else params.items())
    )
    assert answer.status == 400, answer.body
