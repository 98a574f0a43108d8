"""A 3-node Cassandra cluster at replication factor 3 under load: node loss, two nodes lost,
rolling restarts of gateways and downsamplers, and how data spreads over the nodes.

One cluster (``tsgate dev cassandra --nodes 3``'s own code), one keyspace, one Redis, two gateway
processes, two downsampler replicas and a real Prometheus 2.42 serve the whole module; each test
has its own tenant and metric. Writers count what was acknowledged (2xx), and every test ends by
reading each acknowledged sample back: the counts printed are acknowledged vs readable.
"""

import http.client
import socket
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from datetime import datetime

import pytest

from gateway.app.devservices.cassandra import CassandraCluster
from gateway.app.devservices.redis import RedisServer
from protocols import prometheus
from protocols.prometheus import WriteSeries, encode_write_request_v1
from protocols.prometheus.read import Matcher, ReadQuery
from tests.app.test_workers import wait_for
from tests.gatewayproc import GatewayProcess, HTTPAnswer, run_tsgate
from tests.prometheusproc import PrometheusProcess

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

KEYSPACE = "tsgate_cluster"
HOUR_S = 3600
SERIES_PER_REQUEST = 100
CARBON_SERIES = 20
# A killed node replays its commit log when it starts again: 2-3 minutes on a box loaded to 30.
NODE_START_S = 600

PROMETHEUS = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs: [{targets: ["127.0.0.1:SELF_PORT"]}]
remote_write:
  - url: URL
    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 2s}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = CassandraCluster(tmp_path_factory.mktemp("cluster"), nodes=3)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def cluster_url(cluster) -> str:
    """The keyspace made by ``schema apply --replication`` on every node (it waits for agreement)."""
    url = f"cassandra://{cluster.contact_points}/{KEYSPACE}?request_timeout=15s"
    output = run_tsgate(
        "schema", "apply", "--store", url, "--replication", "NetworkTopologyStrategy:dc1=3", timeout=400
    )
    assert f"keyspace {KEYSPACE}" in output
    return url


class Services:
    """Two gateways (ingest and query; A at QUORUM given as flags, B at the default LOCAL_QUORUM)
    and two downsampler replicas sharing one Redis; B takes carbon lines for ``carbon_tenant``."""

    def __init__(self, workdir, url: str, redis_url: str):
        self.carbon_tenant = f"carbon-{uuid.uuid4().hex[:8]}"
        shared = ("--store", url, "--redis", redis_url, "--downsample-delay", "2s", "--shutdown-timeout", "10s")
        self.gateways = [
            GatewayProcess(
                workdir,
                *shared,
                "--roles",
                "ingest,query",
                "--write-consistency",
                "QUORUM",
                "--read-consistency",
                "quorum",
            ),
            GatewayProcess(workdir, *shared, "--roles", "ingest,query", "--graphite-tenant", self.carbon_tenant),
        ]
        self.downsamplers = [
            GatewayProcess(workdir, *shared, "--roles", "downsample", "--downsample-interval", "1s") for _ in range(2)
        ]

    @property
    def all(self) -> list[GatewayProcess]:
        return [*self.gateways, *self.downsamplers]


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def services(cluster_url, redis, tmp_path_factory):
    services = Services(tmp_path_factory.mktemp("services"), cluster_url, redis.url)
    try:
        for process in services.all:
            process.start(timeout=60)
        yield services
    finally:
        for process in services.all:
            process.stop()


@pytest.fixture(scope="module")
def prometheus_sender(services, tmp_path_factory):
    """Prometheus 2.42 scraping itself every second and remote-writing to gateway A."""
    tenant = f"prom-{uuid.uuid4().hex[:8]}"
    url = f"{services.gateways[0].url}/api/v1/write?tenant={tenant}"
    process = PrometheusProcess(tmp_path_factory.mktemp("prometheus"), PROMETHEUS.replace("URL", url)).start()
    process.tenant = tenant
    yield process
    process.stop()


