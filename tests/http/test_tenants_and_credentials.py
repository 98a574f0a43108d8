"""One tenant rule for every HTTP API, and ``--auth-file`` credentials, through a real gateway.

Without credentials the X-Scope-OrgID / X-Tenant header a trusted proxy sets always wins, and a
parameter or body naming another tenant is refused (400), never a silent switch. With
credentials the tenant comes from the credential alone, roles gate the endpoints, and the real
Prometheus 2.42 writes with basic auth and reads with a bearer token.
"""

import base64
import http.client
import json
import subprocess
import sys
import time
import urllib.parse

import pytest

from gateway.http.auth import hash_password, hash_token, verify_password
from tests.gatewayproc import REPO
from tests.prometheusproc import PrometheusProcess

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def now_s() -> int:
    """The clock, read when a request is made (a module-level moment goes stale in a long run)."""
    return int(time.time())


def put(gateway, metric: str, value: float, headers=None, path="/api/put", tags=None):
    body = [
        {"metric": metric, "timestamp": now_s() - 60, "value": value, "tags": {"host": "h1"} if tags is None else tags}
    ]
    return gateway.post(path, body, headers=headers or {})


def query(gateway, metric: str, headers=None, params=""):
    now = now_s()
    path = f"/api/query?metricName={metric}&start={now - 3600}&end={now + 60}&granularity=raw{params}"
    return gateway.get(path, headers=headers or {})


def values_of(answer) -> list[float]:
    assert answer.status == 200, answer.body
    return [value for series in answer.json() for value in series["values"].values()]


# -- without credentials: the header wins -----------------------------------------------------


@pytest.fixture
def open_gateway(start_gateway):
    return start_gateway()


def test_the_header_tenant_is_used_and_a_disagreeing_parameter_is_refused(open_gateway, tenant):
    header = {"X-Scope-OrgID": tenant}
    assert put(open_gateway, "spoof_cpu", 1.0, header).status == 200
    assert values_of(query(open_gateway, "spoof_cpu", header)) == [1.0]
    assert values_of(query(open_gateway, "spoof_cpu", {"X-Tenant": tenant})) == [1.0]
    for params in ("&tenant=other", ";tenant=other", "&x=1;tenant=other"):
        answer = query(open_gateway, "spoof_cpu", header, params)
        assert answer.status == 400, (params, answer.body)
        assert "differs from the tenant header" in answer.json()["error"]
    assert put(open_gateway, "spoof_cpu", 2.0, header, "/api/put?tenant=other").status == 400
    assert values_of(query(open_gateway, "spoof_cpu", header, f"&tenant={tenant}")) == [1.0]


def test_two_tenant_headers_that_disagree_are_refused(open_gateway, tenant):
    answer = query(open_gateway, "spoof_cpu", {"X-Scope-OrgID": tenant, "X-Tenant": "other"})
    assert answer.status == 400
    assert "different tenants" in answer.json()["error"]


