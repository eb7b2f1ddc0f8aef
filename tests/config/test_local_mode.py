"""``trainer.local_mode``: what cannot run in one local process is refused before start, naming the key."""

import os

from hybridflow.config.load import load_config
from hybridflow.trainer.main_ppo import apply_runtime_env
from tests.trainer.helpers import compose_config, config_errors, plan_of

LOCAL = "trainer.local_mode=true"


def test_a_one_process_run_is_accepted(base):
    assert load_config(compose_config(base + [LOCAL])).trainer.local_mode is True


def test_several_processes_a_cluster_address_and_a_ray_timeline_are_refused(base):
    errors = config_errors(
        base
        + [
            LOCAL,
            "trainer.n_gpus_per_node=2",
            "ray_kwargs.ray_init.address=ray://head:10001",
            "ray_kwargs.timeline_json_file=/tmp/timeline.json",
        ]
    )
    local_errors = [error for error in errors if error.startswith("trainer.local_mode=true")]
    assert len(local_errors) == 3, errors
    assert "trainer.n_gpus_per_node=2; set both to 1" in local_errors[0]
    assert "ray_kwargs.ray_init.address='ray://head:10001'" in local_errors[1]
    assert "ray_kwargs.timeline_json_file" in local_errors[2]


def test_runtime_env_entries_other_than_env_vars_are_refused(base):
    (error,) = config_errors(base + [LOCAL, "+ray_kwargs.ray_init.runtime_env.working_dir=/src"])
    assert "runtime_env ['working_dir']; only env_vars apply" in error


def test_runtime_env_vars_are_set_in_this_process(base, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_LOCAL_MARK", raising=False)
    apply_runtime_env(plan_of(base + [LOCAL, "+ray_kwargs.ray_init.runtime_env.env_vars.HYBRIDFLOW_LOCAL_MARK=7"]))
    assert os.environ["HYBRIDFLOW_LOCAL_MARK"] == "7"
