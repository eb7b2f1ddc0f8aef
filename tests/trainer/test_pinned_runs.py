"""Pinned numbers: a seeded 3-step GRPO run (KL loss) and a 3-step PPO/GAE run (critic, KL in the reward)
through ``python -m hybridflow.trainer.main_ppo`` log the losses, KL, entropy and grad norms pinned in
``pinned_runs.json``. A refactor of the step is safe once these pass.

Re-pin after an intended change of the math (or of anything the runs go through), then review the diff:

    HYBRIDFLOW_REPIN=1 .venv/bin/python -m pytest tests/trainer/test_pinned_runs.py

Tolerance: ``|logged - pinned| <= REL * |pinned| + FLOOR``. Another CPU sums fp32 matmuls in another
order (AVX2 against AVX-512 blocking), which moves a log-prob by at most ``V * eps * |log-prob|``
(``tests/float_bounds.py``): ``FLOOR``. AdamW amplifies that: its step ``lr * m / (sqrt(v) + 1e-8)`` is
blind to the gradient's size, so an entry whose gradient cancels to within rounding of 0 may step anywhere
in ``[-lr, lr]`` on one CPU and elsewhere on another. Such entries are a share ``f <= 1e-3`` of the weights
(asserted for this model by ``tests/workers/test_actor_rollout_ref.py``), so they perturb a step of
``~lr`` on every entry by at most ``2 lr sqrt(f P)`` against its ``lr sqrt(P)`` in norm: ``2 sqrt(f) =
6.3%`` of what the step changed, and so of the metrics it moved. ``REL = 0.1`` covers that. A sign
flipped in a loss, or a term doubled or halved, changes a metric by 50% or more (and the runs' later steps
with it), so it cannot pass.

The runs sample their responses: a rounding difference flips a sampled token only when the uniform draw
lands within it of a CDF boundary, odds of order ``V * 1e-7`` per token (under 1% over a run's ~200
tokens). A flipped token changes the rest of the run, so the sampled responses are pinned too: a hash per
step, compared exactly before that step's metrics. At step 1 a mismatch means sampling, the model or the
data changed; later it follows a change in the earlier updates or, rarely, a flipped token.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib

import pytest

from hybridflow.tracking import metric_names as names
from hybridflow.tracking.trackers import read_metrics
from tests.float_bounds import reordered_sum_bound

from .cli import run_cli
from .helpers import tiny_run_overrides

pytestmark = pytest.mark.slow

PINNED = pathlib.Path(__file__).with_name("pinned_runs.json")
REPIN = os.environ.get("HYBRIDFLOW_REPIN") == "1"
STEPS = 3

REL = 0.1
# V * eps * |log-prob| for the tiny model's 263-token vocabulary and log-probs of at most ~10 in size.
FLOOR = reordered_sum_bound(10.0, 263)

SAMPLED = "sampled_responses_sha256"
ACTOR = ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm")
RUNS = {
    "grpo": {
        "estimator": "grpo",
        "overrides": ["actor_rollout_ref.actor.use_kl_loss=true"],
        "metrics": ACTOR + ("actor/kl_loss",),
    },
    "gae": {
        "estimator": "gae",
        "overrides": ["algorithm.use_kl_in_reward=true"],
        "metrics": ACTOR + ("critic/vf_loss", "critic/grad_norm", names.KL_IN_REWARD),
    },
}


def seeded_run(name: str, work: pathlib.Path, tiny_model_dir, tiny_parquet, extra: tuple[str, ...] = ()):
    """{step: logged record} and the per-step hashes of the sampled responses of run ``name``."""
    run = RUNS[name]
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, work / "run", run["estimator"]) + [
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.rollout_data_dir={work / 'rollouts'}",
        # A second epoch is off-policy: step 1 already logs a non-zero pg_loss, ppo_kl and KL.
        "actor_rollout_ref.actor.ppo_epochs=2",
        *run["overrides"],
        *extra,
    ]
    run_cli(overrides, cwd=work)
    steps = {record["step"]: record for record in read_metrics(work / "run")}
    assert sorted(steps) == list(range(1, STEPS + 1))
    hashes = [responses_hash(work / "rollouts" / f"step_{step}.jsonl") for step in range(1, STEPS + 1)]
    return steps, hashes


@pytest.fixture(scope="module", params=sorted(RUNS))
def logged_run(request, tiny_model_dir, tiny_parquet, tmp_path_factory):
    """(run name, its pinned numbers, {step: record}) of a seeded 3-step run, without validation or checkpoints."""
    name = request.param
    steps, hashes = seeded_run(name, tmp_path_factory.mktemp(name), tiny_model_dir, tiny_parquet)
    numbers = {key: [steps[step][key] for step in range(1, STEPS + 1)] for key in RUNS[name]["metrics"]}
    numbers[SAMPLED] = hashes
    return name, numbers, steps


def responses_hash(dump: pathlib.Path) -> str:
    """sha256 of a step's sampled responses, in batch order (from ``trainer.rollout_data_dir``)."""
    responses = [json.loads(line)["response"] for line in dump.read_text().splitlines()]
    return hashlib.sha256(json.dumps(responses).encode()).hexdigest()


