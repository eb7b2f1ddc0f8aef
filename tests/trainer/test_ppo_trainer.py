"""The driver in-process on the shared local Ray cluster: every registered advantage estimator runs a step."""

import pytest

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, needs_critic
from hybridflow.trainer import metric_names as names
from hybridflow.trainer.main_ppo import build_trainer
from hybridflow.trainer.placement import WorkerGroups, create_worker_groups
from hybridflow.trainer.tracking import read_metrics
from hybridflow.trainer.validate import load_config

from .cli import DENSE_REWARD
from .helpers import compose_config, tiny_run_overrides

pytestmark = pytest.mark.slow


class _Shared(WorkerGroups):
    """Groups kept running across trainers (each trainer re-runs init_model, reloading the weights)."""

    def shutdown(self):
        pass


@pytest.fixture(scope="module")
def start_shared_workers(ray_cluster):
    """A ``start_workers`` that starts one set of worker processes per role set and reuses it."""
    started = {}

    def start(plan, role_classes):
        roles = tuple(role_classes)
        if roles not in started:
            started[roles] = create_worker_groups(plan, role_classes)
        workers = started[roles]
        return _Shared(workers.roles, workers.groups, workers.plan)

    yield start
    for workers in started.values():
        workers.shutdown()


@pytest.mark.parametrize("estimator", ADV_ESTIMATORS.names())
def test_every_estimator_runs_a_step(estimator, start_shared_workers, tiny_model_dir, tiny_parquet, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run", estimator) + [
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.cpus_per_worker=0.5",
        f"custom_reward_function.path={DENSE_REWARD}",
    ]
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers(start_workers=start_shared_workers)
        trainer.fit()
    finally:
        trainer.shutdown()
    (record,) = read_metrics(tmp_path / "run")
    assert record["step"] == 1
    assert (names.timing("values") in record) == needs_critic(estimator)
    assert record["actor/grad_norm"] > 0, "no policy gradient: the advantages were all zero"


def test_split_placement_runs_each_role_in_its_own_processes(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run", "gae") + [
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.cpus_per_worker=0.5",
        "trainer.placement=split", f"custom_reward_function.path={DENSE_REWARD}",
    ]
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers()
        actor_pid = trainer.actor_rollout.worker_info()[0]["pid"]
        critic_pid = trainer.critic.worker_group.worker_info()[0]["pid"]
        assert actor_pid != critic_pid
        trainer.fit()
    finally:
        trainer.shutdown()
    (record,) = read_metrics(tmp_path / "run")
    assert record["critic/vf_loss"] > 0 and record["actor/grad_norm"] > 0
