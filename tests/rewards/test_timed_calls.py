import threading
import time

import pytest

from hybridflow.rewards.timed_calls import CallTimeout, TimedCallRunner


def fail():
    raise RuntimeError("boom")


@pytest.fixture
def runner():
    runner = TimedCallRunner(max_workers=2, timeout_s=0.3)
    yield runner
    runner.close()


def test_outcomes_come_back_in_order_with_errors_caught(runner):
    outcomes = runner.run([lambda: 1, fail, lambda: "three"])
    assert [o.status for o in outcomes] == ["ok", "error", "ok"]
    assert outcomes[0].value == 1 and outcomes[2].value == "three"
    assert outcomes[1].error == "RuntimeError: boom"


def test_a_call_that_runs_out_of_its_own_time_is_a_timeout(runner):
    """A remote judge's request bounds its own time and raises CallTimeout: counted as a timeout, not an error."""

    def own_limit():
        raise CallTimeout("no answer within 1 s")

    (outcome,) = runner.run([own_limit])
    assert (outcome.status, outcome.error) == ("timeout", "no answer within 1 s")


def test_a_hanging_call_times_out_and_its_thread_is_replaced(runner):
    release = threading.Event()
    started = time.monotonic()
    outcomes = runner.run([lambda: release.wait(30), lambda: 2, lambda: 3])
    assert [o.status for o in outcomes] == ["timeout", "ok", "ok"]
    assert time.monotonic() - started < 30  # a runner that waited for the hanging call would take its 30 s
    assert runner.num_stuck_threads == 1
    # Both worker slots still serve calls while the stuck thread waits.
    assert [o.value for o in runner.run([lambda: 4, lambda: 5, lambda: 6])] == [4, 5, 6]
    release.set()
    deadline = time.monotonic() + 5
    while runner.num_stuck_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.num_stuck_threads == 0  # the abandoned thread exited once its call returned


def test_the_limit_counts_from_each_call_start_not_from_the_batch_start():
    runner = TimedCallRunner(max_workers=1, timeout_s=0.3)
    outcomes = runner.run([lambda: time.sleep(0.08)] * 6)  # 0.48 s in all, 0.08 s each
    runner.close()
    assert [o.status for o in outcomes] == ["ok"] * 6


def test_without_a_limit_calls_run_inline():
    runner = TimedCallRunner(timeout_s=None)
    caller = threading.get_ident()
    outcomes = runner.run([threading.get_ident, fail])
    assert outcomes[0].value == caller and outcomes[1].status == "error"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_workers=0"):
        TimedCallRunner(max_workers=0)
    with pytest.raises(ValueError, match="timeout_s=0"):
        TimedCallRunner(timeout_s=0)
