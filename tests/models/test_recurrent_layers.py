"""A model with recurrent layers (Qwen3-Next's linear attention, a gated delta rule) carries a state along a row, so
two samples packed into one row see each other (the control below). Such a model runs padded, one sample a row,
whatever ``use_remove_padding`` and ``use_prefix_grouper`` ask, and says so once; its log-probs then equal each
sample's own forward. Ulysses splits Qwen3-Next's linear attention by heads and refuses other linear attention in
one line."""

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig, Qwen3NextForCausalLM

from hybridflow.config.sequence_parallel_options import _head_errors
from hybridflow.models import layouts
from hybridflow.models.layouts import PADDED, choose_layout, choose_packing
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.models.tiny import build_tiny_model
from tests.models.packing_checks import assert_packed_equals_padded_and_unpadded
from tests.recurrent_model import qwen3_next_config

PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH = [5, 3, 5, 2], [4, 2, 3, 1], 5, 4


@pytest.fixture(scope="module")
def recurrent_model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen3NextForCausalLM(qwen3_next_config()).eval()


def test_two_samples_in_one_row_see_each_other(recurrent_model):
    """The control: positions restart at the second sample, yet its logits change."""
    first, second = torch.arange(3, 13)[None], torch.arange(20, 26)[None]
    with torch.no_grad():
        alone = recurrent_model(input_ids=second).logits[0]
        row = torch.cat([first, second], dim=1)
        positions = torch.cat([torch.arange(10), torch.arange(6)])[None]
        packed = recurrent_model(input_ids=row, position_ids=positions).logits[0, 10:]
    assert (packed - alone).abs().max() > 1e-2


def test_it_runs_padded_says_so_once_and_gives_each_samples_own_log_probs(
    recurrent_model, padded_batch, caplog, monkeypatch
):
    batch = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH)
    batch[0][2, :PROMPT_WIDTH] = batch[0][0, :PROMPT_WIDTH]  # a repeated prompt, which could be shared
    monkeypatch.setattr(layouts, "_TOLD_RECURRENT", set())
    with caplog.at_level(logging.WARNING, logger=layouts.__name__):
        chosen = [choose_layout(recurrent_model, *batch[:2], RESPONSE_WIDTH, True, True) for _ in range(2)]
        packed = assert_packed_equals_padded_and_unpadded(recurrent_model, batch, RESPONSE_LENGTHS, RESPONSE_WIDTH)
    assert chosen == [PADDED, PADDED] and choose_packing(recurrent_model, batch[1])[0] == PADDED  # values, scores
    assert [record.getMessage() for record in caplog.records] == [
        "qwen3_next: its linear_attention layers carry a state along the row, so its samples neither pack "
        "(use_remove_padding) nor share prompts (use_prefix_grouper); they run padded, one a row"
    ]
    with torch.no_grad():
        shared, _ = forward_log_probs(recurrent_model, *batch[:3], RESPONSE_WIDTH, share_prompts=True)
    assert torch.equal(shared, packed)


def test_ulysses_is_refused_for_linear_attention_it_does_not_split(tmp_path):
    """Qwen3.5 lays its linear attention's projections out otherwise; Qwen3-Next's splits
    (``tests/models/test_sequence_parallel_recurrent.py``)."""
    Qwen3_5TextConfig(num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    assert _head_errors(key, 2, str(tmp_path), False) == [
        f"{key}=2: the model ({tmp_path}) has linear_attention layers, whose state runs along the whole sequence, "
        f"which Ulysses splits (it splits the linear attention of qwen3_next only); set {key}=1"
    ]


def test_the_tiny_qwen3_next_has_its_layout_and_runs_padded(tmp_path, padded_batch):
    """``hybridflow.models.tiny``'s Qwen3-Next (verl's Qwen3-Next scripts' stand-in): linear layers between full
    ones, their heads 128 wide as Qwen3-Next's (the one width vLLM's CPU kernel of the gated delta rule takes)."""
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, family="qwen3_next")).eval()
    assert type(model) is Qwen3NextForCausalLM
    assert model.config.layer_types == ["linear_attention", "full_attention"]
    assert model.config.linear_key_head_dim == model.config.linear_value_head_dim == 128
    batch = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH)
    assert choose_layout(model, *batch[:2], RESPONSE_WIDTH, True, True) == PADDED
