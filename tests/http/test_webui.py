"""The built-in web page at ``/`` (gateway/http/webui.py), through a real gateway on SQLite: the
routes over HTTP, then the page in a real browser (Debian's chromium and chromedriver, driven
by selenium): explore, query with its graph and table, status, a label value holding markup
shown as text, and the page with ``--auth-file`` credentials.
"""

import base64
import contextlib
import re
import shutil
import tempfile
import time
import urllib.parse

import pytest
from prometheus_client import REGISTRY
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from gateway.core.tenant_activity import TenantActivity
from gateway.http.auth import hash_password, hash_token

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
)
WAIT_S = 30  # the longest any step may take on a loaded machine
HOSTILE = '<script>window.xssRan = 1</script><img src=x onerror="window.xssRan = 1">'
SERIES = {"a": 1.0, "b": 2.0, HOSTILE: 3.0}
BROWSER_HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def write_series(gateway, tenant: str, headers=None) -> int:
    """webui_cpu for three hosts (one named with markup), a point a minute for the 20 minutes
    before now, and a Graphite path; returns that now (epoch seconds)."""
    now_s = int(time.time())
    items = [
        {"metric": "webui_cpu", "tags": {"host": host}, "timestamp": now_s - 60 * age, "value": base + age}
        for host, base in SERIES.items()
        for age in range(1, 21)
    ]
    items += [{"metric": "webui.disk.used", "tags": {}, "timestamp": now_s - 60 * age, "value": 42} for age in (1, 2)]
    answer = gateway.post("/api/put", items, headers={"X-Scope-OrgID": tenant, **(headers or {})})
    assert answer.status == 200, answer.body
    return now_s


# -- the per-tenant figures ------------------------------------------------------------------


def test_tenant_activity_counts_samples_and_forgets_series_past_the_window(tenant):
    now = [1000.0]
    activity = TenantActivity(window_s=1200, prune_every_s=300, clock=lambda: now[0])
    other = f"{tenant}-other"
    activity.record([(tenant, "h1", 0), (tenant, "h2", 1), (tenant, "h1", 2)])
    activity.record([(tenant, "h3", 0), (other, "h1", 1)])  # the native API's items may mix tenants
    assert figures(tenant) == (3, 4) and figures(other) == (1, 1)
    now[0] += 1000
    activity.record([(tenant, "h3", 0)])
    now[0] += 400  # h1 and h2 are 1400 s old, h3 400 s: the prune that is due forgets h1 and h2
    assert activity.prune_if_due()
    assert figures(tenant) == (1, 5) and figures(other) == (0, 1)
    assert not activity.prune_if_due()  # not again before prune_every_s


def figures(tenant: str) -> tuple[float, float]:
    """(active series, samples accepted) of a tenant in this process's metrics."""
    labels = {"tenant": tenant}
    return (
        REGISTRY.get_sample_value("tsgate_tenant_active_series", labels),
        REGISTRY.get_sample_value("tsgate_tenant_samples_accepted_total", labels),
    )


# -- over HTTP --------------------------------------------------------------------------------


def test_root_is_the_json_banner_for_clients_and_the_page_for_browsers(start_gateway):
    gateway = start_gateway()
    for headers in ({}, {"Accept": "application/json"}, {"Accept": "*/*"}):
        answer = gateway.get("/", headers=headers)
        assert answer.status == 200 and answer.headers["Content-Type"] == "application/json", headers
        assert set(answer.json()) == {"name", "version"}
    page = gateway.get("/", headers=BROWSER_HTML)
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert b'<script src="/ui/app.js"' in page.body
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    for path, content_type in (("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")):
        answer = gateway.get(path)
        assert answer.status == 200 and answer.headers["Content-Type"].startswith(content_type), path
        assert len(answer.body) > 1000


