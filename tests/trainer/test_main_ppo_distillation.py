"""On-policy distillation end to end (``distillation.enabled=true``): the teacher on a pool of its own scores every
response token and the actor's loss reads it.

With the student's own folder as the teacher, the two distributions are the same model's: forward_kl_topk over the
teacher's top-k is 0, the student's top-k is the teacher's and both hold the same mass, up to float32 rounding of
two forward paths (the teacher sharded over 2 processes, the student over 1; packed rows either way). That holds
only if every sample's teacher ids reach the student's rows and positions they were taken at (through the data
split across the teacher's ranks, the balance reorder, the mini- and micro-batches): a shifted or swapped row
would give the KL between two different positions' distributions."""

import math

import pytest

from hybridflow.tracking import metric_names as names

from .cli import run_cli
from .helpers import tiny_run_overrides
from .test_main_ppo import _steps

pytestmark = pytest.mark.slow

TOPK = 4
# The top-k divergence alone, one mini-batch a step: step 1's whole update is scored before the student moves
TOP_K_ALONE = (
    "distillation.distillation_loss.loss_mode=forward_kl_topk",
    f"distillation.distillation_loss.topk={TOPK}",
    "distillation.distillation_loss.use_task_rewards=false",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
)


def _distilled(tiny_model_dir, tiny_parquet, run_dir, teacher, *loss):
    return tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir, "grpo") + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.cpus_per_worker=0.5",
        "distillation.enabled=true",
        "distillation.nnodes=1",
        "distillation.n_gpus_per_node=2",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        *loss,
    ]


def test_a_teacher_that_is_the_student_gives_a_zero_top_k_divergence(tiny_model_dir, tiny_parquet, tmp_path):
    run_dir = tmp_path / "run"
    overrides = _distilled(tiny_model_dir, tiny_parquet, run_dir, tiny_model_dir, *TOP_K_ALONE)
    run_cli(overrides, cwd=tmp_path)
    step = _steps(run_dir)[1]
    # Each token's KL is a sum of TOPK terms p (log p - log q) with |log p - log q| at float32 rounding of two
    # forward paths (~1e-6 of logits of size ~1); 1e-5 leaves a factor of 10
    assert 0 <= step["distillation/loss"] < 1e-5, step
    assert abs(step["distillation/student_mass"] - step["distillation/teacher_mass"]) < 1e-5
    # The top-k sets agree but where two logits tie within rounding (about 1e-4 of positions for random logits)
    assert step["distillation/overlap_ratio"] > 0.99
    assert names.timing("teacher") in step


def _two_source_parquet(directory):
    """The tiny parquet's prompts, their data_source alternating between "arithmetic" and "algebra"."""
    from hybridflow.data.parquet_io import write_train_test
    from hybridflow.data.synthetic import arithmetic_problems, train_test_rows

    train, val = train_test_rows(arithmetic_problems(20, seed=0, max_value=9), 4, "arithmetic", "math")
    for row, record in enumerate(train):
        record["data_source"] = SOURCES[row % 2]
    return write_train_test(train, val, directory)


SOURCES = ("arithmetic", "algebra")


def test_two_teachers_each_score_their_own_rows_in_place(tiny_model_dir, tmp_path):
    """verl's MOPD: each data source has a teacher of its own (two copies of the student), so each step's rows
    split between two teacher calls, padded to the pool's 2 processes where a teacher's share is odd. The top-k
    divergence is 0, as in the test above, only if the rejoined calls give every row back its own scores."""
    run_dir = tmp_path / "run"
    teachers = [
        f"+distillation.teacher_models.{source}.{field}={value}"
        for source in SOURCES
        for field, value in (("key", source), ("model_path", tiny_model_dir))
    ]
    overrides = _distilled(
        tiny_model_dir, _two_source_parquet(tmp_path / "data"), run_dir, tiny_model_dir, *TOP_K_ALONE, *teachers
    )
    result = run_cli(overrides, cwd=tmp_path)
    assert "the teacher its data_source names ('arithmetic': " in result.stdout
    step = _steps(run_dir)[1]
    assert 0 <= step["distillation/loss"] < 1e-5, step
    assert step["distillation/overlap_ratio"] > 0.99


def test_a_reverse_kl_reward_trains_without_the_task_advantages(
    tiny_model_dir, tiny_parquet, tmp_path, tmp_path_factory
):
    """verl's OPD scripts' setting: k1 as a reward (use_policy_gradient), the task's advantages unused; the teacher
    another random model of the same tokenizer; in local mode (the teacher's pool in the driver's process); a task
    reward of 0 for every sample."""
    from hybridflow.models.tiny import build_tiny_model

    teacher = build_tiny_model(tmp_path_factory.mktemp("teacher"), seed=1)
    no_reward = tmp_path / "no_reward.py"
    no_reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    run_dir = tmp_path / "run"
    overrides = _distilled(
        tiny_model_dir,
        tiny_parquet,
        run_dir,
        teacher,
        "distillation.distillation_loss.loss_mode=k1",
        "distillation.distillation_loss.use_policy_gradient=true",
        "distillation.distillation_loss.use_task_rewards=false",
        "distillation.distillation_loss.loss_max_clamp=10.0",
        "trainer.local_mode=true",
        f"custom_reward_function.path={no_reward}",
    )
    run_cli(overrides, cwd=tmp_path)
    steps = _steps(run_dir)
    for step in (1, 2):
        record = steps[step]
        # The student and another model disagree: the surrogate's advantages (-k1) are not 0
        assert record["distillation/abs_loss"] > 0.01, record
        for name in ("distillation/loss", "distillation/pg_clipfrac", "distillation/ppo_kl", "actor/grad_norm"):
            assert math.isfinite(record[name]), (name, record)
    # Every sample scores 0: every task advantage is 0, so any gradient is the distillation loss's
    assert steps[1]["critic/advantages/max"] == steps[1]["critic/advantages/min"] == 0
    assert steps[1]["actor/grad_norm"] > 0
