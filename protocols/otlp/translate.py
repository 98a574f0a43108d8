"""OTLP metrics to Prometheus series, as Prometheus 3's OTLP receiver translates them
(storage/remote/otlptranslator/prometheusremotewrite): the result is a remote write batch
(protocols.prometheus.WriteBatch, samples as arrays), so it is written as a remote write is.

- names: protocols/otlp/names.py; labels: a data point's attributes (escaped, colliding names'
  values joined by ``;``, empty values dropped), the promoted resource attributes (unless a
  data point has that label), ``job`` (``service.namespace/service.name``) and ``instance``
  (``service.instance.id``), the scope's ``otel_scope_*`` labels when promoted;
- gauges and sums: a sample a point (``_total`` for a monotonic sum); histograms: ``_sum``,
  ``_count`` and cumulative ``_bucket{le=...}`` series; exponential histograms: native
  histograms, scale reduced to 8; summaries: ``_sum``, ``_count`` and ``{quantile=...}``;
- start times: created timestamps (counters, histograms, summaries); exemplars: trace and span
  ids as ``trace_id``/``span_id`` labels; metadata: type, unit and help a metric;
- ``target_info``: the resource's other attributes, one sample of 1 every half lookback delta
  from the resource's first point to its last;
- a point flagged "no recorded value" is a stale marker;
- delta temporality: refused unless converted to cumulative (DeltaToCumulative), named in the
  answer; refused points are counted, the others kept.
"""

import base64
import itertools
import json
import math
import struct
from collections.abc import Generator, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from protocols.otlp import names
from protocols.otlp.delta import DeltaOutOfOrder, DeltaToCumulative
from protocols.otlp.names import InvalidName, Namer
from protocols.otlp.wire import PROTOBUF, OTLPError, metric_data, parse, split_request
from protocols.prometheus import types_pb2
from protocols.prometheus.write import (
    Exemplar,
    LabelsEntry,
    SampleArrays,
    WriteBatch,
    WriteHistogram,
    WriteMetadata,
    WriteSeries,
    label_bytes,
    read_varint,
)

STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
NO_RECORDED_VALUE = 1  # DataPointFlags
CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_INSTANCE_ID = "service.name", "service.namespace", "service.instance.id"
MAX_EXEMPLAR_RUNES = 128
DEFAULT_ZERO_THRESHOLD = 1e-128
MIN_SCALE, MAX_SCALE = -4, 8
TARGET_INFO = "target_info"
# Data points translated between two pauses of the caller (a few ms).
POINTS_PER_STEP = 500
# Problems named in the answer.
MAX_NAMED_PROBLEMS = 10


class Settings(NamedTuple):
    """Translation settings (Prometheus 3's ``otlp`` configuration block)."""

    strategy: str = names.UNDERSCORE_ESCAPING_WITH_SUFFIXES
    promote_resource_attributes: frozenset[str] = frozenset()
    promote_scope_metadata: bool = False
    keep_identifying_resource_attributes: bool = False
    max_histogram_buckets: int = 0  # of a native histogram (exponential): more is refused; 0: no limit
    lookback_delta_ms: int = 300_000  # target_info is written every half of it


DEFAULT_SETTINGS = Settings()


class Translation(NamedTuple):
    """A request translated: the batch to write, how many data points it held, how many were
    refused and why (the first MAX_NAMED_PROBLEMS), and, to count the data points of items the
    writer refuses, the data point of each sample (of ``batch.arrays``) and of each native
    histogram (in ``batch.series`` order)."""

    batch: WriteBatch
    points: int
    refused_points: int
    problems: list[str]
    sample_points: np.ndarray
    histogram_points: list[int]
    # The created timestamps of known counter series sent with this batch: (where the cache
    # remembers the one stored for each tenant, the timestamp, the position of its sample).
    created: list[tuple[dict[str, int], int, int]]

    def created_stored(self, tenant: str, refused_samples: Iterable[int]) -> None:
        """Remember the created timestamps the writer stored (those of series whose sample was
        not refused): a counter sends the same one with every point, and a series whose stored
        one is unchanged then carries none (no object a point, no lookup in the writer)."""
        refused = set(refused_samples)
        for stored, created, position in self.created:
            if position not in refused:
                stored[tenant] = created


