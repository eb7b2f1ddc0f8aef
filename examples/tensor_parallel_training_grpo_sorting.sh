#!/usr/bin/env bash
# The demo's GRPO run on four worker processes in the paper's hybrid layout: the actor (and its reference) trains
# in (t, d) = (2, 2), FSDP2 x TP (actor.fsdp_config.tensor_parallel_size=2: two groups of two ranks, each rank
# holding half of every attention and MLP weight and FSDP2 sharding it over the other group), and generates in two
# tensor-parallel groups of two (rollout.tensor_model_parallel_size=2); each weight sync moves only the part of a
# rank's generation shard that its training shard lacks.
#   bash examples/tensor_parallel_training_grpo_sorting.sh [--seed 0] [--run_dir DIR] [extra main_ppo overrides ...]
# (the run folder defaults to outputs/demo-tensor-parallel-training: give each seed its own, a run resumes from it)
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m hybridflow.demo --run_dir outputs/demo-tensor-parallel-training \
  trainer.local_mode=false trainer.n_gpus_per_node=4 trainer.cpus_per_worker=0.5 \
  actor_rollout_ref.actor.fsdp_config.tensor_parallel_size=2 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=2 "$@"
