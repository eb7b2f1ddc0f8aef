"""Weight sync of each model family users bring (Llama, Qwen3, Gemma 3, Mistral, Seed-OSS, Qwen3 MoE) into the "hf"
engine: every tensor of the trained actor lands under its own name, and the engine then samples exactly what an
engine built from the actor's saved weights samples, with log-probs equal to the actor's forward (sliding-window
caches included). The vllm engine's check is in test_vllm_model_families.py."""

import torch

from hybridflow.models.loading import load_tokenizer
from hybridflow.models.log_probs import forward_log_probs
from tests.float_bounds import longest_reduction, model_output_bound
from tests.rollout.moved_weights import moved_model
from tests.rollout.prompts import TOOL_QUESTION, left_padded

# Chat-templated, each prompt is longer than the tiny models' sliding window of 8 tokens.
PROMPTS = ["hi", "a longer prompt", TOOL_QUESTION]
RESPONSE_LENGTH = 12


def test_synced_engine_samples_as_an_engine_built_from_the_actors_weights(family_model_dir, make_engine, tmp_path):
    tokenizer = load_tokenizer(family_model_dir)
    actor = moved_model(family_model_dir)
    settings = dict(n=2, response_length=RESPONSE_LENGTH, calculate_log_probs=True)
    synced = make_engine(family_model_dir, **settings)
    synced.load_weights((name, parameter.detach().clone()) for name, parameter in actor.named_parameters())
    engine_tensors, actor_tensors = synced.model.state_dict(), actor.state_dict()
    assert engine_tensors.keys() == actor_tensors.keys()
    assert all(torch.equal(engine_tensors[name], tensor) for name, tensor in actor_tensors.items())

    actor.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    fresh = make_engine(tmp_path, **settings)
    outputs = []
    for engine in (synced, fresh):
        prompts = left_padded(tokenizer, PROMPTS)
        prompts.meta_info["seed"] = 5
        outputs.append(engine.generate_sequences(prompts).batch)
    ours, theirs = outputs
    # The same weights, code and seed: the same arithmetic, so the same bits.
    assert torch.equal(ours["responses"], theirs["responses"])
    assert torch.equal(ours["rollout_log_probs"], theirs["rollout_log_probs"])

    with torch.no_grad():
        actor_log_probs, _ = forward_log_probs(
            actor,
            ours["input_ids"],
            ours["attention_mask"],
            ours["position_ids"],
            RESPONSE_LENGTH,
            use_remove_padding=False,
        )
    # Decoding with a KV cache sums each token's attention in other chunks than one forward over the sequence.
    mask = ours["response_mask"].bool()
    bound = model_output_bound(actor_log_probs, longest_reduction(actor.config))
    torch.testing.assert_close(ours["rollout_log_probs"][mask], actor_log_probs[mask], atol=bound, rtol=0)
