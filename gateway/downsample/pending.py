"""Which series-slots wait for the downsampler, and when a slot has settled.

A slot has settled once it has ended and no sample landed in it for ``delay`` (the last-touch
delay): late data re-marks the slot and pushes it back. Two trackers keep that state:

- StorePending: the ``pending_downsample_sets`` table, with a ``last_touch`` per row; rows
  are deleted only if untouched since they were read.
- RedisPending: ``ingesting|<partition>|<slot>`` (a key that expires ``delay`` after
  the last touch, or after the slot ends plus ``delay`` while it is still current) and
  ``pending|<partition>|<slot>`` (a set of ``<tenant>|<hash>``). A settled set is renamed to
  ``processing|...`` before it is read, so members added meanwhile start a new pending set instead
  of being removed unprocessed (an SREM after processing could lose them; docs/downsampling.rst).
  ``slots|<partition>`` lists the slots that have a pending or processing set, so a round reads
  its partition's slots without a SCAN of the whole keyspace (which also holds the known-series
  caches: millions of keys at scale); a slot leaves it, atomically, once it has neither set.
  When Redis cannot be reached, ingest marks the store table instead (counted), and the
  downsampler reads both.
"""

import logging
from collections import defaultdict
from collections.abc import Collection
from typing import NamedTuple

from twisted.internet import threads

from gateway.core import metrics
from gateway.downsample.partitions import partition_of
from gateway.store import Store
from gateway.store.contract import PendingSet

log = logging.getLogger(__name__)

EVERY_SLOT = 2**62  # a time_slot bound past every slot: list_pending(partition, EVERY_SLOT) lists them all


# KEYS: the slot index, the slot's pending and processing sets; ARGV: the slot. Drops the slot
# from the index when it has neither set; 1 if it did.
FORGET_SLOT = """
if redis.call('exists', KEYS[2]) == 0 and redis.call('exists', KEYS[3]) == 0 then
    return redis.call('srem', KEYS[1], ARGV[1])
end
return 0
"""


class Work(NamedTuple):
    """One settled slot of one partition: the series to roll up, and how to mark it done."""

    partition: int
    time_slot: int
    members: list[tuple[str, str]]
    token: object


class StorePending:
    def __init__(self, store: Store, slot_width_ms: int, delay_ms: int):
        self.store = store
        self.slot_width_ms = slot_width_ms
        self.delay_ms = delay_ms

    async def track(self, items: list[PendingSet], now_ms: int) -> None:
        await self.store.mark_pending(items, now_ms)

    async def settled(self, partition: int, now_ms: int) -> list[Work]:
        before = now_ms - self.delay_ms - self.slot_width_ms + 1
        rows = await self.store.list_pending(partition, before)
        by_slot: dict[int, list[PendingSet]] = defaultdict(list)
        for row in rows:
            if row.last_touch_ms + self.delay_ms <= now_ms:
                by_slot[row.time_slot].append(row)
        return [
            Work(partition, slot, [(r.tenant, r.series_set_hash) for r in group], group)
            for slot, group in sorted(by_slot.items())
        ]

    async def done(self, work: Work, left: Collection[tuple[str, str]] = ()) -> None:
        """The work's marks go, but those of the members ``left`` (failed, or waiting out a
        backoff: gateway/downsample/failures.py), which stay for a later round."""
        finished = [row for row in work.token if (row.tenant, row.series_set_hash) not in left]
        if finished:
            await self.store.delete_pending(finished)

    async def waiting(self, partition: int) -> int:
        """Series-slots of the partition still marked pending, settled or not (what a round left)."""
        return len(await self.store.list_pending(partition, EVERY_SLOT))


