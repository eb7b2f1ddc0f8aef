"""Ulysses over a model with linear-attention layers (Qwen3-Next's gated delta rule): a group of 2 ranks, each
running half the columns and, inside the linear layers, half the heads over whole rows, gives one rank's
log-probs, entropies, values and gradients, with left-padded prompts (which the layers zero) and with gradient
checkpointing (which recomputes the exchanges in the backward)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen3NextForCausalLM

from hybridflow.config.sequence_parallel_options import _head_errors
from hybridflow.distributed.sequence_parallel import sequence_parallel_group
from hybridflow.models.layouts import PADDED
from hybridflow.models.loading import load_causal_lm
from hybridflow.models.log_probs import forward_token_statistics
from hybridflow.models.training_options import enable_gradient_checkpointing
from hybridflow.models.value_model import forward_values, load_value_model
from tests.float_bounds import longest_reduction, model_output_bound, reordered_sum_bound, score_head_bound
from tests.gloo_ranks import run_on_ranks
from tests.models.conftest import make_padded_batch
from tests.recurrent_model import qwen3_next_config

# Prompts of 2-7 tokens, responses of 1-5: rows of 12 columns (both slices hold prompt and response columns),
# then 13, which 2 does not divide.
PROMPT_LENGTHS, RESPONSE_LENGTHS, RESPONSE_WIDTH = [7, 2, 5, 3], [5, 1, 4, 3], 5
SIZE = 2
KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


def _batch(prompt_width: int):
    return make_padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, prompt_width, RESPONSE_WIDTH, seed=4)[:3]


def _results(model_dir: str, group) -> dict:
    """Per run (prompt width, checkpointing): log-probs, entropies, gradients of a loss on them, and values."""
    out = {}
    for prompt_width, checkpointed in ((7, False), (8, True)):
        model = load_causal_lm(model_dir)
        if checkpointed:
            enable_gradient_checkpointing(model)
        batch = _batch(prompt_width)
        statistics = forward_token_statistics(
            model, *batch, RESPONSE_WIDTH, PADDED, calculate_entropy=True, sequence_parallel=group
        )
        weights = torch.linspace(-1.0, 1.0, statistics.log_probs.numel()).view_as(statistics.log_probs)
        (statistics.log_probs * weights + 0.1 * statistics.entropy).sum().backward()
        gradients = {name: param.grad.clone() for name, param in model.named_parameters()}
        if group is not None:  # the group's gradient: the sum over its ranks, each counting its slice k times
            for gradient in gradients.values():
                dist.all_reduce(gradient, group=group.group)
                gradient /= group.size
        with torch.no_grad():
            values = forward_values(
                load_value_model(model_dir), *batch, RESPONSE_WIDTH, PADDED, sequence_parallel=group
            )
        out[prompt_width] = (statistics.log_probs.detach(), statistics.entropy.detach(), gradients, values)
    return out


def _group_results(model_dir: str) -> dict:
    return _results(model_dir, sequence_parallel_group(SIZE, torch.device("cpu")))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Qwen3-Next's layers with dense MLPs: a router's top-k could pick another expert for rounding alone."""
    path = tmp_path_factory.mktemp("qwen3_next")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen3NextForCausalLM(qwen3_next_config(mlp_only_layers=[0, 1])).save_pretrained(path)
    return str(path)


def test_ulysses_over_linear_attention_matches_one_rank(model_dir, tmp_path):
    torch.manual_seed(0)
    alone = _results(model_dir, None)
    every_rank = run_on_ranks(_group_results, SIZE, model_dir, tmp_path / "ranks")
    config = qwen3_next_config()
    num_terms = longest_reduction(config)
    critic = load_value_model(model_dir)
    for prompt_width, (log_probs, entropy, gradients, values) in alone.items():
        assert gradients["model.layers.0.linear_attn.A_log"].abs().max() > 0
        for rank, by_width in every_rank.items():
            got_log_probs, got_entropy, got_gradients, got_values = by_width[prompt_width]
            where = f"prompt width {prompt_width}, rank {rank}"
            torch.testing.assert_close(
                got_log_probs, log_probs, rtol=0, atol=model_output_bound(log_probs, num_terms), msg=where
            )
            torch.testing.assert_close(got_entropy, entropy, rtol=0, atol=model_output_bound(entropy, num_terms))
            torch.testing.assert_close(got_values, values, rtol=0, atol=score_head_bound(critic, num_terms))
            for param, gradient in gradients.items():
                # As in test_sequence_parallel: weights |w| <= 1 times gradients of O(1) outputs.
                scale = float(gradient.abs().max()) + 1.0
                bound = scale * (model_output_bound(log_probs, num_terms) + reordered_sum_bound(1.0, num_terms))
                torch.testing.assert_close(got_gradients[param], gradient, rtol=0, atol=bound, msg=f"{param}, {where}")


def test_a_group_that_does_not_divide_the_key_heads_is_refused_naming_them(tmp_path):
    qwen3_next_config().save_pretrained(tmp_path)  # 4 attention heads, 2 linear-attention key heads
    assert _head_errors(KEY, 2, str(tmp_path), False) == []
    assert _head_errors(KEY, 4, str(tmp_path), False) == [
        f"{KEY}=4 does not divide the model's 2 linear-attention key heads ({tmp_path}); choose one of [1, 2]"
    ]