class _Refused(ValueError):
    """A data point (or a whole metric) left out: the message names it."""


def _float_string(value: float) -> str:
    """A float as Go's strconv.FormatFloat(value, 'f', -1, 64) writes it (bucket bounds, quantiles)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return np.format_float_positional(value, trim="-")


def _double_attribute(value: float) -> str:
    """A double attribute as pdata's Value.AsString writes it (JavaScript's number format)."""
    if math.isinf(value) or math.isnan(value):
        return f"json: unsupported value: {_float_string(value)}"
    if value != 0 and (abs(value) < 1e-6 or abs(value) >= 1e21):
        mantissa, exponent = repr(value).split("e")  # repr writes these with an exponent
        return f"{mantissa}e{'-' if exponent.startswith('-') else '+'}{int(exponent.lstrip('+-'))}"
    return np.format_float_positional(value, trim="-")


def _raw_value(value):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_raw_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _raw_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind) if kind else None


def attribute_string(value) -> str:
    """An AnyValue as a label value, as pdata's Value.AsString gives it."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "double_value":
        return _double_attribute(value.double_value)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind is None:
        return ""
    return json.dumps(_raw_value(value), separators=(",", ":"))


class _Context(NamedTuple):
    """What every series of a resource and scope carries: promoted resource attributes (a data
    point's own label wins), then labels set over the point's (job, instance, scope)."""

    promoted: dict[str, str]
    forced: dict[str, str]

    @property
    def key(self) -> tuple:
        return tuple(self.promoted.items()), tuple(self.forced.items())


# The labels of number points already seen, by their attributes' bytes (the known series of a
# steady sender: translated once, then found by a bytes lookup), as remote write keeps the label
# bytes it validated; emptied when it holds MAX_CACHED_SERIES.
MAX_CACHED_SERIES = 200_000
_SERIES_CACHE: dict[tuple[int, bytes], tuple[dict[str, str], bytes, dict[str, int]]] = {}
_PREFIXES: dict[tuple, int] = {}  # (namer, resource and scope context, metric name): a number
_DATA_POINTS_TAG = 0x0A  # field 1 of Gauge and Sum
# A NumberDataPoint as protobuf writes it: fixed64 fields in field order, start (0x11), time
# (0x19), then the value, a double (0x21) or an int (0x31), then its attributes.
_START, _TIME, _DOUBLE, _INT = 0x11, 0x19, 0x21, 0x31
_EIGHT_BYTES = np.arange(8)


class _Builder:
    """Builds the batch: series table and sample arrays, series with more than samples,
    metadata, and what was refused."""

    def __init__(self, settings: Settings, delta: DeltaToCumulative | None, tenant: str):
        self.settings = settings
        self.namer = Namer.of(settings.strategy)
        self.delta = delta
        self.tenant = tenant
        self.table: dict[bytes, int] = {}  # a series by its label bytes (label_bytes)
        self.labels: list[LabelsEntry] = []
        self.sample_series: list[int] = []
        self.timestamps: list[int] = []
        self.values: list[float] = []
        self.sample_points: list[int] = []
        self.series: list[WriteSeries] = []
        self.histogram_points: list[int] = []
        self.metadata: dict[str, WriteMetadata] = {}
        self.refused = 0
        self.problems: list[str] = []
        self.point = 0  # the number of the data point being translated
        self.target_info_seen: set[tuple[bytes, int]] = set()
        self.created: list[tuple[dict[str, int], int, int]] = []

    def refuse(self, points: int, problem: str) -> None:
        self.refused += points
        if len(self.problems) < MAX_NAMED_PROBLEMS:
            self.problems.append(problem)

    def label_name(self, name: str) -> str:
        return self.namer.label_name(name)

    def attributes(self, attributes: Iterable, context: _Context, skipped: tuple[str, ...] = ("__name__",)) -> dict:
        """A series' labels but ``__name__``: attributes escaped (colliding names' values joined
        by ``;`` in the order of the attributes' names), the context's, empty values dropped."""
        pairs = sorted((kv.key, attribute_string(kv.value)) for kv in attributes if kv.key not in skipped)
        labels: dict[str, str] = {}
        for key, value in pairs:
            name = self.label_name(key)
            labels[name] = f"{labels[name]};{value}" if labels.get(name) else value
        for name, value in context.promoted.items():
            if not labels.get(name):
                labels[name] = value
        labels.update(context.forced)
        return labels

    def sample(self, name: str, base: dict[str, str], timestamp: int, value: float, extra: tuple = ()) -> int:
        """Add a sample; returns its series' index in the table."""
        labels = series_labels(name, base, extra)
        return self.sample_of(labels, label_bytes(labels), timestamp, value)

    def sample_of(self, labels: dict[str, str], key: bytes, timestamp: int, value: float) -> int:
        """Add a sample of a series whose labels and key are made already."""
        index = self.table.get(key)
        if index is None:
            index = self.table[key] = len(self.labels)
            self.labels.append(labels)
        self.sample_series.append(index)
        self.timestamps.append(timestamp)
        self.values.append(value)
        self.sample_points.append(self.point)
        return index

    def extra_series(self, index: int, **fields) -> None:
        """The series of the table's ``index`` with what samples alone do not carry (exemplars,
        created timestamp); its samples are in the arrays already."""
        labels = self.labels[index]
        assert isinstance(labels, dict)
        self.series.append(WriteSeries(labels, **fields))

    def arrays(self) -> SampleArrays:
        return SampleArrays(
            list(self.table),
            self.labels,
            np.array(self.sample_series, dtype=np.intp),
            np.array(self.timestamps, dtype=np.int64),
            np.array(self.values, dtype=np.float64),
        )