class Writer(threading.Thread):
    """Remote write, Prometheus's shape, to the gateways in turn: one request a step, each of
    SERIES_PER_REQUEST series getting the step's timestamp and the step as value.
    ``acknowledged``: timestamps answered 2xx; ``statuses``: every answer (or the error)."""

    def __init__(self, gateways: list[GatewayProcess], tenant: str, metric: str, start_ms: int):
        super().__init__()
        self.gateways, self.tenant, self.metric, self.start_ms = gateways, tenant, metric, start_ms
        self.acknowledged: list[int] = []
        self.statuses: Counter = Counter()
        self.unavailable_without_retry_after = 0
        self.stop = threading.Event()
        self.steps = 0

    def run(self):
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": self.tenant}
        while not self.stop.is_set():
            timestamp = self.start_ms + self.steps * 1000
            gateway = self.gateways[self.steps % len(self.gateways)]
            body = encode_write_request_v1(
                WriteSeries({"__name__": self.metric, "s": str(s)}, [(timestamp, float(self.steps))])
                for s in range(SERIES_PER_REQUEST)
            )
            self.steps += 1
            connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
            try:
                connection.request("POST", "/api/v1/write", body, headers)
                answer = connection.getresponse()
                answer.read()
            except (OSError, http.client.HTTPException) as error:  # a gateway restarting: not acknowledged
                self.statuses[type(error).__name__] += 1
                time.sleep(0.1)
                continue
            finally:
                connection.close()
            self.statuses[answer.status] += 1
            if 200 <= answer.status < 300:
                self.acknowledged.append(timestamp)
            elif answer.status == 503 and not answer.getheader("Retry-After"):
                self.unavailable_without_retry_after += 1
            time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        self.join()


