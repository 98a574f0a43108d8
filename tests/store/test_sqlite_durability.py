"""kill -9 of a gateway under remote-write load: every sample it acknowledged is there after a
restart. The embedded store commits writes in groups (gateway/store/sqlite.py), Cassandra gets a
request's head rows as single-partition batches (gateway/store/cassandra_samples.py); a 2xx must still
mean that the request's own rows are committed."""

import http.client
import threading
import time
import urllib.parse

import pytest

from gateway.core.model import now_ms
from protocols.prometheus import WriteSeries, encode_write_request_v1
from protocols.timespec import format_iso
from tests.gatewayproc import GatewayProcess

SHARDS = 4
SERIES_PER_REQUEST = 200
ROUNDS = 400
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "cassandra"])
def test_sigkill_under_remote_write_load_loses_no_acknowledged_sample(request, tmp_path, tenant, store):
    if store == "sqlite":
        store_args: tuple[str, ...] = ("--data-dir", str(tmp_path / "data"))
    else:
        store_args = ("--store", request.getfixturevalue("cassandra_url"))
    gateway = GatewayProcess(tmp_path, *store_args).start()
    start = now_ms() - 600_000
    acknowledged = [-1] * SHARDS  # the last round each shard had answered 204; rounds go in order
    problems: list[str] = []

    def shard(k: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
        for r in range(ROUNDS):
            body = encode_write_request_v1(
                WriteSeries({"__name__": "durable", "i": str(i)}, [(start + r * 1000, float(r))])
                for i in range(k * SERIES_PER_REQUEST, (k + 1) * SERIES_PER_REQUEST)
            )
            try:
                connection.request("POST", "/api/v1/write", body, {**HEADERS, "X-Scope-OrgID": tenant})
                response = connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException):
                return  # killed: this request was not acknowledged
            if response.status != 204:
                problems.append(f"shard {k} round {r}: {response.status} {answer[:200]!r}")
                return
            acknowledged[k] = r

    senders = [threading.Thread(target=shard, args=(k,)) for k in range(SHARDS)]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 120
    while min(acknowledged) < 10 and time.monotonic() < deadline and not problems:
        time.sleep(0.05)
    gateway.process.kill()  # SIGKILL, in the middle of the load
    gateway.process.wait()
    for sender in senders:
        sender.join(60)
    assert not problems, problems
    assert min(acknowledged) >= 10, f"too few requests acknowledged before the kill: {acknowledged}"

    restarted = GatewayProcess(tmp_path, *store_args).start()
    try:
        query = urllib.parse.urlencode(
            {"metricName": "durable", "tenant": tenant, "start": start, "end": start + ROUNDS * 1000}
        )
        stored = {int(series["tags"]["i"]): series["values"] for series in restarted.get(f"/api/query?{query}").json()}
    finally:
        assert restarted.stop() == 0
    for k, last in enumerate(acknowledged):
        for i in range(k * SERIES_PER_REQUEST, (k + 1) * SERIES_PER_REQUEST):
            values = stored.get(i, {})
            missing = [r for r in range(last + 1) if values.get(format_iso(start + r * 1000)) != float(r)]
            assert not missing, f"series {i}: acknowledged rounds {missing[:5]}... missing after kill -9"
