"""--promql-delayed-name-removal, Prometheus's promql-delayed-name-removal feature: an operator or
function that drops ``__name__`` only marks it, and the answer drops it; label_replace and
label_join can read or keep it, ``by (__name__)`` groups by it. Off (the default) the name goes at
once, as in Prometheus. The engine on hand-made series, then a real gateway's HTTP API."""

import time
import urllib.parse

import numpy as np
import pytest

from gateway.query.promql.engine import Evaluator, Query, parse, plan
from gateway.query.promql.values import PromQLError, Series
from protocols import prometheus
from protocols.prometheus import WriteSeries
from tests.gatewayproc import GatewayProcess

S = 1000
AT_MS = 600 * S
# two counters of one label set but their names, 1/s and 2/s
DATA = [
    Series({"__name__": name, "env": "1"}, np.arange(0, AT_MS + 1, 60 * S), np.arange(11) * 60.0 * per_second)
    for name, per_second in (("a_total", 1), ("b_total", 2))
]


def answer(text: str, delayed: bool) -> dict:
    """The instant answer at AT_MS as {sorted labels: value}."""
    expr = parse(text)
    query = Query(AT_MS, AT_MS, 0, 300 * S)
    data = {
        key: [s for s in DATA if all(m.matches(s.labels.get(m.name, "")) for m in matchers)]
        for key, (matchers, _low, _high) in plan(expr, query).items()
    }
    evaluator = Evaluator(query, data, time.monotonic() + 10, delayed_name_removal=delayed)
    vector = evaluator.result(expr, np.array([AT_MS], dtype=np.int64))
    return {tuple(sorted(labels.items())): float(v[0]) for labels, v in zip(vector.labels, vector.values)}


def test_label_replace_reads_and_keeps_the_name_a_function_dropped():
    text = 'label_replace(rate({env="1"}[5m]), "__name__", "rate_$1", "__name__", "(.+)")'
    assert answer(text, delayed=True) == {
        (("__name__", "rate_a_total"), ("env", "1")): 1.0,
        (("__name__", "rate_b_total"), ("env", "1")): 2.0,
    }
    with pytest.raises(PromQLError, match="same labelset"):  # off: rate's two rows are one label set
        answer(text, delayed=False)


def test_the_answer_drops_the_marked_names():
    assert answer('rate({env="1"}[5m]) > 1.5', delayed=True) == {(("env", "1"),): 2.0}
    assert answer('sum by (env) (rate({env="1"}[5m]))', delayed=True) == {(("env", "1"),): 3.0}
    assert answer("last_over_time(a_total[5m])", delayed=True) == {(("__name__", "a_total"), ("env", "1")): 600.0}
    with pytest.raises(PromQLError, match="same labelset"):  # grouped by the names, then both dropped
        answer('sum by (__name__) (rate({env="1"}[5m]))', delayed=True)


@pytest.mark.slow  # a gateway process
def test_the_flag_through_a_gateway(tmp_path):
    gateway = GatewayProcess(tmp_path, "--promql-delayed-name-removal").start()
    try:
        at_ms = int(time.time()) * 1000 - 60_000
        series = [
            WriteSeries({"__name__": name, "env": "1"}, [(at_ms - 60_000, 0.0), (at_ms, 60.0 * per_second)])
            for name, per_second in (("a_total", 1), ("b_total", 2))
        ]
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
        assert gateway.post("/api/v1/write", prometheus.encode_write_request_v1(series), headers=headers).status == 204
        query = 'label_join(rate({env="1"}[2m]), "source", "_", "__name__")'
        answer = gateway.get(f"/api/v1/query?{urllib.parse.urlencode({'query': query, 'time': at_ms // 1000})}")
        assert answer.status == 200, answer.json()
        result = sorted(answer.json()["data"]["result"], key=lambda s: s["metric"]["source"])
        assert [(s["metric"], s["value"][1]) for s in result] == [
            ({"env": "1", "source": "a_total"}, "0.5"),  # 60 in a minute, over 2 m: no extrapolation below 0
            ({"env": "1", "source": "b_total"}, "1"),
        ]
    finally:
        gateway.stop()