def repin(name: str, numbers: dict[str, list]) -> None:
    pinned = json.loads(PINNED.read_text()) if PINNED.exists() else {}
    pinned[name] = numbers
    PINNED.write_text(json.dumps(pinned, indent=2, sort_keys=True) + "\n")


def test_logged_losses_kl_entropy_and_grad_norms_match_the_pinned_run(logged_run):
    name, numbers, _ = logged_run
    if REPIN:
        repin(name, numbers)
        pytest.skip(f"re-pinned the {name} run in {PINNED.name}; review it with git diff")
    pinned = json.loads(PINNED.read_text())[name]
    assert pinned.keys() == numbers.keys(), "the pinned keys changed: re-pin (see the module docstring)"
    # Step by step: a step's samples come from the weights the steps before it trained.
    for index in range(STEPS):
        step = index + 1
        assert numbers[SAMPLED][index] == pinned[SAMPLED][index], (
            f"step {step} sampled other responses than the pinned run"
            + (
                " (its weights are the initial ones: sampling, the model or the data changed)"
                if step == 1
                else f" though steps 1-{step - 1} logged the pinned numbers: their updates changed below the tolerance "
                "or, if nothing explains that, a rounding difference flipped a sampled token on this CPU"
            )
        )
        for key in RUNS[name]["metrics"]:
            value, expected = numbers[key][index], pinned[key][index]
            assert math.isfinite(value), f"{key} at step {step} is {value}"
            assert abs(value - expected) <= REL * abs(expected) + FLOOR, (
                f"{key} at step {step}: {value} vs pinned {expected} (tolerance {REL:g} relative + {FLOOR:.1e})"
            )


# Metrics that measure time or memory, not the computation.
TIMED = (
    "timing_s/",
    "timing_per_token_ms/",
    names.PERF_THROUGHPUT,
    names.PERF_TIME_PER_STEP,
    "perf/mfu/",
    *names.PERF_MEMORY,
)


def test_local_mode_logs_exactly_what_the_ray_run_logs(logged_run, tiny_model_dir, tiny_parquet, tmp_path):
    """``trainer.local_mode`` builds the same workers in the driver's process with the torch threads a Ray
    worker gets: the same operations in the same order, and only the transport differs (Ray copies tensors
    bit for bit). So every number the Ray run logged but its timings is equal exactly, sampled tokens included;
    the GAE run fuses three roles (actor, reference, critic) in the one process."""
    name, ray_numbers, ray_steps = logged_run
    local_steps, hashes = seeded_run(name, tmp_path, tiny_model_dir, tiny_parquet, extra=("trainer.local_mode=true",))
    assert hashes == ray_numbers[SAMPLED]
    for step, ray_record in ray_steps.items():
        computed = {key: value for key, value in ray_record.items() if not key.startswith(TIMED)}
        assert {key: local_steps[step][key] for key in computed} == computed, f"step {step}"
        assert local_steps[step].keys() == ray_record.keys()
