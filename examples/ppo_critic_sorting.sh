#!/usr/bin/env bash
# PPO with a critic (GAE) on the demo's task and base model: the same run as `make demo`, with a value model.
#   bash examples/ppo_critic_sorting.sh [--seed 0] [extra main_ppo overrides key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m hybridflow.demo --algo ppo --steps 60 "$@"
