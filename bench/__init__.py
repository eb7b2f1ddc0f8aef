"""Benchmarks: each script prints wall time, CPU seconds and load average per row."""
