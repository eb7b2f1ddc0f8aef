#!/usr/bin/env bash
# Multi-turn GRPO with a calculator tool on synthetic arithmetic (examples/data_preprocess/arithmetic.py): the
# rollout runs through the agent loop, which parses hermes <tool_call> blocks, runs the calculator and feeds its
# result back as a tool turn (masked out of the loss). The tool schemas go into the prompt via the chat template.
#
# Defaults suit a 2-core CPU and the demo's tiny base model (examples/tiny_base_model/model, built when missing).
# That model never saw a tool call, so a few steps only show the pipeline running end to end; point MODEL_PATH
# at a tool-calling instruct model (e.g. Qwen2.5-*-Instruct) and raise the step count to learn tool use.
#
#   bash examples/multiturn_calculator/run.sh [extra main_ppo overrides key=value ...]
#
# Environment: MODEL_PATH, RUN_DIR (default outputs/multiturn_calculator), DATA_DIR (default $RUN_DIR/data),
# PYTHON (default: the repo's .venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=examples/multiturn_calculator
PYTHON="${PYTHON:-.venv/bin/python}"
MODEL_PATH="${MODEL_PATH:-examples/tiny_base_model/model}"
RUN_DIR="$(realpath -m "${RUN_DIR:-outputs/multiturn_calculator}")"
DATA_DIR="$(realpath -m "${DATA_DIR:-$RUN_DIR/data}")"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" HF_HUB_OFFLINE=1

if [[ "$MODEL_PATH" == examples/tiny_base_model/model && ! -f "$MODEL_PATH/config.json" ]]; then
    "$PYTHON" examples/tiny_base_model/build.py --out "$MODEL_PATH"
fi
"$PYTHON" examples/data_preprocess/arithmetic.py --local_dir "$DATA_DIR" --num_train 512 --num_test 32

exec "$PYTHON" -m hybridflow.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=640 \
    data.max_response_length=64 \
    actor_rollout_ref.model.path="$(realpath -m "$MODEL_PATH")" \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.optim.lr=1e-4 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.multi_turn.enable=true \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$(realpath "$HERE/tools.yaml")" \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 \
    actor_rollout_ref.rollout.multi_turn.format=hermes \
    trainer.total_training_steps=5 \
    trainer.test_freq=5 \
    trainer.save_freq=-1 \
    trainer.n_gpus_per_node=1 \
    trainer.cpus_per_worker=2 \
    ray_init.num_cpus=2 \
    trainer.default_local_dir="$RUN_DIR" \
    trainer.logger='[console,jsonl]' \
    trainer.project_name=hybridflow_multiturn \
    trainer.experiment_name=calculator_arithmetic \
    hydra.run.dir="$RUN_DIR/hydra" \
    "$@"
