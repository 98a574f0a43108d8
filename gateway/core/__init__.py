"""The bottom layer every path shares: the data model, sample arrays, metrics, caches,
the time layout, per-tenant overrides and the error taxonomy. Imports nothing else of gateway."""
