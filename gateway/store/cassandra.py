"""The production store: Cassandra through cassandra-driver, table for table as contract.py says.

CassandraStore is composed of one mixin a role of the contract, each in its own module with its
statements: cassandra_lifecycle.py, cassandra_index.py, cassandra_samples.py (head rows, blocks,
roll-ups), cassandra_histograms.py, cassandra_exemplars.py, cassandra_pending.py and
cassandra_metadata.py, over cassandra_base.py (options, connection, prepared statements,
batching). Every statement is prepared and runs asynchronously through one bounded request
queue (cassandra_requests.py): each store call fires one Deferred on the reactor thread, so the
reactor never waits on Cassandra. Head rows go in UNLOGGED batches of one data_head partition
(one mutation), or of a request's small partitions that share their replicas (_head_batches),
through acsylla (cassandra_acsylla.py, on a loop thread of its own), or with
head_writer=driver through the queue (head_batch); other writes of many rows (_write_rows) go in
UNLOGGED batches of rows that share a replica, up to ROWS_PER_BATCH rows a request, bound on the
store's binder thread, through acsylla too (or the queue with head_writer=driver).
Timeouts and unavailable replicas become StoreUnavailable (HTTP 503, so senders retry); the
driver reconnects on its own when Cassandra comes back.
"""

import functools

from twisted.internet.defer import ensureDeferred

from gateway.store.calls import store_call
from gateway.store.cassandra_base import parse_url
from gateway.store.cassandra_exemplars import CassandraExemplars
from gateway.store.cassandra_histograms import CassandraHistograms
from gateway.store.cassandra_index import CassandraIndex
from gateway.store.cassandra_lifecycle import CassandraLifecycle
from gateway.store.cassandra_metadata import CassandraMetadata
from gateway.store.cassandra_pending import CassandraPending
from gateway.store.cassandra_samples import CassandraSamples
from gateway.store.contract import series_with_data_read


class CassandraStore(
    CassandraLifecycle,
    CassandraIndex,
    CassandraSamples,
    CassandraHistograms,
    CassandraExemplars,
    CassandraPending,
    CassandraMetadata,
):
    """Every role of the contract on one connection (cassandra_base.CassandraBase)."""

    @functools.partial(store_call, bounded=False)
    def series_with_data(self, tenant, hashes, start_ms, end_ms, granularity=None, raw=True):
        """Through the reads (a composite of bounded store calls): the data_blocks rows and the
        head rows of unsealed slots of the range, then histograms and roll-ups, each read asking
        only for the series not found yet."""
        return ensureDeferred(series_with_data_read(self, tenant, hashes, start_ms, end_ms, granularity, raw))


__all__ = ["CassandraStore", "parse_url"]
