"""The one data model every protocol maps to: samples, series-set text and hash, validation.

A sample is ``(tenant, metric_name, tags, timestamp_ms, value)``. The series-set is the text
``{metric},{k1}={v1},...`` with tags sorted by key and ``\\``, ``,`` and ``=`` escaped; its hash is
murmur3 x64-128 of the UTF-8 text in standard base64 (24 characters). docs/series-set.rst has
the exact rule and test vectors.
"""

import base64
import dataclasses
import re
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import mmh3
import numpy as np

from gateway.core.errors import ClientError

DEFAULT_TENANT = "default"

# The pseudo tag under which series_sets indexes every series of a metric, so that a query
# with no tag filter (and Prometheus's __name__ matcher) is one index lookup like any other.
NAME_TAG = "__name__"

_TENANT_RE = re.compile(r"[A-Za-z0-9!\-_.*'()]+")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ESCAPE_TABLE = str.maketrans({"\\": "\\\\", ",": "\\,", "=": "\\="})


class Sample(NamedTuple):
    tenant: str
    metric_name: str
    tags: dict[str, str]
    timestamp_ms: int
    value: float


class ExemplarSample(NamedTuple):
    """An exemplar of the series (tenant, metric_name, tags): its own labels, value and time."""

    tenant: str
    metric_name: str
    tags: dict[str, str]
    timestamp_ms: int
    value: float
    labels: dict[str, str]


class SeriesSamples(NamedTuple):
    """Samples of one tenant as arrays, as a decoder that gives arrays hands them to ingest
    (IngestPipeline.ingest_arrays): a table of series and, a sample each, the index of its
    series in the table, its timestamp (ms) and value, with no object a sample.

    ``keys[i]`` is the label set as the decoder saw it (remote write: its bytes), the same
    whenever the same series comes again: the known-series cache's key, so a known series costs
    one lookup. ``name_and_tags(labels[i])`` gives its metric name and tags, read only for a
    series not known yet."""

    tenant: str
    keys: Sequence[Hashable]
    labels: Sequence[Any]
    name_and_tags: Callable[[Any], tuple[str, dict[str, str]]]
    series: np.ndarray  # intp
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64


class HistogramSample(NamedTuple):
    """A native histogram sample of the series (tenant, metric_name, tags): its protobuf bytes."""

    tenant: str
    metric_name: str
    tags: dict[str, str]
    timestamp_ms: int
    data: bytes


class SeriesKey(NamedTuple):
    """A series as the store indexes it: the tenant stays outside the hash."""

    tenant: str
    series_set_hash: str
    metric_name: str
    tags: dict[str, str]


class InvalidSample(ClientError):
    """A client mistake in one sample: names the field and the problem, never a crash."""

    def __init__(self, field: str, problem: str, reason: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
        self.reason = reason
        self.details = {"field": field}


@dataclasses.dataclass(frozen=True)
class Limits:
    """Validation limits; every one is a setting (see docs/configuration.rst)."""

    max_name_length: int = 1024
    max_tag_key_length: int = 1024
    max_tag_value_length: int = 2048
    max_tags: int = 64
    max_sample_age_ms: int = 3650 * 86_400_000
    max_future_ms: int = 10 * 60_000


def split_labels(labels: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Prometheus labels as a metric name and tags (every label but ``__name__``)."""
    return labels[NAME_TAG], {key: value for key, value in labels.items() if key != NAME_TAG}


def escape(part: str) -> str:
    return part.translate(_ESCAPE_TABLE)


def series_set_text(metric_name: str, tags: dict[str, str]) -> str:
    parts = [escape(metric_name)]
    for key in sorted(tags):
        parts.append(f"{escape(key)}={escape(tags[key])}")
    return ",".join(parts)


def series_set_hash(text: str) -> str:
    """murmur3 x64-128 (seed 0) of the UTF-8 text; h1 then h2 little-endian, standard base64."""
    return base64.b64encode(mmh3.hash_bytes(text.encode("utf-8"), 0, True)).decode("ascii")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def validate_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not tenant:
        raise InvalidSample("tenant", "must be a non-empty string", "bad_tenant")
    if len(tenant) > 150 or not _TENANT_RE.fullmatch(tenant):
        raise InvalidSample(
            "tenant",
            f"{tenant[:60]!r} must be 1-150 characters of letters, digits and !-_.*'()",
            "bad_tenant",
        )
    return tenant


def _check_text(field: str, text, max_length: int, reason: str) -> None:
    if not isinstance(text, str):
        raise InvalidSample(field, f"must be a string, got {type(text).__name__}", reason)
    if not text:
        raise InvalidSample(field, "must not be empty", reason)
    if len(text) > max_length:
        raise InvalidSample(field, f"is {len(text)} characters, over the limit of {max_length}", reason)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSample(field, "is not valid UTF-8 (lone surrogate)", reason) from None
    if _CONTROL_RE.search(text):
        raise InvalidSample(field, "contains a control character", reason)


def validate_series(metric_name, tags, limits: Limits) -> None:
    """The checks a series passes once: ingest remembers series that passed (gateway/ingest/pipeline.py)."""
    _check_text("metricName", metric_name, limits.max_name_length, "bad_metric_name")
    if not isinstance(tags, dict):
        raise InvalidSample("tags", "must be an object of tag names to values", "bad_tag")
    if len(tags) > limits.max_tags:
        raise InvalidSample("tags", f"has {len(tags)} tags, over the limit of {limits.max_tags}", "too_many_tags")
    for key, value in tags.items():
        _check_text("tags", key, limits.max_tag_key_length, "bad_tag")
        if key == NAME_TAG:
            raise InvalidSample(f"tags.{key}", "is reserved for the metric name", "bad_tag")
        _check_text(f"tags.{key}", value, limits.max_tag_value_length, "bad_tag")


def validate_point(timestamp, value, oldest_ms: int, newest_ms: int) -> None:
    """The checks every sample passes: a float value and an integer timestamp inside the window."""
    if not isinstance(value, float):
        raise InvalidSample("value", f"must be a number, got {type(value).__name__}", "bad_value")
    validate_timestamp(timestamp, oldest_ms, newest_ms)


def validate_timestamp(timestamp, oldest_ms: int, newest_ms: int) -> None:
    """An integer timestamp inside the accepted window (samples, exemplars, native histograms)."""
    if not isinstance(timestamp, int):
        raise InvalidSample("timestamp", f"must be an integer, got {type(timestamp).__name__}", "bad_timestamp")
    if timestamp < oldest_ms:
        raise InvalidSample("timestamp", f"{timestamp} ms is older than the accepted window", "too_old")
    if timestamp > newest_ms:
        raise InvalidSample("timestamp", f"{timestamp} ms is too far in the future", "too_new")
