"""Sample blocks: one series-slot's raw samples as one compressed blob (docs/storage.rst).

A block is a small fixed header followed by the timestamps and the values, each compressed by
pcodec (numpy in and out, lossless: NaN payloads, Prometheus stale markers, -0.0 and infinities
come back bit for bit). The header is versioned so the codec can change without rewriting old
blocks:

    magic b"TB" | version u8 | codec u8 | count u32 | first ts i64 | last ts i64 | timestamps length u32

all little-endian, 28 bytes; the values' bytes follow the timestamps' bytes.
"""

import struct
from typing import NamedTuple

import numpy as np
from pcodec import ChunkConfig, standalone

MAGIC = b"TB"
VERSION = 1
CODEC_PCODEC = 1
_HEADER = struct.Struct("<2sBBIqqI")
_CONFIG = ChunkConfig(compression_level=8)

EMPTY_TIMESTAMPS = np.empty(0, dtype=np.int64)
EMPTY_VALUES = np.empty(0, dtype=np.float64)


class BadBlock(ValueError):
    """Bytes that are not a block this version can read."""


class BlockHeader(NamedTuple):
    version: int
    codec: int
    count: int  # type: ignore[assignment]  # a field, shadowing tuple.count on purpose
    first_ms: int
    last_ms: int


def encode_block(timestamps: np.ndarray, values: np.ndarray) -> bytes:
    """Timestamps (int64 ms, ascending, unique) and float64 values of the same length -> a block."""
    count = len(timestamps)
    if count != len(values):
        raise ValueError(f"{count} timestamps but {len(values)} values")
    if count == 0:
        return _HEADER.pack(MAGIC, VERSION, CODEC_PCODEC, 0, 0, 0, 0)
    timestamps = np.ascontiguousarray(timestamps, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float64)
    packed_timestamps = standalone.simple_compress(timestamps, _CONFIG)
    packed_values = standalone.simple_compress(values, _CONFIG)
    header = _HEADER.pack(
        MAGIC, VERSION, CODEC_PCODEC, count, int(timestamps[0]), int(timestamps[-1]), len(packed_timestamps)
    )
    return header + packed_timestamps + packed_values


def read_header(block: bytes) -> BlockHeader:
    if len(block) < _HEADER.size:
        raise BadBlock(f"a block is at least {_HEADER.size} bytes, got {len(block)}")
    magic, version, codec, count, first, last, _ = _HEADER.unpack_from(block)
    if magic != MAGIC or version != VERSION or codec != CODEC_PCODEC:
        raise BadBlock(f"unknown block format (magic {magic!r}, version {version}, codec {codec})")
    return BlockHeader(version, codec, count, first, last)


def decode_block(block: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A block -> (int64 timestamps, float64 values), both writable arrays."""
    header = read_header(block)
    if header.count == 0:
        return EMPTY_TIMESTAMPS.copy(), EMPTY_VALUES.copy()
    timestamps_length = _HEADER.unpack_from(block)[-1]
    body = memoryview(block)[_HEADER.size :]
    timestamps = standalone.simple_decompress(bytes(body[:timestamps_length]))
    values = standalone.simple_decompress(bytes(body[timestamps_length:]))
    if len(timestamps) != header.count or len(values) != header.count:
        raise BadBlock(
            f"block says {header.count} samples, holds {len(timestamps)} timestamps and {len(values)} values"
        )
    return timestamps, values
