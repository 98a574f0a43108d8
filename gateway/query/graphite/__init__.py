"""Graphite: carbon listeners, the path index and the render engine."""
