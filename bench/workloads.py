"""The suite's two workload shapes, their senders, and the data_raw rows each must end up as.

* Graphite plaintext: P distinct paths x M points 10 s apart, carbon-style ``path value ts\\n``
  lines over K TCP connections; connection k carries the paths i with i % K == k, one point of
  each of its paths, then the next (as carbon relays flush), all encoded before the clock starts.
* Prometheus remote write 1.0: bench.remote_write.Workload (K shards of S series, one sample of
  each series per request, snappy + protobuf), sent by bench.remote_write.send.

The rows (tenant, series_set_hash, time_slot, ts, value) are what the gateway writes for these
samples, computed with the gateway's own series-set hash and slot, in the order they are sent:
the raw loader writes exactly these, and the checks read them back.
"""

import socket
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from bench.common import BenchError
from bench.remote_write import Workload as RemoteWriteWorkload
from gateway.core.layout import Layout
from gateway.core.model import series_set_hash, series_set_text
from gateway.store.contract import time_slot

INTERVAL_S = 10
# The gateway's defaults (--slot-width): the rows must be the ones it writes.
LAYOUT = Layout()
TCP_STATES_OPEN = {"01", "08"}  # ESTABLISHED, CLOSE_WAIT: sockets that may still hold unread bytes
SEND_TIMEOUT_S = 600


class PlaintextWorkload:
    """P paths x M points ending at end_s, split over K connections; bodies encoded up front."""

    def __init__(self, paths: int, points: int, connections: int, end_s: int):
        self.paths = [f"bench.host{i // 10}.metric{i % 10}" for i in range(paths)]
        self.timestamps_s = [end_s - (points - 1 - j) * INTERVAL_S for j in range(points)]
        self.samples = paths * points
        self.label = f"graphite plaintext {paths}x{points}"
        self.bodies = [
            "".join(
                f"{self.paths[i]} {self.value(i, j)!r} {ts}\n"
                for j, ts in enumerate(self.timestamps_s)
                for i in range(k, paths, connections)
            ).encode()
            for k in range(connections)
        ]

    @staticmethod
    def value(i: int, j: int) -> float:
        """Exact in binary, in text and in JSON, so any difference read back is a real one."""
        return i + j / 1024

    def rows(self, tenant: str) -> list[tuple]:
        """data_raw rows in send order (connection by connection): a plain path has no tags."""
        hashes = [series_set_hash(series_set_text(path, {})) for path in self.paths]
        connections = len(self.bodies)
        return [
            (tenant, hashes[i], time_slot(ts * 1000, LAYOUT.slot_width_ms), ts * 1000, self.value(i, j))
            for k in range(connections)
            for j, ts in enumerate(self.timestamps_s)
            for i in range(k, len(self.paths), connections)
        ]


def remote_write_label(workload: RemoteWriteWorkload) -> str:
    return f"remote write {workload.series_per_request}/request"


def remote_write_rows(workload: RemoteWriteWorkload, tenant: str) -> list[tuple]:
    """data_raw rows in send order, request by request: __name__ is the metric, the other labels tags."""
    hashes = []
    for i in range(workload.series):
        labels = workload.labels(i)
        name = labels.pop("__name__")
        hashes.append(series_set_hash(series_set_text(name, labels)))
    size = workload.series_per_request
    return [
        (tenant, hashes[i], time_slot(ts, LAYOUT.slot_width_ms), ts, workload.value(i, r))
        for r, ts in enumerate(workload.timestamps)
        for k in range(len(workload.bodies))
        for i in range(k * size, (k + 1) * size)
    ]


def partitions(rows: list[tuple]) -> dict[tuple[str, int], dict[int, float]]:
    """What each data_raw partition (series_set_hash, time_slot) must hold: {ts: value}."""
    expected = defaultdict(dict)
    for _, hash_, slot, ts, value in rows:
        expected[(hash_, slot)][ts] = value
    return expected


def tcp_queues(port: int) -> tuple[int, int]:
    """Bytes the server's sockets on `port` have received but not read, and bytes its peers have
    written but not yet had acknowledged, from /proc/net/tcp and tcp6 (loopback senders)."""
    unread = unsent = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local_port = int(fields[1].rpartition(":")[2], 16)
                remote_port = int(fields[2].rpartition(":")[2], 16)
                if fields[3] not in TCP_STATES_OPEN:
                    continue
                tx_queue, rx_queue = (int(part, 16) for part in fields[4].split(":"))
                if local_port == port:
                    unread += rx_queue
                elif remote_port == port:
                    unsent += tx_queue
    return unread, unsent


def send_plaintext(port: int, workload: PlaintextWorkload) -> float:
    """Send every connection's lines, then wait until the server has read them all; return seconds.

    "Read" is the same for every receiver: the senders' sockets have nothing left to send and the
    server's sockets nothing left unread (the kernel's counts, /proc/net/tcp). A server that stops
    reading (push-back) makes this wait, which is the point. The connections stay open until then,
    so a server never sees an early close.
    """
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=SEND_TIMEOUT_S) for _ in workload.bodies]
    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(len(sockets)) as pool:
            for future in [pool.submit(sock.sendall, body) for sock, body in zip(sockets, workload.bodies)]:
                future.result()
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while tcp_queues(port) != (0, 0):
            if time.monotonic() > deadline:
                raise BenchError(f"port {port}: the server left bytes unread for {SEND_TIMEOUT_S}s: {tcp_queues(port)}")
            time.sleep(0.01)
        return time.perf_counter() - started
    finally:
        for sock in sockets:
            sock.close()
