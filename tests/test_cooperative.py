"""gateway.cooperative: what keeps a large request from holding the reactor."""

import gc
import json

import pytest

from gateway.cooperative import tune_collector
from protocols import native_json


def large_json_write(items: int = 30_000) -> bytes:
    """bench.reactor_stall's native JSON write: an item a series, ten tags each."""
    common = {f"label_{i:02d}": f"value_{i}" for i in range(8)}
    return json.dumps(
        [
            {"metricName": "stall", "tags": {"series": str(n), **common}, "ts": 1_700_000_000_000, "value": n}
            for n in range(items)
        ]
    ).encode()


@pytest.fixture
def collector_restored():
    """The test process's collector as it was, whatever a test set."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def full_passes_while_decoding(body: bytes) -> int:
    """Full collector passes (each holds the GIL over every object not frozen) while one large
    write is decoded, its items kept as a request keeps them until it is written."""
    gc.collect()
    passes = []

    def count(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            passes.append(info)

    gc.callbacks.append(count)
    try:
        decoded, errors = native_json.decode_write_batch(body, 0)
    finally:
        gc.callbacks.remove(count)
    assert len(decoded) == 30_000 and not errors
    return len(passes)


def test_a_large_json_write_runs_no_full_collection_once_the_collector_is_tuned(collector_restored):
    body = large_json_write()
    gc.freeze()  # as the gateway did before, with Python's default thresholds
    gc.set_threshold(700, 10, 10)
    assert full_passes_while_decoding(body) >= 1
    tune_collector()
    assert gc.get_freeze_count() > 0
    assert full_passes_while_decoding(body) == 0
