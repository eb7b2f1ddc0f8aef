"""The non-finite guard: which steps it counts, and when it stops the run."""

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer import metric_names as names
from hybridflow.trainer.nonfinite import NonFiniteError, NonFiniteGuard


def _scored(scores):
    scores = torch.tensor(scores, dtype=torch.float32)
    return DataProto.from_dict(
        tensors={"token_level_scores": torch.nn.functional.pad(scores[:, None], (2, 0))},
        non_tensors={"data_source": np.array(["a", "b", "c"][: len(scores)], dtype=object)},
    )


def test_finite_scores_and_updates_count_nothing():
    guard = NonFiniteGuard(max_steps=0)
    assert guard.scores_are_finite(_scored([0.0, 1.0, -2.5]), step=1)
    guard.check_updates({"actor/pg_loss": 0.1, "actor/grad_norm": 3.0, "critic/vf_loss": 1.0}, step=1)
    assert guard.metrics() == {names.NONFINITE_STEPS: 0}


def test_non_finite_scores_skip_the_step_and_name_the_first_sample(capsys):
    guard = NonFiniteGuard(max_steps=1)
    assert not guard.scores_are_finite(_scored([0.0, float("nan"), float("inf")]), step=4)
    assert guard.metrics() == {names.NONFINITE_STEPS: 1}
    assert "step 4: the reward of 2 of 3 samples is not finite (first: sample 1, data_source 'b')" in capsys.readouterr().out
    with pytest.raises(NonFiniteError, match=r"step 5: .* more than trainer.max_nonfinite_steps=1: make the reward"):
        guard.scores_are_finite(_scored([float("-inf")]), step=5)


@pytest.mark.parametrize("key", ["actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"])
def test_a_non_finite_loss_or_gradient_norm_is_counted_and_stops_past_the_limit(key):
    guard = NonFiniteGuard(max_steps=0)
    with pytest.raises(NonFiniteError, match=rf"step 2: {key}=nan: the workers skipped those optimizer steps.*lower the learning rate"):
        guard.check_updates({key: float("nan"), "actor/lr": 1e6}, step=2)
    assert guard.metrics() == {names.NONFINITE_STEPS: 1}


def test_the_count_survives_a_checkpoint():
    guard = NonFiniteGuard(max_steps=5)
    guard.check_updates({"actor/grad_norm": float("inf")}, step=1)
    resumed = NonFiniteGuard(max_steps=5)
    resumed.load_state_dict(guard.state_dict())
    assert resumed.metrics() == {names.NONFINITE_STEPS: 1}
