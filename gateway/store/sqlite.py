"""The embedded default store: one SQLite file (WAL, synchronous=FULL, so a commit is durable).

The tables mirror the Cassandra ones column for column (see contract.py) but for the head, with
two differences that stand in for Cassandra's TTLs: sealing a slot deletes the head samples it
sealed, in the same transaction as the block's write, and ``sweep`` deletes blocks, head rows, roll-ups, exemplars and
histograms (and their roll-ups) past their retention, then gives the freed pages back to the file system (incremental auto-vacuum). Data
blocks are in an ordinary rowid table (not WITHOUT ROWID, which suits only small rows).

The head is not ``data_raw`` (one row a sample keyed by series, whose rows of one commit land on
one B-tree page a series) but ``head_batches``, one row a write appended in commit order (its
hashes as text, its timestamps and values as numpy bytes), which the writer folds into
``head_chunks``, one row of numpy bytes a series-slot, once they hold ``FOLD_ROWS`` samples; a
read takes a series' chunks and its samples still in batches, the last write of a timestamp
winning (docs/storage.rst, "The embedded store"). SQLite
calls block, so they run on threads: one writer thread (SQLite allows one writer at a time) and a
small pool of readers, each thread with its own connection.

Writes commit in groups: the writes that arrive while a transaction commits all go into the next
one (``_commit``), so under load one commit (one fsync, one pass over the B-tree pages the rows
land on) carries many requests. Each write's Deferred still fires only once its rows are
committed; if a group fails, its writes are retried one transaction each, so one bad write fails
alone.

SQLiteStore is composed of one mixin a role of the contract, each in its own module:
sqlite_lifecycle.py, sqlite_index.py, sqlite_samples.py, sqlite_histograms.py, sqlite_exemplars.py,
sqlite_pending.py and sqlite_metadata.py, over sqlite_base.py (threads, connections, group
commits); the functions they run on the writer and reader threads are in sqlite_sql.py,
sqlite_head.py (the head log) and sqlite_schema.py.
"""

from gateway.store.sqlite_exemplars import SQLiteExemplars
from gateway.store.sqlite_histograms import SQLiteHistograms
from gateway.store.sqlite_index import SQLiteIndex
from gateway.store.sqlite_lifecycle import SQLiteLifecycle
from gateway.store.sqlite_metadata import SQLiteMetadata
from gateway.store.sqlite_pending import SQLitePending
from gateway.store.sqlite_samples import SQLiteSamples


class SQLiteStore(
    SQLiteLifecycle,
    SQLiteIndex,
    SQLiteSamples,
    SQLiteHistograms,
    SQLiteExemplars,
    SQLitePending,
    SQLiteMetadata,
):
    """Every role of the contract on one file (sqlite_base.SQLiteBase)."""