def raw_get(gateway, path: str, headers: list[tuple[str, str]]):
    """GET with headers as given, repeats included (urllib keeps one of each); status and error."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        connection.putrequest("GET", path)
        for name, value in headers:
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        document = json.loads(answer.read())
        return answer.status, document.get("error", "") if isinstance(document, dict) else ""
    finally:
        connection.close()


@pytest.mark.parametrize("header", ["X-Scope-OrgID", "X-Tenant"])
def test_a_tenant_header_repeated_with_two_tenants_is_refused(open_gateway, tenant, header):
    path = f"/api/query?metricName=spoof_cpu&start={now_s() - 3600}&end={now_s() + 60}"
    status, error = raw_get(open_gateway, path, [(header, tenant), (header, "other")])
    assert status == 400 and f"the {header} header names 2 different tenants" in error, (status, error)
    for headers in ([(header, tenant)], [(header, tenant), (header, tenant)]):
        status, error = raw_get(open_gateway, path, headers)
        assert status == 200, error


def test_a_tenant_parameter_repeated_with_two_tenants_is_refused(open_gateway, tenant):
    assert put(open_gateway, "twice_cpu", 1.0, path=f"/api/put?tenant={tenant}").status == 200
    for params in (f"&tenant={tenant}&tenant=other", f"&tenant=other;tenant={tenant}"):
        answer = query(open_gateway, "twice_cpu", params=params)
        assert answer.status == 400 and "tenant parameter names 2 different tenants" in answer.json()["error"], params
    for params in (f"&tenant={tenant}", f"&tenant={tenant}&tenant={tenant}"):
        assert values_of(query(open_gateway, "twice_cpu", params=params)) == [1.0], params
    form = {"target": "twice.cpu", "format": "json", "from": "-1h", "tenant": tenant}
    answer = open_gateway.post("/render?tenant=other", urllib.parse.urlencode(form).encode(), headers=FORM)
    assert answer.status == 400 and "tenant parameter names 2 different tenants" in answer.json()["error"]
    body = urllib.parse.urlencode([*form.items(), ("tenant", "other")]).encode()
    assert open_gateway.post("/render", body, headers=FORM).status == 400
    for url in ("/render", f"/render?tenant={tenant}"):  # promtool repeats its URL's tenant in the form
        assert open_gateway.post(url, urllib.parse.urlencode(form).encode(), headers=FORM).status == 200, url


def test_a_render_form_field_cannot_switch_tenant(open_gateway, tenant):
    header = {"X-Scope-OrgID": tenant, **FORM}
    body = urllib.parse.urlencode({"target": "spoof.cpu", "format": "json", "from": "-1h", "tenant": "other"}).encode()
    answer = open_gateway.post("/render", body, headers=header)
    assert answer.status == 400, answer.body
    body = urllib.parse.urlencode({"target": "spoof.cpu", "format": "json", "from": "-1h", "tenant": tenant}).encode()
    assert open_gateway.post("/render", body, headers=header).status == 200


def test_a_write_item_naming_another_tenant_than_the_header_is_rejected(open_gateway, tenant):
    item = {"tenant": "other", "metricName": "spoof_mem", "tags": {}, "ts": now_s() - 60, "value": 5.0}
    good = {**item, "tenant": tenant, "value": 6.0}
    answer = open_gateway.post("/api/write", [item, good], headers={"X-Scope-OrgID": tenant})
    assert answer.status == 400
    assert answer.json()["accepted"] == 1 and answer.json()["rejected"][0]["field"] == "tenant"
    assert values_of(query(open_gateway, "spoof_mem", {"X-Scope-OrgID": tenant})) == [6.0]
    assert values_of(query(open_gateway, "spoof_mem", {"X-Scope-OrgID": "other"})) == []


def test_the_parameter_still_names_the_tenant_without_a_header(open_gateway, tenant):
    assert put(open_gateway, "param_cpu", 3.0, path=f"/api/put?tenant={tenant}").status == 200
    assert values_of(query(open_gateway, "param_cpu", params=f"&tenant={tenant}")) == [3.0]


# -- with credentials -------------------------------------------------------------------------

TOKENS = {
    "writer-token-abc": ("writer", ["write"]),
    "reader-token-def": ("reader", ["read"]),
    "admin-token-ghi": ("admin", ["admin"]),
}
USERS = {"grafana": ("grafana-password", ["read"]), "prometheus": ("prom-password", ["write", "read"])}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def auth_file(tmp_path, tenant):
    lines = []
    for token, (name, roles) in TOKENS.items():
        lines += [
            "[[tokens]]",
            f'name = "{name}"',
            f'sha256 = "{hash_token(token)}"',
            f'tenant = "{tenant}"',
            f"roles = {roles}",
            "",
        ]
    for user, (password, roles) in USERS.items():
        lines += [
            "[[users]]",
            f'name = "{user}"',
            f'password = "{hash_password(password)}"',
            f'tenant = "{tenant}"',
            f"roles = {roles}",
            "",
        ]
    path = tmp_path / "auth.toml"
    path.write_text("\n".join(lines).replace("'", '"'))
    return path


@pytest.fixture
def secured(start_gateway, backend_args, auth_file):
    return start_gateway(*backend_args, "--auth-file", str(auth_file))


def test_every_endpoint_but_healthz_needs_a_credential(secured):
    assert secured.get("/healthz").status == 200
    for path in (
        "/",
        "/metrics",
        "/api/query?metricName=x",
        "/render?target=a.b",
        "/metrics/find?query=*",
        "/tags",
        "/api/metadata/tenants",
        "/api/v1/metadata?metric=up",
        "/nowhere",
    ):
        answer = secured.get(path)
        assert answer.status == 401, (path, answer.status)
        assert answer.headers["WWW-Authenticate"] == 'Basic realm="tsgate"'
    for headers in (
        bearer("not-a-token"),
        basic("grafana", "wrong"),
        basic("nobody", "x"),
        {"Authorization": "Digest x"},
        {"Authorization": "Basic %%%"},
    ):
        assert secured.get("/render?target=a.b", headers=headers).status == 401, headers
    assert secured.post("/api/put", [], headers={}).status == 401


def test_the_tenant_comes_from_the_credential_and_roles_gate_endpoints(secured, tenant):
    assert put(secured, "secured_cpu", 7.0, bearer("writer-token-abc")).status == 200
    assert values_of(query(secured, "secured_cpu", bearer("reader-token-def"))) == [7.0]
    assert values_of(query(secured, "secured_cpu", basic("grafana", "grafana-password"))) == [7.0]
    assert query(secured, "secured_cpu", bearer("writer-token-abc")).status == 403
    assert put(secured, "secured_cpu", 8.0, bearer("reader-token-def")).status == 403
    spoofed = {**bearer("reader-token-def"), "X-Scope-OrgID": "other"}
    answer = query(secured, "secured_cpu", spoofed)
    assert answer.status == 403 and "is for tenant" in answer.json()["error"]
    assert query(secured, "secured_cpu", bearer("reader-token-def"), "&tenant=other").status == 403
    assert values_of(query(secured, "secured_cpu", {**bearer("reader-token-def"), "X-Scope-OrgID": tenant})) == [7.0]
    assert secured.get("/api/metadata/tenants", headers=bearer("reader-token-def")).status == 403
    assert tenant in secured.get("/api/metadata/tenants", headers=bearer("admin-token-ghi")).json()
    assert secured.get("/metrics", headers=bearer("admin-token-ghi")).status == 200
    assert secured.get("/metrics", headers=bearer("reader-token-def")).status == 403


def test_grafana_requests_with_basic_auth(secured, tenant):
    """The shapes Grafana's Graphite data source sends (see test_grafana_replay), with its basic auth."""
    assert put(secured, "grafana.cpu", 4.0, bearer("writer-token-abc"), tags={}).status == 200
    credential = basic("grafana", "grafana-password")
    body = urllib.parse.urlencode(
        {"target": "grafana.cpu", "format": "json", "from": "-1h", "until": "now", "maxDataPoints": 100}
    )
    answer = secured.post("/render", body.encode(), headers={**credential, **FORM})
    assert answer.status == 200
    assert [v for v, _ in answer.json()[0]["datapoints"] if v is not None] == [4.0]
    assert secured.get("/metrics/find?query=*", headers=credential).json()[0]["text"] == "grafana"
    assert secured.get("/tags/autoComplete/tags?expr=name%3Dgrafana.cpu", headers=credential).status == 200
    assert secured.get("/version", headers=credential).status == 200
    health = urllib.parse.urlencode(
        {"target": "constantLine(100)", "format": "json", "from": "-1h", "maxDataPoints": 100}
    )
    assert secured.post("/render", health.encode(), headers={**credential, **FORM}).status == 200


