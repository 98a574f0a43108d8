"""Tenant limits apply to every protocol: the pipeline checks them, each protocol says no its own
way (429 + Retry-After on HTTP, paused connections on carbon TCP, dropped datagrams on UDP)."""

import socket
import time

import pytest

from gateway.ingest.limits import RateLimited, TenantLimits
from protocols.prometheus import WriteSeries, encode_write_request_v1
from tests.gatewayproc import metric_value


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_batch_over_the_rate_records_nothing_for_any_of_its_tenants():
    clock = FakeClock()
    limits = TenantLimits(10, max_active_series=2, burst_seconds=1, clock=clock)
    assert limits.admit({"a": {"s1": 10}, "b": {"s1": 3, "s2": 2}}) == {}
    with pytest.raises(RateLimited) as refused:
        limits.admit({"b": {"s1": 1}, "a": {"s2": 1}})
    assert refused.value.limit == "samples_per_second" and refused.value.retry_after_s == 1
    clock.now += 1
    assert limits.admit({"a": {"s3": 1}}) == {}  # s2 was not recorded by the refused batch: s3 fits
    assert limits.admit({"a": {"s2": 1}}) == {"a": {"s2"}}


def test_only_the_new_series_beyond_the_active_limit_are_refused_and_they_cost_no_tokens():
    clock = FakeClock()
    limits = TenantLimits(10, max_active_series=3, burst_seconds=1, clock=clock)
    assert limits.admit({"a": {"s1": 1, "s2": 1}}) == {}
    assert limits.admit({"a": {"s3": 1, "s1": 1, "s4": 5, "s2": 1, "s5": 1}, "b": {"s4": 1}}) == {"a": {"s4", "s5"}}
    limits.admit({"a": {"s1": 5}})  # 2 + 3 + 5 tokens: s4 and s5 took none
    with pytest.raises(RateLimited):
        limits.admit({"a": {"s1": 1}})


def test_a_batch_larger_than_the_burst_passes_once_and_leaves_debt():
    clock = FakeClock()
    limits = TenantLimits(10, burst_seconds=2, clock=clock)
    limits.admit({"a": {"": 100}})
    with pytest.raises(RateLimited) as refused:
        limits.admit({"a": {"": 1}})
    assert refused.value.retry_after_s == 9  # 80 tokens of debt, then 1 more, at 10/s
    clock.now += 8.1
    limits.admit({"a": {"": 1}})


def test_active_series_are_forgotten_after_the_window():
    clock = FakeClock()
    limits = TenantLimits(0, max_active_series=1, active_window_s=60, clock=clock)
    assert limits.admit({"a": {"s1": 1}}) == {}
    assert limits.admit({"a": {"s2": 1}}) == {"a": {"s2"}}
    clock.now += 61
    assert limits.admit({"a": {"s2": 1}}) == {}
    assert not TenantLimits(0, 0).enabled


def test_a_series_written_again_stays_active():
    clock = FakeClock()
    limits = TenantLimits(0, max_active_series=2, active_window_s=600, clock=clock)
    limits.admit({"a": {"s1": 1, "s2": 1}})
    clock.now += 500
    limits.admit({"a": {"s1": 1}})
    clock.now += 200  # s2 was last written 700 s ago: no longer active; s1 200 s ago
    assert limits.admit({"a": {"s3": 1}}) == {}
    assert limits.admit({"a": {"s4": 1, "s1": 1}}) == {"a": {"s4"}}


def test_an_idle_tenant_saves_up_no_more_than_the_burst():
    clock = FakeClock()
    limits = TenantLimits(10, burst_seconds=1, clock=clock)
    clock.now += 3600
    limits.admit({"a": {"": 10}})
    with pytest.raises(RateLimited):
        limits.admit({"a": {"": 1}})


@pytest.fixture
def limited(start_gateway, tenant):
    return start_gateway(
        "--tenant-max-samples-per-second", "50", "--tenant-max-active-series", "20", "--graphite-tenant", tenant
    )


def test_json_and_put_answer_429_over_the_rate(limited, tenant):
    now = int(time.time())
    batch = [{"metricName": "limited_json", "tags": {}, "ts": now - 300 + i, "value": i} for i in range(300)]
    headers = {"X-Scope-OrgID": tenant}
    assert limited.post("/api/write", batch, headers=headers).status == 200
    refused = limited.post("/api/write", batch[:10], headers=headers)
    assert refused.status == 429 and "samples/s" in refused.json()["error"] and int(refused.headers["Retry-After"]) >= 1
    put = [{"metric": "limited_put", "timestamp": now - 10, "value": 1}]
    assert limited.post("/api/put", put, headers=headers).status == 429
    assert limited.post("/api/put", put, headers={"X-Scope-OrgID": tenant + "-other"}).status == 200
    wide = [{"metric": "limited_wide", "tags": {"i": str(i)}, "timestamp": now - 10, "value": 1} for i in range(21)]
    refused = limited.post("/api/put", wide, headers={"X-Scope-OrgID": tenant + "-wide"})
    assert refused.status == 400 and refused.json()["accepted"] == 20
    assert [(r["index"], r["field"]) for r in refused.json()["rejected"]] == [(20, "series")]
    assert "active series (--tenant-max-active-series)" in refused.json()["rejected"][0]["error"]


