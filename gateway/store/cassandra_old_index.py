"""``tsgate schema expire-old-index``: all-time index rows written before they carried a TTL (a
gateway older than the time index, issue 33) get the TTL a row written now gets, so that series
that stopped before the upgrade leave the index with their data (docs/storage.rst, "The index
shrinks"). Rows of live series get theirs anyway, the first time each is indexed in a day.

Each table is walked by token range; a range done is kept in ``index_state`` (the last token done,
a contiguous prefix), so a run that stops (``max_ranges``, an error, Ctrl-C) continues there.
Rewrites carry the run's start as their write time: a row written or deleted by a gateway
meanwhile (later) wins over the copy, so the step is safe while ingest and deletes run.
"""

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from cassandra.concurrent import execute_concurrent

from gateway.store.cassandra_base import PLAIN_ROWS

# The all-time tables (and metric metadata): every row of them is written with the tenant's TTL
# (CassandraIndex._all_time_requests, CassandraMetadata); the time index's tables always were.
ALL_TIME_TABLES = (
    "tenants",
    "metric_names",
    "series_set_hashes",
    "series_sets",
    "tag_keys",
    "tag_values",
    "graphite_paths",
    "tenant_tag_keys",
    "tenant_tag_values",
    "tag_metrics",
    "metric_metadata",
)
MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1  # Murmur3Partitioner's ring: (MIN_TOKEN, MAX_TOKEN]
TOKEN_RANGES = 256  # a table's ring in this many equal ranges: the unit of progress kept
RANGES_AT_ONCE = 8  # ranges read at the same time
BATCHES_IN_FLIGHT = 8  # rewrite batches (CassandraBase._batched) in flight per range read
PAGE_ROWS = 2000
ROWS_PER_FLUSH = 5000  # rewrites collected from a range before they are sent
PROGRESS_EVERY_S = 2.0


class Table(NamedTuple):
    """An all-time table as system_schema describes it."""

    name: str
    partition_key: tuple[str, ...]
    keys: tuple[str, ...]  # partition key and clustering columns
    probed: tuple[str, ...]  # regular columns whose TTL can be read (not collections)
    collections: tuple[str, ...]  # regular columns rewritten with every row rewritten


class Walked(NamedTuple):
    ranges: int  # walked by this run
    done_ranges: int  # done by this run and those before
    total_ranges: int
    rows_seen: int
    rows_rewritten: int
    seconds: float
    finished: bool


def _progress_name(table: str) -> str:
    return f"expire_old_index.{table}"


def token_ranges() -> list[tuple[int, int]]:
    step = (MAX_TOKEN - MIN_TOKEN) // TOKEN_RANGES
    bounds = [MIN_TOKEN + i * step for i in range(TOKEN_RANGES)] + [MAX_TOKEN]
    return list(zip(bounds, bounds[1:]))


