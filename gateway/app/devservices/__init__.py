"""Real Cassandra and Redis servers for tests, CI and development, started from local artifacts (no Docker)."""
