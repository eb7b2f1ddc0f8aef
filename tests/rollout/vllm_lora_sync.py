"""A LoRA actor's weight sync into the vllm engine as the adapter alone, in a process of its own (vLLM on CPU
sizes its KV cache from the memory it finds free, so a second engine in one process would find the first one's
cache taken).

``python -m tests.rollout.vllm_lora_sync MODEL_DIR`` builds an ``ActorRolloutRefWorker`` with a rank-4 adapter and
the vllm rollout on a 1-rank gloo group, updates the actor once, syncs the weights, generates, and prints one
JSON line: whether the sync took the adapter alone, the tensors it wrote, the largest difference between vLLM's
per-token log-probs and the trained actor's of the same tokens, and how far training moved them from the base's.
"""

import json
import os
import sys

import safetensors.torch
import torch.distributed as dist

from hybridflow.distributed.worker import find_free_port
from hybridflow.models.loading import load_model_config
from hybridflow.protocol import DataProto
from hybridflow.rollout.vllm_memory import kv_cache_bytes
from hybridflow.workers import ActorRolloutRefWorker
from tests.workers.helpers import actor_rollout_ref_config, rollout_batch

VLLM_ON_CPU = {"name": "vllm", "calculate_log_probs": True, "enforce_eager": True, "enable_chunked_prefill": False}
SAMPLES = 8


def prompts_of(batch: DataProto) -> DataProto:
    prompts = batch.batch["prompts"]
    attention_mask = batch.batch["attention_mask"][:, : prompts.shape[1]]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_min(0)
    return DataProto.from_dict({"input_ids": prompts, "attention_mask": attention_mask, "position_ids": position_ids})


def main(model_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    rollout = actor_rollout_ref_config(model_dir)["rollout"]
    # Room for the batch's samples at once, whatever the machine's memory (tests/rollout/test_vllm_model_families.py).
    kv_cache = kv_cache_bytes(
        load_model_config(model_dir), "float32", SAMPLES, rollout["prompt_length"] + rollout["response_length"]
    )
    config = actor_rollout_ref_config(
        model_dir,
        model={"lora_rank": 4, "lora_alpha": 8},
        rollout={**VLLM_ON_CPU, "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": kv_cache}}},
    )
    worker = ActorRolloutRefWorker(config, "actor_rollout_ref")
    worker.init_model()
    batch = rollout_batch(SAMPLES, seed=1)
    worker.update_actor(batch.union(worker.compute_log_prob(batch)))
    worker.update_weights()
    output = worker.generate_sequences(prompts_of(batch))
    trained = worker.compute_log_prob(output).batch["old_log_probs"]
    base = worker.compute_ref_log_prob(output).batch["ref_log_prob"]  # a LoRA actor's reference: its base model
    mask = output.batch["response_mask"].bool()
    engine = worker.parts["rollout"].engine
    written = safetensors.torch.load_file(os.path.join(engine._adapter_folder.name, "adapter_model.safetensors"))
    print(
        json.dumps(
            {
                "adapter_only": worker.parts["rollout"].syncs_adapter_only,
                "written": sorted(written),
                "max_diff": float((output.batch["rollout_log_probs"] - trained)[mask].abs().max()),
                "trained_from_base": float((trained - base)[mask].abs().max()),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
