"""tsgate: a time-series protocol gateway (the service side: model, ingest, query, stores, HTTP)."""

__version__ = "0.5.9"
