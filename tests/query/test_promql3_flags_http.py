"""Prometheus 3's experimental language behind its feature flags, through a real gateway's
Prometheus API: the trim operators, the fill modifiers, info() and histogram_quantiles(), and
refusals worded as Prometheus words them."""

import time
import urllib.parse

import pytest

from protocols import prometheus
from protocols.prometheus import WriteHistogram, WriteSeries
from tests.gatewayproc import GatewayProcess
from tests.protocols.test_prometheus_protocol import histogram

pytestmark = pytest.mark.slow  # a gateway process


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """At ``gateway.at_s``: ``a{k="1"}`` 1, ``a{k="2"}`` 2, ``b{k="1"}`` 10; ``up`` with its
    ``target_info``; ``lat``, a native histogram of 1 observation in the zero bucket, 1 in
    (0.5, 1] and 1 in (1, 2]."""
    gateway = GatewayProcess(tmp_path_factory.mktemp("promql3-flags")).start()
    at_ms = int(time.time()) * 1000 - 60_000
    target = {"instance": "host:9100", "job": "node"}
    series = [
        WriteSeries({"__name__": "a", "k": "1"}, [(at_ms, 1.0)]),
        WriteSeries({"__name__": "a", "k": "2"}, [(at_ms, 2.0)]),
        WriteSeries({"__name__": "b", "k": "1"}, [(at_ms, 10.0)]),
        WriteSeries({"__name__": "up", **target}, [(at_ms, 1.0)]),
        WriteSeries({"__name__": "target_info", **target, "version": "1.2"}, [(at_ms, 1.0)]),
        WriteSeries({"__name__": "lat"}, histograms=[WriteHistogram(at_ms, histogram(timestamp=at_ms))]),
    ]
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    assert gateway.post("/api/v1/write", prometheus.encode_write_request_v1(series), headers=headers).status == 204
    gateway.at_s = at_ms // 1000
    yield gateway
    gateway.stop()


def instant(gateway, text: str):
    answer = gateway.get(f"/api/v1/query?{urllib.parse.urlencode({'query': text, 'time': gateway.at_s})}")
    return answer.status, answer.json()


def values(gateway, text: str) -> dict:
    status, document = instant(gateway, text)
    assert status == 200, document
    return {tuple(sorted(s["metric"].items())): s["value"][1] for s in document["data"]["result"]}


def test_trim_operators_keep_the_observations_on_one_side(gateway):
    assert values(gateway, "histogram_count(lat </ 1)") == {(): "2"}  # the zero bucket and (0.5, 1]
    assert values(gateway, "histogram_count(lat >/ 1)") == {(): "1"}  # (1, 2]
    status, document = instant(gateway, "lat >/ 1")
    assert [s["metric"] for s in document["data"]["result"]] == [{"__name__": "lat"}]  # the name is kept


def test_fill_modifiers_stand_in_for_a_missing_partner(gateway):
    assert values(gateway, "a + b") == {(("k", "1"),): "11"}
    assert values(gateway, "a + fill_right(100) b") == {(("k", "1"),): "11", (("k", "2"),): "102"}
    assert values(gateway, "b - fill(0) a") == {(("k", "1"),): "9", (("k", "2"),): "-2"}


def test_info_adds_the_data_labels_of_target_info(gateway):
    labels = {"__name__": "up", "instance": "host:9100", "job": "node", "version": "1.2"}
    assert values(gateway, "info(up)") == {tuple(sorted(labels.items())): "1"}
    assert values(gateway, 'info(up, {version=~".*"})') == {tuple(sorted(labels.items())): "1"}


def test_histogram_quantiles_labels_each_quantile(gateway):
    answer = values(gateway, 'histogram_quantiles(lat, "q", 0.5, 1)')
    assert sorted(answer) == [(("q", "0.5"),), (("q", "1.0"),)]


@pytest.mark.parametrize(
    "text, error",
    [
        ("lat >/ bool 1", "bool modifier can only be used on comparison operators"),
        ("a and fill(0) b", "filling in missing series not allowed for set operators"),
        ("a > __tsgate_trim_vector__(b)", "the function name __tsgate_trim_vector__ is reserved"),
        ("info(up, b)", "expected label selectors only, got vector selector instead"),
    ],
)
def test_refusals_name_the_problem(gateway, text, error):
    status, document = instant(gateway, text)
    assert status == 400 and error in document["error"], document
