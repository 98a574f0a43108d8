"""The gateway's own Prometheus metrics, served at /metrics (prometheus-client).

Under ``--workers N`` every worker process is started with PROMETHEUS_MULTIPROC_DIR set, so
prometheus-client keeps these values in per-process files there and /metrics adds them up
(gateway.http.ops). Counters and histograms are summed, dead workers' counts included, so they
never go backwards. Each gauge says how to combine processes: in-flight figures are summed over
the live workers; the downsample gauges, set only by the worker running the downsample loop
(0 in the others), take the largest live value.
"""

import time

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

# The *_created series double the exposition for no use in a gateway that runs for days.
disable_created_metrics()

SAMPLES_ACCEPTED = Counter("tsgate_samples_accepted", "Samples written to the store", ["protocol"])
SAMPLES_REJECTED = Counter("tsgate_samples_rejected", "Samples refused, by reason", ["protocol", "reason"])
EXEMPLARS_ACCEPTED = Counter("tsgate_exemplars_accepted", "Exemplars written to the store", ["protocol"])
EXEMPLARS_REJECTED = Counter("tsgate_exemplars_rejected", "Exemplars refused, by reason", ["protocol", "reason"])
HISTOGRAMS_ACCEPTED = Counter(
    "tsgate_native_histograms_accepted", "Native histogram samples written to the store", ["protocol"]
)
HISTOGRAMS_REJECTED = Counter(
    "tsgate_native_histograms_rejected", "Native histogram samples refused, by reason", ["protocol", "reason"]
)
HTTP_REQUESTS = Histogram("tsgate_http_request_duration_seconds", "HTTP request latency", ["handler", "method", "code"])
STORE_OPERATIONS = Histogram(
    "tsgate_store_operation_duration_seconds", "Store call latency, by operation", ["operation"]
)
STORE_ERRORS = Counter("tsgate_store_errors", "Store calls that failed, by operation", ["operation"])
METADATA_CACHE = Counter("tsgate_metadata_cache_lookups", "Series metadata cache lookups", ["level", "result"])
REDIS_ERRORS = Counter("tsgate_redis_errors", "Redis calls that failed (ingest went on without Redis)", ["operation"])
PROMETHEUS_SKIPPED = Counter(
    "tsgate_prometheus_skipped", "Remote-write parts not stored (metadata over --max-metadata-length)", ["kind"]
)
AUTH_FAILURES = Counter("tsgate_auth_failures", "HTTP requests refused for their credential (--auth-file)", ["reason"])
RATE_LIMITED = Counter(
    "tsgate_rate_limited_requests",
    "Requests refused with 429 over a limit (a tenant's, or of failed credentials and waiting password checks)",
    ["limit"],
)
CANCELLED_REQUESTS = Counter(
    "tsgate_cancelled_requests", "HTTP requests whose work was cancelled because the client closed the connection"
)
OVERRIDES_RELOAD_FAILURES = Counter(
    "tsgate_overrides_reload_failures", "Overrides files refused on reload (--overrides; the last good one stays)"
)
OVERRIDES_LOADED_AT = Gauge(
    "tsgate_overrides_last_reload_success_timestamp_seconds",
    "When the overrides file in use was loaded (--overrides); the oldest over the live processes",
    multiprocess_mode="livemin",
)
GRAPHITE_PENDING = Gauge(
    "tsgate_graphite_pending_samples", "Graphite samples received and not yet stored", multiprocess_mode="livesum"
)
GRAPHITE_BACKPRESSURE = Counter(
    "tsgate_graphite_backpressure", "Times Graphite TCP reading was paused for a full backlog"
)
GRAPHITE_UDP_DROPPED = Counter(
    "tsgate_graphite_udp_dropped_samples", "Graphite UDP samples dropped over a full backlog"
)
GRAPHITE_LOST = Counter("tsgate_graphite_lost_samples", "Graphite samples dropped after an unexpected store error")
DOWNSAMPLED = Counter("tsgate_downsampled_series_slots", "Series-slots rolled up")
SEALED_SAMPLES = Counter(
    "tsgate_sealed_samples", "Samples written into data blocks by the downsampler (a re-sealed slot counts again)"
)
DOWNSAMPLE_LAG = Gauge(
    "tsgate_downsample_lag_seconds",
    "How long the oldest settled slot found in the last round had waited (0: none waiting)",
    multiprocess_mode="livemax",
)
DOWNSAMPLE_SETTLED = Gauge(
    "tsgate_downsample_settled_slots",
    "Settled partition-slots found waiting at the last round",
    multiprocess_mode="livemax",
)
DOWNSAMPLE_ERRORS = Counter(
    "tsgate_downsample_errors",
    "Settled partition-slots in which a round failed to seal or roll up a series-slot (retried later)",
)
DOWNSAMPLE_SLOT_FAILURES = Counter(
    "tsgate_downsample_slot_failures",
    "Failed attempts to seal (stage=seal) or roll up (stage=rollup, raw block written) a series-slot, by exception",
    ["stage", "reason"],
)
DOWNSAMPLE_NEAR_EXPIRY = Gauge(
    "tsgate_downsample_slots_near_expiry",
    "Failed series-slots still unsealed whose head rows have less than half of --head-retention left",
    multiprocess_mode="livemax",
)
DOWNSAMPLE_PENDING_MARKS = Counter("tsgate_downsample_pending_marks", "Series-slots marked pending at ingest")
SERIES_CREATED = Counter("tsgate_series_metadata_writes", "Series whose metadata was written to the store")
INDEX_BUCKET_SERIES = Counter(
    "tsgate_index_bucket_series", "Series indexed in a bucket of the time index (each series and bucket once)"
)
TENANT_SAMPLES = Counter(
    "tsgate_tenant_samples_accepted",
    "Samples (and native histogram samples) written to the store, by tenant",
    ["tenant"],
)
TENANT_ACTIVE_SERIES = Gauge(
    "tsgate_tenant_active_series",
    "Series written within the last 20 minutes, by tenant (gateway/core/tenant_activity.py)",
    ["tenant"],
    multiprocess_mode="livesum",
)
INGEST_INFLIGHT = Gauge(
    "tsgate_ingest_inflight_samples", "Samples accepted for writing but not yet stored", multiprocess_mode="livesum"
)
CONNECTIONS_OPEN = Gauge(
    "tsgate_open_connections", "TCP connections open on the HTTP and carbon listeners", multiprocess_mode="livesum"
)
CONNECTIONS_REFUSED = Counter(
    "tsgate_refused_connections", "New TCP connections closed at once over --max-connections", ["listener"]
)
SLOW_REQUEST_BODIES = Counter(
    "tsgate_slow_request_bodies",
    "HTTP requests answered 408 and closed: the body came too slowly (--http-body-timeout, --http-body-min-rate)",
    ["reason"],
)
NOT_HTTP = Counter(
    "tsgate_http_not_http_requests",
    "Connections to the HTTP port whose first line was no HTTP request line (carbon lines sent to the wrong port): answered 400 and closed",
)
HTTP_WRITES_ABORTED = Counter(
    "tsgate_http_writes_aborted",
    "HTTP connections closed while their client took nothing of an answer: past --http-write-timeout, or"
    " for a new answer at --http-max-unsent-bytes",
    ["reason"],
)
HTTP_UNSENT_BYTES = Gauge(
    "tsgate_http_unsent_bytes",
    "Bytes of HTTP answers held for clients that have not taken them yet (bounded by --http-max-unsent-bytes)",
    multiprocess_mode="livesum",
)
HTTP_ANSWERS_REFUSED = Counter(
    "tsgate_http_answers_refused",
    "HTTP answers replaced by 503 because the unsent answers of the process were at --http-max-unsent-bytes",
)
IDLE_CLOSED = Counter(
    "tsgate_idle_closed_connections",
    "Idle connections closed (--http-idle-timeout, --carbon-idle-timeout, or for a new one at --max-connections)",
    ["listener"],
)

QUERY_EXECUTOR_KILLS = Counter(
    "tsgate_query_executor_kills",
    "Query executors killed and replaced: at --query-timeout, over --query-max-memory-bytes, at shutdown, or died",
    ["reason"],
)
QUERY_QUEUE_REJECTED = Counter("tsgate_query_queue_rejected", "Queries refused with 429 over a full --query-queue")
QUERY_EXECUTORS_READY = Gauge(
    "tsgate_query_executors_ready", "Query executors started and able to take queries", multiprocess_mode="livesum"
)
QUERY_QUEUED = Gauge("tsgate_query_queued", "Queries waiting for a query executor", multiprocess_mode="livesum")
QUERY_RUNNING = Gauge("tsgate_query_running", "Queries running in a query executor", multiprocess_mode="livesum")


def observe_store(operation: str, deferred):
    """Time a store call and count its failures; returns the same Deferred."""
    started = time.perf_counter()

    def succeeded(result):
        STORE_OPERATIONS.labels(operation).observe(time.perf_counter() - started)
        return result

    def failed(failure):
        STORE_ERRORS.labels(operation).inc()
        return failure

    return deferred.addCallbacks(succeeded, failed)
