"""QueryPlanner's matcher selection on a real SQLite store: which index lookups each kind of
matcher costs (counted by the store-operation metric every planner lookup goes through), and
that the full labels decide in the end."""

import pytest
import pytest_twisted
from prometheus_client import REGISTRY

from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.query.graphite.tagdb import graphite_labels
from gateway.query.planner import QueryPlanner, QueryTooLarge
from protocols.prometheus import Matcher

OPERATIONS = (
    "find_series",
    "list_tag_values",
    "list_tenant_tag_values",
    "find_metrics_by_tag",
    "list_metric_names",
    "get_series",
)
SERIES = [
    ("cpu", {"host": "a", "dc": "x"}),
    ("cpu", {"host": "b", "dc": "y"}),
    ("cpu", {"host": "c"}),
    ("mem", {"host": "a", "dc": "x"}),
]


def lookups() -> dict[str, float]:
    return {
        op: REGISTRY.get_sample_value("tsgate_store_operation_duration_seconds_count", {"operation": op}) or 0.0
        for op in OPERATIONS
    }


@pytest_twisted.async_yield_fixture
async def planner(sqlite_store, tenant):
    keys = [SeriesKey(tenant, series_set_hash(series_set_text(name, tags)), name, tags) for name, tags in SERIES]
    await sqlite_store.write_series(keys)
    yield QueryPlanner(sqlite_store, max_series=3)


async def select(planner, tenant, *matchers) -> tuple[list[tuple[str, dict]], dict[str, float]]:
    """The selected series (sorted) and the lookups it took, by operation."""
    before = lookups()
    found = await planner.select_by_matchers(tenant, [Matcher(*m) for m in matchers], graphite_labels)
    after = lookups()
    spent = {op: after[op] - before[op] for op in OPERATIONS if after[op] != before[op]}
    return sorted(((k.metric_name, k.tags) for k in found), key=repr), spent


@pytest_twisted.ensureDeferred
async def test_an_exact_name_and_an_equality_cost_one_index_lookup(planner, tenant):
    """An exact name's candidates found tell that it exists: no lookup of its __name__ entry
    besides the lookups of the matchers."""
    found, spent = await select(planner, tenant, ("EQ", "__name__", "cpu"), ("EQ", "host", "a"))
    assert found == [("cpu", {"host": "a", "dc": "x"})]
    assert spent == {"find_series": 1, "get_series": 1}
    # none found: the tag index is asked which metrics have host="z" (it might be another name)
    found, spent = await select(planner, tenant, ("EQ", "__name__", "cpu"), ("EQ", "host", "z"))
    assert found == [] and spent == {"find_series": 1, "find_metrics_by_tag": 1}


@pytest_twisted.ensureDeferred
async def test_a_regex_that_needs_a_value_lists_the_metrics_values_then_looks_up_the_matching_ones(planner, tenant):
    found, spent = await select(planner, tenant, ("EQ", "__name__", "cpu"), ("RE", "dc", "x|y|z"))
    assert [tags["host"] for _, tags in found] == ["a", "b"]
    assert spent == {"list_tag_values": 1, "find_series": 2, "get_series": 1}


@pytest_twisted.ensureDeferred
async def test_matchers_that_accept_an_absent_label_are_checked_on_the_labels_not_the_index(planner, tenant):
    found, spent = await select(planner, tenant, ("EQ", "__name__", "cpu"), ("EQ", "dc", ""))
    assert found == [("cpu", {"host": "c"})]
    assert spent == {"find_series": 1, "get_series": 1}  # the metric's __name__ entry, not dc's
    found, _ = await select(planner, tenant, ("EQ", "__name__", "cpu"), ("NRE", "dc", "x"), ("NEQ", "host", "b"))
    assert found == [("cpu", {"host": "c"})]