def test_status_sums_up_tenants_ingest_rejects_and_the_store(start_gateway, backend_args, tenant):
    gateway = start_gateway(*backend_args)
    write_series(gateway, tenant)
    bad = gateway.post(
        "/api/put", [{"metric": "", "timestamp": int(time.time()), "value": 1}], headers={"X-Scope-OrgID": tenant}
    )
    assert bad.status == 400
    status = gateway.get("/admin/status").json()
    kind = "cassandra" if backend_args else "sqlite"
    assert status["store"] == {"kind": kind, "healthy": True, "error": None}
    redis = {"configured": bool(backend_args), "healthy": bool(backend_args), "error": None, "errors": {}}
    assert status["redis"] == redis
    assert status["uptime_seconds"] > 0 and status["version"]
    (mine,) = [row for row in status["tenants"] if row["tenant"] == tenant]
    assert mine == {"tenant": tenant, "active_series": 4, "samples_accepted": 62}
    assert status["samples_accepted"]["json"] >= 62
    assert any(reject["protocol"] == "json" and reject["count"] >= 1 for reject in status["samples_rejected"])
    assert set(status["downsample"]) >= {"lag_seconds", "settled_slots", "slots_near_expiry"}
    session = gateway.get("/ui/session").json()
    assert session["auth"] is False and tenant in session["tenants"]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def secured(start_gateway, tmp_path, tenant):
    """A gateway with an admin user (basic auth), a reader user and a writer token, all of ``tenant``."""
    auth = tmp_path / "auth.toml"
    auth.write_text(
        f'[[users]]\nname = "ops"\npassword = "{hash_password("ops-password")}"\ntenant = "{tenant}"\n'
        'roles = ["admin"]\n\n'
        f'[[users]]\nname = "viewer"\npassword = "{hash_password("viewer-password")}"\ntenant = "{tenant}"\n'
        'roles = ["read"]\n\n'
        f'[[tokens]]\nname = "writer"\nsha256 = "{hash_token("writer-token")}"\ntenant = "{tenant}"\n'
        'roles = ["write"]\n'
    )
    gateway = start_gateway("--auth-file", str(auth))
    write_series(gateway, tenant, {"Authorization": "Bearer writer-token"})
    return gateway


def test_with_credentials_the_page_asks_for_them_and_shows_only_their_tenant(secured, tenant):
    for path in ("/", "/ui/session", "/admin/status"):
        page = secured.get(path, headers=BROWSER_HTML)
        assert page.status == 401 and page.headers["WWW-Authenticate"] == 'Basic realm="tsgate"', path
    viewer = {"Authorization": basic("viewer", "viewer-password")}
    assert secured.get("/", headers={**BROWSER_HTML, **viewer}).status == 200
    assert secured.get("/ui/app.js").status == 200  # no data in it: public, as /healthz
    session = secured.get("/ui/session", headers=viewer).json()
    assert session == {"auth": True, "user": "viewer", "roles": ["read"], "tenants": [tenant]}
    assert secured.get("/admin/status", headers=viewer).status == 403
    status = secured.get("/admin/status", headers={"Authorization": basic("ops", "ops-password")})
    assert status.status == 200 and tenant in [row["tenant"] for row in status.json()["tenants"]]


# -- in a browser -----------------------------------------------------------------------------


@pytest.fixture
def browser(tmp_path):
    """Headless chromium under chromedriver (Debian's: nothing is downloaded), stopped after the test."""
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*BROWSER_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(WAIT_S)
        driver.set_script_timeout(WAIT_S)
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, condition, what: str):
    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(lambda d: condition(d))
    except TimeoutException:
        message = driver.find_element(By.ID, "message").text
        raise AssertionError(f"{what} did not happen within {WAIT_S}s; the page says: {message!r}") from None


def texts(driver, selector: str) -> list[str]:
    """The text of every element ``selector`` finds, read at once (the page may be rebuilding them)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((element) => element.textContent)", selector
    )


def table_rows(driver, selector: str) -> list[list[str]]:
    """The cells' text of every body row of the table ``selector`` finds, read at once."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map((row) => [...row.cells].map((cell) => cell.textContent))",
        selector,
    )


