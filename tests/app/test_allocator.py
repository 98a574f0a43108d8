"""The serving and executor processes' allocator (gateway/app/service.py tune_allocator): a
query's temporaries (arrays of 0.5 MB, a (series, steps) array of 1000 series) reuse the heap
instead of being mapped afresh and page-faulted every 4 KiB, on every query."""

import subprocess
import sys

QUERY = """
import resource, sys
import numpy as np
if sys.argv[1] == "tuned":
    from gateway.app.service import tune_allocator
    tune_allocator()
rows = np.random.default_rng(1).random((1000, 61))
def query():
    totals = np.cumsum(rows, axis=0)
    lost = np.where(np.abs(totals) >= np.abs(rows), totals - rows, rows - totals)
    return (totals + lost).sum()
query()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    query()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    """Minor page faults of 50 such queries in a fresh interpreter."""
    return int(subprocess.run([sys.executable, "-c", QUERY, mode], capture_output=True, text=True, check=True).stdout)


def test_a_querys_arrays_reuse_the_heap():
    assert page_faults("default") > 5_000  # glibc's defaults: each 0.5 MB temporary mapped afresh
    assert page_faults("tuned") < 100
