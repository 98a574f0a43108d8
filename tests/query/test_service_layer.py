"""The services behind the HTTP handlers, on both stores: the Graphite tree walks and tag counts
run within the store's bound on calls in flight (gateway/store/calls.py); tagSeries and Prometheus metadata go through the ingest pipeline
(validation, tenant limits, metadata written once); the pipeline marks pending work through its
marker interface (that the services import nothing of the layers above them is
tests/project/test_layers.py's check); carbon listeners open only with the ingest role."""

import socket
import urllib.parse

import pytest
import pytest_twisted

from gateway.core.model import Limits, Sample, SeriesKey, now_ms, series_set_hash, series_set_text
from gateway.downsample.partitions import partition_of
from gateway.downsample.pending import PendingMarks, StorePending
from gateway.ingest.limits import TenantLimits
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.graphite.finder import Finder
from gateway.query.graphite.tagdb import TagDB, graphite_path
from gateway.query.planner import QueryPlanner
from gateway.store.calls import StoreCalls
from gateway.store.contract import MetricMetadata

READS = {
    "list_path_children",
    "list_tenant_tag_keys",
    "list_tenant_tag_values",
    "list_metric_names",
    "find_metrics_by_tag",
    "find_series",
    "get_series",
    "list_tag_values",
}


class CountedReads:
    """A real store whose reads (the index reads unless told) are counted: how many were asked
    for and with what arguments (``asked``); its calls are bounded to ``limit`` in flight, and
    ``peak`` is the most that were in flight at one moment."""

    def __init__(self, store, limit: int = 64, reads=READS):
        self.store = store
        self.store.calls = StoreCalls(limit)
        self.counted = reads
        self.asked: list[tuple] = []
        self.reads = 0

    @property
    def peak(self) -> int:
        return self.store.calls.peak

    def __getattr__(self, name):
        method = getattr(self.store, name)
        if name not in self.counted:
            return method

        def counted(*args):
            self.asked.append((name, *args))
            self.reads += 1
            return method(*args)

        return counted


def key(tenant: str, name: str, tags: dict[str, str] | None = None) -> SeriesKey:
    tags = tags or {}
    return SeriesKey(tenant, series_set_hash(series_set_text(name, tags)), name, tags)


def pipeline_on(store, **options) -> IngestPipeline:
    return IngestPipeline(store, Limits(max_tags=2), KnownSeries(1000), 1 << 20, **options)


@pytest_twisted.ensureDeferred
async def test_find_over_a_wide_tree_reads_at_most_n_directories_at_once(store, tenant):
    await store.write_series([key(tenant, f"wide.n{i:03d}.leaf") for i in range(120)])
    counted = CountedReads(store, 4)
    nodes = await Finder(counted).find(tenant, "wide.*.leaf")
    assert [node.path for node in nodes] == [f"wide.n{i:03d}.leaf" for i in range(120)]
    assert counted.reads == 121  # "wide", then each of its 120 children
    assert counted.peak == 4


@pytest_twisted.ensureDeferred
async def test_the_whole_tree_walk_reads_at_most_n_directories_at_once(store, tenant):
    paths = [f"idx.a{i:02d}.b{j}" for i in range(30) for j in range(2)] + ["idx.a00", "top"]
    await store.write_series([key(tenant, path) for path in paths])
    counted = CountedReads(store, 3)
    assert await Finder(counted).all_leaves(tenant) == sorted(paths)
    assert counted.reads == 1 + 1 + 30  # the root, "idx", each "idx.aNN" ("idx.a00" is a leaf and a branch: read once)
    assert counted.peak == 3


