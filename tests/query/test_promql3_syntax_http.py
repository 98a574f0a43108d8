"""Prometheus 3's duration expressions and anchored/smoothed modifiers through a real gateway's
Prometheus API: answers, and refusals worded as Prometheus words them."""

import time
import urllib.parse

import pytest

from tests.gatewayproc import GatewayProcess

pytestmark = pytest.mark.slow  # a gateway process

STEP_S = 15
SAMPLES = 40


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A counter ``c`` rising by 1 every 15 s, the last sample at ``gateway.last_s``."""
    gateway = GatewayProcess(tmp_path_factory.mktemp("promql3-syntax")).start()
    first_s = int(time.time()) // STEP_S * STEP_S - STEP_S * SAMPLES
    samples = [
        {"metricName": "c", "tags": {"job": "a"}, "timestamp": (first_s + STEP_S * i) * 1000, "value": i}
        for i in range(SAMPLES)
    ]
    assert gateway.post("/api/write", samples).status == 200
    gateway.last_s = first_s + STEP_S * (SAMPLES - 1)
    yield gateway
    gateway.stop()


def query(gateway, path: str, **params):
    return gateway.get(f"{path}?{urllib.parse.urlencode(params)}")


def test_extended_windows_and_duration_expressions_are_answered(gateway):
    at = gateway.last_s
    # (at - 2m, at]: anchored at the sample 2 m before (31), to the last (39)
    answer = query(gateway, "/api/v1/query", query="increase(c[1m+1m] anchored)", time=at)
    assert answer.status == 200
    assert [s["value"][1] for s in answer.json()["data"]["result"]] == ["8"]
    answer = query(gateway, "/api/v1/query", query="c offset (step() + 30s) smoothed", time=at)
    assert [s["value"][1] for s in answer.json()["data"]["result"]] == ["37"]  # step() is 0 in an instant query
    answer = query(
        gateway, "/api/v1/query_range", query="count_over_time(c[step()*4])", start=at - 30, end=at, step=STEP_S
    )
    assert answer.status == 200
    assert [v for _, v in answer.json()["data"]["result"][0]["values"]] == ["4", "4", "4"]


@pytest.mark.parametrize(
    "text, status, error",
    [
        (
            "deriv(c[1m] smoothed)",
            422,
            "smoothed modifier can only be used with: delta, increase, rate - not with deriv",
        ),
        ("rate(c[5m:1m] anchored)", 400, "parse error: anchored modifier is not supported for subqueries"),
        ("c[1h/0]", 400, "2:6: division by zero"),
        ('c{__tsgate_range_modifier__="anchored"}', 400, "the label name __tsgate_range_modifier__ is reserved"),
    ],
)
def test_refusals_name_the_problem(gateway, text, status, error):
    answer = query(gateway, "/api/v1/query", query=text, time=gateway.last_s)
    assert answer.status == status and error in answer.json()["error"]
