"""Map Graphite-style names onto names Prometheus accepts.

Prometheus 2.x (and PromQL without UTF-8 quoting) only accepts metric names
matching [a-zA-Z_:][a-zA-Z0-9_:]* and label names matching
[a-zA-Z_][a-zA-Z0-9_]*, so a series ingested as "servers.web-1.cpu" must be
renamed before remote read hands it to Prometheus. The mapping is lossy
("a.b" and "a_b" both become "a_b"); callers that need the original name must
keep it themselves.
"""

import re

_METRIC_NAME_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_NAME_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _sanitize(name: str, invalid: re.Pattern[str], kind: str) -> str:
    if not name:
        raise ValueError(f"an empty {kind} cannot be mapped")
    mapped = invalid.sub("_", name)
    return "_" + mapped if mapped[0].isdigit() else mapped


def prometheus_metric_name(name: str) -> str:
    """Replace each character outside [a-zA-Z0-9_:] by "_"; prefix "_" to a leading digit."""
    return _sanitize(name, _METRIC_NAME_INVALID, "metric name")


def sanitize_label_name(name: str) -> str:
    """Replace each character outside [a-zA-Z0-9_] by "_"; prefix "_" to a leading digit."""
    return _sanitize(name, _LABEL_NAME_INVALID, "label name")


def prometheus_labels(metric_name: str, tags: dict[str, str]) -> dict[str, str]:
    """The labels of a series as Prometheus 2.x accepts them: ``__name__`` and the tags, names
    outside its character set mapped (docs/prometheus.rst)."""
    labels = {sanitize_label_name(key): value for key, value in tags.items()}
    labels["__name__"] = prometheus_metric_name(metric_name)
    return labels
