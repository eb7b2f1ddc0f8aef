#!/usr/bin/env bash
# GRPO on GSM8K (arXiv 2110.14168) with a Qwen2.5 instruct model: the port of verl's
# examples/grpo_trainer/run_qwen2_5-*_gsm8k style run, with its hyperparameters (lr 1e-6, KL loss low_var_kl
# with coefficient 0.001, no entropy bonus, 5 samples per prompt, batch 1024 / mini-batch 256).
#
# Needs what this repo never downloads: a local Qwen2.5 model folder (e.g. Qwen2.5-3B-Instruct) and a local copy
# of GSM8K (the Hugging Face parquet files or the GitHub train.jsonl/test.jsonl; see
# examples/data_preprocess/gsm8k.py). At these default sizes it needs GPUs; it is untested on GPU here (the
# test suite runs these exact keys on a tiny model with small sizes appended as overrides).
#
#   MODEL_PATH=~/models/Qwen2.5-3B-Instruct GSM8K_DIR=~/datasets/gsm8k bash examples/gsm8k_grpo_qwen2_5.sh \
#       [extra main_ppo overrides key=value ...]
#
# Extra arguments come last, so they override the keys below (e.g. trainer.n_gpus_per_node=4). Keys map as in
# verl: trainer.n_gpus_per_node / trainer.nnodes size the worker group, *_micro_batch_size_per_gpu are per rank,
# rollout.name picks the engine ('vllm' as in verl, or 'hf' without vLLM); rollout.log_prob_* size the
# old-log-prob pass and ref.log_prob_* the reference pass, as in verl.
# Optional: DATA_DIR (default ~/data/gsm8k) for the converted parquet files, PYTHON (default: the repo's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL_PATH:?set MODEL_PATH to a local Qwen2.5 model folder}"
: "${GSM8K_DIR:?set GSM8K_DIR to a local folder with the GSM8K train/test files}"
DATA_DIR="${DATA_DIR:-$HOME/data/gsm8k}"
PYTHON="${PYTHON:-.venv/bin/python}"

"$PYTHON" examples/data_preprocess/gsm8k.py --local_path "$GSM8K_DIR" --local_dir "$DATA_DIR"

exec "$PYTHON" -m hybridflow.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=true \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=false \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.ref.fsdp_config.param_offload=true \
    algorithm.use_kl_in_reward=false \
    trainer.logger='[console,jsonl]' \
    trainer.project_name=hybridflow_grpo_example_gsm8k \
    trainer.experiment_name=qwen2_5_grpo_gsm8k \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 \
    "$@"
