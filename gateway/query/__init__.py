"""The read path: the planner (tag filters to series), the stitched read of head rows,
blocks and roll-ups, remote read, the Graphite render engine and PromQL."""
