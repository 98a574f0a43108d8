"""The raw step of each Graphite series, from carbon's storage-schemas.conf.

Raw samples arrive at any timestamp; render needs a fixed step. Users coming from carbon
already describe their steps in storage-schemas.conf, so tsgate reads the same file: the first
section whose ``pattern`` matches the series path (``re.search``, as carbon does; tagged series
match on their canonical ``name;k=v`` path) gives the step, the precision of the first archive in
``retentions``. Without a file, or when no section matches, the step is 60 s (carbon's default
schema). How points become buckets: docs/graphite.rst.
"""

import configparser
import re
from pathlib import Path

DEFAULT_STEP = 60
# carbon's retention units: a bare number is seconds, "m" is minutes (not months).
_UNITS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
    "y": 31536000,
    "year": 31536000,
    "years": 31536000,
}
_PRECISION_RE = re.compile(r"(\d+)([a-z]*)")


class StorageSchemas:
    def __init__(self, rules: list[tuple[str, re.Pattern, int]], default_step: int = DEFAULT_STEP):
        self.rules = rules
        self.default_step = default_step
        self._cache: dict[str, int] = {}

    @classmethod
    def from_file(cls, path: Path | None) -> "StorageSchemas":
        if path is None:
            return cls([])
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(Path(path).read_text(encoding="utf-8"))
        except (OSError, configparser.Error) as error:
            raise ValueError(f"--graphite-storage-schemas {path}: {error}") from None
        rules = []
        for section in parser.sections():
            pattern = parser.get(section, "pattern", fallback=None)
            retentions = parser.get(section, "retentions", fallback=None)
            if pattern is None or retentions is None:
                raise ValueError(f"--graphite-storage-schemas {path}: [{section}] needs pattern and retentions")
            try:
                rules.append((section, re.compile(pattern), _precision(retentions.split(",")[0])))
            except (re.error, ValueError) as error:
                raise ValueError(f"--graphite-storage-schemas {path}: [{section}]: {error}") from None
        return cls(rules)

    def step_for(self, path: str) -> int:
        step = self._cache.get(path)
        if step is None:
            step = next((s for _, pattern, s in self.rules if pattern.search(path)), self.default_step)
            if len(self._cache) < 100_000:
                self._cache[path] = step
        return step


def _precision(archive: str) -> int:
    """``10s:6h`` -> 10; ``60:1440`` (seconds per point : points) -> 60."""
    match = _PRECISION_RE.fullmatch(archive.strip().split(":")[0].strip().lower())
    if not match or match.group(2) not in ("", *_UNITS) or int(match.group(1)) <= 0:
        raise ValueError(f"bad precision in {archive!r}")
    return int(match.group(1)) * _UNITS.get(match.group(2), 1)
