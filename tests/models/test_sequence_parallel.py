"""Ulysses sequence parallelism against one rank, on real gloo groups of 2 and 4 processes: the log-probs,
entropies and critic values of each layout (padded, packed, shared prompts), and the gradients of a loss on
them. Bounds from tests/float_bounds.py: the slices change which float32 sums are blocked together, not what
is summed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from transformers import AutoConfig

from hybridflow.distributed.sequence_parallel import sequence_parallel_group
from hybridflow.models.layouts import PADDED, choose_layout
from hybridflow.models.loading import load_causal_lm
from hybridflow.models.log_probs import forward_token_statistics
from hybridflow.models.sequence_parallel import full_attention_mask
from hybridflow.models.training_options import enable_gradient_checkpointing
from hybridflow.models.value_model import forward_values, load_value_model
from hybridflow.workers.config import FSDPConfig
from hybridflow.workers.fsdp import build_device_mesh, shard_model
from tests.float_bounds import longest_reduction, model_output_bound, reordered_sum_bound, score_head_bound
from tests.gloo_ranks import run_on_ranks
from tests.models.conftest import make_padded_batch

# Prompts of 3-9 tokens, responses of 1-6: rows of 15 columns, which no group size here divides.
PROMPT_LENGTHS = [9, 3, 5, 9, 3, 5, 7, 4]
RESPONSE_LENGTHS = [6, 1, 4, 2, 6, 5, 3, 6]
SHARED_PROMPT_ROWS = [0, 0, 1, 1, 2, 2, 3, 3]
# "causal": padded rows without padding, which attend with no mask; "checkpointed": packed, with gradient
# checkpointing, so the backward recomputes each layer, exchanges included.
LAYOUTS = ("padded", "causal", "packed", "shared", "checkpointed")


def _batch(layout_name: str):
    if layout_name == "causal":
        return make_padded_batch([9] * 8, [6] * 8, prompt_width=9, response_width=6, seed=3)[:3]
    batch = make_padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, prompt_width=9, response_width=6, seed=3)
    input_ids, attention_mask, position_ids, _ = batch
    if layout_name == "shared":
        # Two samples per prompt: the second row of each pair repeats the first one's prompt.
        for row, source in enumerate(SHARED_PROMPT_ROWS):
            input_ids[row, :9], attention_mask[row, :9] = input_ids[source * 2, :9], attention_mask[source * 2, :9]
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def _layout(model, layout_name: str, input_ids, attention_mask):
    if layout_name in ("padded", "causal"):
        return PADDED
    if layout_name == "checkpointed":
        enable_gradient_checkpointing(model)
    return choose_layout(
        model, input_ids, attention_mask, 6, share_prompts=layout_name == "shared", use_remove_padding=True
    )


def _statistics_and_gradients(model, layout_name: str, group):
    """Log-probs, entropies, parameter gradients of a loss on them, the layout, and the widths the model ran."""
    input_ids, attention_mask, position_ids = _batch(layout_name)
    layout = _layout(model, layout_name, input_ids, attention_mask)
    model.zero_grad()
    widths = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda _, args: widths.append(args[0].shape[1]))
    statistics = forward_token_statistics(
        model, input_ids, attention_mask, position_ids, 6, layout, calculate_entropy=True, sequence_parallel=group
    )
    hook.remove()
    weights = torch.linspace(-1.0, 1.0, statistics.log_probs.numel()).view_as(statistics.log_probs)
    (statistics.log_probs * weights + 0.1 * statistics.entropy).sum().backward()
    gradients = {name: param.grad.clone() for name, param in model.named_parameters()}
    return statistics.log_probs.detach(), statistics.entropy.detach(), gradients, (layout, widths)


def _values(model_dir, layout_name: str, group):
    critic = load_value_model(model_dir)
    input_ids, attention_mask, position_ids = _batch(layout_name)
    layout = _layout(critic, layout_name, input_ids, attention_mask)
    with torch.no_grad():
        return forward_values(critic, input_ids, attention_mask, position_ids, 6, layout, sequence_parallel=group)


GROUP_SIZES = (2, 4)
WORLD_SIZE = 4  # one world of 4 processes: two groups of 2, then one group of 4


def _group_results(size: int, model_dir: str) -> dict:
    """This rank's statistics, gradients (summed over its group, divided by its size) and values per layout."""
    group = sequence_parallel_group(size, torch.device("cpu"))
    model = load_causal_lm(model_dir)
    out = {}
    for layout_name in LAYOUTS:
        log_probs, entropy, gradients, layout = _statistics_and_gradients(model, layout_name, group)
        # The group's gradient is the sum over its ranks, each counting its slice k times.
        for gradient in gradients.values():
            dist.all_reduce(gradient, group=group.group)
            gradient /= size
        out[layout_name] = (log_probs, entropy, gradients, layout, _values(model_dir, layout_name, group))
    return out


