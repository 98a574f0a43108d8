"""The Graphite render function library, with graphite-web 1.1 semantics, and its /functions catalog.

Every function takes a ``Request`` (render context, the call's raw argument nodes, a way to
evaluate an expression under another time range) and the validated arguments. Functions mutate
and return the series they are given, as graphite-web's do: names, tags and values of the output
follow graphite-web 1.1.8 so that Grafana dashboards show the same legends.

``registry`` holds the parameter types, the registry and the catalog; ``safe`` and ``helpers`` the
shared helpers; one module per group as graphite-web groups them (Combine, Transform, Calculate,
Filter Series, Filter Data, Sorting, Alias, Graph, Special) registers that group's functions on
import, which importing this package does for all of them. ``docs/graphite-functions.rst`` lists
them and the known differences.
"""

from gateway.query.graphite.functions import (  # noqa: F401  (imported to register their functions)
    alias,
    calculate,
    combine,
    filter_data,
    filter_series,
    graph,
    sorting,
    special,
    transform,
)
from gateway.query.graphite.functions.registry import REGISTRY, function_catalog

__all__ = ["REGISTRY", "function_catalog"]
