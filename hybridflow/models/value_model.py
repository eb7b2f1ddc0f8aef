"""The critic (a value per token) and the reward model (a score per sequence).

Both are a causal LM body with a scalar linear head named ``score``, loaded as transformers'
``AutoModelForTokenClassification`` with one label, as verl's critic is. The body's weights come from
any folder of the same architecture: the actor's causal LM (the head is then newly initialised) or a
reward model saved as ``AutoModelForSequenceClassification`` with one label (its ``score`` head loads too).
The reward model is read the same way, and its score is the head's output at each sequence's last real
token, which is what sequence classification computes, without relying on the pad token id to find it.
Dropout in the head is switched off: values and rewards must be deterministic. A new head is drawn from
:data:`HEAD_INIT_SEED` on a forked RNG, so every run and every rank starts from the same head and the
caller's random stream does not move. Differs from verl: verl draws it from the process's unseeded RNG, so
two runs start from different critics and two ranks shard two different heads.
"""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForTokenClassification, PreTrainedModel

from hybridflow.distributed.sequence_parallel import SequenceParallelGroup
from hybridflow.models.layouts import Layout, PackedBatch, SharedPromptBatch, choose_packing, packed_outputs, unpack
from hybridflow.models.loading import from_pretrained_or_raise, load_model_config, resolve_dtype, resolve_model_path
from hybridflow.models.sequence_parallel import SequenceSplit

HEAD_INIT_SEED = 0


def load_value_model(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    override_config: dict | None = None,
) -> PreTrainedModel:
    """A critic: body from ``path`` (causal LM or reward model) plus a scalar head with a bias; ``override_config``
    sets keys of the model's config before the weights are built (e.g. ``attention_dropout``)."""
    return _load_scalar_head_model(
        path, dtype, attn_implementation, trust_remote_code, head_bias=True, override_config=override_config
    )


def load_reward_model(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A reward model saved as one-label sequence classification (``score`` head without bias)."""
    return _load_scalar_head_model(path, dtype, attn_implementation, trust_remote_code, head_bias=False)


def _load_scalar_head_model(path, dtype, attn_implementation, trust_remote_code, head_bias, override_config=None):
    config = load_model_config(path, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    config.token_classification_bias = head_bias
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(HEAD_INIT_SEED)
        return from_pretrained_or_raise(
            AutoModelForTokenClassification,
            resolve_model_path(path),
            config=config,
            dtype=resolve_dtype(dtype),
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )


def forward_token_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    use_remove_padding: bool = True,
) -> torch.Tensor:
    """The scalar head's output at every position: ``[B, L]`` float32, 0 on padding.

    With ``use_remove_padding`` the real tokens run packed unless the padded rectangle is cheaper (see
    ``hybridflow.models.layouts.choose_packing``).
    """
    packed = choose_packing(model, attention_mask)[0].pack(input_ids, attention_mask) if use_remove_padding else None
    return _token_scores(model, input_ids, attention_mask, position_ids, packed)


def _token_scores(
    model, input_ids, attention_mask, position_ids, packed: PackedBatch | None, sequence_parallel=None
) -> torch.Tensor:
    """``forward_token_scores`` on the packed rows given, or on the padded rectangle (``packed`` None)."""
    if packed is not None:
        scores = _head_outputs(model, packed.input_ids, packed.position_ids, None, sequence_parallel)
        return unpack(packed_outputs(scores, packed).float(), packed)
    scores = _head_outputs(model, input_ids, position_ids, attention_mask, sequence_parallel)
    return scores.float() * attention_mask


def _head_outputs(
    model, input_ids, position_ids, attention_mask, sequence_parallel: SequenceParallelGroup | None
) -> torch.Tensor:
    """The scalar head's output ``[N, W]`` at every position of the rows; under Ulysses each rank of the group
    runs its slice and the outputs are gathered (:mod:`hybridflow.models.sequence_parallel`)."""
    if sequence_parallel is None:
        output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return output.logits[..., 0]
    split = SequenceSplit(sequence_parallel, input_ids.shape[1])
    output = split.run(model, input_ids, position_ids, attention_mask)
    return split.gather_columns(output.logits[..., 0])


def forward_values(
    value_model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    layout: Layout,
    sequence_parallel: SequenceParallelGroup | None = None,
) -> torch.Tensor:
    """Critic values ``[B, R]``: ``values[:, t]`` is V of the state before response token ``t``.

    That state ends at column ``L - R - 1 + t``, the same position whose logits give token ``t``'s
    log-prob; entries whose response token is padding are 0. The batch runs in ``layout``, its pass's
    (``hybridflow.models.layouts.choose_layout``); with shared prompts the value before each first response
    token is the prompt's last position's, computed once for the group. With ``sequence_parallel`` every rank
    of that group passes the same batch and gets the same values.
    """
    rows = layout.arrange(input_ids, attention_mask, response_length)
    if isinstance(rows, SharedPromptBatch):
        scores = _head_outputs(value_model, rows.input_ids, rows.position_ids, rows.attention_mask, sequence_parallel)
        return rows.place(scores[rows.keep][rows.logit_row].float())
    scores = _token_scores(value_model, input_ids, attention_mask, position_ids, rows, sequence_parallel)
    return scores[:, -response_length - 1 : -1] * attention_mask[:, -response_length:]


def forward_reward_scores(
    reward_model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    use_remove_padding: bool = True,
    layout: Layout | None = None,
    response_length: int = 0,
) -> torch.Tensor:
    """Reward-model scores ``[B]``: the head's output at each sequence's last real token. With the pass's
    ``layout`` sharing prompts (``choose_layout``; the last ``response_length`` columns are the responses), each
    prompt is computed once for the samples that repeat it."""
    if layout is not None and layout.share_prompts:
        rows = layout.arrange(input_ids, attention_mask, response_length)
        scores = _head_outputs(reward_model, rows.input_ids, rows.position_ids, rows.attention_mask, None)
        return scores.reshape(-1)[rows.last_token].float()
    scores = forward_token_scores(reward_model, input_ids, attention_mask, position_ids, use_remove_padding)
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last_real = (columns * attention_mask.bool()).argmax(dim=1)
    return scores[torch.arange(scores.shape[0], device=scores.device), last_real]
