"""``main_ppo`` with a reward manager class loaded from the user's file (verl's reward.reward_manager.source=
importlib): a short run scored by it, and each bad input refused in one line before anything starts."""

import json
import pathlib

import pytest

from .failure_harness import assert_refused, check_in_process, run_subprocess
from .helpers import tiny_run_overrides

EXAMPLE = pathlib.Path(__file__).parents[2] / "docs" / "examples" / "bonus_reward_manager.py"
NOT_A_MANAGER = """
class NotAManager:
    def __init__(self, tokenizer, compute_score=None):
        pass
"""


def manager_overrides(name="BonusRewardManager", source="importlib", path=EXAMPLE) -> list[str]:
    """verl's keys for the class ``name`` in the file ``path`` (the docs' example manager)."""
    return [
        f"reward.reward_manager.source={source}",
        f"reward.reward_manager.module.path={path}",
        f"reward.reward_manager.name={name}",
    ]


def test_the_run_is_scored_by_the_users_manager(tiny_model_dir, tiny_parquet, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run") + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.local_mode=true",
        "+reward.reward_kwargs.bonus=10.0",
    ]
    outcome = run_subprocess("main_ppo", overrides + manager_overrides(), tmp_path)
    assert outcome.code == 0, outcome.stderr[-4000:]
    assert "BonusRewardManager manager" in outcome.stdout  # the start-up banner names the loaded class
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:  # the registered scorer gives 0 or 1; the bonus lifts every score by 10
        assert 10.0 <= row["critic/score/mean"] <= 11.0
        assert row["critic/score/min"] >= 10.0


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"path": "/no/such/manager.py"}, "reward.reward_manager.module.path='/no/such/manager.py' does not exist"),
        ({"name": "MissingManager"}, "reward.reward_manager.name='MissingManager' is not defined in "),
        (
            {"source": "plugin"},
            "reward.reward_manager.source='plugin' is not one of [register, importlib]; set register",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(base, capsys, monkeypatch, tmp_path, bad, fragment):
    overrides = base + manager_overrides(**bad)
    error = assert_refused(check_in_process("main_ppo", overrides, capsys, monkeypatch, tmp_path), fragment)
    assert "\n" not in error


def test_a_class_that_is_no_manager_is_refused_in_one_line(base, capsys, monkeypatch, tmp_path):
    path = tmp_path / "not_a_manager.py"
    path.write_text(NOT_A_MANAGER)
    overrides = base + manager_overrides("NotAManager", path=path)
    error = assert_refused(
        check_in_process("main_ppo", overrides, capsys, monkeypatch, tmp_path),
        f"reward.reward_manager.name='NotAManager' in {path} is not a subclass of hybridflow.rewards."
        "NaiveRewardManager; subclass it",
    )
    assert "\n" not in error


def test_a_file_source_needs_the_file(base, capsys, monkeypatch, tmp_path):
    overrides = base + ["reward.reward_manager.source=importlib", "reward.reward_manager.name=MyManager"]
    outcome = check_in_process("main_ppo", overrides, capsys, monkeypatch, tmp_path)
    assert_refused(outcome, "reward.reward_manager.source=importlib needs reward.reward_manager.module.path")


def test_unknown_kwargs_name_the_loaded_class(base, capsys, monkeypatch, tmp_path):
    overrides = base + manager_overrides() + ["+reward.reward_kwargs.bonnus=1.0"]
    outcome = check_in_process("main_ppo", overrides, capsys, monkeypatch, tmp_path)
    assert_refused(outcome, "reward_model.reward_kwargs.bonnus is not an option of reward manager", "mean bonus?")
