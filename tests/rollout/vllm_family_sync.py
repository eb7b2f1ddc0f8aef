"""One model family's weight sync into the vllm engine, in a process of its own (vLLM on CPU sizes its KV cache
from the memory it finds free, so a second engine in one process would find the first one's cache taken).

``python tests/rollout/vllm_family_sync.py MODEL_DIR`` builds the engine, syncs every weight of the model moved
at random, samples responses with vLLM's per-token log-probs, and prints one JSON line: the largest difference
from the moved model's log softmax of the same tokens, the largest log-prob in size, and the tokens compared.
"""

import json
import sys

import torch

from hybridflow.models.loading import load_tokenizer
from hybridflow.rollout import RolloutConfig, create_rollout_engine
from tests.rollout.moved_weights import moved_model
from tests.rollout.prompts import TOOL_QUESTION, left_padded

PROMPTS = ["hi", "a longer prompt", TOOL_QUESTION]
RESPONSE_LENGTH = 12


def main(model_dir: str) -> None:
    config = RolloutConfig.from_dict({
        "name": "vllm", "n": 2, "response_length": RESPONSE_LENGTH, "prompt_length": 64, "calculate_log_probs": True,
        "enable_chunked_prefill": False, "enforce_eager": True, "gpu_memory_utilization": 0.05, "max_model_len": 128,
    })
    engine = create_rollout_engine(config, model_dir)
    actor = moved_model(model_dir, seed=0)
    engine.load_weights((name, parameter.detach()) for name, parameter in actor.named_parameters())
    out = engine.generate_sequences(left_padded(load_tokenizer(model_dir), PROMPTS)).batch
    with torch.no_grad():
        logits = actor(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                       position_ids=out["position_ids"]).logits
    width = out["prompts"].shape[1]
    log_softmax = torch.log_softmax(logits[:, width - 1:-1].float(), dim=-1)
    log_probs = log_softmax.gather(-1, out["responses"][..., None])[..., 0]
    mask = out["response_mask"].bool()
    print(json.dumps({
        "max_difference": (out["rollout_log_probs"][mask] - log_probs[mask]).abs().max().item(),
        "largest_log_prob": log_probs[mask].abs().max().item(),
        "tokens": int(mask.sum()),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
