"""The series-set rule, pinned by vectors (docs/series-set.rst), and sample validation."""

import math

import mmh3
import pytest

from gateway.core.model import (
    InvalidSample,
    Limits,
    Sample,
    series_set_hash,
    series_set_text,
    validate_point,
    validate_series,
    validate_tenant,
)

VECTORS = [
    ("cpu", {}, "cpu", "gCNI8jt4+wI1iHZhPG1RQA=="),
    (
        "cpu_idle",
        {"os": "linux", "host": "h-1", "deployment": "prod"},
        "cpu_idle,deployment=prod,host=h-1,os=linux",
        "obRLT0KFP3R2ERAXGwwMjg==",
    ),
    ("a,b", {"k=": "v,\\"}, "a\\,b,k\\==v\\,\\\\", "cE1RvTiDNj15/ex3A+gWGg=="),
    ("servers.a.cpu.idle", {}, "servers.a.cpu.idle", "L406942Na22FzxOarWq+vQ=="),
    ("héllo", {"ключ": "値"}, "héllo,ключ=値", "Eq6jbYx60Czso0Bk6ogAag=="),
]

NOW = 1_700_000_000_000


@pytest.mark.parametrize("metric, tags, text, hash_", VECTORS)
def test_series_set_vectors(metric, tags, text, hash_):
    assert series_set_text(metric, tags) == text
    assert series_set_hash(text) == hash_
    assert len(hash_) == 24


def test_hash_is_murmur3_x64_128_h1_then_h2_little_endian():
    # The published MurmurHash3_x64_128("hello", seed 0) is h1=cbd8a7b341bd9b02, h2=5b1e906a48ae1d19.
    assert mmh3.hash_bytes(b"hello", 0, True).hex() == "029bbd41b3a7d8cb191dae486a901e5b"


def test_escaping_keeps_different_series_apart():
    pairs = [
        (("a", {"b": "c,d=e"}), ("a", {"b": "c", "d": "e"})),
        (("a,b=c", {}), ("a", {"b": "c"})),
        (("a", {"b": "c\\"}), ("a", {"b": "c\\\\"})),
        (("a", {"b=": "c"}), ("a", {"b": "=c"})),
    ]
    for left, right in pairs:
        assert series_set_text(*left) != series_set_text(*right)


def test_tag_order_does_not_matter():
    assert series_set_text("m", {"b": "1", "a": "2"}) == series_set_text("m", {"a": "2", "b": "1"}) == "m,a=2,b=1"


def validate(sample: Sample, limits: Limits) -> None:
    """The checks the pipeline runs on a sample: its series once, then its point."""
    validate_series(sample.metric_name, sample.tags, limits)
    validate_point(sample.timestamp_ms, sample.value, NOW - limits.max_sample_age_ms, NOW + limits.max_future_ms)


def sample(**changes):
    base = dict(tenant="t", metric_name="cpu", tags={"host": "a"}, timestamp_ms=NOW, value=1.0)
    base.update(changes)
    return Sample(**base)


@pytest.mark.parametrize(
    "changes, field, reason",
    [
        ({"metric_name": ""}, "metricName", "bad_metric_name"),
        ({"metric_name": "x" * 1025}, "metricName", "bad_metric_name"),
        ({"metric_name": "a\nb"}, "metricName", "bad_metric_name"),
        ({"metric_name": "bad\ud800"}, "metricName", "bad_metric_name"),
        ({"metric_name": 5}, "metricName", "bad_metric_name"),
        ({"tags": {"": "v"}}, "tags", "bad_tag"),
        ({"tags": {"k": ""}}, "tags.k", "bad_tag"),
        ({"tags": {"k": 1}}, "tags.k", "bad_tag"),
        ({"tags": {"k": "\x00"}}, "tags.k", "bad_tag"),
        ({"tags": {"__name__": "x"}}, "tags.__name__", "bad_tag"),
        ({"tags": {str(i): "v" for i in range(65)}}, "tags", "too_many_tags"),
        ({"tags": ["k"]}, "tags", "bad_tag"),
        ({"value": "1"}, "value", "bad_value"),
        ({"timestamp_ms": NOW - 3651 * 86_400_000}, "timestamp", "too_old"),
        ({"timestamp_ms": NOW + 11 * 60_000}, "timestamp", "too_new"),
        ({"timestamp_ms": 1.5}, "timestamp", "bad_timestamp"),
    ],
)
def test_invalid_samples_name_the_field(changes, field, reason):
    with pytest.raises(InvalidSample) as raised:
        validate(sample(**changes), Limits())
    assert raised.value.field == field
    assert raised.value.reason == reason


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.0, 1e308])
def test_nan_and_infinities_are_valid_values(value):
    validate(sample(value=value), Limits())


def test_limits_are_configurable():
    with pytest.raises(InvalidSample):
        validate(sample(metric_name="abcd"), Limits(max_name_length=3))


@pytest.mark.parametrize("tenant", ["", "a b", "a|b", "x" * 151, "t\n"])
def test_bad_tenants(tenant):
    with pytest.raises(InvalidSample):
        validate_tenant(tenant)


def test_good_tenant():
    assert validate_tenant("team-a_1.prod") == "team-a_1.prod"
