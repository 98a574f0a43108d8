"""Benchmarks run by hand against real services (see bench/README.rst); not part of the test suite."""