@pytest_twisted.ensureDeferred
async def test_tag_values_are_counted_at_most_n_at_once(store, tenant):
    series = [key(tenant, "cpu", {"host": f"h{i:02d}"}) for i in range(30)] + [
        key(tenant, "mem", {"host": f"h{i:02d}"}) for i in range(10)
    ]
    await store.write_series(series)
    counted = CountedReads(store, 4)
    tags = TagDB(counted, QueryPlanner(counted, 10_000))
    assert await tags.value_counts(tenant, "host") == [(f"h{i:02d}", 2 if i < 10 else 1) for i in range(30)]
    assert counted.peak == 4
    assert await tags.value_counts(tenant, "name") == [("cpu", 30), ("mem", 10)]
    assert counted.peak == 4


@pytest_twisted.ensureDeferred
async def test_tag_series_registers_valid_series_and_names_the_rejects(store, tenant):
    pipeline = pipeline_on(store)
    series = [
        (tenant, "reg.ok", {"dc": "eu"}),
        (tenant, "reg.wide", {"a": "1", "b": "2", "c": "3"}),
        (tenant, "reg.plain", {}),
    ]
    accepted, rejected = await pipeline.register_series("graphite_tags", series)
    assert [graphite_path(k) for k in accepted] == ["reg.ok;dc=eu", "reg.plain"]
    assert [(r.index, r.field, r.reason) for r in rejected] == [(1, "tags", "too_many_tags")]
    tags = TagDB(store, QueryPlanner(store, 10_000))
    assert [graphite_path(k) for k in await tags.find_series(tenant, ["dc=eu"])] == ["reg.ok;dc=eu"]
    assert [node.path for node in await Finder(store).find(tenant, "reg.*")] == ["reg.plain"]


@pytest_twisted.ensureDeferred
async def test_tag_series_counts_against_the_tenants_active_series(store, tenant):
    """Only the new series beyond the limit are refused; the others are indexed."""
    pipeline = pipeline_on(store, tenant_limits=TenantLimits(0, max_active_series=3))
    too_many = [(tenant, "limited", {"i": str(i)}) for i in range(4)]
    accepted, rejected = await pipeline.register_series("graphite_tags", too_many)
    assert [key.tags for key in accepted] == [{"i": "0"}, {"i": "1"}, {"i": "2"}]
    assert [(reject.index, reject.reason) for reject in rejected] == [(3, "max_active_series")]
    assert sorted(await store.list_tenant_tag_values(tenant, "i")) == ["0", "1", "2"]
    result = await pipeline.ingest(
        "json", [Sample(tenant, "limited", {"i": i}, now_ms(), 1.0) for i in ("3", "0")]
    )  # a fourth series, now by a sample: refused, the known one beside it written
    assert [(reject.index, reject.reason) for reject in result.rejected] == [(0, "max_active_series")]


@pytest_twisted.ensureDeferred
async def test_tag_series_writes_the_metadata_of_a_series_once(store, tenant):
    counted = CountedWrites(store)
    pipeline = pipeline_on(counted)
    for _ in range(2):
        await pipeline.register_series("graphite_tags", [(tenant, "once", {"k": "v"})])
    await pipeline.ingest("json", [Sample(tenant, "once", {"k": "v"}, now_ms(), 1.0)])
    assert counted.series_written == 1


class CountedWrites:
    """A real store counting the series whose metadata it was asked to write."""

    def __init__(self, store):
        self.store = store
        self.series_written = 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def write_series(self, series):
        self.series_written += len(series)
        return self.store.write_series(series)


@pytest_twisted.ensureDeferred
async def test_metric_metadata_is_kept_once_per_change_and_too_long_rows_are_skipped(store, tenant):
    pipeline = pipeline_on(store, max_metadata_length=20)
    counter = MetricMetadata(tenant, "requests_total", "counter", "Requests.", "")
    await pipeline.ingest_metric_metadata([counter, MetricMetadata(tenant, "long", "gauge", "x" * 21, "")])
    assert await store.get_metric_metadata(tenant, "requests_total") == counter
    assert await store.get_metric_metadata(tenant, "long") is None
    changed = counter._replace(help="All requests.")
    await pipeline.ingest_metric_metadata([changed])
    assert await store.get_metric_metadata(tenant, "requests_total") == changed


