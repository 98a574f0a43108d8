"""Carbon listeners end to end: real sockets into a real gateway, read back over HTTP."""

import pickle
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.parse

from gateway.app.devservices.process import free_port, terminate
from tests.gatewayproc import metric_value


def send_tcp(port: int, *chunks: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        for chunk in chunks:
            connection.sendall(chunk)
            time.sleep(0.01)


def query(gateway, metric: str, tenant: str = "default", **tags):
    params = {"tenant": tenant, "metricName": metric, "start": "2h-ago", "tag": [f"{k}={v}" for k, v in tags.items()]}
    answer = gateway.get("/api/query?" + urllib.parse.urlencode(params, doseq=True))
    return answer.json() if answer.status == 200 else []


def wait_for(check, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def test_plaintext_tcp(gateway):
    now = int(time.time())
    prefix = f"e2e{now}"
    lines = (
        f"{prefix}.web1.cpu 1.5 {now - 20}\n{prefix}.web1.cpu 2.5 {now - 10}\n"
        f"two-fields-only 1\n{prefix}.web1.mem nan {now}\n"
        f"{prefix}.load;host=web1;dc=x 0.75 {now - 5}\n{prefix}.web2.cpu 4 -1\n"
    ).encode()
    send_tcp(gateway.graphite_port, lines[:17], lines[17:40], lines[40:])
    series = wait_for(lambda: query(gateway, f"{prefix}.web1.cpu"))
    assert list(series[0]["values"].values()) == [1.5, 2.5] and series[0]["tags"] == {}
    tagged = wait_for(lambda: query(gateway, f"{prefix}.load", host="web1"))
    assert tagged[0]["tags"] == {"dc": "x", "host": "web1"}
    arrival = wait_for(lambda: query(gateway, f"{prefix}.web2.cpu"))
    (stamp,) = arrival[0]["values"]
    assert abs(time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone - now) <= 5
    assert (
        metric_value(gateway, 'tsgate_samples_rejected_total{protocol="graphite_plaintext",reason="bad_field_count"}')
        == 1
    )
    assert metric_value(gateway, 'tsgate_samples_rejected_total{protocol="graphite_plaintext",reason="nan_value"}') == 1
    assert "bad_field_count" in gateway.log()


def test_plaintext_udp(gateway):
    now = int(time.time())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(f"udp{now}.a 1 {now}\nudp{now}.b 2 {now}".encode(), ("127.0.0.1", gateway.graphite_port))
    assert wait_for(lambda: query(gateway, f"udp{now}.b"))[0]["values"]


def frame(payload) -> bytes:
    data = pickle.dumps(payload, protocol=2)
    return struct.pack("!L", len(data)) + data


class Evil:
    def __reduce__(self):
        return (subprocess.call, (["touch", "/tmp/tsgate-pwned"],))


def test_pickle_with_a_hostile_frame_in_the_middle(gateway, tmp_path):
    now = int(time.time())
    good = frame([(f"pk{now}.a", (now - 1, 1.0)), (f"pk{now}.b", (now - 1, 2.0))])
    evil = struct.pack("!L", len(pickle.dumps([Evil()]))) + pickle.dumps([Evil()])
    after = frame([[f"pk{now}.c", [now - 1, 3.0]]])
    send_tcp(gateway.pickle_port, good, evil, after[:3], after[3:])
    assert wait_for(lambda: query(gateway, f"pk{now}.c"))
    assert query(gateway, f"pk{now}.a") and query(gateway, f"pk{now}.b")
    assert not (tmp_path / "tsgate-pwned").exists() and not __import__("os").path.exists("/tmp/tsgate-pwned")
    assert metric_value(gateway, 'tsgate_samples_rejected_total{protocol="graphite_pickle",reason="bad_pickle"}') == 1


def test_listener_tenant(start_gateway):
    gateway = start_gateway("--graphite-tenant", "carbon-team")
    now = int(time.time())
    send_tcp(gateway.graphite_port, f"tenanted.metric 1 {now}\n".encode())
    assert wait_for(lambda: query(gateway, "tenanted.metric", tenant="carbon-team"))
    assert query(gateway, "tenanted.metric") == []


def test_carbon_c_relay_into_tsgate(gateway, tmp_path):
    relay_binary = shutil.which("carbon-c-relay")
    assert relay_binary, "carbon-c-relay is needed: apt-get install -y carbon-c-relay (.ci/run does it)"
    port = free_port()
    config = tmp_path / "relay.conf"
    config.write_text(
        f"listen type linemode 127.0.0.1:{port} proto tcp;\n"
        f"cluster tsgate forward 127.0.0.1:{gateway.graphite_port};\n"
        "match * send to tsgate stop;\n"
    )
    log = (tmp_path / "relay.log").open("wb")
    relay = subprocess.Popen([relay_binary, "-f", str(config), "-s", "-b", "10", "-q", "1000"], stdout=log, stderr=log)
    try:
        now = int(time.time())
        deadline = time.monotonic() + 10
        while True:
            try:
                send_tcp(port, "".join(f"relay{now}.host{i}.cpu {i} {now - 30 + i}\n" for i in range(20)).encode())
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "relay.log").read_text()
                time.sleep(0.2)
        for i in (0, 19):
            # metadata is written before data: wait for the value, not just the series
            series = wait_for(lambda: [s for s in query(gateway, f"relay{now}.host{i}.cpu") if s["values"]], 90)
            assert list(series[0]["values"].values()) == [float(i)]
    finally:
        terminate(relay, 10)


def test_backpressure_while_cassandra_is_down_loses_nothing(start_gateway, cassandra_server, cassandra_url, tenant):
    """A full backlog pauses TCP reading; when Cassandra is back every line sent is stored."""
    gateway = start_gateway(
        "--store", cassandra_url + "?request_timeout=2s", "--graphite-tenant", tenant, "--graphite-max-pending", "2000"
    )
    now = int(time.time())
    series_count, points = 50, 400
    send_tcp(gateway.graphite_port, f"bp.warmup 1 {now}\n".encode())
    assert wait_for(lambda: query(gateway, "bp.warmup", tenant=tenant))
    cassandra_server.stop()
    payload = "".join(f"bp.s{s} {p} {now - 3600 + p}\n" for p in range(points) for s in range(series_count)).encode()
    sender = threading.Thread(target=send_tcp, args=(gateway.graphite_port, payload))
    sender.start()
    try:
        assert wait_for(lambda: metric_value(gateway, "tsgate_graphite_backpressure_total") >= 1, 30)
    finally:
        cassandra_server.start()
    sender.join(120)
    assert not sender.is_alive()

    def stored(s: int) -> int:
        series = query(gateway, f"bp.s{s}", tenant=tenant)
        return len(series[0]["values"]) if series else 0

    assert wait_for(lambda: stored(0) == stored(series_count - 1) == points, 120)
    total = sum(stored(s) for s in range(series_count))
    assert total == series_count * points
    assert metric_value(gateway, "tsgate_graphite_lost_samples_total") == 0