def series_text(labels: dict[str, str]) -> str:
    """The page's text of a series (app.js seriesText): a name outside PromQL's identifiers quoted
    inside the braces, as Prometheus 3 writes it."""
    name = labels.pop("__name__", "")
    escape = lambda value: value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # noqa: E731
    pairs = [f'{key}="{escape(labels[key])}"' for key in sorted(labels)]
    if name and not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
        return "{" + ", ".join([f'"{escape(name)}"', *pairs]) + "}"
    return name + "{" + ", ".join(pairs) + "}"


def test_explore_query_and_status_in_a_browser(start_gateway, browser, tenant):
    gateway = start_gateway()
    now_s = write_series(gateway, tenant)
    browser.get(f"{gateway.url}/?tenant={tenant}#explore")
    wait_for(browser, lambda d: "webui_cpu" in texts(d, "#metric-list li"), "the metric list")
    assert "webui.disk.used" in texts(browser, "#metric-list li")  # a Graphite path's name as written
    assert Select(browser.find_element(By.ID, "tenant")).first_selected_option.text == tenant

    # Explore: the series of a metric, label values shown as text (the markup is not run).
    browser.find_element(By.CSS_SELECTOR, '#metric-list li[data-metric="webui_cpu"]').click()
    wait_for(browser, lambda d: len(texts(d, "#series-table tbody tr")) == 3, "the series table")
    assert sorted(texts(browser, "#series-table tbody td")) == sorted(SERIES)
    assert browser.find_elements(By.CSS_SELECTOR, "#series-table img, #series-table script") == []
    browser.find_element(By.CSS_SELECTOR, '#label-list li[data-label="host"]').click()
    wait_for(browser, lambda d: sorted(texts(d, "#label-values li")) == sorted(SERIES), "the label values")
    browser.execute_script(
        "[...document.querySelectorAll('#label-values li')].find((li) => li.dataset.value === arguments[0]).click()",
        HOSTILE,
    )
    wait_for(browser, lambda d: len(table_rows(d, "#series-table")) == 1, "the series of a label value")
    assert table_rows(browser, "#series-table") == [[HOSTILE]]
    wait_for(browser, lambda d: "webui/" in texts(d, "#graphite-tree li"), "the Graphite tree")
    # A dotted name is the same name on the Prometheus API: its series, quoted as Prometheus 3 does.
    browser.find_element(By.CSS_SELECTOR, '#metric-list li[data-metric="webui.disk.used"]').click()
    wait_for(browser, lambda d: "webui.disk.used: 1 series" in texts(d, "#explore-title"), "the dotted metric's series")

    # Query: a fixed window, so the test can ask the API the same question.
    browser.find_element(By.ID, "tab-query").click()
    browser.find_element(By.ID, "query-expr").send_keys("webui_cpu")
    browser.execute_script(
        "const end = new Date(arguments[0] * 1000);"
        "const local = new Date(end.getTime() - end.getTimezoneOffset() * 60000);"
        "document.getElementById('query-end').value = local.toISOString().slice(0, 19);",
        now_s,
    )
    browser.find_element(By.ID, "query-run").click()
    wait_for(browser, lambda d: len(texts(d, "#query-table tbody tr")) == 3, "the query table")
    drawn = browser.find_elements(By.CSS_SELECTOR, "#query-chart g.series")
    assert len(drawn) == 3
    assert all(int(group.get_attribute("data-points")) > 5 for group in drawn)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#query-chart path.series-line")) == 3
    step = round(3600 / 250)
    params = urllib.parse.urlencode({"query": "webui_cpu", "start": now_s - 3600, "end": now_s, "step": step})
    answer = gateway.get(f"/api/v1/query_range?{params}", headers={"X-Scope-OrgID": tenant}).json()["data"]["result"]
    expected = sorted([series_text(dict(s["metric"])), str(len(s["values"])), s["values"][-1][1]] for s in answer)
    shown = sorted(cells[:3] for cells in table_rows(browser, "#query-table"))
    assert shown == expected and len(expected) == 3
    assert series_text({"__name__": "webui_cpu", "host": HOSTILE}) in texts(browser, "#query-legend li")
    assert browser.find_elements(By.CSS_SELECTOR, "#query-legend img, #query-table img") == []

    # the time axis ticks on round times: a 1 h window every 10 minutes
    ticks = [text for text in texts(browser, "#query-chart .axis text") if ":" in text]
    assert len(ticks) >= 5 and all(int(text[-2:]) % 10 == 0 for text in ticks), ticks

    # A query that does not parse: the API's error is shown, the last answer is not left under it.
    browser.find_element(By.ID, "query-expr").send_keys(" +")
    browser.find_element(By.ID, "query-run").click()
    wait_for(browser, lambda d: "400" in d.find_element(By.ID, "message").text, "the parse error")
    assert table_rows(browser, "#query-table") == []
    assert browser.find_elements(By.CSS_SELECTOR, "#query-chart") == []

    # A Graphite leaf from the tree, as a target.
    browser.find_element(By.ID, "tab-explore").click()
    wait_for(browser, lambda d: "webui/" in texts(d, "#graphite-tree > li"), "the Graphite tree")
    browser.find_element(By.CSS_SELECTOR, '#graphite-tree li[data-path="webui"]').click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'li[data-path="webui.disk"]'), "a branch opened")
    browser.find_element(By.CSS_SELECTOR, 'li[data-path="webui.disk"]').click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'li[data-path="webui.disk.used"]'), "a leaf")
    browser.find_element(By.CSS_SELECTOR, 'li[data-path="webui.disk.used"]').click()
    wait_for(browser, lambda d: texts(d, "#query-table tbody td")[:1] == ["webui.disk.used"], "the Graphite answer")
    assert texts(browser, "#query-table tbody td")[1:3] == ["2", "42"]
    assert browser.find_element(By.ID, "query-kind").get_attribute("value") == "graphite"

    # Status: the tenant with its active series and samples.
    browser.find_element(By.ID, "tab-status").click()
    wait_for(browser, lambda d: tenant in texts(d, "#status-tenants tbody td"), "the tenant in the status view")
    (cells,) = [cells for cells in table_rows(browser, "#status-tenants") if cells[0] == tenant]
    assert cells[1] == "4" and int(cells[2]) == 62, cells
    assert "json" in texts(browser, "#status-ingest tbody td")
    assert "sqlite: healthy" in browser.find_element(By.ID, "status-summary").text
    # its cardinality over the last day: 4 series, webui_cpu the largest metric, host the largest label
    wait_for(browser, lambda d: table_rows(d, "#status-card-metrics"), "the cardinality tables")
    assert table_rows(browser, "#status-card-metrics") == [["webui_cpu", "3"], ["webui.disk.used", "1"]]
    assert table_rows(browser, "#status-card-labels")[:2] == [["host", "3"], ["__name__", "2"]]
    assert ["__name__=webui_cpu", "3"] in table_rows(browser, "#status-card-pairs")
    assert [f"host={HOSTILE}", "1"] in table_rows(browser, "#status-card-pairs")
    assert browser.find_element(By.ID, "status-cardinality-summary").text.startswith("4 series")
    assert browser.execute_script("return window.xssRan") is None


def test_the_page_with_credentials_in_a_browser(secured, browser, tenant):
    """The browser answers the page's 401 with the user and password (given in the URL here, typed
    into its login prompt by a person), keeps them, and sends them with every API call of the page."""
    browser.get(secured.url.replace("http://", "http://viewer:viewer-password@") + "/#explore")
    wait_for(browser, lambda d: "webui_cpu" in texts(d, "#metric-list li"), "the metric list")
    assert texts(browser, "#tenant option") == [tenant]
    assert browser.find_element(By.ID, "who").text == "viewer (read)"
    browser.find_element(By.ID, "tab-status").click()
    wait_for(browser, lambda d: "admin role" in d.find_element(By.ID, "message").text, "the refusal of the status view")