def series_labels(name: str, base: dict[str, str], extra: tuple = ()) -> dict[str, str]:
    """A series' labels, sorted, empty values dropped: ``base``, ``__name__`` and an ``extra`` (le, quantile)."""
    labels = {**base, "__name__": name}
    if extra:
        labels[extra[0]] = extra[1]
    return {k: labels[k] for k in sorted(labels) if labels[k]}


def _resource_context(builder: _Builder, resource) -> tuple[_Context, dict[str, str]]:
    """The resource's labels for its series (promoted attributes, job, instance) and its
    job/instance alone (for target_info)."""
    attributes = {kv.key: attribute_string(kv.value) for kv in resource.attributes}
    identity = {}
    if SERVICE_NAME in attributes:
        namespace = attributes.get(SERVICE_NAMESPACE)
        identity["job"] = (
            f"{namespace}/{attributes[SERVICE_NAME]}" if SERVICE_NAMESPACE in attributes else attributes[SERVICE_NAME]
        )
    if SERVICE_INSTANCE_ID in attributes:
        identity["instance"] = attributes[SERVICE_INSTANCE_ID]
    promoted = {
        builder.label_name(key): value
        for key, value in sorted(attributes.items())
        if key in builder.settings.promote_resource_attributes
    }
    return _Context(promoted, {k: v for k, v in identity.items() if v}), identity


def _scope_labels(builder: _Builder, scope_metrics) -> dict[str, str]:
    if not builder.settings.promote_scope_metadata or not scope_metrics.scope.name:
        return {}
    scope = scope_metrics.scope
    labels = {builder.label_name("otel_scope_" + kv.key): attribute_string(kv.value) for kv in scope.attributes}
    labels.update(
        otel_scope_name=scope.name, otel_scope_version=scope.version, otel_scope_schema_url=scope_metrics.schema_url
    )
    return labels


