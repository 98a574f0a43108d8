"""CRC-32C (Castagnoli) in pure Python, for remote read frame checksums.

The standard library only has the IEEE CRC-32 (zlib.crc32); the chunked
remote read frames need the Castagnoli polynomial, and no extra dependency is
worth it for that.
"""

_POLYNOMIAL = 0x82F63B78  # Castagnoli, bit-reversed


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLYNOMIAL if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _make_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """Return the CRC-32C of `data`; pass a previous result as `crc` to continue it."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
