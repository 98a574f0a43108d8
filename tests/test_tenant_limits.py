"""Tenant limits apply to every protocol: the pipeline checks them, each protocol says no its own
way (429 + Retry-After on HTTP, paused connections on carbon TCP, dropped datagrams on UDP)."""

import socket
import time

import pytest

from gateway.limits import RateLimited, TenantLimits
from tests.gatewayproc import metric_value


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_refused_batch_records_nothing_for_any_of_its_tenants():
    clock = FakeClock()
    limits = TenantLimits(10, max_active_series=2, burst_seconds=1, clock=clock)
    limits.admit({"a": (10, {"s1"}), "b": (5, {"s1", "s2"})})
    with pytest.raises(RateLimited) as refused:
        limits.admit({"b": (1, {"s1"}), "a": (1, {"s1"})})
    assert refused.value.limit == "samples_per_second" and refused.value.retry_after_s == 1
    with pytest.raises(RateLimited) as refused:
        limits.admit({"a": (0, {"s1"}), "b": (0, {"s3"})})
    assert refused.value.limit == "active_series"
    clock.now += 1
    limits.admit({"b": (5, {"s1"})})
    limits.admit({"a": (5, {"s2"})})


def test_a_batch_larger_than_the_burst_passes_once_and_leaves_debt():
    clock = FakeClock()
    limits = TenantLimits(10, burst_seconds=2, clock=clock)
    limits.admit({"a": (100, set())})
    with pytest.raises(RateLimited) as refused:
        limits.admit({"a": (1, set())})
    assert refused.value.retry_after_s == 9  # 80 tokens of debt, then 1 more, at 10/s
    clock.now += 8.1
    limits.admit({"a": (1, set())})


def test_active_series_are_forgotten_after_the_window():
    clock = FakeClock()
    limits = TenantLimits(0, max_active_series=1, active_window_s=60, clock=clock)
    limits.admit({"a": (1, {"s1"})})
    with pytest.raises(RateLimited) as refused:
        limits.admit({"a": (1, {"s2"})})
    assert refused.value.retry_after_s == 60
    clock.now += 61
    limits.admit({"a": (1, {"s2"})})
    assert not TenantLimits(0, 0).enabled


def test_a_series_written_again_stays_active_and_the_wait_named_is_at_most_a_minute():
    clock = FakeClock()
    limits = TenantLimits(0, max_active_series=2, active_window_s=600, clock=clock)
    limits.admit({"a": (1, {"s1", "s2"})})
    clock.now += 500
    limits.admit({"a": (1, {"s1"})})
    clock.now += 200  # s2 was last written 700 s ago: no longer active; s1 200 s ago
    limits.admit({"a": (1, {"s3"})})
    with pytest.raises(RateLimited) as refused:
        limits.admit({"a": (1, {"s4"})})
    assert refused.value.retry_after_s == 60  # s1 frees its place in 400 s


def test_an_idle_tenant_saves_up_no_more_than_the_burst():
    clock = FakeClock()
    limits = TenantLimits(10, burst_seconds=1, clock=clock)
    clock.now += 3600
    limits.admit({"a": (10, set())})
    with pytest.raises(RateLimited):
        limits.admit({"a": (1, set())})


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
    assert refused.status == 429 and "active series" in refused.json()["error"]


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
