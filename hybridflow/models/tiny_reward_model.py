"""A tiny reward model with a tokenizer and chat template of its own, built locally for tests and CPU demos.

Its tokenizer is byte-level like the tiny policy's (:mod:`hybridflow.models.tiny`) but nothing else matches: the
special tokens come first (``<pad>``, ``<s>``, ``</s>``), so every byte has another id, and its chat template is
not ChatML (``<s>[USER] ...</s>``). A policy's token ids mean nothing to it, so its samples must be re-tokenized
(``reward_model.model.input_tokenizer``). The model is a random ``Qwen2ForSequenceClassification`` with one label,
its score head scaled up so that different texts score visibly apart.
"""

from __future__ import annotations

import pathlib

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForSequenceClassification

from hybridflow.models.tiny import byte_value

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<pad>", "<s>", "</s>"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<s>[' + message['role'] | upper + '] ' + message['content'] + '</s>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<s>[ASSISTANT] ' }}{%- endif -%}"
)
HEAD_SCALE = 50.0


def build_reward_tokenizer() -> PreTrainedTokenizerFast:
    """259 tokens: the 3 special tokens (ids 0, 1, 2), then the 256 bytes (ids 3..258)."""
    byte_alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=byte_value)
    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]
    vocab = {symbol: index for index, symbol in enumerate(specials + byte_alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_reward_model(out_dir: str | pathlib.Path, seed: int = 0, hidden_size: int = 64) -> pathlib.Path:
    """Write the random reward model and its tokenizer to ``out_dir`` in Hugging Face format; returns it."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_reward_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.mul_(HEAD_SCALE)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
