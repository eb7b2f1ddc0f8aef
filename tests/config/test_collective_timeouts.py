"""verl's ``nccl_timeout`` keys set each pool's process-group timeout: how long a collective waits for a rank
that stopped or is stuck (``distributed/futures.py`` names it when the wait ends)."""

from hybridflow.config.load import load_config
from hybridflow.config.plan import build_plan
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
