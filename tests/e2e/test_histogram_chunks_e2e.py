"""Native histograms through remote read STREAMED_XOR_CHUNKS, checked by Prometheus's own decoder.

Histograms are written with remote write to a real ``tsgate serve`` (both stores); a Go program
built against prometheus/prometheus v0.309.1 (tests/chunkdecoder.py) asks for streamed chunks and
decodes every chunk with tsdb/chunkenc. What it prints must be what was written, bit for bit
(floats as their bits), with chunks cut where chunkenc requires: at 120 samples, at a counter
reset, at a layout change and where the kind of sample changes.
"""

import struct
from itertools import accumulate

from protocols.prometheus import WriteHistogram, WriteSeries, types_pb2
from tests.chunkdecoder import decode_remote_read
from tests.e2e.test_exemplars_e2e import now_ms, write

H = types_pb2.Histogram
STEP = 15_000
HINTS = {H.UNKNOWN: "UnknownCounterReset", H.NO: "NotCounterReset", H.GAUGE: "GaugeType"}


def hexbits(value: float) -> str:
    return struct.pack(">d", value).hex()


def with_spans(spans, negative_spans, **fields) -> H:
    """A Histogram message of ``fields`` and its (offset, length) spans."""
    message = H(**fields)
    for offset, length in spans:
        message.positive_spans.add(offset=offset, length=length)
    for offset, length in negative_spans:
        message.negative_spans.add(offset=offset, length=length)
    return message


def integer(
    t,
    spans,
    deltas,
    zero=0,
    negative_spans=(),
    negative_deltas=(),
    schema=3,
    sum_=None,
    hint=H.UNKNOWN,
    custom=(),
    zero_threshold=2.0**-128,
):
    """A valid integer histogram (its count is the sum of its buckets)."""
    count = zero + sum(accumulate(deltas)) + sum(accumulate(negative_deltas))
    return with_spans(
        spans,
        negative_spans,
        count_int=count,
        zero_count_int=zero,
        sum=float(count) * 1.5 if sum_ is None else sum_,
        schema=schema,
        zero_threshold=zero_threshold,
        positive_deltas=deltas,
        negative_deltas=negative_deltas,
        reset_hint=hint,
        timestamp=t,
        custom_values=custom,
    )


def floating(
    t,
    spans,
    counts,
    zero=0.0,
    negative_spans=(),
    negative_counts=(),
    schema=0,
    sum_=1.25,
    hint=H.UNKNOWN,
    custom=(),
    zero_threshold=0.001,
):
    return with_spans(
        spans,
        negative_spans,
        count_float=zero + sum(counts) + sum(negative_counts),
        zero_count_float=zero,
        sum=sum_,
        schema=schema,
        zero_threshold=zero_threshold,
        positive_counts=counts,
        negative_counts=negative_counts,
        reset_hint=hint,
        timestamp=t,
        custom_values=custom,
    )


def decoded_form(message: H, hint: int) -> dict:
    """A written histogram as the decoder prints it, with the hint chunkenc gives back."""
    is_float = message.WhichOneof("count") == "count_float"
    number = hexbits if is_float else str
    return {
        "t": message.timestamp,
        "hint": HINTS[hint],
        "schema": message.schema,
        "zero_threshold": hexbits(message.zero_threshold),
        "count": number(message.count_float if is_float else message.count_int),
        "zero_count": number(message.zero_count_float if is_float else message.zero_count_int),
        "sum": hexbits(message.sum),
        "positive_spans": [{"offset": s.offset, "length": s.length} for s in message.positive_spans],
        "negative_spans": [{"offset": s.offset, "length": s.length} for s in message.negative_spans],
        "positive": [number(v) for v in (message.positive_counts if is_float else message.positive_deltas)],
        "negative": [number(v) for v in (message.negative_counts if is_float else message.negative_deltas)],
        "custom_values": [hexbits(v) for v in message.custom_values],
    }


def float_form(t: int, value: float) -> dict:
    return {
        "t": t,
        "value": hexbits(value),
        "schema": 0,
        "positive_spans": None,
        "negative_spans": None,
        "positive": None,
        "negative": None,
        "custom_values": None,
    }


