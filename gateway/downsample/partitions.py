"""Which downsampling partition a series belongs to: a jump consistent hash (Lamping and Veach,
the algorithm behind Guava's consistentHash), so changing the partition count moves few series."""

import mmh3

_MASK = (1 << 64) - 1


def jump_hash(key: int, buckets: int) -> int:
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    key &= _MASK
    bucket, candidate = -1, 0
    while candidate < buckets:
        bucket = candidate
        key = (key * 2862933555777941757 + 1) & _MASK
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def partition_of(tenant: str, series_set_hash: str, partitions: int) -> int:
    """The 64-bit murmur3 of ``tenant|hash`` through the jump hash."""
    key = mmh3.hash64(f"{tenant}|{series_set_hash}".encode(), 0, True, False)[0]
    return jump_hash(key, partitions)


def parse_partitions(text: str, count: int) -> list[int]:
    """``0-15,40`` -> [0, ..., 15, 40]; every partition must be below the count."""
    chosen: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"{part!r} is not a partition or a range like 0-15")
        low, high = int(first), int(last or first)
        if low > high or high >= count:
            raise ValueError(f"{part!r} is outside 0-{count - 1}")
        chosen.update(range(low, high + 1))
    return sorted(chosen)