def test_carbon_is_paused_over_the_rate_and_loses_nothing(limited, tenant):
    """Two bursts of 300 lines at 50 samples/s: the second waits for the bucket (TCP reading
    paused meanwhile), datagrams sent during the wait are dropped and counted, and every TCP
    line is stored in the end."""
    start = int(time.time()) - 900
    lines = [f"limited.carbon {i} {start + i}\n".encode() for i in range(600)]
    with socket.create_connection(("127.0.0.1", limited.graphite_port)) as sender:
        sender.sendall(b"".join(lines[:300]))
        time.sleep(0.5)
        sender.sendall(b"".join(lines[300:]))
        deadline = time.monotonic() + 10
        while metric_value(limited, 'tsgate_rate_limited_requests_total{limit="samples_per_second"}') < 1:
            assert time.monotonic() < deadline, limited.log()
            time.sleep(0.1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(f"limited.udp 1 {start}\n".encode(), ("127.0.0.1", limited.graphite_port))
        deadline = time.monotonic() + 30
        query = f"/api/query?metricName=limited.carbon&start={start - 1}&end={start + 700}&granularity=raw"
        while True:
            stored = limited.get(query, headers={"X-Scope-OrgID": tenant}).json()
            count = len(stored[0]["values"]) if stored else 0
            if count == 600 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert count == 600
    assert metric_value(limited, "tsgate_graphite_backpressure_total") >= 1
    assert metric_value(limited, "tsgate_graphite_udp_dropped_samples_total") == 1


def stored_values(gateway, tenant: str, name: str, start: int) -> int:
    query = f"/api/query?metricName={name}&start={start - 1}&end={start + 700}&granularity=raw"
    answer = gateway.get(query, headers={"X-Scope-OrgID": tenant}).json()
    return len(answer[0]["values"]) if answer else 0


def test_new_series_over_the_active_limit_are_refused_alone_on_carbon_and_remote_write(start_gateway, tenant):
    """A carbon batch that crosses --tenant-max-active-series writes its existing series at once
    (no connection paused, later lines flow) and refuses the new ones, counted and logged;
    remote write answers 400 naming them and writes the rest."""
    gateway = start_gateway("--tenant-max-active-series", "5", "--graphite-tenant", tenant)
    start = int(time.time()) - 600
    with socket.create_connection(("127.0.0.1", gateway.graphite_port)) as sender:
        sender.sendall(b"".join(f"active.{i} 1 {start}\n".encode() for i in range(5)))
        deadline = time.monotonic() + 30
        while stored_values(gateway, tenant, "active.4", start) < 1:
            assert time.monotonic() < deadline, gateway.log()
            time.sleep(0.2)
        sender.sendall(b"".join(f"active.{i} 2 {start + 60}\n".encode() for i in range(8)))
        sender.sendall(b"".join(f"active.{i} 3 {start + 120}\n".encode() for i in range(5)))
        deadline = time.monotonic() + 30
        while sum(stored_values(gateway, tenant, f"active.{i}", start) for i in range(5)) < 15:
            assert time.monotonic() < deadline, gateway.log()
            time.sleep(0.2)
    assert [stored_values(gateway, tenant, f"active.{i}", start) for i in range(8)] == [3] * 5 + [0] * 3
    assert metric_value(gateway, "tsgate_graphite_backpressure_total") == 0
    refused = 'tsgate_samples_rejected_total{protocol="graphite_plaintext",reason="max_active_series"}'
    assert metric_value(gateway, refused) == 3
    assert "max_active_series" in gateway.log()

    series = [WriteSeries({"__name__": "active_new"}, [(start * 1000 + 180_000, 4.0)])]
    series += [WriteSeries({"__name__": f"active.{i}"}, [(start * 1000 + 180_000, 4.0)]) for i in range(5)]
    answer = gateway.post(
        "/api/v1/write",
        encode_write_request_v1(series),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": tenant},
    )
    assert answer.status == 400, answer.body
    assert b"1 of 6 samples rejected: series: a new series over the tenant's limit of 5 active series" in answer.body
    assert [stored_values(gateway, tenant, f"active.{i}", start) for i in range(5)] == [4] * 5
    assert stored_values(gateway, tenant, "active_new", start) == 0
