"""GRPO through main_ppo with rollout.name=vllm: the demo's task for 12 steps, its workers in Ray, the rollout
in the actor's processes (hybrid engine; also split over 2 ranks), or on a pool of its own a step ahead
(one-step-off policy; also split over the pool's 2 ranks) or generating continuously (fully async); the
validation accuracy (the mean validation reward) must rise; a kill -9 mid-run whose resumed steps equal an
uninterrupted run's; and fully async's partial rollout landing syncs in vLLM's generation in flight. Runs where
vllm is installed (`make test-vllm`)."""

import pytest

pytest.importorskip("vllm")

from hybridflow.models.loading import load_model_config  # noqa: E402
from hybridflow.rollout.vllm_memory import kv_cache_bytes  # noqa: E402
from tests.trainer.cli import assert_demo_learned, run_demo  # noqa: E402
from tests.trainer.test_main_ppo import grpo_kill_9_then_resume  # noqa: E402
from tests.trainer.test_main_ppo_fully_async import run_held_partial_rollout  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


ROLLOUT_POOL = ["actor_rollout_ref.hybrid_engine=false", "trainer.cpus_per_worker=1"]
FULLY_ASYNC = ROLLOUT_POOL + [
    "async_training.enable=true",
    "async_training.partial_rollout=false",
    "data.gen_batch_size=1",
    "async_training.trigger_parameter_sync_step=1",
    "async_training.staleness_threshold=0.5",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "algorithm.rollout_correction.bypass_mode=true",
]


# Two actor ranks sharing one vLLM engine split in halves (vLLM's SPMD engines, one shard per rank).
TENSOR_PARALLEL = [
    "trainer.n_gpus_per_node=2",
    "trainer.cpus_per_worker=1",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
]


# A rollout pool of its own of 2 ranks sharing one vLLM engine split in halves, each sent its halves' slices;
# with the actor, 3 processes of one Ray CPU each (Ray's CPUs are a count of its own, not the machine's).
POOL_TENSOR_PARALLEL = ROLLOUT_POOL + [
    "rollout.n_gpus_per_node=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "ray_kwargs.ray_init.num_cpus=3",
]


@pytest.mark.parametrize(
    "placement",
    [[], ROLLOUT_POOL, FULLY_ASYNC, TENSOR_PARALLEL, POOL_TENSOR_PARALLEL],
    ids=["hybrid-engine", "one-step-off", "fully-async", "tensor-parallel", "one-step-off-tensor-parallel"],
)
def test_a_grpo_run_on_vllm_learns(tmp_path, placement):
    completed, rows = run_demo(
        tmp_path / "demo",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=true",
        # vLLM on CPU: no chunked prefill (the config check says why); the demo sizes the KV cache itself.
        "actor_rollout_ref.rollout.enable_chunked_prefill=false",
        "trainer.local_mode=false",
        *placement,
    )
    assert_demo_learned(completed, rows)
    # Each step but the last ends syncing its update into the engine that generates next (the hybrid engine's
    # after the last one too, for what a validation or the next run generates).
    sync = (
        "timing_s/sync_rollout_weights"
        if "async_training.enable=true" in placement or ROLLOUT_POOL[0] in placement
        else "timing_s/update_weights"
    )
    synced = {row["step"]: row[sync] for row in rows if sync in row}
    assert set(range(1, 12)) <= set(synced) and all(seconds > 0 for seconds in synced.values()), synced


def test_kill_9_then_resume_on_vllm_matches_an_uninterrupted_run(tiny_model_dir, tiny_parquet, tmp_path):
    """The hybrid engine on vLLM: killed with -9 at its first checkpoint, the same command resumes (the engine
    starts from the model folder and takes the checkpoint's weights), and every later step equals an
    uninterrupted run's, each prompt of an epoch trained once."""
    grpo_kill_9_then_resume(tiny_model_dir, tiny_parquet, tmp_path, vllm_overrides(tiny_model_dir, 8))


def vllm_overrides(model_dir, samples: int) -> list[str]:
    """The vllm engine on CPU for a tiny run: eager, unchunked, a cache for ``samples`` sequences of up to 64 + 8
    tokens in float32 (the widest dtype)."""
    cache = kv_cache_bytes(load_model_config(model_dir), "float32", samples, 72)
    return [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.enable_chunked_prefill=false",
        f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={cache}",
    ]


# Imported by every Ray worker of the run: from the engine's second call on, the first sample to hold 2 tokens
# waits (outside vLLM's step) until new weights land, and a load waits until the call has drawn a token, each at
# most 120 s (a run whose syncs wait for the call ends, and fails; a training step on a slow machine takes tens
# of seconds): the load lands between two steps of the call. A split engine's load lands only at a step (the one
# its ranks agree on), so there the sample waits until the load is sent.
HOLD_VLLM_FOR_A_SYNC = """
import time
from contextlib import contextmanager
from hybridflow.rollout import vllm_engine

Engine, Drawing = vllm_engine.VLLMRolloutEngine, vllm_engine._Drawing
generate, loading, add = Engine._generate, Engine.loading_weights, Drawing.add
calls, landed, sent, held, drawn = [], [0], [0], set(), set()
awaited = [landed]


def counted_generate(self, requests):
    awaited[0] = sent if self._group_landing is not None else landed
    calls.append(awaited[0][0])
    return generate(self, requests)


def held_add(self, output, version):
    finished = add(self, output, version)
    call = len(calls)
    if self.token_ids:
        drawn.add(call)
    if call > 1 and call not in held and len(self.token_ids) >= 2:
        held.add(call)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and awaited[0][0] == calls[-1]:
            time.sleep(0.01)
    return finished


@contextmanager
def loading_after_a_token(self, version):
    deadline = time.monotonic() + 120
    while len(calls) > 1 and len(calls) not in drawn and time.monotonic() < deadline:
        time.sleep(0.01)
    sent[0] += 1
    with loading(self, version):
        yield
    landed[0] += 1


Engine._generate, Drawing.add, Engine.loading_weights = counted_generate, held_add, loading_after_a_token
"""


def test_partial_rollout_on_vllm_tags_each_token_with_its_weights(tiny_model_dir, varied_parquet, tmp_path):
    """async_training.partial_rollout=true with the vllm engine on real pools: the pool's group takes the weight
    load beside a call in flight, vLLM's step loop lets it land between two steps, and every token is tagged, so
    the steps that train on calls held across a sync hold samples drawn by two weight versions (as the hf engine's
    test in test_main_ppo_fully_async.py)."""
    vllm = vllm_overrides(tiny_model_dir, 4)  # a call's 2 prompts x 2 samples
    run_held_partial_rollout(HOLD_VLLM_FOR_A_SYNC, tiny_model_dir, varied_parquet, tmp_path, vllm)


def test_partial_rollout_on_a_split_vllm_pool_lands_each_sync_at_one_step_of_both_ranks(
    tiny_model_dir, varied_parquet, tmp_path
):
    """As above with the pool's vLLM engine split over its 2 processes: each rank is sent its sync on its own
    thread, the ranks agree on the step where it lands (``rollout/group_landing.py``), and the later steps train
    on samples drawn by two weight versions. The actor and the pool's 2 ranks share the run's 2 Ray CPUs."""
    split = ["rollout.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    vllm = vllm_overrides(tiny_model_dir, 4) + split + ["trainer.cpus_per_worker=0.5"]
    run_held_partial_rollout(HOLD_VLLM_FOR_A_SYNC, tiny_model_dir, varied_parquet, tmp_path, vllm)
