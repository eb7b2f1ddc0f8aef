"""verl's V1 separate_async on the driver (``trainer/separate_async.py``): its sampler's ``drop`` and ``wait`` over
a rollout pool whose calls finish when asked, verl's off-policy metrics from each token's weight version, and one
step's metrics made of its mini-batches' as verl's ``MetricsAggregator`` makes them."""

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.phases import StepTimer
from hybridflow.trainer.rollout_collection import PendingGeneration
from hybridflow.trainer.separate_async import SeparateAsyncCollector, merge_passes, off_policy_metrics

N = 2  # samples per prompt


class Pool:
    """A rollout pool whose samples' tokens carry the weight version synced last (one token each)."""

    def __init__(self):
        self.version, self.calls, self.n = 0, [], N
        self.pad_token_id = 0

    def start(self, prompts):
        self.calls.append(len(prompts))
        return PendingGeneration(prompts, future=self.version)

    def finish(self, pending):
        samples = pending.prompts.repeat(N, interleave=True)
        samples.batch["rollout_weight_versions"] = torch.full((len(samples), 1), pending.future)
        return samples

    def sync(self, step, timer, version=0):
        self.version = version


class Prompts:
    def __init__(self):
        self.taken = 0

    def next(self):
        self.taken += 1
        return DataProto.from_dict({"input_ids": torch.tensor([[self.taken]])})


def collector(pool, threshold, strategy, steps=3):
    return SeparateAsyncCollector(
        pool,
        lambda batch: (batch, None, {}),
        pool.sync,
        mini_batch_size=1,
        train_batch_size=2,
        warmup_batches=1,
        threshold=threshold,
        strategy=strategy,
        total_steps=steps,
    )


def prompts_of(batch):
    return batch.batch["input_ids"][::N, 0].tolist()


def test_drop_replaces_groups_older_than_the_threshold():
    """Steps of 2 mini-batches of 1 prompt, the pool one batch (2 prompts) ahead: step 1 trains on the first call
    and starts the second with version 0, which step 2 finds 2 versions old: with threshold 1 dropped, and 2 new
    prompts generated with version 1 in their place (then the next call starts); with threshold 2 trained on."""
    for threshold, step_2_prompt in ((1, 5), (2, 3)):
        pool, source = Pool(), Prompts()
        sampler = collector(pool, threshold=threshold, strategy="drop")
        step_1 = [sampler.collect(source, StepTimer(), 1) for _ in range(2)]
        assert [prompts_of(batch) for batch, _ in step_1] == [[1], [2]]
        sampler.sync_weights(1, StepTimer())
        batch, metrics = sampler.collect(source, StepTimer(), 2)
        assert prompts_of(batch) == [step_2_prompt]
        if threshold == 2:
            assert names.OFF_POLICY_EVICTED not in metrics and pool.calls == [2, 2, 2]
            assert metrics[names.stat(names.OFF_POLICY_STALENESS, "max")] == 1  # version 0 at the trainer's 1
            continue
        assert pool.calls == [2, 2, 2, 2] and metrics[names.OFF_POLICY_EVICTED] == 2
        assert metrics[names.stat(names.OFF_POLICY_EVICTED_STALENESS, "mean")] == 2
        assert metrics[names.stat(names.OFF_POLICY_STALENESS, "max")] == 0  # drawn by version 1, the trainer's
        assert sampler.total_prompts == 3 * 2 + 2  # the run's prompts and the 2 replacements


@pytest.mark.parametrize("threshold, waits", [(1, True), (2, False)])
def test_wait_finishes_the_generation_in_flight_once_it_reached_the_threshold(threshold, waits):
    """Step 1's second mini-batch is queued already; the call started after the first (version 0) is 1 version
    old at step 1: with threshold 1 the mini-batch waits for it, with 2 it does not."""
    pool, source = Pool(), Prompts()
    sampler = collector(pool, threshold=threshold, strategy="wait")
    sampler.collect(source, StepTimer(), 1)
    assert sampler.running is not None
    sampler.collect(source, StepTimer(), 1)
    assert (sampler.running is None) == waits
    assert len(sampler.queued_versions) == (2 if waits else 0)


def test_off_policy_metrics_follow_each_samples_first_and_last_token_versions():
    versions = torch.tensor([[0, 0, 1, -1], [2, 2, 2, 2], [-1, -1, -1, -1], [1, 2, -1, -1]])  # -1: padding
    metrics = off_policy_metrics(DataProto.from_dict({"rollout_weight_versions": versions}), current_version=2)
    # samples with tokens: spans 2, 1, 2; staleness 2 - last = 1, 0, 0; worst 2 - first = 2, 0, 1
    assert metrics[names.stat(names.OFF_POLICY_SPANS, "max")] == 2
    assert metrics[names.stat(names.OFF_POLICY_SPANS, "mean")] == pytest.approx(5 / 3)
    assert metrics[names.stat(names.OFF_POLICY_STALENESS, "mean")] == pytest.approx(1 / 3)
    assert metrics[names.stat(names.OFF_POLICY_STALENESS_WORST, "max")] == 2
    assert metrics[names.stat(names.OFF_POLICY_STALENESS_WORST, "min")] == 0


def test_a_steps_metrics_merge_its_mini_batches_as_verl_aggregates_them():
    """Averages weighted by each mini-batch's samples, extremes and counts kept, the learning rate the last."""

    def part(rows, metrics):
        batch = DataProto.from_dict({"x": torch.zeros(rows, 1)}, meta_info={"seed": rows})
        return batch, batch, metrics

    passes = [
        part(2, {"actor/pg_loss": 1.0, "actor/lr": 0.1, "actor/grad_norm/max": 3.0, names.OFF_POLICY_EVICTED: 1.0}),
        part(6, {"actor/pg_loss": 3.0, "actor/lr": 0.2, "actor/grad_norm/max": 1.0}),
    ]
    batch, trained, metrics = merge_passes(passes, 0)
    assert len(batch) == len(trained) == 8 and batch.meta_info == {}
    assert metrics == {
        "actor/pg_loss": (2 * 1.0 + 6 * 3.0) / 8,
        "actor/lr": 0.2,
        "actor/grad_norm/max": 3.0,
        names.OFF_POLICY_EVICTED: 1.0,
    }
    untrained = [(batch, None, metrics) for batch, _, metrics in passes]
    assert merge_passes(untrained, 0)[1] is None
    assert np.isclose(merge_passes(passes[:1], 0)[2]["actor/pg_loss"], 1.0)
