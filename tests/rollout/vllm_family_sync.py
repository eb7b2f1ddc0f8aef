"""One model family's weight sync into the vllm engine, in a process of its own (vLLM on CPU allocates its KV cache
once per process, so a second engine in one process would compete with the first one's).

``python -m tests.rollout.vllm_family_sync MODEL_DIR [--kv_cache_bytes N | --gpu_memory_utilization U] [--node_memory
TOTAL AVAILABLE]`` builds the engine, syncs every weight of the model moved at random (after a first sync of other
weights and a generation from them), samples responses with vLLM's per-token log-probs, and prints one JSON line: the
largest difference from the moved model's log softmax of the same tokens, the largest log-prob in size, the tokens
compared, and the samples' tokens and vLLM's log-probs of them. ``--dtype`` sets the engine's dtype (float32 by
default); ``--started_from_moved`` starts the engine from the moved model, saved, and syncs nothing, for a sync to be
compared with. ``--node_memory`` makes vLLM see a NUMA node of that many bytes (tests/rollout/vllm_small_machine.py);
``--without_estimate`` leaves the memory check to vLLM itself, as when hybridflow's estimate of the process's memory
falls short. Where hybridflow refuses the engine's memory settings, it prints hybridflow's one-line error to stderr and
exits with 2.
"""

import argparse
import json
import sys

from hybridflow.models.layouts import recurrent_layer_types
from hybridflow.models.loading import load_model_config, load_tokenizer
from hybridflow.rollout import RolloutConfig, create_rollout_engine
from hybridflow.rollout.vllm_memory import kv_cache_bytes
from tests.rollout.moved_weights import moved_model
from tests.rollout.prompts import TOOL_QUESTION, left_padded
from tests.rollout.teacher_forced import response_log_probs

PROMPTS = ["hi", "a longer prompt", TOOL_QUESTION]
SAMPLES = 2
RESPONSE_LENGTH = 12
MAX_MODEL_LEN = 128
# The moved models synced in turn, a generation between; the last is the one the engine ends with.
SYNC_SEEDS = (1, 0)


def sync_kv_cache_bytes(model_dir) -> int:
    """A KV cache that holds every sequence of this sync at once, whatever the machine."""
    return kv_cache_bytes(load_model_config(model_dir), "float32", len(PROMPTS) * SAMPLES, MAX_MODEL_LEN)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--kv_cache_bytes", type=int, default=None)
    size.add_argument("--gpu_memory_utilization", type=float, default=None)
    parser.add_argument("--node_memory", type=int, nargs=2, default=None, metavar=("TOTAL", "AVAILABLE"))
    parser.add_argument("--without_estimate", action="store_true", help="leave the memory check to vLLM itself")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--started_from_moved", metavar="FOLDER", default=None, help="save the moved model there")
    args = parser.parse_args(argv)
    if args.without_estimate:
        from hybridflow.rollout.vllm_engine import VLLMRolloutEngine

        VLLMRolloutEngine._check_cpu_kv_cache = lambda engine: None
    if args.node_memory:
        from tests.rollout.vllm_small_machine import report_node_memory

        report_node_memory(*args.node_memory)
    memory = (
        {"gpu_memory_utilization": args.gpu_memory_utilization}
        if args.gpu_memory_utilization
        else {
            "engine_kwargs": {
                "vllm": {"kv_cache_memory_bytes": args.kv_cache_bytes or sync_kv_cache_bytes(args.model_dir)}
            }
        }
    )
    config = RolloutConfig.from_dict(
        {
            "name": "vllm",
            "n": SAMPLES,
            "response_length": RESPONSE_LENGTH,
            "prompt_length": 64,
            "calculate_log_probs": True,
            "enable_chunked_prefill": False,
            "enforce_eager": True,
            "max_model_len": MAX_MODEL_LEN,
            "dtype": args.dtype,
            # vLLM caches a recurrent model's prefixes only with chunked prefill, off here (as hybridflow refuses)
            "enable_prefix_caching": not recurrent_layer_types(load_model_config(args.model_dir)),
            **memory,
        }
    )
    if args.started_from_moved:
        actor = moved_model(args.model_dir, seed=SYNC_SEEDS[-1])
        folder = saved(actor, args.model_dir, args.started_from_moved)
        out = generate(create_rollout_engine(config, folder), folder)
    else:
        engine = create_rollout_engine(config, args.model_dir)
        # Two syncs with a generation between: the second must replace what the first one's processing left.
        for seed in SYNC_SEEDS:
            actor = moved_model(args.model_dir, seed=seed)
            out = generate(engine, args.model_dir, actor.named_parameters())
    report(out, response_log_probs(actor, out))


def generate(engine, model_dir, weights=None):
    """Loads ``weights`` (if any) and samples, seeded alike whatever the engine's calls so far."""
    from hybridflow.errors import HybridflowError

    try:
        if weights is not None:
            engine.load_weights((name, parameter.detach()) for name, parameter in weights)
    except HybridflowError as error:
        print(f"hybridflow: error: {error}", file=sys.stderr)
        sys.exit(2)
    prompts = left_padded(load_tokenizer(model_dir), PROMPTS)
    prompts.meta_info["seed"] = 7
    return engine.generate_sequences(prompts).batch


def saved(model, model_dir, folder) -> str:
    """``model`` saved to ``folder`` with the tokenizer of ``model_dir``."""
    model.save_pretrained(folder)
    load_tokenizer(model_dir).save_pretrained(folder)
    return folder


def report(out, log_probs) -> None:
    mask = out["response_mask"].bool()
    print(
        json.dumps(
            {
                "max_difference": (out["rollout_log_probs"][mask] - log_probs[mask]).abs().max().item(),
                "largest_log_prob": log_probs[mask].abs().max().item(),
                "tokens": int(mask.sum()),
                "token_ids": out["responses"][mask].tolist(),
                "rollout_log_probs": out["rollout_log_probs"][mask].tolist(),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
