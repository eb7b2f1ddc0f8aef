"""Weight sync of each model family users bring (Llama, Qwen3, Gemma 3, Mistral, Seed-OSS, Qwen3 MoE) into the vllm
engine: after a sync, vLLM's per-token log-probs of its samples equal the synced actor's log softmax; in bfloat16
(verl's rollout dtype, and the only one vLLM's CPU build runs Qwen3-Next's linear attention in), a synced engine
samples exactly as one started from the synced weights. Runs where vllm
is installed (`make test-vllm`), each sync in a process of its own (tests/rollout/vllm_family_sync.py says why), with
a KV cache sized from the sync's sequences, so the result does not depend on the machine's memory; and on a machine
made to look small, where a share of its memory is refused in hybridflow's one line before vLLM loads the model."""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from hybridflow.models.loading import load_model_config  # noqa: E402
from hybridflow.rollout.vllm_memory import GIB, KV_BYTES_KEY, SHARE_KEY, cpu_node_memory  # noqa: E402
from tests.float_bounds import longest_reduction, reordered_sum_bound  # noqa: E402
from tests.rollout.vllm_family_sync import sync_kv_cache_bytes  # noqa: E402
from tests.trainer.cli import HANG_GUARD_S

pytestmark = pytest.mark.vllm

REPOSITORY = pathlib.Path(__file__).parents[2]


def run_sync(model_dir, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.rollout.vllm_family_sync", str(model_dir), *options],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def assert_log_probs_match(completed: subprocess.CompletedProcess, model_dir) -> None:
    """Both sides run float32; vLLM's CPU kernels sum in other orders, so a log-prob may differ by the reordered
    sum bound of its longest sum (tests/float_bounds.py) at its own size."""
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["tokens"] > 0
    bound = reordered_sum_bound(result["largest_log_prob"], longest_reduction(load_model_config(model_dir)))
    assert result["max_difference"] <= bound, result


@pytest.fixture(scope="module")
def qwen3_next_model_dir(tmp_path_factory):
    from hybridflow.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_next"), seed=0, family="qwen3_next")


def skip_unless_available(needed: int) -> None:
    """The one way this machine can fall short of an explicit cache: its NUMA node has less available."""
    memory = cpu_node_memory()
    if needed > memory.available:
        pytest.skip(
            f"NUMA node {memory.node} has {memory.available / GIB:.2f} GiB available, less than the "
            f"{needed / GIB:.2f} GiB KV cache this sync needs"
        )


def test_synced_vllm_engine_gives_the_actors_log_probs(family_model_dir):
    skip_unless_available(sync_kv_cache_bytes(family_model_dir))
    assert_log_probs_match(run_sync(family_model_dir), family_model_dir)


@pytest.mark.parametrize("model", ["tiny_model_dir", "qwen3_next_model_dir"])
def test_a_bfloat16_sync_samples_exactly_as_an_engine_started_from_the_synced_weights(model, request, tmp_path):
    """Synced or loaded from a checkpoint, vLLM rounds the same float32 weights the same way into its bfloat16 ones,
    then runs the same kernels on the same prompts with the same seeds: the tokens and log-probs are equal, bit for
    bit. A weight the sync misses or mangles (a fused projection, a recurrent layer's state parameters) differs."""
    model_dir = request.getfixturevalue(model)
    skip_unless_available(sync_kv_cache_bytes(model_dir))
    synced = run_sync(model_dir, "--dtype", "bfloat16")
    started = run_sync(model_dir, "--dtype", "bfloat16", "--started_from_moved", str(tmp_path / "moved"))
    for completed in (synced, started):
        assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    synced, started = (json.loads(completed.stdout.strip().splitlines()[-1]) for completed in (synced, started))
    assert synced["tokens"] > 0
    assert (synced["token_ids"], synced["rollout_log_probs"]) == (started["token_ids"], started["rollout_log_probs"])


# A machine whose NUMA node vLLM sees with 1 GiB, 0.75 GiB of it available: a 2-core, 2-node laptop or a container.
SMALL_NODE = (GIB, 3 * GIB // 4)


def test_on_a_small_machine_an_explicit_cache_syncs_and_a_share_is_refused_in_one_line(tiny_model_dir):
    """The sync's own cache size fits the small node; a 5% share of it (51 MiB) is less than the process holds
    once torch and vLLM are imported, so hybridflow refuses it before vLLM loads the model, naming both keys."""
    small = ["--node_memory", *map(str, SMALL_NODE)]
    assert sync_kv_cache_bytes(tiny_model_dir) <= SMALL_NODE[1]
    assert_log_probs_match(run_sync(tiny_model_dir, *small), tiny_model_dir)

    refused = run_sync(tiny_model_dir, *small, "--gpu_memory_utilization", "0.05")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-4000:]
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith(
        f"hybridflow: error: {SHARE_KEY}=0.05 gives vLLM 0.05 GiB on CPU (0.05 x the 1.00 GiB of NUMA node "
    ), error
    assert "Traceback" not in refused.stderr
    assert "leaving no room" in error and f"set +{KV_BYTES_KEY}=" in error, error
    assert "Initializing a V1 LLM engine" not in refused.stderr  # refused before vLLM started


def test_where_the_estimate_falls_short_vllms_own_refusal_is_one_line_too(tiny_model_dir):
    """vLLM measures the process's memory after loading the model; should that leave no room where hybridflow's
    lower bound did, vLLM's refusal reaches the user as one line with the explicit size to set."""
    refused = run_sync(
        tiny_model_dir, "--node_memory", *map(str, SMALL_NODE), "--gpu_memory_utilization", "0.05", "--without_estimate"
    )
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-4000:]
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith(
        "hybridflow: error: vLLM found no room for its KV cache on CPU (Available memory on node "
    ), error
    assert f"set +{KV_BYTES_KEY}=" in error and "Traceback" not in refused.stderr, error
