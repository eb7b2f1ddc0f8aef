"""``distillation.*``: verl's on-policy distillation keys read into the plan (a teacher role on a pool of its own,
the actor's loss), what cannot run refused in one line before anything starts, and verl's teacher-server settings
listed as not read."""

import json
import shutil

import pytest

from hybridflow.config.load import load_config, load_config_with_notes
from hybridflow.config.plan import build_plan
from tests.trainer.helpers import compose_config, config_errors, plan_of

TEACHER = "distillation.teacher_models.teacher_model.model_path"


@pytest.fixture()
def distilled(base, tiny_model_dir):
    """base, distilled from a teacher on a pool of 2 processes (the tiny model itself: the same tokenizer)."""
    return base + [
        "distillation.enabled=true",
        "distillation.nnodes=1",
        "distillation.n_gpus_per_node=2",
        f"{TEACHER}={tiny_model_dir}",
        # 3 processes of half a CPU on a cluster told 2 CPUs: the same on any machine
        "trainer.cpus_per_worker=0.5",
        "ray_kwargs.ray_init.num_cpus=2",
    ]


def test_a_verl_distillation_command_line_plans_a_teacher_on_a_pool_of_its_own(distilled, tiny_model_dir):
    plan = plan_of(
        distilled
        + [
            "distillation.distillation_loss.loss_mode=forward_kl_topk",
            "distillation.distillation_loss.topk=16",
            "distillation.distillation_loss.use_task_rewards=false",
        ]
    )
    assert plan.worker_roles["teacher"] == "teacher"
    assert plan.resources.role_pool["teacher"] == "teacher_pool"
    assert plan.resources.pools["teacher_pool"].world_size == 2
    assert plan.teacher.model_path == str(tiny_model_dir) and plan.teacher.topk == 16
    # verl's teacher dtype follows the rollout's
    assert plan.teacher.dtype == plan.actor_rollout_ref.rollout.dtype
    assert plan.distillation_loss.loss_mode == "forward_kl_topk"
    assert plan.phases["teacher"].runs and "its top-16 log-probs" in plan.phases["teacher"].why
    assert "use_task_rewards=false" in plan.phases["teacher"].why
    # A sample whose task advantages are all 0 still has a distillation loss: no skipping it
    assert not plan.skip_zero_signal
    # An estimator reads the sampled token's log-prob alone
    assert plan_of(distilled).teacher.topk is None
    assert not plan_of(distilled[:-6]).phases["teacher"].runs


def test_verls_teacher_server_settings_are_listed_as_not_read(distilled):
    server = "distillation.teacher_models.teacher_model"
    overrides = distilled + [f"{server}.inference.tensor_model_parallel_size=4", f"{server}.num_replicas=2"]
    config, _ = load_config_with_notes(compose_config(overrides), check_environment=False)
    plan = build_plan(config, 16)
    (note,) = [line for line in plan.notes if line.startswith(server)]
    assert note.startswith(f"{server}: num_replicas, inference.tensor_model_parallel_size accepted, but not read")
    # At verl's defaults (and the settings that follow the rollout's) nothing is listed
    assert not [line for line in plan_of(distilled).notes if line.startswith(server)]
    # The teacher's dtype is read
    assert plan_of(distilled + [f"{server}.inference.dtype=bfloat16"]).teacher.dtype == "bfloat16"


@pytest.mark.parametrize(
    "setting, named",
    [
        ("distillation.nnodes=0", "distillation.nnodes=0 x distillation.n_gpus_per_node=2"),
        (f"{TEACHER}=null", f"{TEACHER} is empty"),
        ("distillation.distillation_loss.loss_mode=k1", "needs use_policy_gradient=true"),
        ("distillation.distillation_loss.loss_mode=jsd", "loss_mode='jsd'"),
        ("distillation.distillation_loss.policy_loss_mode=gspo", "only vanilla is supported"),
        ("+distillation.teacher_models.teacher_model.port=3", "has unknown keys ['port']"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line(distilled, setting, named):
    errors = config_errors(distilled + [setting])
    assert len(errors) == 1 and named in errors[0], errors


def test_several_teachers_are_refused_in_one_line(distilled, tiny_model_dir):
    """verl's MOPD: a second entry replaces teacher_model, routed by teacher_key."""
    teachers = [
        f"+distillation.teacher_models.{name}.{key}={value}"
        for name in ("gsm8k", "math")
        for key, value in (("key", name), ("model_path", tiny_model_dir))
    ]
    (error,) = config_errors(distilled + teachers)
    assert (
        "has 2 teachers (gsm8k, math) routed by distillation.teacher_key (verl's MOPD), which hybridflow does not"
        in (error)
    )


def test_top_k_under_ulysses_is_refused(distilled):
    errors = config_errors(
        distilled
        + [
            "distillation.distillation_loss.loss_mode=forward_kl_topk",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "trainer.n_gpus_per_node=2",
        ]
    )
    assert any("needs top-k log-probs under Ulysses, which hybridflow does not have" in error for error in errors), (
        errors
    )


def test_a_teacher_of_another_vocabulary_is_refused_before_workers_start(distilled, tiny_model_dir, tmp_path):
    other = tmp_path / "other_teacher"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    with pytest.raises(Exception) as caught:
        load_config(compose_config(distilled + [f"{TEACHER}={other}"]), check_environment=True)
    (error,) = caught.value.errors
    assert f"{TEACHER}='{other}' has vocab_size {config['vocab_size'] + 64}" in error
    assert "the teacher reads the student's token ids" in error
    missing = tmp_path / "missing"
    with pytest.raises(Exception) as caught:
        load_config(compose_config(distilled + [f"{TEACHER}={missing}"]), check_environment=True)
    assert any(f"{TEACHER}='{missing}'" in error for error in caught.value.errors)


def test_the_teacher_pool_counts_in_the_local_clusters_cpus(distilled):
    """1 training + 2 teacher processes x 1 CPU each do not fit a local cluster told 2 CPUs (they would wait for
    CPUs forever); in local mode nothing starts, so nothing is counted."""
    errors = config_errors(distilled + ["ray_kwargs.ray_init.num_cpus=2", "trainer.cpus_per_worker=1"])
    assert errors == [
        "trainer.placement=colocated needs 3 CPUs (1 pool(s) x 1 process(es) + 2 teacher-pool process(es) x "
        "trainer.cpus_per_worker=1) but ray_kwargs.ray_init.num_cpus=2; lower trainer.n_gpus_per_node or "
        "trainer.cpus_per_worker, or raise ray_kwargs.ray_init.num_cpus"
    ]
    plan_of(distilled + ["ray_kwargs.ray_init.num_cpus=2", "trainer.cpus_per_worker=1", "trainer.local_mode=true"])
