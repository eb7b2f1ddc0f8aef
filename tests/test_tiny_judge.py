"""The demo's judge (examples/tiny_judge): its build writes a model the reward-model worker reads, scoring as the
build measured it, and the committed judge is as accurate on the held-out answers as its build_info.json says."""

import importlib.util
import json
import pathlib
import sys

import pytest
import torch

from hybridflow.models.value_model import forward_reward_scores, load_reward_model

JUDGE_DIR = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tiny_judge"
# A score this close to 0 may fall on either side of "sorted" under another machine's float rounding.
UNDECIDED = 1e-3


def load_build():
    spec = importlib.util.spec_from_file_location("tiny_judge_build", JUDGE_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def held_out_answers(build, maker, seed: int, num_train: int, num_val: int):
    """The build's second held-out set: each validation prompt's right answer, then a near miss of each."""
    training, val = build.split_problems(seed, num_train, num_val)
    return build.answer_pairs(maker, training, val, seed)[1]


def judged(model_dir, maker, pairs):
    """The scores of the judge as the reward-model worker loads it, and the pairs' labels (1.0 = right)."""
    judge = load_reward_model(model_dir).eval()
    input_ids, attention_mask, position_ids, labels = maker.batch(pairs)
    with torch.no_grad():
        scores = forward_reward_scores(judge, input_ids, attention_mask, position_ids)
    return scores, labels


def test_committed_judge_is_as_accurate_as_its_build_says():
    build = load_build()
    info = json.loads((JUDGE_DIR / "model" / "build_info.json").read_text())
    maker = build.PairMaker(build.load_tokenizer(build.BASE_MODEL, padding_side="left"))
    num_val = info["held_out"]["right_answers_and_near_misses"]["pairs"] // 2
    pairs = held_out_answers(build, maker, info["seed"], build.NUM_PROBLEMS, num_val)
    scores, labels = judged(JUDGE_DIR / "model", maker, pairs)
    correct = ((scores > 0).float() == labels).sum().item()
    undecided = (scores.abs() < UNDECIDED).sum().item()
    claimed = info["held_out"]["right_answers_and_near_misses"]["accuracy"] * len(pairs)
    assert abs(correct - claimed) <= undecided + 0.5, (correct, claimed, undecided)  # 0.5: the 4 decimals kept
    assert info["held_out"]["base_samples"]["accuracy"] >= 0.95, info


@pytest.mark.slow
def test_a_quick_build_writes_a_judge_the_reward_worker_reads(tmp_path):
    """A few steps on a few prompts: the saved judge, loaded as main_ppo loads a reward model, scores the held-out
    answers exactly as the build measured them in memory."""
    build = load_build()
    out = tmp_path / "judge"
    args = ["--steps", "3", "--num_train", "30", "--num_val", "10", "--samples_per_prompt", "1", "--eval_every", "3"]
    args += ["--batch_size", "16"]
    info = build.main([*args, "--out", str(out), "--seed", "1"])
    maker = build.PairMaker(build.load_tokenizer(out, padding_side="left"))
    pairs = held_out_answers(build, maker, seed=1, num_train=30, num_val=10)
    measured = info["held_out"]["right_answers_and_near_misses"]
    assert measured["pairs"] == len(pairs) == 20
    assert build.accuracy(load_reward_model(out), maker, pairs) == measured
    assert info["training_pairs"]["right"] + info["training_pairs"]["wrong"] == 30 * 3
