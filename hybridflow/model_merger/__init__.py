"""Turn a hybridflow actor checkpoint into a Hugging Face folder: verl's ``verl.model_merger`` for FSDP.

    python -m hybridflow.model_merger merge --backend fsdp \
        --local_dir checkpoints/hybridflow/ppo/global_step_1/actor --target_dir /path/to/merged_hf_model
    python -m hybridflow.model_merger test --local_dir .../global_step_1/actor --test_hf_dir /path/to/hf_model

``merge`` writes a folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads, with the tokenizer;
a LoRA actor's adapter is merged into the base weights, or with ``--save_lora_adapter`` kept apart as verl
lays it out (base weights in the folder, the adapter in ``lora_adapter/``). ``test`` compares the merged
weights with a Hugging Face folder (e.g. the checkpoint's own ``huggingface/`` export). It reads a checkpoint
in one process, without workers or a process group. This package sits above the trainer: nothing imports it.
"""
