"""separate_async's step switching (``trainer/step_switch.py``): verl's decision (threshold, time saved against the
switch's cost), its adaptive threshold, and the collector lending the actor's processes the prompt groups the next
step lacks, over a pool and an actor whose calls finish when the test says."""

import pytest
import torch

from hybridflow.config.schema import HybridRolloutSwitchConfig
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.phases import StepTimer
from hybridflow.trainer.rollout_collection import PendingGeneration
from hybridflow.trainer.separate_async import SeparateAsyncCollector
from hybridflow.trainer.step_switch import StepSwitch

from .test_separate_async_collection import Prompts

N = 2  # samples per prompt


def switch(ratio=0.5, adaptive=False, train_batch_size=8, mini_batch_size=2, processes=(2, 2)):
    settings = HybridRolloutSwitchConfig(
        enable_switch=True, switch_threshold_ratio=ratio, adaptive_switch_threshold=adaptive
    )
    return StepSwitch(settings, train_batch_size=train_batch_size, mini_batch_size=mini_batch_size, processes=processes)


def test_the_threshold_is_the_ratio_of_the_batch_within_one_mini_batch_and_the_batch():
    assert switch(ratio=0.5).threshold() == 4
    assert switch(ratio=0.1).threshold() == 2  # round(0.8) = 1, below one mini-batch
    assert switch(ratio=1.0).threshold() == 8


def test_lending_needs_groups_missing_and_more_time_saved_than_a_switch_costs():
    """Threshold 4 of a batch of 8; the pool has half the processes, so lending halves the time left."""
    decision = switch()
    decision.sampling(ready=0, waited_seconds=4.0)  # 2 groups missing, 2 s each
    metrics = decision.end_step(ready_next=1, steps_left=True)
    assert decision.lend_next  # no switch measured yet: it lends
    assert metrics[names.SWITCH_REMAINING] == 3 and metrics[names.SWITCH_PER_SAMPLE_SECONDS] == 2.0
    assert names.SWITCH_COST_SECONDS not in metrics
    decision.switched(1.0, 0.5)  # a switch there and back costs 1.5 s
    metrics = decision.end_step(ready_next=3, steps_left=True)
    assert not decision.lend_next  # 1 group x 2 s x 1/2 = 1 s saved < 1.5 s
    assert metrics[names.SWITCH_COST_SECONDS] == 1.5 and metrics[names.SWITCH_SHOULD_SWITCH] == 0
    decision.end_step(ready_next=2, steps_left=True)
    assert decision.lend_next  # 2 x 2 x 1/2 = 2 s > 1.5 s
    decision.end_step(ready_next=4, steps_left=True)
    assert not decision.lend_next  # the threshold is met
    decision.end_step(ready_next=0, steps_left=False)
    assert not decision.lend_next  # no step follows


def test_the_adaptive_threshold_moves_after_release_steps_in_a_row():
    """verl's defaults: +0.05 after 2 steps that waited over 2 s, -0.03 after 2 that did not, down to 1 / (train
    batch / mini-batch)."""
    decision = switch(ratio=0.4, adaptive=True, train_batch_size=10, mini_batch_size=2)
    ratios = []
    for waited in (3.0, 3.0, 3.0, 0.0, 3.0, 0.0, 0.0) + (0.0,) * 12:
        decision.sampling(ready=0, waited_seconds=waited)
        decision.end_step(ready_next=0, steps_left=True)
        ratios.append(round(decision.ratio, 4))
    assert ratios[:7] == [0.4, 0.45, 0.5, 0.5, 0.5, 0.5, 0.47]
    assert ratios[-1] == 0.2  # the floor: one mini-batch of the batch


class Future:
    def __init__(self, value):
        self.value, self.finished = value, True

    def done(self):
        return self.finished


class Engines:
    """The pool (engine None) and the actor's lent engine; each call's samples carry one token tagged with the
    pool's synced version (the actor's engine tags 0: it numbers no versions)."""

    def __init__(self):
        self.version, self.calls, self.pool_done = 0, [], True
        self.pad_token_id = 0

    def start(self, prompts, engine=None):
        self.calls.append((engine, prompts.batch["input_ids"][:, 0].tolist()))
        future = Future(0 if engine else self.version)
        future.finished = engine is not None or self.pool_done
        return PendingGeneration(prompts, future)

    def finish(self, pending):
        samples = pending.prompts.repeat(N, interleave=True)
        samples.batch["rollout_weight_versions"] = torch.full((len(samples), 1), pending.future.value)
        return samples

    def sync(self, step, timer, version=0):
        self.version = version


