"""Store drivers behind one contract (contract.py); open_store() picks one from a URL."""

from urllib.parse import urlsplit

from gateway.store.contract import Store, StoreUnavailable


def open_store(url: str, slot_width_ms: int, raw_retention_ms: int) -> Store:
    """Build (not start) the driver a ``--store`` URL names."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from gateway.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, slot_width_ms)
    if scheme == "cassandra":
        from gateway.store.cassandra import CassandraStore

        return CassandraStore.from_url(url, raw_retention_ms, slot_width_ms)
    raise ValueError(f"--store {url!r}: unknown scheme {scheme!r} (expected sqlite:// or cassandra://)")


__all__ = ["Store", "StoreUnavailable", "open_store"]
