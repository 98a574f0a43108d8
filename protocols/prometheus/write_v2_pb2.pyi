from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Request(_message.Message):
    __slots__ = ("symbols", "timeseries")
    SYMBOLS_FIELD_NUMBER: _ClassVar[int]
    TIMESERIES_FIELD_NUMBER: _ClassVar[int]
    symbols: _containers.RepeatedScalarFieldContainer[str]
    timeseries: _containers.RepeatedCompositeFieldContainer[TimeSeries]
    def __init__(self, symbols: _Optional[_Iterable[str]] = ..., timeseries: _Optional[_Iterable[_Union[TimeSeries, _Mapping]]] = ...) -> None: ...

class TimeSeries(_message.Message):
    __slots__ = ("labels_refs", "samples", "histograms", "exemplars", "metadata", "created_timestamp")
    LABELS_REFS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAMS_FIELD_NUMBER: _ClassVar[int]
    EXEMPLARS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    labels_refs: _containers.RepeatedScalarFieldContainer[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    histograms: _containers.RepeatedCompositeFieldContainer[Histogram]
    exemplars: _containers.RepeatedCompositeFieldContainer[Exemplar]
    metadata: Metadata
    created_timestamp: int
    def __init__(self, labels_refs: _Optional[_Iterable[int]] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., histograms: _Optional[_Iterable[_Union[Histogram, _Mapping]]] = ..., exemplars: _Optional[_Iterable[_Union[Exemplar, _Mapping]]] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ..., created_timestamp: _Optional[int] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("value", "timestamp", "start_timestamp")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    value: float
    timestamp: int
    start_timestamp: int
    def __init__(self, value: _Optional[float] = ..., timestamp: _Optional[int] = ..., start_timestamp: _Optional[int] = ...) -> None: ...

class Exemplar(_message.Message):
    __slots__ = ("labels_refs", "value", "timestamp")
    LABELS_REFS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    labels_refs: _containers.RepeatedScalarFieldContainer[int]
    value: float
    timestamp: int
    def __init__(self, labels_refs: _Optional[_Iterable[int]] = ..., value: _Optional[float] = ..., timestamp: _Optional[int] = ...) -> None: ...

class Histogram(_message.Message):
    __slots__ = ("count_int", "count_float", "sum", "schema", "zero_threshold", "zero_count_int", "zero_count_float", "negative_spans", "negative_deltas", "negative_counts", "positive_spans", "positive_deltas", "positive_counts", "reset_hint", "timestamp", "custom_values", "start_timestamp")
    class ResetHint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RESET_HINT_UNSPECIFIED: _ClassVar[Histogram.ResetHint]
        RESET_HINT_YES: _ClassVar[Histogram.ResetHint]
        RESET_HINT_NO: _ClassVar[Histogram.ResetHint]
        RESET_HINT_GAUGE: _ClassVar[Histogram.ResetHint]
    RESET_HINT_UNSPECIFIED: Histogram.ResetHint
    RESET_HINT_YES: Histogram.ResetHint
    RESET_HINT_NO: Histogram.ResetHint
    RESET_HINT_GAUGE: Histogram.ResetHint
    COUNT_INT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FLOAT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    ZERO_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_INT_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_FLOAT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_SPANS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_DELTAS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_SPANS_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_DELTAS_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    RESET_HINT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_VALUES_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    count_int: int
    count_float: float
    sum: float
    schema: int
    zero_threshold: float
    zero_count_int: int
    zero_count_float: float
    negative_spans: _containers.RepeatedCompositeFieldContainer[BucketSpan]
    negative_deltas: _containers.RepeatedScalarFieldContainer[int]
    negative_counts: _containers.RepeatedScalarFieldContainer[float]
    positive_spans: _containers.RepeatedCompositeFieldContainer[BucketSpan]
    positive_deltas: _containers.RepeatedScalarFieldContainer[int]
    positive_counts: _containers.RepeatedScalarFieldContainer[float]
    reset_hint: Histogram.ResetHint
    timestamp: int
    custom_values: _containers.RepeatedScalarFieldContainer[float]
    start_timestamp: int
    def __init__(self, count_int: _Optional[int] = ..., count_float: _Optional[float] = ..., sum: _Optional[float] = ..., schema: _Optional[int] = ..., zero_threshold: _Optional[float] = ..., zero_count_int: _Optional[int] = ..., zero_count_float: _Optional[float] = ..., negative_spans: _Optional[_Iterable[_Union[BucketSpan, _Mapping]]] = ..., negative_deltas: _Optional[_Iterable[int]] = ..., negative_counts: _Optional[_Iterable[float]] = ..., positive_spans: _Optional[_Iterable[_Union[BucketSpan, _Mapping]]] = ..., positive_deltas: _Optional[_Iterable[int]] = ..., positive_counts: _Optional[_Iterable[float]] = ..., reset_hint: _Optional[_Union[Histogram.ResetHint, str]] = ..., timestamp: _Optional[int] = ..., custom_values: _Optional[_Iterable[float]] = ..., start_timestamp: _Optional[int] = ...) -> None: ...

class BucketSpan(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("type", "help_ref", "unit_ref")
    class MetricType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        METRIC_TYPE_UNSPECIFIED: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_COUNTER: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_GAUGE: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_HISTOGRAM: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_GAUGEHISTOGRAM: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_SUMMARY: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_INFO: _ClassVar[Metadata.MetricType]
        METRIC_TYPE_STATESET: _ClassVar[Metadata.MetricType]
    METRIC_TYPE_UNSPECIFIED: Metadata.MetricType
    METRIC_TYPE_COUNTER: Metadata.MetricType
    METRIC_TYPE_GAUGE: Metadata.MetricType
    METRIC_TYPE_HISTOGRAM: Metadata.MetricType
    METRIC_TYPE_GAUGEHISTOGRAM: Metadata.MetricType
    METRIC_TYPE_SUMMARY: Metadata.MetricType
    METRIC_TYPE_INFO: Metadata.MetricType
    METRIC_TYPE_STATESET: Metadata.MetricType
    TYPE_FIELD_NUMBER: _ClassVar[int]
    HELP_REF_FIELD_NUMBER: _ClassVar[int]
    UNIT_REF_FIELD_NUMBER: _ClassVar[int]
    type: Metadata.MetricType
    help_ref: int
    unit_ref: int
    def __init__(self, type: _Optional[_Union[Metadata.MetricType, str]] = ..., help_ref: _Optional[int] = ..., unit_ref: _Optional[int] = ...) -> None: ...