def expected_chunks(layout: list[tuple[str, str, list]]) -> list[tuple[str, str, int, int, list[dict]]]:
    """(encoding, header, min, max, samples) of each chunk; in a histogram chunk the first
    sample's hint is unknown (gauge in a gauge chunk) and the others' no reset, as chunkenc reads them."""
    chunks = []
    for encoding, header, samples in layout:
        if encoding == "XOR":
            forms = [float_form(t, v) for t, v in samples]
            times = [t for t, _ in samples]
        else:
            gauge = header == "GaugeType"
            forms = [decoded_form(m, H.GAUGE if gauge else (H.NO if i else H.UNKNOWN)) for i, m in enumerate(samples)]
            times = [m.timestamp for m in samples]
        chunks.append((encoding, header, min(times), max(times), forms))
    return chunks


def found_chunks(records: list[dict], name: str) -> list[tuple[str, str, int, int, list[dict]]]:
    chunks = []
    for record in records:
        assert record["labels"]["__name__"] == name and record["query_index"] == 0
        chunks.append(
            (
                record["encoding"],
                record.get("header", ""),
                record["min_time_ms"],
                record["max_time_ms"],
                record["samples"],
            )
        )
    return chunks


def histograms(messages) -> list[WriteHistogram]:
    return [WriteHistogram(m.timestamp, m.SerializeToString()) for m in messages]


def test_streamed_histogram_chunks_round_trip_through_chunkenc(gateway, tenant):
    t0 = now_ms() - 2 * 3600_000
    url = f"{gateway.url}/api/v1/read"

    def check(name, series_samples, messages, layout):
        answer = write(
            gateway,
            tenant,
            [WriteSeries({"__name__": name, "job": "h14"}, series_samples, histograms=histograms(messages))],
        )
        assert answer.status == 204, answer.body
        records = decode_remote_read(url, tenant, t0 - 1, now_ms(), name)
        assert found_chunks(records, name) == expected_chunks(layout)
        assert all(record["labels"] == {"__name__": name, "job": "h14"} for record in records)

    # Integer histograms with a zero bucket and negative buckets: a counter reset at 50 (the
    # count goes down), then at 90 a new positive bucket (a new layout, no reset).
    ints = []
    for i in range(130):
        t = t0 + i * STEP
        if i < 50:
            ints.append(
                integer(t, [(0, 2), (2, 1)], [i + 1, 0, 1], zero=i, negative_spans=[(-1, 1)], negative_deltas=[i])
            )
        elif i < 90:
            ints.append(
                integer(
                    t, [(0, 2), (2, 1)], [i - 50, 1, 1], zero=i - 50, negative_spans=[(-1, 1)], negative_deltas=[i - 50]
                )
            )
        else:
            ints.append(
                integer(
                    t,
                    [(0, 2), (2, 2)],
                    [i - 50, 1, 1, 0],
                    zero=i - 50,
                    negative_spans=[(-1, 1)],
                    negative_deltas=[i - 50],
                )
            )
    check(
        "requests_seconds",
        [],
        ints,
        [
            ("HISTOGRAM", "UnknownCounterReset", ints[:50]),
            ("HISTOGRAM", "CounterReset", ints[50:90]),
            ("HISTOGRAM", "NotCounterReset", ints[90:]),
        ],
    )

    # Float histograms: 120-sample chunks, a NaN sum, and a reset the writer's hint announces.
    floats = [
        floating(
            t0 + i * STEP,
            [(1, 2)],
            [0.5 * i, 0.25 * i],
            zero=0.125 * i,
            negative_spans=[(-2, 1), (1, 1)],
            negative_counts=[i / 3, 1.0],
            sum_=float("nan") if i == 7 else 1.5 * i,
            hint=H.YES if i == 200 else H.UNKNOWN,
        )
        for i in range(250)
    ]
    check(
        "latency_seconds",
        [],
        floats,
        [
            ("FLOAT_HISTOGRAM", "UnknownCounterReset", floats[:120]),
            ("FLOAT_HISTOGRAM", "NotCounterReset", floats[120:200]),
            ("FLOAT_HISTOGRAM", "CounterReset", floats[200:]),
        ],
    )

    # Custom buckets (schema -53), integer then float, between float samples in one series.
    bounds = [0.1, 0.25, 1.0, 2.5, 1e6 + 0.5]
    nhcb_int = [
        integer(t0 + (3 + i) * STEP, [(0, 6)], [i, 1, 0, 0, 2, 0], schema=-53, custom=bounds, zero_threshold=0.0)
        for i in range(10)
    ]
    nhcb_float = [
        floating(
            t0 + (13 + i) * STEP,
            [(0, 3), (2, 1)],
            [1.0, 2.0 + i, 3.0, 4.5],
            schema=-53,
            custom=bounds,
            zero_threshold=0.0,
        )
        for i in range(10)
    ]
    before = [(t0 + i * STEP, float(i)) for i in range(3)]
    after = [(t0 + (23 + i) * STEP, 0.1 * i) for i in range(5)]
    check(
        "nhcb_seconds",
        before + after,
        nhcb_int + nhcb_float,
        [
            ("XOR", "", before),
            ("HISTOGRAM", "UnknownCounterReset", nhcb_int),
            ("FLOAT_HISTOGRAM", "UnknownCounterReset", nhcb_float),
            ("XOR", "", after),
        ],
    )

    # Gauge histograms go down and up in one chunk.
    gauges = [
        integer(t0 + i * STEP, [(0, 1)], [count], zero=1, hint=H.GAUGE, schema=0)
        for i, count in enumerate([5, 1, 7, 0, 3])
    ]
    check("queue_bytes", [], gauges, [("HISTOGRAM", "GaugeType", gauges)])


