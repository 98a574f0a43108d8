"""The TCP connections accepted by every listener (HTTP, carbon plaintext, pickle), counted as one.

One cap over all of them (``--max-connections``), so connections cannot use up the process's file
descriptors (which the store needs too). At the cap a new connection takes the place of the
oldest idle one (``evictable``: an HTTP connection with no request being answered, idle
keep-alive or still sending its request, head or body, or a carbon connection that has not sent
a complete line or frame yet), so a flood of sockets that never finish a request cannot lock
everyone else out, however slowly they trickle bytes; else of the oldest one stalled in a write
for over STALLED_S (its client takes nothing of an answer: ``stalled_s``); when there is none (every connection is
busy), the new connection is closed at once, counted and logged (at most once per
``LOG_INTERVAL_S``). At shutdown the same registry closes them: each
connection's ``close_when_idle`` answers what it already received first, and ``abort_all`` ends
whatever is left when the shutdown timeout runs out.
"""

import logging
import time

from twisted.internet import defer

from gateway.core import metrics

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0
STALLED_S = 1.0  # a connection whose send buffer stayed full this long has a client that does not read


class Connections:
    def __init__(self, limit: int):
        self.limit = limit
        self.closing = False
        self.open: dict = {}  # connection -> None, oldest first
        self._empty: list[defer.Deferred] = []
        self._logged_at = float("-inf")

    def admit(self, listener: str, address) -> bool:
        """Whether a new connection to ``listener`` may be served (False: the caller closes it)."""
        if len(self.open) < self.limit:
            return True
        idle = next((connection for connection in self.open if connection.evictable), None)
        if idle is None:
            idle = next((connection for connection in self.open if connection.stalled_s() >= STALLED_S), None)
        if idle is not None:
            metrics.IDLE_CLOSED.labels(idle.listener).inc()
            self._log(listener, address, f"closed the oldest idle connection ({idle.listener}) for a new one")
            self.closed(idle)  # now, so that the next new connection picks another one
            idle.transport.abortConnection()
            return True
        metrics.CONNECTIONS_REFUSED.labels(listener).inc()
        self._log(listener, address, "closed a new connection")
        return False

    def _log(self, listener: str, address, what: str) -> None:
        """A warning at most once per ``LOG_INTERVAL_S`` (the metrics count every case)."""
        now = time.monotonic()
        if now - self._logged_at >= LOG_INTERVAL_S:
            self._logged_at = now
            peer = f"{address.host}:{address.port}" if hasattr(address, "port") else str(address)
            log.warning(
                "%s: %s from %s: %d connections open, the limit (--max-connections); logged at most once per %ds",
                listener,
                what,
                peer,
                len(self.open),
                LOG_INTERVAL_S,
            )

    def opened(self, connection) -> None:
        self.open[connection] = None
        metrics.CONNECTIONS_OPEN.set(len(self.open))

    def closed(self, connection) -> None:
        if connection not in self.open:
            return  # already taken out by admit()
        del self.open[connection]
        metrics.CONNECTIONS_OPEN.set(len(self.open))
        if not self.open:
            waiting, self._empty = self._empty, []
            for deferred in waiting:
                deferred.callback(None)

    def close_all(self) -> defer.Deferred:
        """Ask every connection to close once it has answered what it received; fires when all are closed."""
        self.closing = True
        for connection in list(self.open):
            connection.close_when_idle()
        if not self.open:
            return defer.succeed(None)
        deferred: defer.Deferred[None] = defer.Deferred()
        self._empty.append(deferred)
        return deferred

    def abort_all(self) -> None:
        for connection in list(self.open):
            connection.transport.abortConnection()