def _every_group_size(model_dir: str) -> dict:
    return {size: _group_results(size, model_dir) for size in GROUP_SIZES}


@pytest.fixture(scope="module")
def every_rank(tiny_model_dir, tmp_path_factory) -> dict:
    """Each rank's results by group size."""
    return run_on_ranks(_every_group_size, WORLD_SIZE, tiny_model_dir, tmp_path_factory.mktemp("ulysses"))


@pytest.fixture(scope="module")
def single_rank(tiny_model_dir):
    torch.manual_seed(0)
    model = load_causal_lm(tiny_model_dir)
    return {
        name: (*_statistics_and_gradients(model, name, None), _values(tiny_model_dir, name, None)) for name in LAYOUTS
    }


@pytest.mark.parametrize("size", GROUP_SIZES)
def test_ulysses_matches_one_rank_in_every_layout(size, tiny_model_dir, single_rank, every_rank):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    num_terms = longest_reduction(config)
    critic = load_value_model(tiny_model_dir)
    for name in LAYOUTS:
        log_probs, entropy, gradients, (layout, widths), values = single_rank[name]
        assert layout.share_prompts == (name == "shared")
        assert (layout.rows_per_sample is not None) == (name in ("packed", "checkpointed"))
        for rank, by_size in every_rank.items():
            got_log_probs, got_entropy, got_gradients, (_, got_widths), got_values = by_size[size][name]
            assert got_widths == [math.ceil(width / size) for width in widths]
            torch.testing.assert_close(
                got_log_probs, log_probs, rtol=0, atol=model_output_bound(log_probs, num_terms), msg=f"{name}, {rank}"
            )
            torch.testing.assert_close(got_entropy, entropy, rtol=0, atol=model_output_bound(entropy, num_terms))
            torch.testing.assert_close(got_values, values, rtol=0, atol=score_head_bound(critic, num_terms))
            for param, gradient in gradients.items():
                # A sum over tokens of weights (|w| <= 1) times gradients of O(1) outputs, each within its
                # forward's bound, through the forward's sums transposed.
                scale = float(gradient.abs().max()) + 1.0
                bound = scale * (model_output_bound(log_probs, num_terms) + reordered_sum_bound(1.0, num_terms))
                torch.testing.assert_close(got_gradients[param], gradient, rtol=0, atol=bound, msg=param)


def _sharded_eager_log_probs(model_dir: str) -> torch.Tensor:
    """Ulysses over 2 ranks with the model sharded as the workers shard it (FSDP2 gives each decoder layer a class
    of torch's own) and attending with its modeling file's eager function."""
    cpu = torch.device("cpu")
    group = sequence_parallel_group(2, cpu)
    model = shard_model(
        load_causal_lm(model_dir, attn_implementation="eager"), build_device_mesh(-1, cpu), FSDPConfig()
    )
    with torch.no_grad():
        statistics = forward_token_statistics(model, *_batch("padded"), 6, PADDED, sequence_parallel=group)
    return statistics.log_probs


def test_ulysses_attends_with_the_eager_function_of_a_sharded_model(tiny_model_dir, single_rank, tmp_path):
    log_probs = single_rank["padded"][0]
    num_terms = longest_reduction(AutoConfig.from_pretrained(tiny_model_dir))
    for got in run_on_ranks(_sharded_eager_log_probs, 2, tiny_model_dir, tmp_path).values():
        torch.testing.assert_close(got, log_probs, rtol=0, atol=model_output_bound(log_probs, num_terms))


def test_the_full_mask_keeps_padded_packed_and_shared_rows_apart():
    # Padded: row 0 has one pad column first; causal over the real columns, the pad column sees itself.
    mask = full_attention_mask(torch.tensor([[0, 1, 1]]), torch.tensor([[0, 0, 1]]), width=4)[0, 0]
    assert mask.tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [False, True, True, False],
        [False, False, False, True],
    ]
    # Packed: two samples (positions 0, 1 | 0, 1, 2); a sample starts where positions do not continue.
    packed = full_attention_mask(None, torch.tensor([[0, 1, 0, 1, 2]]))[0, 0]
    assert packed[1, 0] and not packed[2, 1] and packed[4, 2] and not packed[4, 1]
    shared = torch.tensor([[[[True, False], [True, True]]]])
    assert torch.equal(full_attention_mask(shared, torch.tensor([[0, 1]]), width=2), shared)
