#!/usr/bin/env bash
# The demo's GRPO run on four worker processes that generate in two tensor-parallel groups of two: each rank holds
# half of every attention and MLP weight of the generation model (rollout.tensor_model_parallel_size=2), the
# actor trains with FSDP2 over all four, and each weight sync moves only the part of a rank's generation shard
# that its training shard lacks.
#   bash examples/tensor_parallel_grpo_sorting.sh [--seed 0] [--run_dir DIR] [extra main_ppo overrides key=value ...]
# (the run folder defaults to outputs/demo-tensor-parallel: give each seed its own, a run resumes from its folder)
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m hybridflow.demo --run_dir outputs/demo-tensor-parallel \
  trainer.local_mode=false trainer.n_gpus_per_node=4 trainer.cpus_per_worker=0.5 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 "$@"
