"""Fixtures of the merger tests: checkpoints written by an actor trained one step in this process."""

from tests.workers.conftest import process_group  # noqa: F401 - the in-process 1-rank group
