"""/api/v1/series over a range through a real gateway: the series with data in the range, as
Prometheus checks each series' chunks, though the time index lists a series for its whole hour
bucket and, written in a bucket's last quarter, for the next bucket too (docs/storage.rst)."""

import time

from gateway.core.layout import INDEX_BUCKET_MS
from protocols.prometheus import WriteSeries
from tests.e2e.test_read_path_e2e import remote_write
from tests.http.test_promql_api_e2e import promql

MINUTE = 60_000


def pods(gateway, tenant: str, path: str, start_ms: int, end_ms: int, **params) -> set[str]:
    answer = promql(gateway, tenant, path, start=start_ms / 1000, end=end_ms / 1000, **params)
    assert answer.status == 200, answer.body
    data = answer.json()["data"]
    return {series["pod"] for series in data} if path == "/api/v1/series" else set(data)


def test_series_lists_only_those_with_samples_in_the_range(gateway, tenant):
    """In the last full hour bucket: ``gone`` stopped before the range, ``live`` spans it, ``late``
    started after it, ``ahead`` wrote only in the bucket's last minute (indexed ahead in the
    current bucket, where it has no sample)."""
    now = int(time.time() * 1000)
    bucket = now - now % INDEX_BUCKET_MS - INDEX_BUCKET_MS
    spans = {
        "gone": (5, 15),
        "live": (10, 50),
        "late": (35, 40),
        "ahead": (59, 59),
    }
    remote_write(
        gateway,
        tenant,
        [
            WriteSeries(
                {"__name__": "churn_total", "job": "api", "pod": pod},
                [(bucket + minute * MINUTE, float(minute)) for minute in range(first, last + 1)],
            )
            for pod, (first, last) in spans.items()
        ],
    )
    match = {"match[]": 'churn_total{job="api"}'}
    assert pods(gateway, tenant, "/api/v1/series", bucket + 20 * MINUTE, bucket + 30 * MINUTE, **match) == {"live"}
    assert pods(gateway, tenant, "/api/v1/series", bucket + 15 * MINUTE, bucket + 35 * MINUTE, **match) == {
        "gone",
        "live",
        "late",
    }
    current = bucket + INDEX_BUCKET_MS
    assert pods(gateway, tenant, "/api/v1/series", current, now, **match) == set()
    # label values read the index as Prometheus reads its own, without chunks: the whole buckets
    values = pods(gateway, tenant, "/api/v1/label/pod/values", bucket + 20 * MINUTE, bucket + 30 * MINUTE)
    assert values == set(spans)
    assert "ahead" in pods(gateway, tenant, "/api/v1/label/pod/values", current, now)
    # without a range: every series
    answer = promql(gateway, tenant, "/api/v1/series", **match)
    assert {series["pod"] for series in answer.json()["data"]} == set(spans)