@pytest_twisted.ensureDeferred
async def test_the_pipeline_marks_written_series_slots_through_its_marker(store, tenant):
    tracker = StorePending(store, store.slot_width_ms, 60_000)
    pipeline = pipeline_on(store, pending=PendingMarks(tracker, 8))
    now = now_ms()
    await pipeline.ingest("json", [Sample(tenant, "marked", {}, now, 1.0)])
    hash_ = series_set_hash(series_set_text("marked", {}))
    slot = now - now % store.slot_width_ms
    pending = await store.list_pending(partition_of(tenant, hash_, 8), slot + store.slot_width_ms)
    assert (slot, tenant, hash_) in {(row.time_slot, row.tenant, row.series_set_hash) for row in pending}


def form(**fields) -> bytes:
    return urllib.parse.urlencode(fields, doseq=True).encode()


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_tag_multi_series_over_http_registers_the_good_paths_and_answers_400_for_the_others(
    start_gateway, backend_args, tenant
):
    gateway = start_gateway(*backend_args, "--max-tags", "2")
    headers = {**FORM, "X-Scope-OrgID": tenant}
    answer = gateway.post(
        "/tags/tagMultiSeries", form(path=["http.ok;dc=eu", "http.wide;a=1;b=2;c=3", "http.bad;=x"]), headers=headers
    )
    assert answer.status == 400, answer.body
    message = answer.json()["error"]
    assert (
        "2 of 3 paths rejected" in message
        and "'http.wide;a=1;b=2;c=3': tags:" in message
        and "'http.bad;=x'" in message
    )
    assert gateway.get("/tags/findSeries?expr=dc%3Deu", headers=headers).json() == ["http.ok;dc=eu"]
    answer = gateway.post("/tags/tagSeries", form(path="http.one;b=2;a=1"), headers=headers)
    assert answer.status == 200 and answer.json() == "http.one;a=1;b=2"
    assert gateway.get("/tags/a", headers=headers).json() == {"tag": "a", "values": [{"value": "1", "count": 1}]}


def test_tag_series_over_http_refuses_only_the_new_series_over_the_active_series_limit(start_gateway, tenant):
    gateway = start_gateway("--tenant-max-active-series", "20")
    headers = {**FORM, "X-Scope-OrgID": tenant}
    paths = [f"limited;i={i:02d}" for i in range(21)]
    refused = gateway.post("/tags/tagMultiSeries", form(path=paths), headers=headers)
    error = refused.json()["error"]
    assert refused.status == 400 and "1 of 21 paths rejected" in error and "active series" in error, error
    assert len(gateway.get("/tags/findSeries?expr=i%21%3D&expr=name%3Dlimited", headers=headers).json()) == 20
    assert gateway.post("/tags/tagMultiSeries", form(path=paths[:20]), headers=headers).status == 200


def bound(port: int, kind: int) -> bool:
    """Whether some process holds this loopback port (TCP or UDP): then we cannot bind it."""
    with socket.socket(socket.AF_INET, kind) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_without_the_ingest_role_no_carbon_listener_opens(start_gateway, tmp_path, workers):
    """GatewayProcess asks for carbon plaintext TCP and UDP and pickle on every gateway."""
    reader = start_gateway("--roles", "query,downsample", "--workers", workers, "--data-dir", str(tmp_path / "reader"))
    assert not bound(reader.graphite_port, socket.SOCK_STREAM)
    assert not bound(reader.graphite_port, socket.SOCK_DGRAM)
    assert not bound(reader.pickle_port, socket.SOCK_STREAM)
    assert "no carbon listeners" in reader.log() and "graphite off, graphite-udp off, pickle off" in reader.log()
    writer = start_gateway("--roles", "ingest", "--workers", workers, "--data-dir", str(tmp_path / "writer"))
    assert bound(writer.graphite_port, socket.SOCK_STREAM)
    assert bound(writer.graphite_port, socket.SOCK_DGRAM)
    assert bound(writer.pickle_port, socket.SOCK_STREAM)
