"""The SQLite head read's choice of samples (gateway/store/sqlite_head.py): of each series'
timestamp the last written, by series then time, whether the series and timestamps fit one
sortable number or (timestamps spanning more than any stored range) need a two-key sort."""

import numpy as np
import pytest

from gateway.store.sqlite_head import _last_writes


def expected(owner: np.ndarray, timestamps: np.ndarray) -> list[tuple[int, int, int]]:
    """(series, timestamp, index) of the last write of each series' timestamp, in order."""
    last: dict[tuple[int, int], int] = {}
    for index, key in enumerate(zip(owner.tolist(), timestamps.tolist())):
        last[key] = index
    return sorted((series, ts, index) for (series, ts), index in last.items())


@pytest.mark.parametrize("span", [3_900_000, 2**61], ids=["an-hour", "beyond-any-range"])
def test_the_last_write_of_each_series_timestamp_in_order(span):
    rng = np.random.default_rng(7)
    owner = rng.integers(0, 300, 5_000)
    timestamps = rng.choice(np.linspace(-span // 2, span // 2, 40, dtype=np.int64), 5_000)
    kept = _last_writes(owner, timestamps)
    assert [(int(owner[i]), int(timestamps[i]), int(i)) for i in kept] == expected(owner, timestamps)
    assert len(_last_writes(owner[:0], timestamps[:0])) == 0