WRITER = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs: [{targets: ["127.0.0.1:SELF_PORT"]}]
remote_write:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/write
    basic_auth: {username: prometheus, password: prom-password}
    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s}
"""

READER = """
global:
  scrape_interval: 1m
remote_read:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/read
    authorization: {credentials: reader-token-def}
    read_recent: true
"""


def test_real_prometheus_writes_with_basic_auth_and_reads_with_a_bearer_token(secured, tmp_path, tenant):
    writer = PrometheusProcess(tmp_path / "writer", WRITER.replace("GATEWAY_PORT", str(secured.port))).start()
    reader = PrometheusProcess(tmp_path / "reader", READER.replace("GATEWAY_PORT", str(secured.port))).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            result = reader.api("/api/v1/query", query='up{job="prometheus"}')["data"]["result"]
            if result or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert result and result[0]["value"][1] == "1", result
        names = secured.get("/api/metadata/metricNames", headers=bearer("reader-token-def")).json()
        assert "up" in names
    finally:
        writer.stop()
        reader.stop()


# -- the auth file and its CLI ----------------------------------------------------------------


def tsgate(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.slow
def test_the_cli_hashes_secrets_for_the_auth_file():
    """Each prints the auth-file line to paste."""
    token = tsgate("auth", "hash-token", stdin="s3cret\n")
    assert token.returncode == 0 and token.stdout == f'sha256 = "{hash_token("s3cret")}"\n'
    password = tsgate("auth", "hash-password", stdin="hunter2\n")
    key, equals, value = password.stdout.strip().partition(" = ")
    assert password.returncode == 0 and key == "password" and equals
    assert verify_password("hunter2", value.strip('"')) and not verify_password("hunter3", value.strip('"'))
    assert tsgate("auth", "hash-token", stdin="").returncode == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, problem",
    [
        ("[[users]]\nname='a'\npassword='clear-text'\ntenant='t'\nroles=['read']\n", "not a hash"),
        ("[[tokens]]\nname='a'\nsha256='abc'\ntenant='t'\nroles=['read']\n", "sha256 must be"),
        (f"[[tokens]]\nname='a'\nsha256='{'0' * 64}'\ntenant='t'\nroles=['root']\n", "roles must be"),
        (f"[[tokens]]\nname='a'\nsha256='{'0' * 64}'\ntenant='a b'\nroles=['read']\n", "tenant"),
        ("", "no [[tokens]]"),
        ("[[tokens", "auth.toml"),
    ],
)
def test_a_bad_auth_file_stops_the_start_with_its_reason(tmp_path, text, problem):
    path = tmp_path / "auth.toml"
    path.write_text(text)
    result = tsgate("serve", "--auth-file", str(path), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert problem in result.stderr