def random_series(rng, t0: int, is_float: bool, size: int) -> list[H]:
    """Valid histograms that wander between a few layouts, reset now and then, and take counts
    of every width (so every varbit width and XOR window turns up)."""
    layouts = [
        (3, 2.0**-128, [(0, 2), (2, 1)], [(-1, 1)], []),
        (3, 2.0**-128, [(0, 2), (2, 2)], [(-1, 1)], []),
        (-2, 0.0, [(-5, 3)], [], []),
        (8, 0.001, [], [(0, 4), (7, 1)], []),
        (-53, 0.0, [(0, 2), (1, 2)], [], [0.005, 0.1, 1.0, 60.0, 1e6 + 0.3]),
    ]
    messages, t = [], t0
    for _ in range(size):
        t += rng.choice([1, 1000, 15_000, 15_000, 15_001, rng.randint(1, 600_000)])
        if not messages or rng.random() < 0.05:
            schema, zero_threshold, positive, negative, custom = rng.choice(layouts)
            scale = rng.choice([1, 1000, 1 << 30, 1 << 50])
        n_positive, n_negative = sum(length for _, length in positive), sum(length for _, length in negative)
        grow = rng.random() >= 0.03  # else a reset: counts start again low
        base = len(messages) * scale if grow else 0
        positive_counts = [base + rng.randint(0, scale) for _ in range(n_positive)]
        negative_counts = [base + rng.randint(0, scale) for _ in range(n_negative)]
        zero = 0 if schema == -53 else base + rng.randint(0, scale)
        sum_ = rng.choice([float("nan"), -0.0, rng.random() * scale, float(rng.randint(0, 10))])
        if is_float:
            messages.append(
                floating(
                    t,
                    positive,
                    [c / 4 for c in positive_counts],
                    zero / 4,
                    negative,
                    [c / 4 for c in negative_counts],
                    schema,
                    sum_,
                    custom=custom,
                    zero_threshold=zero_threshold,
                )
            )
        else:
            deltas = [b - a for a, b in zip([0, *positive_counts], positive_counts)]
            negative_deltas = [b - a for a, b in zip([0, *negative_counts], negative_counts)]
            messages.append(
                integer(
                    t,
                    positive,
                    deltas,
                    zero,
                    negative,
                    negative_deltas,
                    schema,
                    sum_,
                    custom=custom,
                    zero_threshold=zero_threshold,
                )
            )
    return messages


def test_random_histograms_come_back_bit_exact_from_chunkenc(gateway, tenant):
    """Hundreds of random histograms a series, integer and float: every sample chunkenc decodes
    is the one written (but its hint), in order, in chunks of at most 120."""
    import random

    rng = random.Random(1414)
    t0 = now_ms() - 12 * 3600_000  # 400 steps of about a minute
    for name, is_float in (("random_int", False), ("random_float", True)):
        messages = random_series(rng, t0, is_float, 400)
        answer = write(gateway, tenant, [WriteSeries({"__name__": name}, histograms=histograms(messages))])
        assert answer.status == 204, answer.body
        records = decode_remote_read(f"{gateway.url}/api/v1/read", tenant, t0, now_ms(), name)
        assert len(records) > 5 and all(1 <= len(r["samples"]) <= 120 for r in records)
        assert {r["encoding"] for r in records} == {"FLOAT_HISTOGRAM" if is_float else "HISTOGRAM"}
        found = [sample for record in records for sample in record["samples"]]
        assert [{**sample, "hint": None} for sample in found] == [
            {**decoded_form(m, H.UNKNOWN), "hint": None} for m in messages
        ]
