"""Training in a tensor-parallel layout (FSDP2 x TP) against one rank, on a real gloo group of 4 processes: the 2-D
layouts (t, d) = (2, 2) and (4, 1), of the tiny model and of a Qwen3 one, whose q and k norms each rank applies to
its own heads. Every rank computes the same batch; the log-probs, entropies and critic values of each layout (padded,
packed, shared prompts, checkpointed), the gradients of a loss on them, and the global gradient norm equal the whole
model's within the float32 bounds of tests/float_bounds.py: the splits change which sums are blocked together (a
row-split layer's partial sums meet in an all-reduce), not what is summed."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.tensor import DTensor
from transformers import AutoConfig

from hybridflow.models.loading import load_causal_lm
from hybridflow.models.log_probs import forward_token_statistics
from hybridflow.models.tensor_parallel import split_plan
from hybridflow.models.tiny import build_tiny_model
from hybridflow.models.value_model import forward_values, load_value_model
from hybridflow.workers.config import FSDPConfig
from hybridflow.workers.fsdp import build_device_mesh, shard_model
from hybridflow.workers.training import clip_grad_norm, row_group
from tests.float_bounds import longest_reduction, model_output_bound, reordered_sum_bound, score_head_bound
from tests.gloo_ranks import run_on_ranks
from tests.models.test_sequence_parallel import _batch, _layout

WORLD_SIZE = 4
TENSOR_PARALLEL_SIZES = (2, 4)
LAYOUTS = ("padded", "packed", "shared", "checkpointed")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _statistics_and_gradients(model, layout_name: str) -> tuple:
    """Log-probs, entropies, whole gradients of a loss on them, and the gradient norm."""
    input_ids, attention_mask, position_ids = _batch(layout_name)
    layout = _layout(model, layout_name, input_ids, attention_mask)
    model.zero_grad()
    statistics = forward_token_statistics(
        model, input_ids, attention_mask, position_ids, 6, layout, calculate_entropy=True
    )
    weights = torch.linspace(-1.0, 1.0, statistics.log_probs.numel()).view_as(statistics.log_probs)
    (statistics.log_probs * weights + 0.1 * statistics.entropy).sum().backward()
    gradients = {name: _full(param.grad).clone() for name, param in model.named_parameters()}
    norm = clip_grad_norm(list(model.parameters()), max_norm=1e9)
    return statistics.log_probs.detach(), statistics.entropy.detach(), gradients, norm


def _values(critic, layout_name: str) -> torch.Tensor:
    input_ids, attention_mask, position_ids = _batch(layout_name)
    layout = _layout(critic, layout_name, input_ids, attention_mask)
    with torch.no_grad():
        return forward_values(critic, input_ids, attention_mask, position_ids, 6, layout)


def _split_results(size: int, model_dir: str) -> dict:
    mesh = build_device_mesh(-1, torch.device("cpu"), tensor_parallel_size=size)
    rows = row_group(1, torch.device("cpu"), mesh)
    model = shard_model(load_causal_lm(model_dir), mesh, FSDPConfig())
    critic = shard_model(load_value_model(model_dir), mesh, FSDPConfig())
    local = sum(_local_size(param) for param in model.parameters())
    out = {"rows": (rows.size, rows.data_parallel_size, rows.sequence_parallel), "local": local}
    for name in LAYOUTS:
        out[name] = (*_statistics_and_gradients(model, name), _values(critic, name))
    return out


def _local_size(param: torch.Tensor) -> int:
    return (param.to_local() if isinstance(param, DTensor) else param).numel()


def _both_sizes(model_dir: str) -> dict:
    return {size: _split_results(size, model_dir) for size in TENSOR_PARALLEL_SIZES}


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def split_model_dir(request, four_kv_heads_model_dir, tmp_path_factory):
    """The tiny model with 4 key-value heads, and a Qwen3 one: its q and k norms act on each rank's own heads."""
    if request.param == "qwen2":
        return four_kv_heads_model_dir
    out_dir = tmp_path_factory.mktemp("four_kv_heads_qwen3")
    return build_tiny_model(out_dir, family="qwen3", num_attention_heads=4, num_key_value_heads=4)


@pytest.fixture(scope="module")
def every_rank(split_model_dir, tmp_path_factory) -> dict:
    out_dir = tmp_path_factory.mktemp("tensor_parallel_training")
    return run_on_ranks(_both_sizes, WORLD_SIZE, split_model_dir, out_dir)


@pytest.fixture(scope="module")
def single_rank(split_model_dir) -> dict:
    model_dir = split_model_dir
    model, critic = load_causal_lm(model_dir), load_value_model(model_dir)
    return {name: (*_statistics_and_gradients(model, name), _values(critic, name)) for name in LAYOUTS}


def _local_size_bound(model_dir: str, size: int) -> float:
    """A rank's parameter count at most: a split layer's parameters 1/size each by tensor parallelism, then 1/dp
    by FSDP2 (1/4 in all), any other (the norms) 1/dp by FSDP2 alone; FSDP2's dim-0 chunks round up by less than
    one row. (The model's row-split layers have no bias, which tensor parallelism would not split.)"""
    model = load_causal_lm(model_dir)
    split_layers = set(split_plan(model, "fsdp_config.tensor_parallel_size"))
    data_parallel_size = WORLD_SIZE // size
    bound = 0.0
    for name, param in model.named_parameters():
        parts = WORLD_SIZE if name.rsplit(".", 1)[0] in split_layers else data_parallel_size
        bound += param.numel() / parts + param.numel() / param.shape[0]
    return bound


@pytest.mark.parametrize("size", TENSOR_PARALLEL_SIZES)
def test_a_split_model_trains_like_the_whole_one(size, split_model_dir, single_rank, every_rank):
    model_dir = split_model_dir
    config = AutoConfig.from_pretrained(model_dir)
    num_terms = longest_reduction(config)
    critic = load_value_model(model_dir)
    local_bound = _local_size_bound(model_dir, size)
    for rank, by_size in every_rank.items():
        results = by_size[size]
        # Groups of `size` share their rows, computed whole (no sequence split).
        assert results["rows"] == (size, WORLD_SIZE // size, None)
        assert results["local"] <= local_bound
        for name in LAYOUTS:
            log_probs, entropy, gradients, norm, values = single_rank[name]
            got_log_probs, got_entropy, got_gradients, got_norm, got_values = results[name]
            bound = model_output_bound(log_probs, num_terms)
            torch.testing.assert_close(got_log_probs, log_probs, rtol=0, atol=bound, msg=f"{name}, rank {rank}")
            torch.testing.assert_close(got_entropy, entropy, rtol=0, atol=model_output_bound(entropy, num_terms))
            torch.testing.assert_close(got_values, values, rtol=0, atol=score_head_bound(critic, num_terms))
            gradient_bounds = {}
            for param, gradient in gradients.items():
                # As in test_sequence_parallel: a weighted sum of O(1) outputs' gradients, through transposed sums.
                scale = float(gradient.abs().max()) + 1.0
                gradient_bounds[param] = scale * (bound + reordered_sum_bound(1.0, num_terms))
                torch.testing.assert_close(
                    got_gradients[param], gradient, rtol=0, atol=gradient_bounds[param], msg=param
                )
            # | ||g'|| - ||g|| | <= ||g' - g|| (each element within its bound), plus the norm's own sum of squares.
            elements = sum(gradient.numel() * gradient_bounds[param] ** 2 for param, gradient in gradients.items())
            numel = sum(gradient.numel() for gradient in gradients.values())
            assert abs(got_norm - norm) <= math.sqrt(elements) + reordered_sum_bound(norm, numel)