class OldIndexExpiry:
    """One run over a connected session of ``store`` (a CassandraStore whose cluster is open)."""

    def __init__(self, store, session, say: Callable[[str], None]):
        self.store = store
        self.session = session
        self.say = say
        self.keyspace = store.keyspace
        self.written_at_us = int(time.time() * 1_000_000)
        self._statements: dict[tuple[str, tuple[str, ...]], object] = {}
        self._lock = threading.Lock()

    def run(self, max_ranges: int | None = None, restart: bool = False) -> Walked:
        started = time.monotonic()
        self._table("index_state")  # where progress is kept: says `schema apply` is due when missing
        if restart:
            for name in ALL_TIME_TABLES:
                self.session.execute(f"DELETE FROM {self.keyspace}.index_state WHERE name = %s", [_progress_name(name)])
        budget = max_ranges if max_ranges is not None else len(ALL_TIME_TABLES) * TOKEN_RANGES
        ranges = seen = rewritten = 0
        for name in ALL_TIME_TABLES:
            table = self._table(name)
            done, table_seen, table_rewritten = self._walk(table, budget)
            budget -= done
            ranges, seen, rewritten = ranges + done, seen + table_seen, rewritten + table_rewritten
        total = len(ALL_TIME_TABLES) * TOKEN_RANGES
        done = sum(self._done_before(name) for name in ALL_TIME_TABLES)
        return Walked(ranges, done, total, seen, rewritten, time.monotonic() - started, done == total)

    def _table(self, name: str) -> Table:
        rows = list(
            self.session.execute(
                "SELECT column_name, kind, position, type FROM system_schema.columns"
                " WHERE keyspace_name = %s AND table_name = %s",
                [self.keyspace, name],
            )
        )
        if not rows:
            raise RuntimeError(f"table {self.keyspace}.{name} does not exist: run `tsgate schema apply` first")

        def kind(wanted: str) -> list[str]:
            return [r.column_name for r in sorted(rows, key=lambda r: r.position) if r.kind == wanted]

        partition_key, clustering = kind("partition_key"), kind("clustering")
        regular = sorted((r for r in rows if r.kind == "regular"), key=lambda r: r.column_name)
        collections = [r.column_name for r in regular if r.type.startswith(("map<", "set<", "list<"))]
        probed = [r.column_name for r in regular if r.column_name not in collections]
        return Table(name, tuple(partition_key), (*partition_key, *clustering), tuple(probed), tuple(collections))

    def _done_before(self, name: str) -> int:
        """The ranges of the table a run before did (the contiguous prefix kept)."""
        row = self.session.execute(
            f"SELECT value FROM {self.keyspace}.index_state WHERE name = %s", [_progress_name(name)]
        ).one()
        if row is None:
            return 0
        return sum(end <= row.value for _, end in token_ranges())

    def _walk(self, table: Table, budget: int) -> tuple[int, int, int]:
        """The table's ranges not done before, up to ``budget`` of them; their progress kept in order."""
        before = self._done_before(table.name)
        todo = token_ranges()[before:][: max(0, budget)]
        if before:
            self.say(f"{table.name}: {before} of {TOKEN_RANGES} token ranges done by an earlier run")
        seen = rewritten = done = 0
        said = time.monotonic()
        pool = ThreadPoolExecutor(RANGES_AT_ONCE)
        try:
            futures = [pool.submit(self._range, table, start, end) for start, end in todo]
            for future, (_, end) in zip(futures, todo):
                range_seen, range_rewritten = future.result()
                seen, rewritten, done = seen + range_seen, rewritten + range_rewritten, done + 1
                self.session.execute(
                    f"INSERT INTO {self.keyspace}.index_state (name, value) VALUES (%s, %s)",
                    [_progress_name(table.name), end],
                )
                if time.monotonic() - said >= PROGRESS_EVERY_S or done == len(todo):
                    said = time.monotonic()
                    self.say(
                        f"{table.name}: {before + done} of {TOKEN_RANGES} token ranges,"
                        f" {seen:,} rows seen, {rewritten:,} rewritten with a TTL"
                    )
        finally:
            pool.shutdown(cancel_futures=True)
        return done, seen, rewritten

    def _range(self, table: Table, start: int, end: int) -> tuple[int, int]:
        """The rows of one token range: each that has a cell without a TTL (or that cannot tell:
        only key columns, or none of its probed cells set) rewritten with the tenant's TTL."""
        columns = (*table.keys, *table.probed, *table.collections)
        ttls = "".join(f", TTL({c})" for c in table.probed)
        token = f"token({', '.join(table.partition_key)})"
        query = self._prepared(
            ("select", table.name),
            f"SELECT {', '.join(columns)}{ttls} FROM {self.keyspace}.{table.name} WHERE {token} > ? AND {token} <= ?",
        )
        query.fetch_size = PAGE_ROWS
        tenant_at = table.keys.index("tenant")
        keys = len(table.keys)
        seen, requests, rewritten = 0, [], 0
        for row in self.session.execute(query, (start, end), execution_profile=PLAIN_ROWS, timeout=60):
            seen += 1
            values = dict(zip(columns, row))
            row_ttls = row[len(columns) :]
            set_cells = [c for c in table.probed if values[c] is not None]
            stale = [c for c, ttl in zip(table.probed, row_ttls) if values[c] is not None and ttl is None]
            if set_cells and not stale:
                continue
            rewrite = (*stale, *(c for c in table.collections if values[c] is not None))
            statement = self._insert(table, rewrite)
            ttl_s = self.store._all_time_ttl_s(row[tenant_at])
            requests.append((statement, (*row[:keys], *(values[c] for c in rewrite), self.written_at_us, ttl_s)))
            if len(requests) >= ROWS_PER_FLUSH:
                rewritten += self._send(requests)
                requests = []
        return seen, rewritten + self._send(requests)

    def _insert(self, table: Table, rewrite: tuple[str, ...]):
        columns = (*table.keys, *rewrite)
        return self._prepared(
            (table.name, rewrite),
            f"INSERT INTO {self.keyspace}.{table.name} ({', '.join(columns)})"
            f" VALUES ({', '.join('?' * len(columns))}) USING TIMESTAMP ? AND TTL ?",
        )

    def _prepared(self, name: tuple, text: str):
        with self._lock:
            if name not in self._statements:
                statement = self.session.prepare(text)
                is_write = text.startswith("INSERT")
                options = self.store.options
                statement.consistency_level = options.write_consistency if is_write else options.read_consistency
                statement.is_idempotent = True
                self._statements[name] = statement
            return self._statements[name]

    def _send(self, requests: list) -> int:
        if requests:
            execute_concurrent(
                self.session, self.store._batched(requests), concurrency=BATCHES_IN_FLIGHT, raise_on_first_error=True
            )
        return len(requests)
