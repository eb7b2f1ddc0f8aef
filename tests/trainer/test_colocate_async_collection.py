"""verl's V1 colocate_async sampling on the driver (``trainer/colocate_async.py``), over a rollout that follows the
engine's partial-rollout contract step by step: every prompt's samples need a fixed number of tokens (its length
column), a call draws one token per decode step for every unfinished sample and stops at the step where enough of
each rank's groups (and every required one) have finished."""

import math
import pickle

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.rollout.partial_samples import split_groups
from hybridflow.rollout.requests import FINISH_ABORT, FINISH_LENGTH
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.colocate_async import ColocateAsyncCollector
from hybridflow.trainer.phases import StepTimer
from hybridflow.trainer.rollout_collection import EndOfData, Generation

N = 2  # samples per prompt
TOKEN = 7


class LockstepRollout:
    """Ranks that draw one token per decode step; a prompt's first token id is its samples' full length."""

    def __init__(self, world_size=2):
        self.world_size = world_size
        self.calls = []

    def continue_samples(self, inputs, quotas, metas):
        self.calls.append([len(share) for share in inputs])
        return [self._rank(samples, quota) for samples, quota in zip(inputs, quotas)]

    @staticmethod
    def _rank(samples, quota):
        open_groups = {s.group for s in samples if not s.finished}
        required = {s.group for s in samples if s.required}
        if quota == 0 and not required:
            return samples
        finished_groups = set()
        while open_groups - finished_groups:
            for s in samples:
                if not s.finished:
                    s.token_ids = s.token_ids + [TOKEN]
                    s.log_probs = s.log_probs + [-1.0]
                    s.finish_reason = FINISH_LENGTH if len(s.token_ids) == s.prompt_ids[0] else None
            finished_groups = {g for g in open_groups if all(s.finished for s in samples if s.group == g)}
            if len(finished_groups) >= quota and required <= finished_groups:
                break
        for s in samples:
            s.required = False
            if not s.finished:
                s.finish_reason = FINISH_ABORT
        return samples


class Prompts:
    """Batches of ``size`` prompts whose lengths cycle through ``lengths``, ``batches`` of them in all."""

    def __init__(self, lengths, size, batches):
        self.lengths, self.size, self.batches, self.taken = lengths, size, batches, 0

    def next(self):
        if self.taken == self.batches:
            raise EndOfData("no more prompts")
        first = self.taken * self.size
        self.taken += 1
        index = np.arange(first, first + self.size)
        lengths = torch.tensor([self.lengths[i % len(self.lengths)] for i in index])
        tensors = {
            "input_ids": torch.stack([lengths, lengths], dim=1),
            "attention_mask": torch.ones(self.size, 2, dtype=torch.long),
            "position_ids": torch.arange(2).repeat(self.size, 1),
        }
        return DataProto.from_dict(tensors, non_tensors={"index": index})


def scored(batch, scoring=None):
    return batch, {}, {}


def collector(rollout, total_steps=4, warmup=1, threshold=None, strategy="drop", batch=4):
    generate = Generation(rollout, {"pad_token_id": 0, "eos_token_id": 1}, seed=3, n=N, val_n=1)
    return ColocateAsyncCollector(
        generate,
        scored,
        train_batch_size=batch,
        warmup_batches=warmup,
        threshold=threshold,
        strategy=strategy,
        total_steps=total_steps,
        response_length=8,
        with_log_probs=True,
    )


def trained(batch):
    """(prompt index, response length) of each group of a training batch."""
    index = batch.non_tensor_batch["index"][::N]
    return [(int(i), int(n)) for i, n in zip(index, batch.batch["response_mask"].sum(-1)[::N])]


def test_split_groups_balances_the_samples_left_and_rounds_each_share_of_the_needed_groups_up():
    shares, quotas = split_groups([2, 1, 1, 2, 2], parts=2, needed=3)
    assert shares == [[0, 3], [1, 2, 4]]
    assert quotas == [math.ceil(3 * 2 / 5), math.ceil(3 * 3 / 5)] == [2, 2]


