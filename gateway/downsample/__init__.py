"""The downsampler: pending series-slots are rolled up into one table per granularity."""
