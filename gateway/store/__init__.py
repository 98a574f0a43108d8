"""Store drivers behind one contract (contract.py); open_store() picks one from a URL."""

from urllib.parse import urlsplit

from gateway.core.layout import Layout
from gateway.store.contract import Store, StoreUnavailable


def open_store(url: str, layout: Layout) -> Store:
    """Build (not start) the driver a ``--store`` URL names."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from gateway.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(url, layout)
    if scheme == "cassandra":
        from gateway.store.cassandra import CassandraStore

        return CassandraStore.from_url(url, layout)
    raise ValueError(f"{url!r}: unknown scheme {scheme!r} (expected sqlite:// or cassandra://)")


__all__ = ["Store", "StoreUnavailable", "open_store"]
