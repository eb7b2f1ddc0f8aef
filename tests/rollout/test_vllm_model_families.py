"""Weight sync of each model family users bring (Llama, Qwen3, Gemma 3, Mistral) into the vllm engine: after a
sync, vLLM's per-token log-probs of its samples equal the synced actor's log softmax. Runs where vllm is installed
(`make test-vllm`), each family in a process of its own (tests/rollout/vllm_family_sync.py says why)."""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from hybridflow.models.loading import load_model_config  # noqa: E402
from tests.float_bounds import longest_reduction, reordered_sum_bound  # noqa: E402

pytestmark = pytest.mark.vllm

REPOSITORY = pathlib.Path(__file__).parents[2]


def test_synced_vllm_engine_gives_the_actors_log_probs(family_model_dir):
    """Both sides run float32; vLLM's CPU kernels sum in other orders, so a log-prob may differ by the reordered
    sum bound of its longest sum (tests/float_bounds.py) at its own size."""
    completed = subprocess.run(
        [sys.executable, "-m", "tests.rollout.vllm_family_sync", str(family_model_dir)],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["tokens"] > 0
    bound = reordered_sum_bound(result["largest_log_prob"], longest_reduction(load_model_config(family_model_dir)))
    assert result["max_difference"] <= bound, result
