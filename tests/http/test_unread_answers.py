"""Clients that ask for large answers and do not read them (issue 38, item 3): their connections
are closed after --http-write-timeout, the answers they hold count against
--http-max-unsent-bytes, and /healthz keeps answering meanwhile. Through real sockets, each with a
4 KB receive buffer, to a real gateway whose memory is read from /proc."""

import select
import socket
import time
import urllib.parse

from tests.gatewayproc import metric_value

# About 9 MB of JSON, computed by a query executor: a sine every second over three days.
LARGE_ANSWER = "/render?" + urllib.parse.urlencode({"target": 'sinFunction("a",1,1)', "from": "-3d", "format": "json"})
CONNECTIONS = 30
WRITE_TIMEOUT_S = 2


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def ask_and_read_nothing(port: int) -> socket.socket:
    """A connection with a 4 KB receive buffer that asks for the large answer and reads 64 bytes of it."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    client.sendall(f"GET {LARGE_ANSWER} HTTP/1.1\r\nHost: tsgate\r\n\r\n".encode())
    return client


def closed_by_the_server(client: socket.socket) -> bool:
    """Whether the gateway closed (reset) the connection, seen without reading: reading would be
    progress, which the write deadline is right to honour."""
    poll = select.poll()
    poll.register(client, select.POLLERR | select.POLLHUP | select.POLLRDHUP)
    return bool(poll.poll(0))


def test_clients_that_do_not_read_are_closed_and_their_answers_bounded(start_gateway):
    gateway = start_gateway(
        "--http-write-timeout",
        f"{WRITE_TIMEOUT_S}s",
        "--http-max-unsent-bytes",
        str(32 << 20),
        "--max-connections",
        "40",
    )
    pid = gateway.process.pid
    before = resident_mb(pid)
    clients = [ask_and_read_nothing(gateway.port) for _ in range(CONNECTIONS)]
    started = time.monotonic()
    refused = []
    for client in clients:
        client.settimeout(60)
        head = client.recv(64)
        refused.append(head.startswith(b"HTTP/1.1 503"))
    waiting = [client for client, was_refused in zip(clients, refused) if not was_refused]
    peak, probes, slowest = before, 0, 0.0
    # Answers come from two query executors one after the other: the last starts seconds late.
    while waiting and time.monotonic() < started + WRITE_TIMEOUT_S + 20:
        asked = time.monotonic()
        assert gateway.get("/healthz", timeout=5).status == 200
        slowest = max(slowest, time.monotonic() - asked)
        probes += 1
        peak = max(peak, resident_mb(pid))
        waiting = [client for client in waiting if not closed_by_the_server(client)]
        time.sleep(0.05)
    closed_after = time.monotonic() - started
    for client in clients:
        client.close()
    print(
        f"{sum(refused)} answered 503, the others closed in {closed_after:.1f} s; {probes} /healthz answered,"
        f" the slowest in {slowest * 1000:.0f} ms;"
        f" resident {before:.0f} MB, peak {peak:.0f} MB"
    )
    assert not waiting, f"{len(waiting)} connections that read nothing were still open after {closed_after:.0f} s"
    assert slowest < 1, f"/healthz took {slowest:.1f} s"
    # 30 answers of 9 MB held whole would be 270 MB more; the bound is 32 MB, plus answers in transit.
    assert peak < before + 150, f"the gateway grew from {before:.0f} MB to {peak:.0f} MB"
    aborted = sum(
        metric_value(gateway, f'tsgate_http_writes_aborted_total{{reason="{reason}"}}')
        for reason in ("write_timeout", "unsent_bytes")
    )
    assert aborted + sum(refused) >= CONNECTIONS - 1  # one answer at most may have been read whole by the kernel
    assert gateway.get("/healthz").status == 200