@pytest_twisted.ensureDeferred
async def test_without_an_exact_name_the_tenant_wide_tag_index_picks_the_metrics(planner, tenant):
    found, spent = await select(planner, tenant, ("EQ", "dc", "x"))
    assert found == [("cpu", {"host": "a", "dc": "x"}), ("mem", {"host": "a", "dc": "x"})]
    assert spent == {"find_metrics_by_tag": 1, "find_series": 2, "get_series": 2}
    found, spent = await select(planner, tenant, ("RE", "__name__", "c.*"), ("RE", "dc", "[xy]"))
    assert [tags["host"] for _, tags in found] == ["a", "b"]
    assert (
        spent["list_tenant_tag_values"] == 1 and spent["find_metrics_by_tag"] == 2 and "list_metric_names" not in spent
    )


@pytest_twisted.ensureDeferred
async def test_only_matchers_that_accept_anything_list_every_metric_name(planner, tenant):
    found, spent = await select(planner, tenant, ("RE", "__name__", "c.*"), ("NEQ", "host", "a"))
    assert [tags["host"] for _, tags in found] == ["b", "c"]
    assert spent == {"list_metric_names": 1, "find_series": 1, "get_series": 1}
    found, spent = await select(planner, tenant, ("EQ", "__name__", "absent"))
    assert found == [] and spent == {"find_series": 1, "list_metric_names": 1}


@pytest_twisted.ensureDeferred
async def test_more_candidates_than_the_limit_are_refused_before_their_series_are_read(planner, tenant):
    before = lookups()["get_series"]
    with pytest.raises(QueryTooLarge):
        await planner.select_by_matchers(tenant, [Matcher("RE", "__name__", ".+")], graphite_labels)
    assert (
        lookups()["get_series"] == before + 1
    )  # cpu's three series were read; mem's would pass the limit and were not
    assert await planner.select_series(tenant, "cpu", {"dc": "x"}) == [
        SeriesKey(
            tenant, series_set_hash(series_set_text("cpu", {"host": "a", "dc": "x"})), "cpu", {"host": "a", "dc": "x"}
        )
    ]


@pytest_twisted.ensureDeferred
async def test_series_come_by_name_then_tags_on_every_run(sqlite_store, tenant):
    """Prometheus's storage gives series sorted by labels; a set's order (the hash seed's) made
    topk ties and sums near overflow differ from run to run."""
    names = [("disk", {"host": f"h{i:02d}", "dev": d}) for i in range(20) for d in ("sdb", "sda")]
    keys = [SeriesKey(tenant, series_set_hash(series_set_text(n, t)), n, t) for n, t in names]
    await sqlite_store.write_series(keys)
    found = await QueryPlanner(sqlite_store, max_series=100).select_by_matchers(
        tenant, [Matcher("EQ", "__name__", "disk")], graphite_labels
    )
    assert [k.tags for k in found] == sorted((t for _, t in names), key=lambda t: sorted(t.items()))


@pytest_twisted.ensureDeferred
async def test_a_selection_is_given_again_while_the_index_finds_the_same_series(planner, sqlite_store, tenant):
    """The index is read every time; while it finds the same series for the same matchers, the
    selection built before (labels, checks, order) is given again, and a series written since,
    or other matchers, select anew."""
    planner = QueryPlanner(sqlite_store, max_series=100)
    matchers = [Matcher("EQ", "__name__", "cpu"), Matcher("NRE", "dc", "y")]
    first = await planner.select(tenant, matchers, graphite_labels)
    again = await planner.select(tenant, matchers, graphite_labels)
    assert [s.key.tags for s in first] == [{"host": "a", "dc": "x"}, {"host": "c"}]
    assert again == first and all(a is b for a, b in zip(again, first))
    other = await planner.select(tenant, [Matcher("EQ", "__name__", "cpu"), Matcher("RE", "dc", "y")], graphite_labels)
    assert [s.key.tags for s in other] == [{"host": "b", "dc": "y"}]
    tags = {"host": "d", "dc": "z"}
    await sqlite_store.write_series([SeriesKey(tenant, series_set_hash(series_set_text("cpu", tags)), "cpu", tags)])
    after = await planner.select(tenant, matchers, graphite_labels)
    assert [s.key.tags for s in after] == [{"host": "a", "dc": "x"}, tags, {"host": "c"}]
