"""The non-finite guard: which steps it counts and flags, and when it stops the run."""

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
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
    update = {"actor/pg_loss": 0.1, "actor/grad_norm": 3.0, "actor/nonfinite_skip_frac": 0.0, "critic/vf_loss": 1.0}
    assert guard.updates_are_finite(update, step=1)
    assert guard.metrics(1) == {names.NONFINITE_STEPS: 0, names.NONFINITE_SKIP: 0.0}


def test_non_finite_scores_skip_the_step_and_name_the_first_sample(capsys):
    guard = NonFiniteGuard(max_steps=1)
    assert not guard.scores_are_finite(_scored([0.0, float("nan"), float("inf")]), step=4)
    assert guard.metrics(4) == {names.NONFINITE_STEPS: 1, names.NONFINITE_SKIP: 1.0}
    assert guard.metrics(5) == {names.NONFINITE_STEPS: 1, names.NONFINITE_SKIP: 0.0}
    assert (
        "step 4: the reward of 2 of 3 samples is not finite (first: sample 1, data_source 'b')"
        in capsys.readouterr().out
    )
    with pytest.raises(NonFiniteError, match=r"^step 5: .* more than trainer.max_nonfinite_steps=1: make the reward"):
        guard.scores_are_finite(_scored([float("-inf")]), step=5)


@pytest.mark.parametrize(
    "role, loss, lr_key",
    [("actor", "pg_loss", "actor_rollout_ref.actor.optim.lr"), ("critic", "vf_loss", "critic.optim.lr")],
)
def test_a_non_finite_update_names_the_role_the_share_skipped_and_its_learning_rate(role, loss, lr_key):
    # Two optimizer steps, the second skipped: its NaN makes the means of the loss and grad norm NaN.
    update = {
        f"{role}/{loss}": float("nan"),
        f"{role}/grad_norm": float("nan"),
        f"{role}/nonfinite_skip_frac": 0.5,
        f"{role}/lr": 1e6,
    }
    guard = NonFiniteGuard(max_steps=0)
    with pytest.raises(NonFiniteError) as raised:
        guard.updates_are_finite(update, step=2)
    assert str(raised.value) == (
        f"step 2: the update was not finite, {role}: {role}/{loss}=nan, {role}/grad_norm=nan (50% of its optimizer "
        "steps skipped); that is 1 step(s) with non-finite values, more than trainer.max_nonfinite_steps=0: lower "
        f"the learning rate ({lr_key}=1e+06) or keep grad_clip on (steps with non-finite values are not checkpointed)"
    )
    assert guard.metrics(2) == {names.NONFINITE_STEPS: 1, names.NONFINITE_SKIP: 1.0}


def test_the_count_survives_a_checkpoint():
    guard = NonFiniteGuard(max_steps=5)
    guard.updates_are_finite({"actor/grad_norm": float("inf")}, step=1)
    resumed = NonFiniteGuard(max_steps=5)
    resumed.load_state_dict(guard.state_dict())
    assert resumed.metrics(2) == {names.NONFINITE_STEPS: 1, names.NONFINITE_SKIP: 0.0}
