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
    ((teacher,), topk) = plan.teacher.models, plan.teacher.topk
    assert teacher.model_path == str(tiny_model_dir) and topk == 16
    # One teacher scores every row: no routing
    assert plan.teacher.route_by is None and teacher.key is None
    # verl's teacher dtype follows the rollout's
    assert teacher.dtype == plan.actor_rollout_ref.rollout.dtype
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
    assert plan_of(distilled + [f"{server}.inference.dtype=bfloat16"]).teacher.models[0].dtype == "bfloat16"


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


def _teachers(model_dir, *keys):
    return [
        f"+distillation.teacher_models.{key}.{field}={value}"
        for key in keys
        for field, value in (("key", key), ("model_path", model_dir))
    ]


def test_several_teachers_route_rows_by_their_key(distilled, tiny_model_dir, tmp_path):
    """verl's MOPD: entries added beside teacher_model replace it, each scoring the rows whose teacher_key names
    it; each its own dtype; the start-up line lists num_replicas as not read, but not a routed teacher's key."""
    teachers = _teachers(tiny_model_dir, "gsm8k", "math") + [
        "+distillation.teacher_models.math.inference.dtype=bfloat16",
        "+distillation.teacher_models.math.num_replicas=2",
    ]
    plan = plan_of(distilled + teachers)
    assert plan.teacher.route_by == "data_source"
    assert [(model.key, model.model_path, model.dtype) for model in plan.teacher.models] == [
        ("gsm8k", str(tiny_model_dir), plan.actor_rollout_ref.rollout.dtype),
        ("math", str(tiny_model_dir), "bfloat16"),
    ]
    assert "the teacher its data_source names ('gsm8k': " in plan.phases["teacher"].why
    (note,) = [line for line in plan.notes if line.startswith("distillation.teacher_models.")]
    assert note.startswith("distillation.teacher_models.math: num_replicas accepted, but not read")
    by_ability = plan_of(distilled + teachers + ["distillation.teacher_key=ability"])
    assert by_ability.teacher.route_by == "ability"


GSM8K, MATH = "+distillation.teacher_models.gsm8k", "+distillation.teacher_models.math"


@pytest.mark.parametrize(
    "settings, named",
    [
        (
            [f"{GSM8K}.key=gsm8k", f"{MATH}.key=math", "distillation.teacher_key=extra_info"],
            "distillation.teacher_key='extra_info' is not a field every row carries",
        ),
        ([f"{GSM8K}.key=gsm8k", f"{MATH}.key=gsm8k"], "distillation.teacher_models.{gsm8k, math} all have key='gsm8k'"),
        ([f"{GSM8K}.key=gsm8k"], "distillation.teacher_models.math.key is empty"),
    ],
)
def test_teachers_that_cannot_be_told_apart_are_refused_in_one_line(distilled, tiny_model_dir, settings, named):
    folders = [f"{GSM8K}.model_path={tiny_model_dir}", f"{MATH}.model_path={tiny_model_dir}"]
    errors = config_errors(distilled + folders + settings)
    assert len(errors) == 1 and named in errors[0], errors


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


def test_training_rows_no_teacher_is_keyed_to_are_refused_before_workers_start(
    distilled, tiny_model_dir, capsys, monkeypatch, tmp_path
):
    """The tiny parquet's rows are all data_source 'arithmetic': two teachers keyed to other sources leave them
    without one, which the full check (the data read before Ray) names with the first such prompt."""
    from tests.trainer.failure_harness import assert_refused, check_in_process

    teachers = _teachers(tiny_model_dir, "gsm8k", "math")
    outcome = check_in_process("main_ppo", distilled + teachers, capsys, monkeypatch, tmp_path)
    assert_refused(
        outcome,
        "data.train_files: data_source='arithmetic' (prompt 0 of the training set, after filtering) names no teacher "
        "(distillation.teacher_models keys: ['gsm8k', 'math']); add a teacher with key='arithmetic'",
    )
    # Keyed to the rows' source, the same teachers pass
    from hybridflow.trainer import main_ppo

    main_ppo.cli(distilled + [item.replace("key=math", "key=arithmetic") for item in teachers])
    assert "config check passed (full)" in capsys.readouterr().out
