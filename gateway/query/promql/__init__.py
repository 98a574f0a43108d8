"""PromQL: Prometheus's query language evaluated over tsgate's read path (docs/promql.rst)."""
