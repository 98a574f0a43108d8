"""CPU per sample of decoding plus the ingest pipeline, without a database: the gateway's own share.

End-to-end figures on a shared 2-core box mix tsgate's CPU with Cassandra's and the neighbours';
this isolates the Python work tsgate does per sample before the store: the protocol decoder,
building samples, validation, the series-set hash (or the known-series cache) and pending marks.
The store accepts and discards (DiscardingStore), so the figures exclude the driver's per-row cost,
which bench/ingest.py measures for real. Each workload sends its series twice: the first pass
finds new series (validation, hash, metadata), the second only known ones (the steady state).
Workloads: Graphite plaintext, remote write 1.0 (rw) and 2.0 (rw2), native JSON, each decoded
and ingested as its handler does, one request after the other under a running reactor.

    python -m bench.hotpath                    # table of µs of CPU per sample
    python -m bench.hotpath --profile rw       # plus the top functions of one workload (cProfile)
"""

import argparse
import cProfile
import json
import pstats
import time

from twisted.internet import defer, task

from gateway.core.layout import Layout
from gateway.core.model import NAME_TAG, Limits, Sample, SeriesSamples, now_ms
from gateway.downsample.pending import PendingMarks, StorePending
from gateway.ingest.carbon import series_samples
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.ingest.push import series_name_and_tags
from protocols import native_json
from protocols.graphite.plaintext import PlaintextDecoder
from protocols.prometheus import write as remote_write

TENANT = "bench"


class DiscardingStore:
    """Accepts every write at once: what is left is the gateway's CPU, not the database's."""

    def __init__(self):
        self.slot_width_ms = Layout().slot_width_ms

    def write_raw(self, points):
        return defer.succeed(None)

    def write_series(self, series):
        return defer.succeed(None)

    def mark_pending(self, rows, touched_ms):
        return defer.succeed(None)


# Each workload decodes its bodies as the gateway's handler does and yields, a body each, the
# pipeline call the handler makes.


def plaintext(bodies):
    for body in bodies:
        samples = series_samples(TENANT, PlaintextDecoder().feed(body, now_ms())[0])
        yield lambda pipeline: pipeline.ingest_arrays("graphite_plaintext", samples)


def prometheus(content_type):
    def decode(bodies):
        for body in bodies:
            arrays = remote_write.decode_write_request(body, content_type, "snappy", 1 << 30, arrays=True).arrays
            samples = SeriesSamples(
                TENANT,
                arrays.keys,
                arrays.labels,
                series_name_and_tags,
                arrays.series,
                arrays.timestamps,
                arrays.values,
            )
            yield lambda pipeline: pipeline.ingest_arrays("prometheus", samples)

    return decode


def native(bodies):
    for body in bodies:
        decoded, _ = native_json.decode_write_batch(body, now_ms())
        rows = [Sample(TENANT, i.metric_name, i.tags, i.timestamp_ms, i.value) for _, i in decoded]
        yield lambda pipeline: pipeline.ingest("json", rows)


def rw_bodies(encode, chunks: list[range], start: int) -> list[bytes]:
    return [
        encode(
            [
                remote_write.WriteSeries(
                    {NAME_TAG: "bench_metric", "job": "bench", "instance": f"h{i % 100}", "series": str(i)},
                    [(start * 1000, float(i))],
                )
                for i in chunk
            ]
        )
        for chunk in chunks
    ]


def workloads(series: int, per_request: int) -> dict:
    """Bodies as senders shape them: one sample per series per request (a scrape's worth)."""
    start = now_ms() // 1000 - 60
    chunks = [range(first, min(series, first + per_request)) for first in range(0, series, per_request)]
    return {
        "plaintext": (
            plaintext,
            [
                b"".join(b"servers.host%d.cpu.metric%d %d.5 %d\n" % (i % 100, i, i, start) for i in chunk)
                for chunk in chunks
            ],
        ),
        "rw": (
            prometheus(remote_write.V1_CONTENT_TYPE),
            rw_bodies(remote_write.encode_write_request_v1, chunks, start),
        ),
        "rw2": (
            prometheus(remote_write.V2_CONTENT_TYPE),
            rw_bodies(remote_write.encode_write_request_v2, chunks, start),
        ),
        "json": (
            native,
            [
                json.dumps(
                    [
                        {
                            "metricName": "bench_metric",
                            "tags": {"host": f"h{i % 100}", "series": str(i)},
                            "ts": start,
                            "value": float(i),
                        }
                        for i in chunk
                    ]
                ).encode()
                for chunk in chunks
            ],
        ),
    }


async def run(pipeline: IngestPipeline, decode, bodies) -> None:
    """Decode each body and ingest it, one after the other, as one connection's requests are."""
    for ingest in decode(bodies):
        await ingest(pipeline)


async def measure(decode, bodies, samples: int, profile: bool) -> tuple[float, float]:
    """µs of CPU per sample: first pass (new series), second pass (known series). Under a running
    reactor: a long batch pauses for it (gateway.core.cooperative), which without one never resumes."""
    store = DiscardingStore()
    pending = PendingMarks(StorePending(store, store.slot_width_ms, 60_000), 64)
    pipeline = IngestPipeline(store, Limits(), KnownSeries(10_000_000), 1 << 40, pending=pending)
    started = time.process_time()
    await run(pipeline, decode, bodies)
    new = time.process_time() - started
    profiler = cProfile.Profile()
    started = time.process_time()
    if profile:
        profiler.enable()
    await run(pipeline, decode, bodies)
    known = time.process_time() - started
    if profile:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    assert len(pipeline.known) == samples, f"{len(pipeline.known)} series known after two passes of {samples}"
    return new / samples * 1e6, known / samples * 1e6


async def measure_all(args) -> None:
    print(f"{'workload':<10} {'new series µs/sample':>21} {'known series µs/sample':>23}")
    for name, (decode, bodies) in workloads(args.series, args.per_request).items():
        if args.profile and args.profile != name:
            continue
        new, known = await measure(decode, bodies, args.series, args.profile == name)
        print(f"{name:<10} {new:>21.2f} {known:>23.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hotpath", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--per-request", type=int, default=2000)
    parser.add_argument(
        "--profile", choices=["plaintext", "rw", "rw2", "json"], help="cProfile the known-series pass of one workload"
    )
    args = parser.parse_args(argv)
    task.react(lambda _: defer.ensureDeferred(measure_all(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
