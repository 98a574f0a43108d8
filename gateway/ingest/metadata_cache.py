"""Which series already have their metadata in the store, so ingest writes it once per series.

Level one is a bounded in-memory LRU keyed by tenant + series-set hash; level two,
when ``--redis`` is given, is Redis, shared by all replicas. A false miss at either level only
costs a harmless re-insert of the metadata, never correctness.
"""

import logging
import time
from collections.abc import Iterable

from twisted.internet import reactor, threads
from twisted.internet.defer import Deferred, succeed
from twisted.python.threadpool import ThreadPool

from gateway.core import blocking, metrics
from gateway.core.caches import LRUMap

log = logging.getLogger(__name__)


class SeenSeries(LRUMap):
    """A bounded LRU set of keys (metric metadata rows, aggregator sets already stored), with
    each lookup counted under ``level``."""

    def __init__(self, max_entries: int, level: str = "memory"):
        super().__init__(max_entries)
        self.level = level

    def __contains__(self, key: tuple) -> bool:
        found = self.get(key) is not None
        metrics.METADATA_CACHE.labels(self.level, "hit" if found else "miss").inc()
        return found

    def add_all(self, keys: Iterable[tuple]) -> None:
        super().add_all(dict.fromkeys(keys, True))


class KnownSeries(LRUMap):
    """Level one for series: series whose metadata the store has, with their series-set hash.

    Keyed by the label set as a protocol decoded it, ``(tenant, metric name, (*tag names, *tag
    values))``: one flat tuple, which a dict's n names then n values decode unambiguously, and
    which costs no tuple per tag. A sample of a known series skips the validation of its name
    and tags, the series-set text and the murmur3 hash: docs/performance-log.rst shows those were most
    of ingest's own CPU. The same series with its tags in another order is a second entry (a
    harmless extra metadata write) with the same hash. An entry holds the tag values, with the
    names interned (ingest._compact): about 490 bytes for four tags, with the LRU's own links.
    """

    def forget(self, series: set[tuple[str, str]]) -> None:
        """Drop the entries of these (tenant, hash), whose metadata was deleted (gateway/ingest/deletes.py):
        their next sample writes it again. One pass over the cache: an admin's delete, not ingest."""
        doomed = [key for key, hash_ in self._entries.items() if (key[0], hash_) in series]
        for key in doomed:
            del self._entries[key]


class RedisSeenSeries:
    """Level two, shared by every replica: one Redis key per tenant + series-set hash (and one
    per tenant + ``<hash>|<bucket>`` for the time index: the series is indexed in that bucket).

        Claiming a key with SET NX before inserting the metadata would be wrong: if that insert then
        failed, the key would say "indexed" while Cassandra has nothing, and other replicas would skip the insert and
        acknowledge data nobody can find. So a key is set only after the store accepted the metadata:
        a key in Redis always means the metadata is in the store. Two replicas that see a new series
        at once both insert it, which is harmless.

        Redis being down never stops ingest: lookups fall through (every series counts as unseen, so
        its metadata is re-inserted) and the errors are counted. After a failure Redis is left alone
        for a few seconds so that each request does not wait for a timeout.
    """

    RETRY_AFTER_S = 5.0

    def __init__(self, url: str, key_ttl_ms: int, timeout_s: float = 0.5):
        import redis

        self._redis_errors = (redis.RedisError, OSError)
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.key_ttl_s = max(1, key_ttl_ms // 1000)
        self._pool = ThreadPool(1, 4, name="redis")
        self._down_until = 0.0
        self.namespace = ""  # set by the gateway once the store's identity is known (redis_namespace)

    def key(self, tenant: str, series_set_hash: str) -> str:
        return f"{self.namespace}series|{tenant}|{series_set_hash}"

    def start(self) -> None:
        self._pool.start()

    def stop(self) -> Deferred:
        return blocking.in_daemon_thread(self._pool.stop)

    def ping(self) -> Deferred:
        """Fire when Redis answers PING, fail with why not (the status page's health check)."""
        return threads.deferToThreadPool(reactor, self._pool, self.client.ping)

    def _call(self, operation: str, function, fallback):
        """Run a Redis call on the pool; on failure count it, back off, and fire with ``fallback``."""
        if time.monotonic() < self._down_until:
            metrics.METADATA_CACHE.labels("redis", "skipped").inc()
            return succeed(fallback)

        def failed(failure):
            failure.trap(*self._redis_errors)
            metrics.REDIS_ERRORS.labels(operation).inc()
            self._down_until = time.monotonic() + self.RETRY_AFTER_S
            log.warning("redis %s failed (%s); going on without it", operation, failure.getErrorMessage())
            return fallback

        return threads.deferToThreadPool(reactor, self._pool, function).addErrback(failed)

    def unseen(self, keys: list[tuple[str, str]]) -> Deferred:
        """Fire with the keys Redis does not know (all of them when Redis cannot answer)."""
        if not keys:
            return succeed([])

        def lookup():
            pipeline = self.client.pipeline(transaction=False)
            for tenant, hash_ in keys:
                pipeline.exists(self.key(tenant, hash_))
            found = pipeline.execute()
            hits = sum(1 for exists in found if exists)
            metrics.METADATA_CACHE.labels("redis", "hit").inc(hits)
            metrics.METADATA_CACHE.labels("redis", "miss").inc(len(keys) - hits)
            return [key for key, exists in zip(keys, found) if not exists]

        return self._call("lookup", lookup, list(keys))

    def forget(self, keys: list[tuple[str, str]]) -> Deferred:
        """Drop keys whose metadata was deleted (gateway/ingest/deletes.py)."""
        if not keys:
            return succeed(None)
        return self._call("forget", lambda: self.client.delete(*(self.key(t, h) for t, h in keys)), None)

    def mark(self, keys: list[tuple[str, str]]) -> Deferred:
        """Record keys whose metadata the store has accepted."""
        if not keys:
            return succeed(None)

        def store():
            pipeline = self.client.pipeline(transaction=False)
            for tenant, hash_ in keys:
                pipeline.set(self.key(tenant, hash_), b"1", ex=self.key_ttl_s)
            pipeline.execute()

        return self._call("mark", store, None)