class CarbonSender(threading.Thread):
    """Carbon plaintext lines, CARBON_SERIES series a step, one timestamp a step; ``sent``: the
    timestamps whose lines all went out on the socket (carbon has no acknowledgements)."""

    def __init__(self, port: int, metric: str, start_s: int):
        super().__init__()
        self.port, self.metric, self.start_s = port, metric, start_s
        self.sent: list[int] = []
        self.stop = threading.Event()

    def run(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as connection:
            while not self.stop.is_set():
                timestamp = self.start_s + len(self.sent)
                lines = "".join(f"{self.metric}.s{s} {len(self.sent)} {timestamp}\n" for s in range(CARBON_SERIES))
                connection.sendall(lines.encode())
                self.sent.append(timestamp)
                time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        self.join()


def past_slot_start_ms() -> int:
    """The start of the hour slot two hours ago: settled as soon as writing stops."""
    return (int(time.time()) // HOUR_S - 2) * HOUR_S * 1000


def retried(request, for_s: float = 60) -> tuple[int, HTTPAnswer]:
    """An HTTP request sent again after each 503 as its Retry-After says, for up to ``for_s``: a
    client's way through the seconds before Cassandra convicts a killed node (reads sent to it
    time out until then), or while a node just back is slow. The 503s counted, the last answer."""
    deadline = time.monotonic() + for_s
    answer = request()
    unavailable = 0
    while answer.status == 503 and time.monotonic() < deadline:
        unavailable += 1
        time.sleep(int(answer.headers["Retry-After"]))
        answer = request()
    return unavailable, answer


def stored(gateway: GatewayProcess, tenant: str, metric: str, start_ms: int) -> dict[str, dict[int, float]]:
    """Every raw sample of the metric's series as {series: {timestamp ms: value}}."""
    query = urllib.parse.urlencode(
        {"metricName": metric, "start": start_ms // 1000 - 1, "granularity": "raw", "tenant": tenant}
    )
    _, answer = retried(lambda: gateway.get(f"/api/query?{query}", timeout=120))
    assert answer.status == 200, answer.body
    return {
        "".join(f"{k}={v}" for k, v in sorted(series.get("tags", {}).items())) or series["metricName"]: {
            int(datetime.fromisoformat(ts).timestamp() * 1000): value for ts, value in series["values"].items()
        }
        for series in answer.json()
    }


def assert_every_acknowledged_sample_readable(gateway: GatewayProcess, writer: Writer) -> None:
    """Each series holds every acknowledged timestamp, with its step as value, and nothing that
    was never sent: acknowledged vs readable, counted exactly."""
    samples = stored(gateway, writer.tenant, writer.metric, writer.start_ms)
    assert len(samples) == SERIES_PER_REQUEST, sorted(samples)[:5]
    acknowledged = set(writer.acknowledged)
    readable = 0
    for name, series in samples.items():
        lost = acknowledged - set(series)
        assert not lost, f"{name}: acknowledged but not readable: {sorted(lost)[:5]} ({len(lost)})"
        wrong = {ts: v for ts, v in series.items() if v != (ts - writer.start_ms) // 1000}
        assert not wrong, f"{name}: values not as written: {list(wrong.items())[:5]}"
        readable += len(acknowledged & set(series))
    print(
        f"{writer.metric}: {len(acknowledged) * SERIES_PER_REQUEST} samples acknowledged,"
        f" {readable} of them readable; answers {dict(writer.statuses)}"
    )


def assert_all_carbon_lines_readable(gateway: GatewayProcess, tenant: str, sender: CarbonSender) -> None:
    """Carbon batches the store refuses are retried, never dropped: every line sent becomes
    readable (once the gateway has read and stored its backlog)."""
    expected = {ts * 1000: float(step) for step, ts in enumerate(sender.sent)}

    def missing() -> dict[int, int]:
        """Lines not readable yet, by series."""
        counts = {}
        for s in range(CARBON_SERIES):
            samples = stored(gateway, tenant, f"{sender.metric}.s{s}", sender.start_s * 1000)
            series = samples.get(f"{sender.metric}.s{s}", {})
            assert all(expected.get(ts) == value for ts, value in series.items()), f"s{s}: values not as sent"
            counts[s] = len(expected) - len(series)
        return {s: count for s, count in counts.items() if count}

    deadline = time.monotonic() + 120
    while missing():
        assert time.monotonic() < deadline, f"carbon lines sent but not readable, by series: {missing()}"
        time.sleep(1)
    print(f"{sender.metric}: {len(expected) * CARBON_SERIES} carbon lines sent, all readable")


def queries_complete(gateway: GatewayProcess, tenant: str, metric: str, start_ms: int) -> int:
    """PromQL, Graphite render and remote read each answer 200 with data, in the end; the 503s
    (with Retry-After) answered on the way, which the caller reports."""
    start_s = start_ms // 1000
    promql = urllib.parse.urlencode({"query": f"count(count_over_time({metric}[2h]))", "time": start_s + 600})
    unavailable, answer = retried(lambda: gateway.get(f"/api/v1/query?{promql}", headers={"X-Scope-OrgID": tenant}))
    assert answer.status == 200 and answer.json()["data"]["result"], answer.body
    render = urllib.parse.urlencode(
        {"target": f"seriesByTag('name={metric}')", "from": start_s - 1, "until": start_s + 600, "format": "json"}
    )
    retries, answer = retried(lambda: gateway.get(f"/render?{render}", headers={"X-Scope-OrgID": tenant}))
    unavailable += retries
    assert answer.status == 200 and answer.json(), answer.body
    body = prometheus.encode_read_request(
        [ReadQuery(start_ms, start_ms + 600_000, [Matcher("EQ", "__name__", metric)])]
    )
    retries, answer = retried(
        lambda: gateway.post("/api/v1/read", body, headers={"X-Scope-OrgID": tenant, "Content-Encoding": "snappy"})
    )
    unavailable += retries
    assert answer.status == 200, answer.body
    (result,) = prometheus.decode_read_response(answer.body, 1 << 24)
    assert len(result) == SERIES_PER_REQUEST
    return unavailable


def prometheus_samples_all_written(prometheus_sender: PrometheusProcess, gateway: GatewayProcess) -> None:
    """Prometheus retries what got 5xx: in the end the gateway holds exactly the samples of
    ``up`` that Prometheus's own TSDB holds over the same window, and none was dropped."""
    at = int(time.time()) - 5
    query = 'count_over_time(up{job="prometheus"}[15m])'

    def local() -> float:
        return float(prometheus_sender.api("/api/v1/query", query=query, time=at)["data"]["result"][0]["value"][1])

    def remote() -> float:
        params = urllib.parse.urlencode({"query": query, "time": at})
        answer = gateway.get(f"/api/v1/query?{params}", headers={"X-Scope-OrgID": prometheus_sender.tenant})
        result = answer.json()["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    wait_for(lambda: remote() == local(), timeout=120, what=f"Prometheus's up samples at the gateway ({local()})")
    failed = prometheus_sender.api("/api/v1/query", query="prometheus_remote_storage_samples_failed_total")
    assert float(failed["data"]["result"][0]["value"][1]) == 0
    print(f"prometheus: {local():.0f} samples of up in its TSDB, the same count readable at the gateway")


def run_until(writer: Writer, steps: int, timeout: float = 120) -> None:
    target = writer.steps + steps
    wait_for(lambda: writer.steps >= target, timeout=timeout, what=f"{steps} more write steps")


def test_a_node_killed_under_load_keeps_writes_and_queries_going_and_loses_nothing(
    cluster, services, prometheus_sender
):
    """kill -9 one node mid-load: at QUORUM (RF 3) the two others take the writes (at least 90%;
    the rest 503) and answer every query; the node restarts, rejoins, and every acknowledged
    sample, carbon line and Prometheus sample reads back."""
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    start_ms = past_slot_start_ms()
    writer = Writer(services.gateways, tenant, "node_kill", start_ms)
    carbon = CarbonSender(services.gateways[1].graphite_port, f"node_kill_{tenant[2:]}", start_ms // 1000)
    writer.start()
    carbon.start()
    try:
        run_until(writer, 10)
        cluster.nodes[2].kill()
        # What `tsgate dev cassandra --nodes 3` watches: one node down, the cluster still runs.
        assert cluster.stopped_nodes() == [cluster.nodes[2]] and cluster.running
        before = writer.statuses.copy()
        run_until(writer, 30)
        queries_unavailable = sum(queries_complete(g, tenant, "node_kill", start_ms) for g in services.gateways)
        while_down = writer.statuses - before
        assert all(node.query("SELECT release_version FROM system.local") for node in cluster.nodes[:2])
        # The dev command's SIGUSR1: the stopped node starts again on its data and rejoins.
        assert cluster.restart_stopped(NODE_START_S) == [cluster.nodes[2]]
        run_until(writer, 10)
    finally:
        writer.finish()
        carbon.finish()
    print(f"writes while a node was down: {dict(while_down)}; queries answered 503 first: {queries_unavailable}")
    assert set(writer.statuses) <= {200, 204, 503}, writer.statuses
    # Until the others convict the killed node, a replica slow to answer (a loaded box syncing
    # its commit log) can time a QUORUM write out: a 503 the sender retries, never acknowledged.
    assert while_down[204] >= 0.9 * sum(while_down.values()), f"writes refused with one node down: {while_down}"
    assert_every_acknowledged_sample_readable(services.gateways[0], writer)
    assert_all_carbon_lines_readable(services.gateways[1], services.carbon_tenant, carbon)
    prometheus_samples_all_written(prometheus_sender, services.gateways[0])


def test_two_nodes_killed_answer_503_with_retry_after_and_recover_every_acknowledged_sample(
    cluster, services, prometheus_sender
):
    """kill -9 two of three nodes: no quorum, so writes answer 503 with Retry-After, never a 2xx
    that was not stored; Prometheus and carbon retry; after both nodes return every acknowledged
    sample, every carbon line and every Prometheus sample is readable."""
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    start_ms = past_slot_start_ms()
    writer = Writer(services.gateways, tenant, "two_down", start_ms)
    carbon = CarbonSender(services.gateways[1].graphite_port, f"two_down_{tenant[2:]}", start_ms // 1000)
    writer.start()
    carbon.start()
    try:
        run_until(writer, 10)
        cluster.nodes[1].kill()
        cluster.nodes[2].kill()
        wait_for(lambda: writer.statuses[503] >= 10, timeout=120, what="writes refused with 503")
        assert cluster.restart_stopped(NODE_START_S) == cluster.nodes[1:]
        acknowledged = len(writer.acknowledged)
        wait_for(lambda: len(writer.acknowledged) >= acknowledged + 10, timeout=120, what="writes accepted again")
    finally:
        writer.finish()
        carbon.finish()
    assert set(writer.statuses) <= {200, 204, 503}, writer.statuses
    assert writer.unavailable_without_retry_after == 0
    assert_every_acknowledged_sample_readable(services.gateways[1], writer)
    assert_all_carbon_lines_readable(services.gateways[1], services.carbon_tenant, carbon)
    prometheus_samples_all_written(prometheus_sender, services.gateways[0])


def test_rolling_restart_of_gateways_and_downsamplers_loses_nothing_and_seals_every_slot(
    services, redis, prometheus_sender
):
    """SIGTERM and restart each gateway and downsampler in turn under load: every acknowledged
    sample reads back with its own value once both downsamplers sealed every slot (no pending
    or in-progress slot is left in Redis)."""
    import redis as redis_client

    tenant = f"t-{uuid.uuid4().hex[:12]}"
    start_ms = past_slot_start_ms()
    writer = Writer(services.gateways, tenant, "rolling", start_ms)
    writer.start()
    try:
        run_until(writer, 10)
        for process in services.all:
            assert process.stop() == 0, process.log()[-3000:]
            process.start(timeout=60)
            run_until(writer, 10)
    finally:
        writer.finish()
    client = redis_client.Redis.from_url(redis.url)

    def slots_left() -> list[bytes]:
        """This test's series-slots still pending or being processed (other tests' slots may
        wait out a failure's back-off)."""
        keys = [key for key in client.scan_iter(match="tsgate|*") if b"|pending|" in key or b"|processing|" in key]
        return [member for key in keys for member in client.smembers(key) if member.startswith(tenant.encode())]

    deadline = time.monotonic() + 300
    while slots_left():
        assert time.monotonic() < deadline, f"series-slots never sealed: {slots_left()[:5]}"
        time.sleep(1)
    client.close()
    assert set(writer.statuses) - {200, 204, 503, "ConnectionRefusedError", "RemoteDisconnected"} == set(), (
        writer.statuses
    )
    assert_every_acknowledged_sample_readable(services.gateways[0], writer)
    prometheus_samples_all_written(prometheus_sender, services.gateways[0])


def test_ten_thousand_series_spread_within_20_percent_across_the_nodes(cluster, cluster_url, services):
    """Each series' partition goes to the node owning its token (the first of its replicas): with
    the tokens the nodes report, 10k series fall within 20% of an even third per node."""
    from cassandra import ConsistencyLevel
    from cassandra.cluster import Cluster
    from cassandra.query import SimpleStatement

    tenant = f"t-{uuid.uuid4().hex[:12]}"
    gateway = services.gateways[0]
    timestamp = past_slot_start_ms()
    for chunk in range(10):
        body = encode_write_request_v1(
            WriteSeries({"__name__": "spread", "s": str(chunk * 1000 + s)}, [(timestamp, 1.0)]) for s in range(1000)
        )
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
        _, answer = retried(lambda: gateway.post("/api/v1/write", body, headers=headers, timeout=120))
        assert answer.status == 204, answer.body
    session_cluster = Cluster([node.host for node in cluster.nodes], port=cluster.port)
    try:
        session = session_cluster.connect()
        # Both tables from the same node: itself in system.local, the others in system.peers_v2.
        seen_by = cluster.nodes[0]
        owners = {}
        for row in seen_by.query("SELECT rpc_address, tokens FROM system.local") or []:
            owners.update({int(token): row.rpc_address for token in row.tokens})
        for row in seen_by.query("SELECT native_address, tokens FROM system.peers_v2") or []:
            owners.update({int(token): row.native_address for token in row.tokens})
        assert len(set(owners.values())) == 3, owners
        ring = sorted(owners)
        scan = SimpleStatement(
            f"SELECT tenant, token(tenant, series_set_hash) FROM {KEYSPACE}.series_set_hashes",
            consistency_level=ConsistencyLevel.QUORUM,  # at ONE a replica that dropped a write misses rows
        )
        rows = session.execute(scan, timeout=120)
        tokens = [token for row_tenant, token in rows if row_tenant == tenant]
    finally:
        session_cluster.shutdown()

    def owner(token: int) -> str:
        return owners[next((t for t in ring if token <= t), ring[0])]

    per_node = Counter(owner(token) for token in tokens)
    print(f"series per node (first replica): {dict(per_node)}")
    assert sum(per_node.values()) == 10_000
    assert len(per_node) == 3
    assert all(abs(count - 10_000 / 3) <= 0.2 * 10_000 / 3 for count in per_node.values()), per_node
