"""Metric and label names as Prometheus shows them.

Prometheus 3 takes any non-empty UTF-8 text as a metric or label name
(``http.server.request.duration``, ``k8s.pod.name``): tsgate's PromQL and HTTP APIs show every
series as written (utf8_labels). Prometheus 2.x only accepts metric names matching
[a-zA-Z_:][a-zA-Z0-9_:]* and label names matching [a-zA-Z_][a-zA-Z0-9_]*, and fails a whole
remote read that returns another, so for a 2.x reader a series ingested as "servers.web-1.cpu"
is renamed (prometheus_labels). That mapping is lossy ("a.b" and "a_b" both become "a_b");
callers that need the original name must keep it themselves.
"""

import re

NAME_LABEL = "__name__"
# Prometheus 3's value-encoding escape of a name in a URL path (/api/v1/label/<name>/values):
# "U__" then the name, "_" doubled, each other character outside [a-zA-Z0-9_:] as "_<hex>_".
ESCAPED_NAME_PREFIX = "U__"
# At most 5 hex digits: Prometheus's UnescapeName gives up on a sixth (so no code point past U+FFFFF).
_ESCAPED_PART = re.compile(r"__|_([0-9a-fA-F]{1,5})_|_")
_LEGACY_CLIENT = re.compile(r"Prometheus/[12]\.")

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
    labels[NAME_LABEL] = prometheus_metric_name(metric_name)
    return labels


def utf8_labels(metric_name: str, tags: dict[str, str]) -> dict[str, str]:
    """The labels of a series as Prometheus 3 shows them: ``__name__`` and the tags as written."""
    return {**tags, NAME_LABEL: metric_name}


def labels_for_reader(user_agent: str | None):
    """The label view a remote-read client takes: Prometheus 1.x and 2.x refuse a whole answer
    holding a name outside their character set (prometheus_labels), others read names as written."""
    return prometheus_labels if user_agent and _LEGACY_CLIENT.match(user_agent) else utf8_labels


def unescape_name(name: str) -> str:
    """A name as Prometheus 3 reads it in a URL path: ``U__`` value-encoding undone
    (``U__k8s_2e_pod_2e_name`` is ``k8s.pod.name``, ``__`` is ``_``); a name without the prefix, or
    whose escapes are not valid, is taken as it is (as Prometheus's model.UnescapeName does)."""
    if not name.startswith(ESCAPED_NAME_PREFIX):
        return name
    escaped = name[len(ESCAPED_NAME_PREFIX) :]
    parts, position = [], 0
    for found in _ESCAPED_PART.finditer(escaped):
        parts.append(escaped[position : found.start()])
        if found.group() == "__":
            parts.append("_")
        elif found.group(1) is None:
            return name  # a lone "_" opens no valid escape
        else:
            code = int(found.group(1), 16)
            if 0xD800 <= code <= 0xDFFF:
                return name
            parts.append(chr(code))
        position = found.end()
    parts.append(escaped[position:])
    return "".join(parts)
