"""verl's ``nccl_timeout`` keys set each pool's process-group timeout: how long a collective waits for a rank
that stopped or is stuck (``distributed/futures.py`` names it when the wait ends)."""

from types import SimpleNamespace

from hybridflow.config.load import load_config
from hybridflow.config.plan import build_plan
from hybridflow.trainer.worker_groups import _start_groups
from tests.trainer.helpers import compose_config, config_errors

ARR, CRITIC = "actor_rollout_ref.nccl_timeout", "critic.nccl_timeout"


def test_each_pool_waits_as_long_as_the_longest_of_its_roles(base):
    config = load_config(compose_config(base + ["algorithm.adv_estimator=gae", f"{ARR}=30", f"{CRITIC}=45"]))
    assert build_plan(config, 16).resources.collective_timeouts == {"global_pool": 45}
    split = load_config(compose_config(base + ["algorithm.adv_estimator=gae", "trainer.placement=split", f"{ARR}=30"]))
    timeouts = build_plan(split, 16).resources.collective_timeouts
    assert timeouts == {"actor_rollout_ref_pool": 30, "critic_pool": 600}


def test_a_timeout_that_is_not_positive_is_refused(base):
    assert config_errors(base + [f"{ARR}=0", f"{CRITIC}=-5"]) == [
        f"{ARR}=0 is out of range; it must satisfy 0 < nccl_timeout",
        f"{CRITIC}=-5 is out of range; it must satisfy 0 < nccl_timeout",
    ]


def test_each_group_starts_with_its_pools_timeout(base):
    """The trainer hands each pool's timeout to the group it starts (``RayWorkerGroup`` sets it in the workers'
    process group: tests/distributed/test_errors.py)."""
    config = load_config(compose_config(base + ["algorithm.adv_estimator=gae", "trainer.placement=split", f"{ARR}=30"]))
    plan = build_plan(config, 16)
    started = {}

    def make_group(pool, class_with_init, name, timeout):
        started[name] = timeout
        return SimpleNamespace(spawn=dict, kill=lambda: None)

    _start_groups(plan.resources, {role: None for role in plan.resources.role_pool}, make_group)
    assert started == {"actor_rollout_ref": 30, "critic": 600}
