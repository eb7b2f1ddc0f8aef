#!/usr/bin/env bash
# The demo's GRPO run on two worker processes that form one Ulysses group: the actor (and the reference, when one
# is used) splits every sequence in two, each rank running half of its columns (ulysses_sequence_parallel_size=2).
#   bash examples/ulysses_grpo_sorting.sh [--seed 0] [--run_dir DIR] [extra main_ppo overrides key=value ...]
# (the run folder defaults to outputs/demo-ulysses: give each seed its own, a run resumes from its folder)
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m hybridflow.demo --run_dir outputs/demo-ulysses \
  trainer.local_mode=false trainer.n_gpus_per_node=2 trainer.cpus_per_worker=1 \
  actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 "$@"
