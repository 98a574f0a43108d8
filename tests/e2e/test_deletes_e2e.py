"""Deletes through a real gateway process and ``tsgate delete`` (docs/operations.rst), on both stores:
Prometheus's delete_series, the Graphite admin delete, the CLI's dry run, and a delete racing with
ingest and sealing."""

import threading
import time
import urllib.parse
from collections import Counter
from datetime import UTC, datetime

from gateway.http.auth import hash_token
from tests.gatewayproc import metric_value, run_tsgate

MINUTE = 60_000
HOUR = 60 * MINUTE
# Partitions pinned: no waiting for a partition lease another test's gateway on the shared keyspace left behind.
ADMIN = (
    "--enable-admin-api",
    "--downsample-delay",
    "0s",
    "--downsample-interval",
    "1s",
    "--downsample-partitions",
    "0-63",
)


def write(gateway, tenant: str, name: str, tags: dict, timestamps) -> None:
    body = [{"metricName": name, "tags": tags, "ts": ts, "value": float(ts // 1000 % 1000)} for ts in timestamps]
    answer = gateway.post("/api/write", body, headers={"X-Scope-OrgID": tenant})
    assert answer.status == 200, answer.body


def query(gateway, tenant: str, name: str, tags: dict, start_ms: int, end_ms: int, **extra) -> dict[int, float]:
    """{timestamp ms: value} of the series from the native query API."""
    params = [("metricName", name), ("start", str(start_ms)), ("end", str(end_ms)), *extra.items()]
    params += [("tag", f"{k}={v}") for k, v in tags.items()]
    answer = gateway.get("/api/query?" + urllib.parse.urlencode(params), headers={"X-Scope-OrgID": tenant})
    assert answer.status == 200, answer.body
    found = {}
    for series in answer.json():
        for text, value in series["values"].items():
            moment = datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=UTC)
            found[round(moment.timestamp() * 1000)] = value
    return found


def read(gateway, tenant: str, name: str, tags: dict, start_ms: int, end_ms: int) -> list[int]:
    """Raw sample timestamps of the series (ms)."""
    return sorted(query(gateway, tenant, name, tags, start_ms, end_ms, granularity="raw"))


def admin(gateway, tenant: str, path: str, params: list[tuple[str, str]], timeout: float = 30):
    return gateway.post(
        f"{path}?{urllib.parse.urlencode(params)}", b"", headers={"X-Scope-OrgID": tenant}, timeout=timeout
    )


def sealed(gateway, timeout_s: float = 60) -> None:
    """Wait until the gateway's downsampler sealed samples into blocks."""
    deadline = time.monotonic() + timeout_s
    while metric_value(gateway, "tsgate_sealed_samples_total") == 0:
        assert time.monotonic() < deadline, "nothing was sealed"
        time.sleep(0.5)


def past_minutes(hours: int) -> tuple[list[int], int]:
    """One timestamp a minute over the last ``hours`` hours, ending two minutes ago; and now."""
    now = int(time.time() * 1000)
    last = now - now % MINUTE - 2 * MINUTE
    return list(range(last - hours * 60 * MINUTE, last + 1, MINUTE)), now


def rollup_counts(gateway, tenant: str, now: int, end_ms: int) -> dict[int, float]:
    found = query(
        gateway, tenant, "jobs_up", {"job": "x"}, now - 4 * HOUR, end_ms, granularity="5m", aggregator="count"
    )
    return {ts: count for ts, count in found.items() if count}


def test_delete_series_range_then_whole(start_gateway, backend_args, tenant):
    gateway = start_gateway(*backend_args, *ADMIN)
    timestamps, now = past_minutes(3)
    write(gateway, tenant, "jobs_up", {"job": "x", "i": "1"}, timestamps)
    write(gateway, tenant, "jobs_up", {"job": "y", "i": "1"}, timestamps)
    sealed(gateway)
    start, end = timestamps[60], timestamps[120]
    # twice, the second time once the downsampler's rounds are over, as docs/operations.rst says:
    # a seal racing the first delete can write back roll-ups of the range
    for _ in range(2):
        answer = admin(
            gateway,
            tenant,
            "/api/v1/admin/tsdb/delete_series",
            [("match[]", 'jobs_up{job="x"}'), ("start", str(start / 1000)), ("end", str(end / 1000))],
        )
        assert answer.status == 204, answer.body
        time.sleep(3)
    window = (now - 4 * 60 * MINUTE, now)
    assert read(gateway, tenant, "jobs_up", {"job": "x"}, *window) == [t for t in timestamps if not start <= t <= end]
    assert read(gateway, tenant, "jobs_up", {"job": "y"}, *window) == timestamps
    series = gateway.get("/api/v1/series?match[]=jobs_up", headers={"X-Scope-OrgID": tenant}).json()["data"]
    assert len(series) == 2  # x still has samples outside the range

    # the downsampler rolls the cut slots up again from what is left: 5 m counts of the sealed slots
    kept = [t for t in timestamps if not start <= t <= end and t < now - now % HOUR]
    expected = {bucket: float(count) for bucket, count in Counter(t - t % (5 * MINUTE) for t in kept).items()}
    deadline = time.monotonic() + 120
    while (counts := rollup_counts(gateway, tenant, now, now - now % HOUR - 1)) != expected:
        assert time.monotonic() < deadline, sorted(set(counts.items()) ^ set(expected.items()))
        time.sleep(0.5)

    answer = admin(gateway, tenant, "/api/v1/admin/tsdb/delete_series", [("match[]", 'jobs_up{job="x"}')])
    assert answer.status == 204, answer.body
    assert read(gateway, tenant, "jobs_up", {"job": "x"}, *window) == []
    headers = {"X-Scope-OrgID": tenant}
    series = gateway.get("/api/v1/series?match[]=jobs_up", headers=headers).json()["data"]
    assert series == [{"__name__": "jobs_up", "job": "y", "i": "1"}]
    assert gateway.get("/api/v1/label/job/values", headers=headers).json()["data"] == ["y"]
    assert read(gateway, tenant, "jobs_up", {"job": "y"}, *window) == timestamps

    # deleting y, the last series of the metric, takes the metric name and its labels away too
    assert admin(gateway, tenant, "/api/v1/admin/tsdb/delete_series", [("match[]", "jobs_up")]).status == 204
    assert gateway.get("/api/v1/label/__name__/values", headers=headers).json()["data"] == []
    assert gateway.get("/api/v1/labels", headers=headers).json()["data"] == ["__name__"]

    # a deleted series written again (its metadata known to this gateway before) is found again
    write(gateway, tenant, "jobs_up", {"job": "x", "i": "1"}, timestamps[-1:])
    series = gateway.get("/api/v1/series?match[]=jobs_up", headers=headers).json()["data"]
    assert series == [{"__name__": "jobs_up", "job": "x", "i": "1"}]


def test_delete_series_bad_parameters(start_gateway, tenant):
    """Each refused with 400 bad_data naming the problem (one gateway asked each in turn)."""
    gateway = start_gateway(*ADMIN)
    for params, error in [
        ([], "no match[] parameter provided"),
        ([("match[]", "up{")], "invalid parameter"),
        ([("match[]", "rate(up[5m])")], "is not a series selector"),
        ([("match[]", '{job=~".*"}')], "at least one non-empty matcher"),
        ([("match[]", "up"), ("start", "yesterday")], 'invalid parameter "start"'),
        ([("match[]", "up"), ("start", "200"), ("end", "100")], "end timestamp must not be before start time"),
    ]:
        answer = admin(gateway, tenant, "/api/v1/admin/tsdb/delete_series", params)
        assert answer.status == 400, (params, answer.body)
        assert answer.json()["errorType"] == "bad_data" and error in answer.json()["error"], (params, answer.body)


def test_admin_endpoints_off_without_the_flag(start_gateway, tenant):
    gateway = start_gateway()
    write(gateway, tenant, "kept", {"a": "b"}, past_minutes(1)[0])
    answer = admin(gateway, tenant, "/api/v1/admin/tsdb/delete_series", [("match[]", "kept")])
    assert answer.status == 503
    assert answer.json() == {
        "status": "error",
        "errorType": "unavailable",
        "error": "admin APIs disabled; start the gateway with --enable-admin-api",
    }
    assert admin(gateway, tenant, "/admin/graphite/delete", [("path", "kept")]).status == 403
    assert gateway.get("/api/v1/series?match[]=kept", headers={"X-Scope-OrgID": tenant}).json()["data"]


def test_graphite_delete_of_a_glob(start_gateway, backend_args, tenant):
    gateway = start_gateway(*backend_args, *ADMIN)
    timestamps, now = past_minutes(2)
    for path in ("srv.a.cpu", "srv.a.mem", "srv.b.cpu"):
        write(gateway, tenant, path, {}, timestamps)
    sealed(gateway)
    answer = admin(gateway, tenant, "/admin/graphite/delete", [("path", "srv.a.*")])
    assert answer.status == 200, answer.body
    assert answer.json() == {"paths": ["srv.a.cpu", "srv.a.mem"], "removed": 2}
    headers = {"X-Scope-OrgID": tenant}
    found = gateway.get("/metrics/find?query=srv.*", headers=headers).json()
    assert [node["id"] for node in found] == ["srv.b"]
    assert read(gateway, tenant, "srv.a.cpu", {}, now - 3 * 60 * MINUTE, now) == []
    assert read(gateway, tenant, "srv.b.cpu", {}, now - 3 * 60 * MINUTE, now) == timestamps

    # from/until as /render takes them; the branch stays while srv.b.cpu has samples left
    cut = timestamps[-30]
    params = [("path", "srv.b.cpu"), ("from", str(cut // 1000)), ("until", "now")]
    assert admin(gateway, tenant, "/admin/graphite/delete", params).json() == {"paths": ["srv.b.cpu"], "removed": 0}
    assert read(gateway, tenant, "srv.b.cpu", {}, now - 3 * 60 * MINUTE, now) == [t for t in timestamps if t < cut]
    assert [n["id"] for n in gateway.get("/metrics/find?query=srv.*", headers=headers).json()] == ["srv.b"]
    for params, error in [([], "parameter 'path' is required"), ([("path", "x"), ("from", "soon")], "from/until")]:
        answer = admin(gateway, tenant, "/admin/graphite/delete", params)
        assert answer.status == 400 and error in answer.json()["error"], answer.body


def tsgate_delete(store_args: tuple[str, ...], *args: str) -> str:
    return run_tsgate("delete", *store_args, *args, timeout=300)


def test_cli_dry_run_then_delete(start_gateway, backend_args, tenant, tmp_path):
    gateway = start_gateway(*backend_args, *ADMIN)
    store_args = backend_args or ("--data-dir", str(tmp_path / "data"))
    timestamps, now = past_minutes(2)
    write(gateway, tenant, "cli_up", {"job": "x"}, timestamps)
    write(gateway, tenant, "cli_up", {"job": "y"}, timestamps)
    sealed(gateway)
    start, end = timestamps[10], timestamps[29]
    dry = tsgate_delete(
        store_args, "--tenant", tenant, "--match", 'cli_up{job="x"}', "--start", str(start // 1000),
        "--end", str(end // 1000), "--dry-run",
    )  # fmt: skip
    assert dry.splitlines() == [
        'cli_up{job="x"}: 20 samples, 0 histograms',
        "dry run: would delete 20 samples and 0 histograms of 1 series; 0 series would leave every index",
    ]
    window = (now - 3 * 60 * MINUTE, now)
    assert read(gateway, tenant, "cli_up", {"job": "x"}, *window) == timestamps
    done = tsgate_delete(store_args, "--tenant", tenant, "--match", 'cli_up{job="x"}', "--dry-run")
    assert done.splitlines()[-1].endswith(f"would delete {len(timestamps)} samples and 0 histograms of 1 series;"
                                          " 1 series would leave every index")  # fmt: skip
    done = tsgate_delete(store_args, "--tenant", tenant, "--match", 'cli_up{job="x"}')
    assert (
        done.splitlines()[-1]
        == f"deleted {len(timestamps)} samples and 0 histograms of 1 series; 1 series left every index"
    )
    headers = {"X-Scope-OrgID": tenant}
    series = gateway.get("/api/v1/series?match[]=cli_up", headers=headers).json()["data"]
    assert series == [{"__name__": "cli_up", "job": "y"}]
    done = tsgate_delete(store_args, "--tenant", tenant, "--graphite", "nothing.*", "--dry-run")
    assert done.splitlines() == [
        "dry run: would delete 0 samples and 0 histograms of 0 series; 0 series would leave every index"
    ]


def test_delete_racing_with_ingest_and_sealing(start_gateway, backend_args, tenant):
    """Writers keep writing another series and the deleted series (outside the range) while the
    range is deleted again and again and the downsampler seals: every sample outside the range
    stays readable."""
    gateway = start_gateway(*backend_args, *ADMIN)
    timestamps, now = past_minutes(3)
    start, end = timestamps[30], timestamps[150]
    write(gateway, tenant, "race", {"k": "same"}, timestamps)
    write(gateway, tenant, "race", {"k": "other"}, timestamps)
    written = {"same": [t for t in timestamps if not start <= t <= end], "other": list(timestamps)}
    stop = threading.Event()
    failures = []

    def writer():
        step = 0
        while not stop.is_set():
            step += 1
            fresh = int(time.time() * 1000) - step % 7  # distinct timestamps after the range
            try:
                for name in ("same", "other"):
                    write(gateway, tenant, "race", {"k": name}, [fresh])
                    written[name].append(fresh)
            except AssertionError as error:
                failures.append(error)
                return
            time.sleep(0.02)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(4):
            params = [("match[]", 'race{k="same"}'), ("start", str(start / 1000)), ("end", str(end / 1000))]
            answer = admin(gateway, tenant, "/api/v1/admin/tsdb/delete_series", params)
            assert answer.status == 204, answer.body
            time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures
    window = (now - 4 * 60 * MINUTE, int(time.time() * 1000) + MINUTE)
    assert read(gateway, tenant, "race", {"k": "same"}, *window) == sorted(set(written["same"]))
    assert read(gateway, tenant, "race", {"k": "other"}, *window) == sorted(set(written["other"]))


def test_with_an_auth_file_deletes_need_the_admin_role_and_stay_in_its_tenant(start_gateway, tenant, tmp_path):
    lines = []
    for name, roles in (("writer", ["write", "read"]), ("operator", ["admin"])):
        lines += ["[[tokens]]", f'name = "{name}"', f'sha256 = "{hash_token(name + "-token")}"']
        lines += [f'tenant = "{tenant}"', f"roles = {roles}".replace("'", '"'), ""]
    (tmp_path / "auth.toml").write_text("\n".join(lines))
    gateway = start_gateway(*ADMIN, "--auth-file", str(tmp_path / "auth.toml"))
    writer, operator = ({"Authorization": f"Bearer {name}-token"} for name in ("writer", "operator"))
    body = [{"metricName": "secured", "tags": {"a": "b"}, "ts": ts, "value": 1.0} for ts in past_minutes(1)[0]]
    assert gateway.post("/api/write", body, headers=writer).status == 200
    path = "/api/v1/admin/tsdb/delete_series?match[]=secured"
    assert gateway.post(path, b"").status == 401
    assert gateway.post(path, b"", headers=writer).status == 403
    other = gateway.post(path, b"", headers={**operator, "X-Scope-OrgID": tenant + "-other"})
    assert other.status == 403, other.body
    assert gateway.get("/api/v1/series?match[]=secured", headers=writer).json()["data"]
    assert gateway.post(path, b"", headers=operator).status == 204
    assert gateway.get("/api/v1/series?match[]=secured", headers=writer).json()["data"] == []


DELETE_SERIES = 20_000


def test_parallel_deletes_of_every_series_leave_healthz_answering(start_gateway, tenant):
    """Issue 38 item 5: deletes whose selectors match every series of a tenant, sent in
    parallel, froze /healthz for seconds while the serving process matched them. Now each selects
    in a query executor and a tenant has one delete at a time: the others get 429 with Retry-After
    at once, /healthz keeps answering, and the one delete removes every series."""
    gateway = start_gateway(*ADMIN, "--max-series-per-query", str(DELETE_SERIES))
    now_ms = int(time.time() * 1000)
    for first in range(0, DELETE_SERIES, 5000):
        body = [
            {
                "metricName": "many",
                "tags": {"i": str(i), "grp": str(i % 100), "job": "j"},
                "ts": now_ms - MINUTE,
                "value": 1,
            }
            for i in range(first, first + 5000)
        ]
        assert gateway.post("/api/write", body, headers={"X-Scope-OrgID": tenant}, timeout=60).status == 200
    selector = [("match[]", '{i=~".+",grp=~".+",job=~".+"}')]
    healthz: list[tuple[int, float]] = []  # status, seconds
    answers = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.monotonic()
            status = gateway.get("/healthz", timeout=30).status
            healthz.append((status, time.monotonic() - started))
            time.sleep(0.05)

    def delete() -> None:
        # removing 20,000 series takes SQLite 15 s on a quiet 2-core box (30 s before its index
        # questions were asked in batches): a client waits for it
        answers.append(admin(gateway, tenant, "/api/v1/admin/tsdb/delete_series", selector, timeout=300))

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        deletes = [threading.Thread(target=delete) for _ in range(4)]
        for thread in deletes:
            thread.start()
            time.sleep(0.05)
        for thread in deletes:
            thread.join()
    finally:
        done.set()
        prober.join()
    statuses = Counter(answer.status for answer in answers)
    slowest = max(seconds for _, seconds in healthz)
    print(f"deletes answered {dict(statuses)}; /healthz max {slowest * 1000:.0f} ms of {len(healthz)}")
    assert statuses[204] >= 1 and statuses[204] + statuses[429] == 4, [a.body for a in answers]
    for answer in answers:
        if answer.status == 429:
            assert answer.headers["Retry-After"] and "already under way" in answer.json()["error"], answer.body
    assert {status for status, _ in healthz} == {200} and slowest < 1.0, sorted(healthz)[-5:]
    series = gateway.get("/api/v1/series?match[]=many", headers={"X-Scope-OrgID": tenant}, timeout=60)
    assert series.status == 200 and series.json()["data"] == [], series.body[:300]
