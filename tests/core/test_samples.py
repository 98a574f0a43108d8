"""Many series' samples laid end to end (gateway/core/samples.py SamplesStack): built from a
Samples a series and split back, the series without samples included."""

import numpy as np

from gateway.core.samples import Samples, stacked


def some(*timestamps: int) -> Samples:
    return Samples(np.array(timestamps, dtype=np.int64), np.array(timestamps, dtype=np.float64) / 2)


def test_a_stack_splits_back_into_each_series_samples_in_order():
    parts = [some(1, 2), some(), some(5), some()]
    stack = stacked(parts)
    assert stack.bounds == [0, 2, 2, 3, 3]
    assert [part.points() for part in stack.split()] == [part.points() for part in parts]
    assert stacked([]).bounds == [0] and stacked([]).split() == []
