"""A coroutine on a thread of its own: the caller's timeout fires, and an abandoned call that ends after the
caller's loop has closed ends quietly."""

import asyncio
import threading
import time

import pytest

from hybridflow.rollout.off_loop import run_off_loop


async def _blocking(seconds: float) -> str:
    time.sleep(seconds)  # blocks its own loop only
    return "done"


def test_a_blocking_call_times_out_and_ends_quietly_after_the_callers_loop_closed(monkeypatch):
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(run_off_loop(_blocking(0.5), timeout=0.05, name="abandoned"))
    (thread,) = [thread for thread in threading.enumerate() if thread.name == "abandoned"]
    thread.join(timeout=5)
    assert not thread.is_alive() and errors == []


def test_a_call_within_its_limit_returns_its_result():
    assert asyncio.run(run_off_loop(_blocking(0.01), timeout=5)) == "done"