def test_a_step_trains_on_the_first_groups_to_finish_and_the_rest_go_on_from_their_tokens():
    rollout = LockstepRollout()
    source = Prompts(lengths=[8, 8, 2, 3], size=4, batches=4)
    collect = collector(rollout)
    batch, metrics = collect.collect(source, StepTimer(), step=1)
    # the warm-up batch too: 8 groups, alternately on the two ranks; each rank's two short ones finish first
    assert rollout.calls == [[8, 8]]
    assert sorted(trained(batch)) == [(2, 2), (3, 3), (6, 2), (7, 3)]
    assert batch.batch["responses"].shape == (8, 8) and len(set(batch.non_tensor_batch["uid"])) == 4
    assert metrics[names.stat(names.OFF_POLICY_SPANS, "max")] == 1.0
    # the long ones stopped at the decode step of their rank's last needed group
    assert sorted(len(s.token_ids) for g in collect.groups for s in g.samples) == [2, 2, 2, 2, 3, 3, 3, 3]

    batch, metrics = collect.collect(source, StepTimer(), step=2)
    assert trained(batch) == [(0, 8), (1, 8), (4, 8), (5, 8)], "step 1's groups go first, finished with new weights"
    assert metrics[names.stat(names.OFF_POLICY_SPANS, "min")] == 2.0
    assert metrics[names.stat(names.OFF_POLICY_STALENESS, "max")] == 0.0
    assert metrics[names.stat(names.OFF_POLICY_STALENESS_WORST, "max")] == 1.0


def test_no_batch_is_added_after_the_runs_steps_have_had_theirs_and_then_the_data_is_done():
    source = Prompts(lengths=[2], size=4, batches=10)
    collect = collector(LockstepRollout(), total_steps=2, warmup=1)
    collect.collect(source, StepTimer(), step=1)
    collect.collect(source, StepTimer(), step=2)
    assert source.taken == 2 and collect.batches_added == 2 and not collect.groups
    with pytest.raises(EndOfData):
        collect.collect(source, StepTimer(), step=3)


def test_drop_replaces_a_finished_group_older_than_the_threshold_with_a_new_prompt():
    source = Prompts(lengths=[1, 6, 1, 1], size=3, batches=8)
    collect = collector(LockstepRollout(world_size=1), total_steps=8, threshold=1, batch=3)
    # step 1 (with its warm-up batch) trains on groups 0, 2 and 3; group 4 finished too, 1 and 5 are 1 token in
    assert trained(collect.collect(source, StepTimer(), step=1)[0]) == [(0, 1), (2, 1), (3, 1)]
    batch, metrics = collect.collect(source, StepTimer(), step=2)
    # group 4 is 2 versions old at step 2: dropped, and a new prompt (9) takes its place
    assert metrics[names.OFF_POLICY_EVICTED] == 1.0
    assert metrics[names.stat(names.OFF_POLICY_EVICTED_STALENESS, "max")] == 2.0
    assert trained(batch) == [(6, 1), (7, 1), (8, 1)]
    assert [int(g.prompt.non_tensor_batch["index"][0]) for g in collect.groups] == [1, 5, 9]


def test_wait_finishes_every_group_that_reached_the_threshold_before_the_step_goes_on():
    source = Prompts(lengths=[1, 6, 1, 1], size=3, batches=8)
    collect = collector(LockstepRollout(world_size=1), total_steps=8, threshold=2, strategy="wait", batch=3)
    collect.collect(source, StepTimer(), step=1)
    batch, metrics = collect.collect(source, StepTimer(), step=2)
    # groups 1 and 5 are 2 versions old at step 2: the step waits for them, and they started first
    assert trained(batch) == [(1, 6), (4, 1), (5, 6)]
    assert names.OFF_POLICY_EVICTED not in metrics


def test_a_checkpoint_round_trip_goes_on_exactly_as_the_run_would_have():
    def run(resume_after=None):
        source, collect = Prompts(lengths=[5, 2, 7, 1, 3], size=4, batches=6), collector(LockstepRollout(), 6)
        out = []
        for step in range(1, 5):
            out.append(trained(collect.collect(source, StepTimer(), step)[0]))
            if step == resume_after:
                state, calls = pickle.loads(pickle.dumps(collect.state_dict())), collect.generate.calls
                collect = collector(LockstepRollout(), 6)
                collect.load_state_dict(state)
                collect.generate.calls = calls  # the trainer's checkpoint keeps it (rollout_calls)
        return out

    assert run(resume_after=2) == run()