def _exemplars(exemplars) -> list[Exemplar]:
    found = []
    for exemplar in exemplars:
        labels = {}
        if exemplar.trace_id.strip(b"\0"):
            labels["trace_id"] = exemplar.trace_id.hex()
        if exemplar.span_id.strip(b"\0"):
            labels["span_id"] = exemplar.span_id.hex()
        attributes = [(kv.key, attribute_string(kv.value)) for kv in exemplar.filtered_attributes]
        runes = sum(len(k) + len(v) for k, v in labels.items()) + sum(len(k) + len(v) for k, v in attributes)
        if runes <= MAX_EXEMPLAR_RUNES:
            labels.update(attributes)
        value = exemplar.as_double if exemplar.WhichOneof("value") == "as_double" else float(exemplar.as_int)
        found.append(Exemplar(dict(sorted(labels.items())), value, exemplar.time_unix_nano // 1_000_000))
    return found


def _number(point) -> float:
    if point.flags & NO_RECORDED_VALUE:
        return STALE_NAN
    return point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)


def _kind(metric) -> str:
    data = metric.WhichOneof("data")
    if data == "sum":
        return names.MONOTONIC_COUNTER if metric.sum.is_monotonic else names.NON_MONOTONIC_COUNTER
    return {
        "gauge": names.GAUGE,
        "histogram": names.HISTOGRAM,
        "exponential_histogram": names.EXPONENTIAL_HISTOGRAM,
        "summary": names.SUMMARY,
    }.get(data or "", "")


_PROMETHEUS_TYPES = {
    names.GAUGE: "gauge",
    names.MONOTONIC_COUNTER: "counter",
    names.NON_MONOTONIC_COUNTER: "gauge",
    names.HISTOGRAM: "histogram",
    names.EXPONENTIAL_HISTOGRAM: "histogram",
    names.SUMMARY: "summary",
}


def buckets_layout(counts: list[int], offset: int, scale_down: int, adjust_offset: bool = True):
    """Native histogram spans and deltas of OTLP bucket counts, ``scale_down`` times merged
    (Prometheus's convertBucketsLayout, its gaps of up to two buckets filled with empty ones)."""
    if not counts:
        return [], []
    spans = [[(offset >> scale_down) + 1 if adjust_offset else offset, 0]]
    deltas: list[int] = []
    previous = 0

    def append(count: int) -> None:
        nonlocal previous
        spans[-1][1] += 1
        deltas.append(count - previous)
        previous = count

    bucket = (offset >> scale_down) + 1
    count = 0
    for i, value in enumerate(counts):
        following = ((i + offset) >> scale_down) + 1
        if following == bucket:
            count += value
            continue
        if count == 0:
            count = value
            continue
        gap = following - bucket - 1
        if gap > 2:
            spans.append([gap, 0])
        else:
            for _ in range(gap):
                append(0)
        append(count)
        count = value
        bucket = following
    gap = ((len(counts) + offset - 1) >> scale_down) + 1 - bucket
    if gap > 2:
        spans.append([gap, 0])
    else:
        for _ in range(gap):
            append(0)
    append(count)
    return spans, deltas


def native_histogram(point, temporality: int, max_buckets: int) -> bytes:
    """The prometheus.Histogram bytes of an exponential histogram point (_Refused if its scale is
    below -4 or it has more than ``max_buckets`` buckets once its scale is reduced to 8)."""
    scale = point.scale
    if scale < MIN_SCALE:
        raise _Refused(f"scale {scale} is below {MIN_SCALE}")
    scale_down = max(0, scale - MAX_SCALE)
    positive, negative = point.positive.bucket_counts, point.negative.bucket_counts
    if max_buckets and len(positive) + len(negative) > (max_buckets + 2) << scale_down:
        raise _Refused(f"{len(positive) + len(negative)} buckets, over the limit of {max_buckets}")
    p_spans, p_deltas = buckets_layout(list(positive), point.positive.offset, scale_down)
    n_spans, n_deltas = buckets_layout(list(negative), point.negative.offset, scale_down)
    if max_buckets and len(p_deltas) + len(n_deltas) > max_buckets:
        raise _Refused(f"{len(p_deltas) + len(n_deltas)} buckets, over the limit of {max_buckets}")
    histogram = types_pb2.Histogram(
        schema=min(scale, MAX_SCALE),
        zero_threshold=DEFAULT_ZERO_THRESHOLD,
        zero_count_int=point.zero_count,
        positive_spans=[types_pb2.BucketSpan(offset=o, length=n) for o, n in p_spans],
        positive_deltas=p_deltas,
        negative_spans=[types_pb2.BucketSpan(offset=o, length=n) for o, n in n_spans],
        negative_deltas=n_deltas,
        reset_hint=types_pb2.Histogram.ResetHint.GAUGE if temporality == DELTA else types_pb2.Histogram.UNKNOWN,
        timestamp=point.time_unix_nano // 1_000_000,
    )
    if point.flags & NO_RECORDED_VALUE:
        histogram.sum = STALE_NAN
        histogram.count_float = STALE_NAN
    else:
        histogram.sum = point.sum if point.HasField("sum") else 0.0
        histogram.count_int = point.count
    return histogram.SerializeToString()


def _points(metric):
    data = metric.WhichOneof("data")
    return getattr(metric, data).data_points if data else ()


def _temporality(metric) -> int | None:
    data = metric.WhichOneof("data")
    if data in ("sum", "histogram", "exponential_histogram"):
        return getattr(metric, data).aggregation_temporality
    return None


def translate_steps(
    request: ExportMetricsServiceRequest | bytes,
    settings: Settings = DEFAULT_SETTINGS,
    delta: DeltaToCumulative | None = None,
    tenant: str = "",
    max_points: int = 0,
) -> Generator[None, None, Translation]:
    """Translate ``request`` (a message, or a protobuf one's bytes, parsed a piece at a time:
    wire.split_request), yielding every POINTS_PER_STEP data points and between pieces.
    ``delta``: where delta sums and histograms are summed into cumulative ones (None: they are
    refused); 413 once the request holds more than ``max_points`` data points (0: no limit),
    before they are translated."""
    builder = _Builder(settings, delta, tenant)
    points = 0
    resource: _Resource | None = None
    for item in _resource_metrics(request):
        if item is None:
            yield
            continue
        number, resource_metrics, data_bytes = item
        if resource is None or resource.number != number:
            _target_info(builder, resource)
            resource = _Resource(number, resource_metrics.resource)
        context, resource.identity = _resource_context(builder, resource_metrics.resource)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = _scope_labels(builder, scope_metrics)
            scoped = _Context(context.promoted, {**context.forced, **scope}) if scope else context
            for metric in scope_metrics.metrics:
                raw_data = next(data_bytes)
                data_points = _points(metric)
                if not data_points:
                    continue
                resource.saw([point.time_unix_nano for point in data_points])
                before = points
                points += len(data_points)
                if max_points and points > max_points:
                    raise OTLPError(
                        413,
                        f"the request carries more than {max_points} data points, the most one request may carry"
                        " (--remote-write-max-samples)",
                    )
                try:
                    yield from _metric(builder, metric, raw_data, scoped, before)
                except _Refused as error:
                    builder.refuse(len(data_points), str(error))
    _target_info(builder, resource)
    batch = WriteBatch(version=2, series=builder.series, metadata=list(builder.metadata.values()))
    batch.arrays = builder.arrays()
    return Translation(
        batch,
        points,
        builder.refused,
        builder.problems,
        np.array(builder.sample_points, dtype=np.int64),
        builder.histogram_points,
        builder.created,
    )


class _Resource:
    """A resource being translated (its metrics may come in several pieces): its number in the
    request, its job and instance, and the times of its first and last points (ns)."""

    def __init__(self, number: tuple[int, int], resource):
        self.number = number
        self.resource = resource
        self.identity: dict[str, str] = {}
        self.earliest: int | None = None
        self.latest: int | None = None

    def saw(self, times: list[int]) -> None:
        self.earliest = min(times) if self.earliest is None else min(self.earliest, *times)
        self.latest = max(times) if self.latest is None else max(self.latest, *times)


def _resource_metrics(
    request: ExportMetricsServiceRequest | bytes,
) -> Iterator[tuple[tuple[int, int], Any, Iterator[bytes | None]] | None]:
    """The ResourceMetrics of a request, each with its number (the same for every piece of one
    resource) and the bytes of its metrics' data messages where the request's bytes hold them
    (wire.metric_data; else None each), and None between the pieces of a protobuf request."""
    if isinstance(request, ExportMetricsServiceRequest):
        for index, resource_metrics in enumerate(request.resource_metrics):
            yield (0, index), resource_metrics, itertools.repeat(None)
        return
    for piece in split_request(request):
        if piece is None:
            yield None
            continue
        number, raw = piece
        message = parse(raw, PROTOBUF)
        for index, (resource_metrics, data) in enumerate(zip(message.resource_metrics, metric_data(raw))):
            yield (number, index), resource_metrics, iter(data)
        yield None


def translate(
    request: ExportMetricsServiceRequest | bytes, settings: Settings = DEFAULT_SETTINGS, delta=None, tenant: str = ""
):
    """translate_steps run to its end."""
    steps = translate_steps(request, settings, delta, tenant)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _metric(
    builder: _Builder, metric, raw_data: bytes | None, context: _Context, first_point: int
) -> Generator[None, None, None]:
    kind = _kind(metric)
    if not kind:
        raise _Refused(f"metric {metric.name!r} has no data of a known type")
    temporality = _temporality(metric)
    if temporality is not None and temporality != CUMULATIVE:
        if temporality != DELTA:
            raise _Refused(f"metric {metric.name!r} has no aggregation temporality")
        if builder.delta is None or kind == names.EXPONENTIAL_HISTOGRAM:
            raise _Refused(
                f"metric {metric.name!r} has delta temporality, which is refused"
                + (" (exponential histograms are never converted)" if builder.delta is not None else "")
                + " (--otlp-convert-delta converts delta sums and histograms to cumulative)"
            )
    try:
        name = builder.namer.metric_name(metric.name, metric.unit, kind)
    except InvalidName as error:
        raise _Refused(str(error)) from None
    builder.metadata[name] = WriteMetadata(
        name, _PROMETHEUS_TYPES[kind], metric.description, names.unit_name(metric.unit)
    )
    data = metric.WhichOneof("data")
    if data in ("gauge", "sum") and temporality != DELTA:
        yield from _number_points(builder, metric, raw_data, name, kind, context, first_point)
        return
    add = _ADD[data]
    for number, point in enumerate(_points(metric)):
        if number and not number % POINTS_PER_STEP:
            yield
        builder.point = first_point + number
        try:
            base = builder.attributes(point.attributes, context)
            add(builder, name, kind, base, point, temporality)
        except (_Refused, InvalidName, DeltaOutOfOrder) as error:
            builder.refuse(1, f"metric {metric.name!r}: {error}")


def _number_points(
    builder: _Builder, metric, raw: bytes | None, name: str, kind: str, context: _Context, first_point: int
) -> Generator[None, None, None]:
    """The points of a gauge or cumulative sum, read from their bytes (``raw``, the data message
    as the request holds it, or written again): each series' labels made once and found again
    by its attributes' bytes (_SERIES_CACHE), times and values read by _ReadNumbers with numpy;
    a point in another layout (no start time on a counter, exemplars, fields left out) or with
    flags takes _add_number."""
    data = getattr(metric, metric.WhichOneof("data"))
    points = data.data_points
    if raw is None:
        raw = data.SerializeToString()
    prefix = _PREFIXES.setdefault((builder.namer, context.key, name), len(_PREFIXES))
    counter = kind == names.MONOTONIC_COUNTER
    numbers = _ReadNumbers(builder, raw, counter)
    table, labels_of, add_series, add_time, add_point = (
        builder.table,
        builder.labels,
        builder.sample_series.append,
        numbers.time_at.append,
        builder.sample_points.append,
    )
    position, size, number = 0, len(raw), -1
    while position < size:
        tag, length = raw[position], raw[position + 1]
        if length < 0x80:
            position += 2
        elif raw[position + 2] < 0x80:  # a point of 128 bytes to 16 KiB
            length = length - 0x80 + (raw[position + 2] << 7)
            position += 3
        else:
            length, position = read_varint(raw, position + 1)
        if tag != _DATA_POINTS_TAG:
            if tag & 7 == 2:  # another length-delimited field: skipped
                position += length
            continue  # aggregation_temporality, is_monotonic: varints, read already
        at, position = position, position + length
        number += 1
        if number and not number % POINTS_PER_STEP:
            numbers.done()
            yield
        if length >= 27 and raw[at] == _START and raw[at + 9] == _TIME and raw[at + 18] in (_DOUBLE, _INT):
            time_at = at + 10
        elif not counter and length >= 18 and raw[at] == _TIME and raw[at + 9] in (_DOUBLE, _INT):
            time_at = at + 1
        else:
            time_at = 0
        try:
            found = _SERIES_CACHE.get((prefix, raw[time_at + 17 : position])) if time_at else None
            if found is None:
                numbers.done()  # the samples before this point's, in order
                builder.point = first_point + number
                point = points[number]
                base = builder.attributes(point.attributes, context)
                if not time_at or point.flags or point.exemplars:
                    _add_number(builder, name, kind, base, point, CUMULATIVE)
                    continue
                labels = series_labels(name, base)
                found = (labels, label_bytes(labels), {})
                if len(_SERIES_CACHE) >= MAX_CACHED_SERIES:
                    _SERIES_CACHE.clear()
                    _PREFIXES.clear()
                    prefix = _PREFIXES.setdefault((builder.namer, context.key, name), 0)
                _SERIES_CACHE[(prefix, raw[time_at + 17 : position])] = found
            index = table.get(found[1])
            if index is None:
                index = table[found[1]] = len(labels_of)
                labels_of.append(found[0])
            add_series(index)
            add_time(time_at)
            add_point(first_point + number)
            if counter:
                numbers.stored.append(found[2])
        except InvalidName as error:
            builder.refuse(1, f"metric {metric.name!r}: {error}")
    numbers.done()
    builder.point = first_point + number  # the point target_info's samples are counted with


class _ReadNumbers:
    """The times and values of number points whose series are in the builder's arrays already
    (``time_at``: where each point's time is in ``raw``, its value 9 bytes on, a counter's start
    9 bytes before), read at once with numpy; a counter series whose start time is not the
    created timestamp ``stored`` for the tenant (the cache's dict of each point) gets it sent."""

    def __init__(self, builder: _Builder, raw: bytes, counter: bool):
        self.builder = builder
        self.bytes = np.frombuffer(raw, dtype=np.uint8)
        self.counter = counter
        self.time_at: list[int] = []
        self.stored: list[dict[str, int]] = []

    def _fixed64(self, at: np.ndarray) -> np.ndarray:
        return self.bytes[at[:, None] + _EIGHT_BYTES].view("<u8").reshape(-1)

    def done(self) -> None:
        """Add the times and values of the points read so far."""
        if not self.time_at:
            return
        builder = self.builder
        at = np.array(self.time_at, dtype=np.intp)
        first = len(builder.timestamps)
        timestamps = (self._fixed64(at) // 1_000_000).astype(np.int64)
        values = self._fixed64(at + 9).view(np.float64)
        ints = self.bytes[at + 8] == _INT
        if ints.any():
            values[ints] = values[ints].view(np.int64)
        builder.timestamps.extend(timestamps.tolist())
        builder.values.extend(values.tolist())
        if self.counter:
            created = (self._fixed64(at - 9) // 1_000_000).astype(np.int64)
            tenant = builder.tenant
            stored = np.array([known.get(tenant, 0) for known in self.stored], dtype=np.int64)
            for number in np.flatnonzero((created != 0) & (created != stored)).tolist():
                position = first + number
                sample = (builder.timestamps[position], builder.values[position])
                index = builder.sample_series[position]
                builder.extra_series(index, samples=[sample], created_timestamp=int(created[number]))
                builder.created.append((self.stored[number], int(created[number]), position))
        self.time_at.clear()
        self.stored.clear()


def _created(point) -> int:
    return point.start_time_unix_nano // 1_000_000


def _add_number(builder: _Builder, name: str, kind: str, base: dict, point, temporality) -> None:
    timestamp, value = point.time_unix_nano // 1_000_000, _number(point)
    created = _created(point)
    if temporality == DELTA:
        assert builder.delta is not None
        value, created = builder.delta.sum(builder.tenant, name, base, created, timestamp, value)
    index = builder.sample(name, base, timestamp, value)
    exemplars = _exemplars(point.exemplars) if kind != names.GAUGE else []
    created = created if kind == names.MONOTONIC_COUNTER else 0
    if exemplars or created:
        builder.extra_series(index, samples=[(timestamp, value)], exemplars=exemplars, created_timestamp=created)


def _add_histogram(builder: _Builder, name: str, kind: str, base: dict, point, temporality) -> None:
    timestamp, created = point.time_unix_nano // 1_000_000, _created(point)
    stale = point.flags & NO_RECORDED_VALUE
    bounds, counts = list(point.explicit_bounds), list(point.bucket_counts)
    total, count = (point.sum if point.HasField("sum") else None), point.count
    if temporality == DELTA:
        assert builder.delta is not None
        total, count, counts, created = builder.delta.histogram(
            builder.tenant, name, base, created, timestamp, total, count, bounds, counts
        )
    extras: list[tuple[int, float, list[Exemplar]]] = []
    if total is not None:
        extras.append((builder.sample(f"{name}_sum", base, timestamp, STALE_NAN if stale else total), total, []))
    extras.append((builder.sample(f"{name}_count", base, timestamp, STALE_NAN if stale else count), count, []))
    exemplars = sorted(_exemplars(point.exemplars), key=lambda e: e.value)
    cumulative, taken = 0, 0
    for bound, bucket_count in zip(bounds, counts):
        cumulative += bucket_count
        mine = []
        while taken < len(exemplars) and exemplars[taken].value <= bound:
            mine.append(exemplars[taken])
            taken += 1
        value = STALE_NAN if stale else float(cumulative)
        extras.append(
            (builder.sample(f"{name}_bucket", base, timestamp, value, ("le", _float_string(bound))), value, mine)
        )
    value = STALE_NAN if stale else float(count)
    extras.append((builder.sample(f"{name}_bucket", base, timestamp, value, ("le", "+Inf")), value, exemplars[taken:]))
    for index, value, mine in extras:
        if created or mine:
            builder.extra_series(index, samples=[(timestamp, value)], exemplars=mine, created_timestamp=created)


def _add_summary(builder: _Builder, name: str, kind: str, base: dict, point, temporality) -> None:
    timestamp, created = point.time_unix_nano // 1_000_000, _created(point)
    stale = point.flags & NO_RECORDED_VALUE
    rows = [
        (builder.sample(f"{name}_sum", base, timestamp, STALE_NAN if stale else point.sum), point.sum),
        (builder.sample(f"{name}_count", base, timestamp, STALE_NAN if stale else float(point.count)), point.count),
    ]
    for quantile in point.quantile_values:
        value = STALE_NAN if stale else quantile.value
        builder.sample(name, base, timestamp, value, ("quantile", _float_string(quantile.quantile)))
    if created:
        for index, value in rows:
            builder.extra_series(index, samples=[(timestamp, value)], created_timestamp=created)


def _add_exponential(builder: _Builder, name: str, kind: str, base: dict, point, temporality) -> None:
    data = native_histogram(point, temporality, builder.settings.max_histogram_buckets)
    timestamp = point.time_unix_nano // 1_000_000
    labels = {k: v for k, v in sorted({**base, "__name__": name}.items()) if v}
    builder.series.append(
        WriteSeries(
            labels,
            histograms=[WriteHistogram(timestamp, data)],
            exemplars=_exemplars(point.exemplars),
            created_timestamp=_created(point),
        )
    )
    builder.histogram_points.append(builder.point)


_ADD = {
    "gauge": _add_number,
    "sum": _add_number,
    "histogram": _add_histogram,
    "summary": _add_summary,
    "exponential_histogram": _add_exponential,
}


def _target_info(builder: _Builder, read: _Resource | None) -> None:
    """target_info samples of a resource with points, attributes beyond its identity and a job or
    instance: from its first point to its last every half lookback delta, and at its last."""
    if read is None or read.earliest is None or read.latest is None:
        return
    resource, identity = read.resource, read.identity
    earliest, latest = read.earliest // 1_000_000, read.latest // 1_000_000
    identifying = (
        ()
        if builder.settings.keep_identifying_resource_attributes
        else (
            SERVICE_NAME,
            SERVICE_NAMESPACE,
            SERVICE_INSTANCE_ID,
        )
    )
    others = [kv for kv in resource.attributes if kv.key not in (SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_INSTANCE_ID)]
    if not others or not identity:
        return
    try:
        base = builder.attributes(resource.attributes, _Context({}, identity), skipped=("__name__", *identifying))
    except InvalidName as error:
        builder.refuse(0, f"target_info: {error}")
        return
    if not base.get("job") and not base.get("instance"):
        return
    builder.metadata.setdefault(TARGET_INFO, WriteMetadata(TARGET_INFO, "gauge", "Target metadata", ""))
    key = label_bytes(base)
    interval = builder.settings.lookback_delta_ms // 2
    times = [*range(earliest, latest, interval), latest]
    for timestamp in times:
        if (key, timestamp) not in builder.target_info_seen:
            builder.target_info_seen.add((key, timestamp))
            builder.sample(TARGET_INFO, base, timestamp, 1.0)
