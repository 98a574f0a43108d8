"""Snappy block format (not the framed format), with a size check before inflating.

Remote write and remote read bodies are single snappy blocks. A block starts
with the uncompressed length as a uvarint, so we can refuse an oversized body
(a "snappy bomb") from its first bytes, before any memory is allocated for it.
"""

import cramjam

from .errors import ProtocolError

# The snappy format stores the uncompressed length as a 32-bit value.
_MAX_SNAPPY_LENGTH = 0xFFFFFFFF


def uncompressed_length(block: bytes) -> int:
    """Return the uncompressed length announced at the start of a snappy block."""
    value = 0
    for i, byte in enumerate(block[:5]):
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            if value > _MAX_SNAPPY_LENGTH:
                break
            return value
    raise ProtocolError(400, "corrupt snappy block: bad uncompressed-length header")


def decompress_block(block: bytes, max_decompressed_bytes: int) -> bytes:
    """Inflate a snappy block: 413 if it announces more than the limit, 400 if corrupt."""
    length = uncompressed_length(block)
    if length > max_decompressed_bytes:
        raise ProtocolError(
            413,
            f"snappy block would decompress to {length} bytes, limit is {max_decompressed_bytes}",
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise ProtocolError(400, f"corrupt snappy block: {exc}") from exc


def compress_block(data: bytes) -> bytes:
    """Compress `data` as one snappy block, as Prometheus expects."""
    return bytes(cramjam.snappy.compress_raw(data))
