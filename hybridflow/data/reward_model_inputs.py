"""The policy's samples re-tokenized for a reward model with a tokenizer of its own (verl's
``reward_model.model.input_tokenizer``).

Each sample's prompt messages (the dataset's ``raw_prompt`` column) and its response, decoded by the policy's
tokenizer with the EOS string removed, become one chat that ends with the assistant's turn; the reward model's
chat template renders it (no generation prompt) and its tokenizer tokenizes the text (no special tokens added),
right-padded or cut on the right to ``max_length`` tokens, with ``position_ids`` counting the real tokens. This is
what verl's FSDP ``RewardModelWorker._switch_chat_template`` did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch


def same_tokenizer(policy_tokenizer: Any, reward_tokenizer: Any) -> bool:
    """Whether the policy's token ids read the same to the reward model: the same vocabulary (added tokens too),
    EOS token and chat template."""
    return (
        policy_tokenizer.get_vocab() == reward_tokenizer.get_vocab()
        and policy_tokenizer.eos_token == reward_tokenizer.eos_token
        and policy_tokenizer.chat_template == reward_tokenizer.chat_template
    )


def response_text(tokenizer: Any, response_ids: Sequence[int]) -> str:
    """A response's real tokens decoded, special tokens kept, every EOS string removed (as verl)."""
    text = tokenizer.decode(list(response_ids), skip_special_tokens=False)
    return text.replace(tokenizer.eos_token, "") if tokenizer.eos_token else text


def reward_model_chat(tokenizer: Any, messages: Sequence[dict], response: str) -> str:
    """The prompt's messages and the response as the assistant's turn, rendered by ``tokenizer``'s chat template."""
    chat = [dict(message) for message in messages] + [{"role": "assistant", "content": response}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)


@dataclass(frozen=True)
class ChatTemplateSwitch:
    """Samples of the policy's tokenizer -> the reward model's ``input_ids``, ``attention_mask``, ``position_ids``
    ``[B, max_length]`` (``max_length`` None: the policy's sequence length)."""

    policy_tokenizer: Any
    reward_tokenizer: Any
    max_length: int | None = None

    def texts(self, raw_prompts: Sequence[Any], responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """Each sample's chat as the reward model's template renders it (``responses`` and ``response_mask``
        ``[B, R]``: the policy's response ids and which are real)."""
        texts = []
        for messages, ids, mask in zip(raw_prompts, responses, response_mask.bool()):
            if not isinstance(messages, (list, tuple, np.ndarray)):
                raise TypeError(f"raw_prompt must be a list of chat messages, got {type(messages).__name__}")
            response = response_text(self.policy_tokenizer, ids[mask].tolist())
            texts.append(reward_model_chat(self.reward_tokenizer, list(messages), response))
        return texts

    def __call__(self, raw_prompts: Sequence[Any], responses: torch.Tensor, attention_mask: torch.Tensor):
        """The reward model's inputs for samples whose policy ``attention_mask`` is ``[B, P + R]``."""
        width = self.max_length or attention_mask.shape[1]
        response_mask = attention_mask[:, -responses.shape[1] :]
        texts = self.texts(raw_prompts, responses, response_mask)
        pad_id = self.reward_tokenizer.pad_token_id
        input_ids = torch.full((len(texts), width), 0 if pad_id is None else pad_id, dtype=torch.long)
        mask = torch.zeros((len(texts), width), dtype=torch.long)
        for row, text in enumerate(texts):
            ids = self.reward_tokenizer(text, add_special_tokens=False)["input_ids"][:width]
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
        return {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids}
