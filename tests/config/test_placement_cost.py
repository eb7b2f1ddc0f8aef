"""The simulated step of a plan (``config/placement_cost.py``), worked out by hand."""

import pytest

from hybridflow.config.layouts import parse_layout
from hybridflow.config.parallel_plans import GENERATION, Plan
from hybridflow.config.placement_cost import PhaseTimes, step_seconds

ROLES = ["actor_rollout_ref", "ref", "critic"]
# Seconds of each phase of the whole batch on a pool of 1 and of 2 ranks, alone
ONE = {"gen": 2.0, "update_weights": 0.1, "ref": 1.0, "values": 1.0, "update_critic": 4.0, "update_actor": 2.0}
TWO = {phase: seconds / 2 for phase, seconds in ONE.items()}
TIMES = PhaseTimes({(1, "dp"): ONE, (2, "dp"): TWO}, driver=0.2)
OWN_DEVICES = {1: 1.0, 2: 1.0}
ONE_CORE_PER_TWO_RANKS = {1: 1.0, 2: 2.0}


def test_together_every_phase_runs_on_the_pool_one_after_another():
    seconds = step_seconds(Plan(parse_layout("actor+critic:2", ROLES, 2)), TIMES, ONE_CORE_PER_TWO_RANKS)
    # the pool's own two ranks' sharing is in its calibrated times: nothing else computes beside it
    assert seconds == pytest.approx({"generate": 1.05, "log_probs": 1.0, "updates": 3.0, "driver": 0.2, "step": 5.25})


def test_apart_on_devices_of_their_own_the_critic_overlaps_the_actor():
    seconds = step_seconds(Plan(parse_layout("actor:1/critic:1", ROLES, 2)), TIMES, OWN_DEVICES)
    assert seconds == pytest.approx({"generate": 2.1, "log_probs": 1.0, "updates": 4.0, "driver": 0.2, "step": 7.3})


def test_apart_on_shared_cores_the_pools_slow_each_other_while_both_compute():
    seconds = step_seconds(Plan(parse_layout("actor:1/critic:1", ROLES, 2)), TIMES, ONE_CORE_PER_TWO_RANKS)
    # updates: both at half speed until the actor's 2 s are done (4 s), then the critic's last 2 s alone
    assert seconds == pytest.approx({"generate": 2.1, "log_probs": 2.0, "updates": 6.0, "driver": 0.2, "step": 10.3})


def test_a_reference_apart_computes_beside_the_actor_and_the_critic():
    times = PhaseTimes({(1, "dp"): {**ONE, "old_log_prob": 1.0}}, driver=0.0)
    layout = parse_layout("actor:1/ref:1/critic:1", ROLES, 3)
    seconds = step_seconds(Plan(layout), times, {1: 1.0, 2: 1.0, 3: 1.5})
    # old, ref and values (1 s each) on three pools at once, each 1.5x slower
    assert seconds["log_probs"] == pytest.approx(1.5)
    same = PhaseTimes({(1, "dp"): ONE, (2, "dp"): ONE}, 0.0)
    fused = step_seconds(Plan(parse_layout("actor:2/critic:1", ROLES, 3)), same, {3: 1.0, 2: 1.0, 1: 1.0})
    assert fused["log_probs"] == pytest.approx(1.0 + 0.0)  # ref (1 s) on the actor's pool beside values (1 s)


def test_each_phase_takes_the_time_of_its_owners_split():
    # on 2 ranks: generation twice as fast split in halves, the critic's update 4x slower split by sequence
    times = PhaseTimes(
        {(2, "dp"): TWO, (2, "tp2"): {**TWO, "gen": 0.5}, (2, "sp2"): {**TWO, "update_critic": 8.0}}, driver=0.0
    )
    layout = parse_layout("actor+critic:2", ROLES, 2)
    plain = step_seconds(Plan(layout), times, OWN_DEVICES)
    split = step_seconds(Plan(layout, ((GENERATION, "tp2"), ("critic", "sp2"))), times, OWN_DEVICES)
    assert split["generate"] == pytest.approx(plain["generate"] - 0.5)
    assert split["updates"] == pytest.approx(plain["updates"] + 6.0)
    # the actor's own split is dp: its old log-probs and update keep the dp times
    assert split["log_probs"] == pytest.approx(plain["log_probs"])
