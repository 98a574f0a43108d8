"""What every role of the SQLite driver shares: its connections, the single writer thread and
the pool of readers, group commits, and the schedule of head-log folds.
"""

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Self
from urllib.parse import unquote, urlsplit

from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.python.threadpool import ThreadPool

from gateway.core import blocking
from gateway.core.layout import Layout
from gateway.store.contract import Store, StoreUnavailable
from gateway.store.sqlite_head import FOLD_ROWS, fold_head_log
from gateway.store.sqlite_sql import transaction

log = logging.getLogger(__name__)

# The log is also folded when it took no head row for FOLD_CHECK_S (a quiet store reads chunks
# alone) and at least every FOLD_MAX_AGE_S (a small store's log stays short).
FOLD_CHECK_S = 5.0
FOLD_MAX_AGE_S = 300


def _commit_group(connection: sqlite3.Connection, writes: list[tuple]) -> list[Exception | None]:
    """Every (statements function, arguments) of ``writes`` in one transaction; if one write's data
    fails it, each in its own, so that only the failing ones fail. Returns each write's error or
    None. An OperationalError (locked past the busy timeout, disk full) would fail each alike:
    it fails them all at once."""
    try:
        transaction(connection, [statement for statements, args in writes for statement in statements(*args)])
        return [None] * len(writes)
    except sqlite3.OperationalError as error:
        return [error] * len(writes)
    except Exception as error:
        if len(writes) == 1:
            return [error]
    outcomes: list[Exception | None] = []
    for statements, args in writes:
        try:
            transaction(connection, statements(*args))
            outcomes.append(None)
        except Exception as error:
            outcomes.append(error)
    return outcomes


def _fold_failed(failure) -> None:
    """A fold that failed leaves its rows in the head log, where reads find them; the next fold takes them."""
    log.error("folding the SQLite head log failed: %s", failure.getErrorMessage())


class SQLiteBase(Store):
    """Threads, connections and group commits; each role's mixin (sqlite_*.py) builds on it."""

    def __init__(
        self,
        path: Path,
        layout: Layout,
        readers: int = 4,
        fold_rows: int | None = None,
        fold_check_s: float = FOLD_CHECK_S,
    ):
        super().__init__(layout)
        self.path = path
        self.fold_rows = fold_rows or FOLD_ROWS
        self.fold_check_s = fold_check_s
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._writer = ThreadPool(1, 1, name="sqlite-writer")
        self._readers = ThreadPool(1, readers, name="sqlite-reader")
        self._queued: list[tuple] = []  # (statements function, its arguments, Deferred) for the next commit
        self._committing = False
        self._rows_since_fold = 0  # head rows this store wrote since it last folded the head log
        self._rows_at_check = 0  # _rows_since_fold at the last _fold_when_quiet
        self._checks_since_fold = 0
        self._fold_check = task.LoopingCall(self._fold_when_quiet)

    @classmethod
    def from_url(cls, url: str, layout: Layout) -> Self:
        """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``."""
        parts = urlsplit(url)
        path = unquote(parts.path)[1:] if parts.path.startswith("/") else unquote(parts.path)
        if parts.netloc or not path:
            raise ValueError(f"{url!r}: expected sqlite:///path/to/file.db")
        return cls(Path(path), layout)

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            # Each connection stays on the thread that made it; close() closes them all after
            # the threads have stopped, hence check_same_thread=False.
            connection = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("PRAGMA secure_delete=FAST")
            self._local.connection = connection
            self._connections.append(connection)
        return connection

    def _run(self, pool: ThreadPool, function, *args):
        def guarded():
            try:
                return function(self._connection(), *args)
            except sqlite3.OperationalError as error:
                raise StoreUnavailable(f"sqlite: {error}") from error

        return blocking.in_pool(pool, guarded)

    def _write(self, function, *args):
        return self._run(self._writer, function, *args)

    def _read(self, function, *args):
        return self._run(self._readers, function, *args)

    def _commit(self, statements, *args) -> Deferred:
        """Write ``statements(*args)`` (a list of (query, rows)) in the next group commit; the
        Deferred fires once they are committed."""
        deferred: Deferred[None] = Deferred()
        self._queued.append((statements, args, deferred))
        if not self._committing:
            self._commit_queued()
        return deferred

    def _commit_queued(self) -> None:
        entries, self._queued = self._queued, []
        self._committing = True
        self._write(_commit_group, [(statements, args) for statements, args, _ in entries]).addBoth(
            self._committed, entries
        )

    def _committed(self, outcome, entries: list[tuple]) -> None:
        """Answer every write of a group, then fold the head log if due (the writes are committed:
        they need not wait for it), then commit what queued meanwhile (writes queued by these
        answers included). The writer runs one call at a time, in order."""
        outcomes = outcome if isinstance(outcome, list) else [outcome] * len(entries)
        for (_, _, deferred), result in zip(entries, outcomes):
            if result is None:
                deferred.callback(None)
            elif isinstance(result, sqlite3.OperationalError):
                deferred.errback(StoreUnavailable(f"sqlite: {result}"))
            else:
                deferred.errback(result)
        if self._rows_since_fold >= self.fold_rows:
            self._fold()
        if self._queued:
            self._commit_queued()
        else:
            self._committing = False

    def _fold(self) -> None:
        """Fold the head log on the writer thread, after what it is doing now."""
        self._rows_since_fold = self._rows_at_check = self._checks_since_fold = 0
        self._write(fold_head_log, self.slot_width_ms).addErrback(_fold_failed)

    def _fold_when_quiet(self) -> None:
        """Every fold_check_s: fold a log that took no head row since the last check, or that was
        last folded FOLD_MAX_AGE_S ago."""
        self._checks_since_fold += 1
        quiet = self._rows_since_fold == self._rows_at_check
        if self._rows_since_fold and (quiet or self._checks_since_fold * self.fold_check_s >= FOLD_MAX_AGE_S):
            self._fold()
        self._rows_at_check = self._rows_since_fold
