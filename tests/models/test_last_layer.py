"""The last decoder layer runs its query, output projection and MLP only where logits are kept: log-probs,
entropies and gradients equal the full layer's up to float32 order, in every layout."""

import contextlib

import pytest
import torch

from hybridflow.models import log_probs as log_probs_module
from hybridflow.models.last_layer import kept_positions_only, last_decoder_layer
from hybridflow.models.log_probs import forward_log_probs
from tests.float_bounds import longest_reduction, model_output_bound
from tests.models.test_shared_prompts import LAYOUTS, assert_gradients_agree, grouped_batch

# share_prompts, use_remove_padding of each layout forward_log_probs can take
PATHS = {"shared": (True, False), "packed": (False, True), "padded": (False, False)}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_kept_positions_only_gives_the_full_layers_log_probs_and_gradients(tiny_model, padded_batch, path, monkeypatch):
    prompts, samples, response_lengths = LAYOUTS["grpo_groups"]
    batch = grouped_batch(padded_batch, prompts, samples, response_lengths)
    response_mask = batch[3]
    share_prompts, use_remove_padding = PATHS[path]
    mlp_rows = []
    last_decoder_layer(tiny_model).mlp.down_proj.register_forward_hook(
        lambda module, args, output: mlp_rows.append(args[0].shape[:-1].numel())
    )

    def run():
        tiny_model.zero_grad()
        log_probs, entropy = forward_log_probs(
            tiny_model, *batch[:3], 6, use_remove_padding=use_remove_padding, calculate_entropy=True,
            share_prompts=share_prompts,
        )
        ((log_probs + 0.1 * entropy) * response_mask).sum().backward()
        return log_probs.detach(), entropy.detach(), [p.grad.clone() for p in tiny_model.parameters()]

    skipped_lp, skipped_entropy, skipped_grads = run()
    monkeypatch.setattr(log_probs_module, "kept_positions_only", lambda model, keep: contextlib.nullcontext())
    full_lp, full_entropy, full_grads = run()

    # Kept: the positions predicting a response token (a group's prompt end predicts each member's first token
    # once when shared), or in the padded rectangle its last R + 1 columns.
    predicted = int(response_mask.sum())
    expected = {"shared": predicted - len(response_lengths) + len(prompts), "packed": predicted, "padded": 12 * 7}
    kept_rows, all_rows = mlp_rows
    assert kept_rows == expected[path] and all_rows > kept_rows
    num_terms = longest_reduction(tiny_model.config)
    torch.testing.assert_close(skipped_lp, full_lp, atol=model_output_bound(full_lp, num_terms), rtol=0)
    torch.testing.assert_close(skipped_entropy, full_entropy, atol=model_output_bound(full_entropy, num_terms), rtol=0)
    assert_gradients_agree(skipped_grads, full_grads, num_terms + int(response_mask.sum()))


def test_the_layer_is_restored_after_the_block_and_left_alone_under_gradient_checkpointing(tiny_model):
    layer = last_decoder_layer(tiny_model)
    keep = torch.zeros(2, 5, dtype=torch.bool)
    keep[:, -2:] = True
    with kept_positions_only(tiny_model, keep):
        assert "forward" in vars(layer.mlp)
    assert all("forward" not in vars(part) for part in (layer.mlp, layer.self_attn.q_proj, layer.self_attn.o_proj))
    tiny_model.gradient_checkpointing_enable()
    with kept_positions_only(tiny_model, keep):
        assert "forward" not in vars(layer.mlp), "a recomputed layer must compute what its forward computed"
