"""Which prompts each step of a run trained on, read from its ``trainer.rollout_data_dir`` dumps, and the count
that every prompt of an epoch was trained exactly once (across a kill -9 and a resume too)."""

import json
import pathlib

DUMPS = "rollouts"  # trainer.rollout_data_dir, relative to the run's working folder
# A counted run: epochs of 8 prompts (the tiny parquet has 16), two of them, and each step's prompts dumped
COUNTED = ["data.train_max_samples=8", "trainer.total_epochs=2", f"trainer.rollout_data_dir={DUMPS}"]


def prompts_by_step(dump_dir: pathlib.Path) -> dict[int, list[int]]:
    """Each step's prompts as data-set indices, one per prompt group (``uid``), in batch order; every group's
    samples must be of one prompt."""
    steps = {}
    for path in dump_dir.glob("step_*.jsonl"):
        groups: dict[str, list[int]] = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            groups.setdefault(row["uid"], []).append(row["index"])
        assert all(len(set(indices)) == 1 for indices in groups.values()), f"{path}: a group mixes prompts"
        steps[int(path.stem.removeprefix("step_"))] = [indices[0] for indices in groups.values()]
    return steps


def _epoch_and_samples(overrides: list[str]) -> tuple[list[int], int]:
    """The data-set indices of the training prompts a run of ``overrides`` reads (its data.train_max_samples),
    and its samples per prompt."""
    from hybridflow.config.load import load_config
    from hybridflow.models.loading import load_tokenizer
    from hybridflow.trainer.main_ppo import _datasets

    from .helpers import compose_config

    config = load_config(compose_config(overrides))
    train, _ = _datasets(config, load_tokenizer(config.actor_rollout_ref.model.path))
    return [train[row]["index"] for row in range(len(train))], config.actor_rollout_ref.rollout.n


def assert_each_prompt_trained_once_per_epoch(dump_dir: pathlib.Path, overrides: list[str], steps: int) -> None:
    """Steps 1 to ``steps`` of a run of ``overrides`` trained, in order, on every prompt of an epoch once, then on
    distinct prompts of the next epoch: a prompt lost or trained twice fails."""
    epoch, samples_per_prompt = _epoch_and_samples(overrides)
    by_step = prompts_by_step(dump_dir)
    assert sorted(by_step) == list(range(1, steps + 1)), sorted(by_step)
    for step in by_step:
        rows = len((dump_dir / f"step_{step}.jsonl").read_text().splitlines())
        assert rows == len(by_step[step]) * samples_per_prompt, f"step {step}: {rows} samples"
    trained = [index for step in sorted(by_step) for index in by_step[step]]
    assert len(trained) >= len(epoch), f"{len(trained)} prompts trained, fewer than an epoch's {len(epoch)}"
    for start in range(0, len(trained), len(epoch)):
        # Distinct prompts of the data, as many as an epoch has: each of them once
        chunk = trained[start : start + len(epoch)]
        assert len(set(chunk)) == len(chunk) and set(chunk) <= set(epoch), f"epoch trained {chunk} of {epoch}"