class Actor:
    def __init__(self):
        self.syncs = 0

    def update_weights(self):
        self.syncs += 1
        return [0.0]


def collector(engines, actor, warmup_batches, ratio=1.0):
    return SeparateAsyncCollector(
        engines,
        lambda batch: (batch, None, {}),
        engines.sync,
        mini_batch_size=1,
        train_batch_size=2,
        warmup_batches=warmup_batches,
        threshold=None,
        strategy="drop",
        total_steps=3,
        switch=switch(ratio=ratio, train_batch_size=2, mini_batch_size=1, processes=(1, 1)),
        actor=actor,
    )


def test_a_step_after_a_decision_to_lend_starts_with_the_actor_generating_the_groups_missing():
    """No warm-up: step 1 trains on the pool's only call and leaves the queue empty, so the next step lacks its
    2 groups (threshold 2 = the batch); step 2 has the actor's engine, given the actor's weights, generate both
    with version 1 (the weights after step 1), within the version's budget of 2, and trains on them."""
    engines, actor, source = Engines(), Actor(), Prompts()
    sampler = collector(engines, actor, warmup_batches=0)
    for _ in range(2):
        sampler.collect(source, StepTimer(), 1)
    metrics = sampler.sync_weights(1, StepTimer())
    assert metrics[names.SWITCH_SHOULD_SWITCH] == 1 and metrics[names.SWITCH_REMAINING] == 2
    timer = StepTimer()
    batch, metrics = sampler.collect(source, timer, 2)
    assert engines.calls == [(None, [1, 2]), (actor, [3, 4])] and actor.syncs == 1
    assert batch.batch["input_ids"][::N, 0].tolist() == [3]
    assert batch.batch["rollout_weight_versions"].unique().tolist() == [1]  # the actor's weights: version 1
    assert metrics[names.stat(names.OFF_POLICY_STALENESS, "max")] == 0
    assert {names.PHASE_SWITCH_TO_ROLLOUT, names.PHASE_SWITCH_WAIT, names.PHASE_SWITCH_TO_TRAINER} <= set(timer.seconds)
    assert sampler.staleness_samples == 2 and sampler.started_prompts == 4
    assert len(sampler.switch.to_rollout_costs) == 1
    state = sampler.state_dict()
    assert state["switch"]["to_rollout_costs"] == list(sampler.switch.to_rollout_costs) and state["step"] == 2


@pytest.mark.parametrize("pool_done", [True, False])
def test_a_step_whose_groups_are_ready_by_its_start_does_not_lend(pool_done):
    """One warm-up batch: after step 1 the pool's second call runs and the queue is empty, so step 1 decides to
    lend; if that call finished by step 2's start, step 2 has its threshold and the actor stays a trainer (verl's
    on_step_begin); if not, the actor generates the 2 groups missing while the pool's call goes on."""
    engines, actor, source = Engines(), Actor(), Prompts()
    engines.pool_done = False  # the pool's calls run until the test finishes one (or the driver waits)
    sampler = collector(engines, actor, warmup_batches=1)
    sampler.collect(source, StepTimer(), 1)  # waits for the first call, then starts the second
    sampler.collect(source, StepTimer(), 1)
    assert sampler.sync_weights(1, StepTimer())[names.SWITCH_SHOULD_SWITCH] == 1
    sampler.running.future.finished = pool_done
    sampler.collect(source, StepTimer(), 2)
    lent = [prompts for engine, prompts in engines.calls if engine is actor]
    assert lent == ([] if pool_done else [[5, 6]])


def test_the_pool_takes_what_the_budget_leaves_after_the_lent_groups():
    """No warm-up and a threshold of one group: step 2 lends the actor 1 prompt of the version's 2, and the pool,
    idle since its budget ran out, starts the other at once."""
    engines, actor, source = Engines(), Actor(), Prompts()
    sampler = collector(engines, actor, warmup_batches=0, ratio=0.5)
    for _ in range(2):
        sampler.collect(source, StepTimer(), 1)
    assert sampler.sync_weights(1, StepTimer())[names.SWITCH_REMAINING] == 1
    first, _ = sampler.collect(source, StepTimer(), 2)
    second, _ = sampler.collect(source, StepTimer(), 2)
    assert engines.calls == [(None, [1, 2]), (actor, [3]), (None, [4])]
    assert [batch.batch["input_ids"][0, 0].item() for batch in (first, second)] == [3, 4]