class RedisPending:
    def __init__(self, url: str, fallback: StorePending, slot_width_ms: int, delay_ms: int):
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._errors = (redis.RedisError, OSError)
        self.fallback = fallback
        self.slot_width_ms = slot_width_ms
        self.delay_ms = delay_ms
        self.namespace = ""
        self._indexed = False
        self._forget_slot = self.client.register_script(FORGET_SLOT)

    def use_namespace(self, namespace: str) -> None:
        """Prefix every key (see redis_namespace); set once the store's identity is known."""
        self.namespace = namespace

    async def track(self, items: list[PendingSet], now_ms: int) -> None:
        """One pipelined round trip per batch: SET ingesting (with its expiry) per slot, SADD per
        series, then each slot listed in its partition's index (after its set: FORGET_SLOT)."""
        slots = {(i.partition, i.time_slot) for i in items}

        def write():
            pipeline = self.client.pipeline(transaction=False)
            for partition, slot in slots:
                expiry = max(slot + self.slot_width_ms + self.delay_ms - now_ms, self.delay_ms, 1)
                pipeline.set(f"{self.namespace}ingesting|{partition}|{slot}", b"1", px=expiry)
            for item in items:
                pipeline.sadd(
                    f"{self.namespace}pending|{item.partition}|{item.time_slot}",
                    f"{item.tenant}|{item.series_set_hash}",
                )
            for partition, slot in slots:
                pipeline.sadd(f"{self.namespace}slots|{partition}", slot)
            pipeline.execute()

        try:
            await threads.deferToThread(write)
        except self._errors as error:
            metrics.REDIS_ERRORS.labels("pending").inc()
            log.warning("redis pending tracking failed (%s); marking the store table instead", error)
            await self.fallback.track(items, now_ms)

    def _index_existing_sets(self) -> None:
        """Once a process: list in ``slots|<partition>`` the sets a gateway without that index
        left (one SCAN, not one a partition a round)."""
        if self._indexed:
            return
        for prefix in ("processing", "pending"):
            for key in self.client.scan_iter(match=f"{self.namespace}{prefix}|*", count=1000):
                partition, slot = key.rsplit(b"|", 2)[1:]
                self.client.sadd(f"{self.namespace}slots|{int(partition)}", int(slot))
        self._indexed = True

    def _slots(self, partition: int) -> list[int]:
        """The partition's slots with a pending or processing set (and the emptied ones, forgotten
        here: atomically, so a set made meanwhile keeps its slot listed)."""
        self._index_existing_sets()
        index = f"{self.namespace}slots|{partition}"
        slots = []
        for member in self.client.smembers(index):
            slot = int(member)
            keys = [f"{self.namespace}{prefix}|{partition}|{slot}" for prefix in ("pending", "processing")]
            if self._forget_slot(keys=[index, *keys], args=[slot]):
                continue
            slots.append(slot)
        return sorted(slots)

    async def settled(self, partition: int, now_ms: int) -> list[Work]:
        namespace = self.namespace

        def read() -> list[Work]:
            work = []
            for slot in self._slots(partition):
                processing = f"{namespace}processing|{partition}|{slot}"
                if not self.client.exists(processing):
                    pending = f"{namespace}pending|{partition}|{slot}"
                    if self.client.exists(f"{namespace}ingesting|{partition}|{slot}") or not self.client.renamenx(
                        pending, processing
                    ):
                        continue
                members = [m.decode().rsplit("|", 1) for m in self.client.smembers(processing)]
                work.append(Work(partition, slot, [(tenant, hash_) for tenant, hash_ in members], processing))
            return work

        try:
            found = await threads.deferToThread(read)
        except self._errors as error:
            metrics.REDIS_ERRORS.labels("pending").inc()
            log.warning("redis pending scan failed (%s); only the store table is read this round", error)
            found = []
        return found + await self.fallback.settled(partition, now_ms)

    async def done(self, work: Work, left: Collection[tuple[str, str]] = ()) -> None:
        """The processing set goes; the members ``left`` go back to the slot's pending set first
        (one transaction), so a later round takes them with any late data of the slot."""
        if not isinstance(work.token, str):
            await self.fallback.done(work, left)
            return

        def finish():
            pipeline = self.client.pipeline(transaction=True)
            if left:
                pipeline.sadd(
                    f"{self.namespace}pending|{work.partition}|{work.time_slot}",
                    *(f"{tenant}|{hash_}" for tenant, hash_ in left),
                )
                pipeline.sadd(f"{self.namespace}slots|{work.partition}", work.time_slot)
            pipeline.delete(work.token)
            pipeline.execute()

        await threads.deferToThread(finish)

    async def waiting(self, partition: int) -> int:
        """Members of the partition's pending and processing sets, plus the store table's rows."""

        def count() -> int:
            return sum(
                self.client.scard(f"{self.namespace}{prefix}|{partition}|{slot}")
                for slot in self._slots(partition)
                for prefix in ("processing", "pending")
            )

        return await threads.deferToThread(count) + await self.fallback.waiting(partition)


class PendingMarks:
    """The ingest pipeline's pending marker (gateway.ingest.pipeline.PendingMarker): each written
    series-slot goes to its partition's pending set in ``tracker`` (StorePending or RedisPending)."""

    def __init__(self, tracker: "StorePending | RedisPending", partitions: int):
        self.tracker = tracker
        self.partitions = partitions
        self.delay_ms = tracker.delay_ms

    async def mark(self, series_slots: list[tuple[str, str, int]], now_ms: int) -> None:
        items = [
            PendingSet(partition_of(tenant, hash_, self.partitions), slot, tenant, hash_)
            for tenant, hash_, slot in series_slots
        ]
        await self.tracker.track(items, now_ms)


def redis_namespace(store_identity: str) -> str:
    """The prefix of every Redis key of one store: deployments (or a keyspace dropped and made
    again) sharing one Redis must not see each other's "already indexed" marks or pending sets.
    Store identities are letters, digits, ``:``, ``-`` and ``_``: nothing a SCAN pattern reads
    as a wildcard."""
    return f"tsgate|{store_identity}|"


class RedisPartitionLock:
    """Competing consumers: a partition is processed by whoever takes ``lock|<partition>`` first;
    the lock expires after ``lease_ms``, so a replica that dies frees its work."""

    _RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"

    def __init__(self, pending: RedisPending, owner: str, lease_ms: int):
        self.pending = pending
        self.client = pending.client
        self.owner = owner
        self.lease_ms = lease_ms

    def __call__(self, partition: int):
        lock = self

        class Held:
            async def __aenter__(self):
                self.key = key = f"{lock.pending.namespace}lock|{partition}"
                try:
                    self.acquired = bool(
                        await threads.deferToThread(lock.client.set, key, lock.owner, nx=True, px=lock.lease_ms)
                    )
                except Exception as error:
                    metrics.REDIS_ERRORS.labels("lock").inc()
                    log.warning("redis lock for partition %d failed (%s); skipping it this round", partition, error)
                    self.acquired = False
                return self.acquired

            async def __aexit__(self, *exc_info):
                if self.acquired:
                    await threads.deferToThread(lock.client.eval, RedisPartitionLock._RELEASE, 1, self.key, lock.owner)

        return Held()
