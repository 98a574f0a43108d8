"""The write path: the one ingest pipeline (validate, hash, limits, metadata, store
writes), tenant limits, created timestamps, the metadata cache, carbon's listeners, deletes."""
