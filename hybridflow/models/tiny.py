"""A tiny causal LM and its tokenizer, built locally for tests and CPU demos (no network).

The tokenizer is byte-level with no merges: every ASCII character (digits, operators, letters, spaces,
newlines) is one token, any other text still round-trips exactly through its UTF-8 bytes, and the chat
markers and tool tags are single tokens. The model is a randomly initialised ``Qwen2ForCausalLM`` by
default, or one of the other families users bring (``FAMILIES``), each built from its own transformers
config with the traits that set it apart; the same seed gives the same weights.
"""

from __future__ import annotations

import pathlib
from importlib import resources
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
    SeedOssConfig,
    SeedOssForCausalLM,
)

PAD_TOKEN = "<|endoftext|>"
CHAT_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
# Special tokens are dropped by ``decode(skip_special_tokens=True)``; the tool tags are plain added
# tokens (as in Qwen2.5) so decoded responses keep them for the tool parser.
SPECIAL_TOKENS = (PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# The model families ``build_tiny_model`` builds: (config class, model class) by family name.
FAMILIES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "seed_oss": (SeedOssConfig, SeedOssForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextForCausalLM),
}


def chat_template() -> str:
    """The Qwen2.5-style ChatML template (with tools) shipped beside this module."""
    return resources.files("hybridflow.models").joinpath("chat_template.jinja").read_text()


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer of 263 tokens: 256 bytes, then the 3 special and 4 tool tokens."""
    byte_alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=byte_value)
    vocab = {symbol: index for index, symbol in enumerate(byte_alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    # Added in Qwen's order, so the ids run pad, chat start, eos, then the tool tags.
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.add_tokens(list(TOOL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[CHAT_START_TOKEN],
        model_max_length=1024,
    )
    tokenizer.chat_template = chat_template()
    return tokenizer


def byte_value(symbol: str) -> int:
    """The byte that GPT-2's byte-to-unicode table maps to ``symbol``."""
    code = ord(symbol)
    # Printable bytes map to themselves; the 68 others were shifted to 256 + their rank.
    if code < 256:
        return code
    unprintable = [b for b in range(256) if not _is_printable_byte(b)]
    return unprintable[code - 256]


def _is_printable_byte(b: int) -> bool:
    return ord("!") <= b <= ord("~") or ord("¡") <= b <= ord("¬") or ord("®") <= b <= ord("ÿ")


def build_tiny_model(
    out_dir: str | pathlib.Path,
    seed: int = 0,
    *,
    family: str = "qwen2",
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 1024,
    sliding_window: int = 8,
) -> pathlib.Path:
    """Write a random causal LM of ``family`` (a key of ``FAMILIES``) and its tokenizer to ``out_dir`` in
    Hugging Face format.

    ``AutoTokenizer.from_pretrained(out_dir)`` and ``AutoModelForCausalLM.from_pretrained(out_dir)`` load
    it offline. The defaults give about 0.33M parameters and build in well under a second; the keyword
    arguments size a larger model for demos. ``sliding_window`` applies to the families that have one
    (gemma3, mistral). Returns ``out_dir`` as a Path.
    """
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not a tiny model family; choose one of {sorted(FAMILIES)}")
    config_class, model_class = FAMILIES[family]
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    head_dim = hidden_size // num_attention_heads
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        # Qwen2 has no BOS token; its config names <|endoftext|> as BOS, and so does this one.
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **_family_options(family, head_dim, num_hidden_layers, sliding_window, intermediate_size),
    )
    _save(model_class, config, seed, tokenizer, out_dir)
    return out_dir


def _save(model_class: type, config: Any, seed: int, tokenizer: Any, out_dir: pathlib.Path) -> None:
    """Random weights seeded by ``seed``, saved with the tokenizer."""
    # A private RNG stream: building a model must not move the caller's seeded sequence.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _family_options(family: str, head_dim: int, num_layers: int, sliding_window: int, intermediate_size: int) -> dict:
    """What a family's tiny config sets beyond the shared sizes: the traits of the checkpoints users bring."""
    if family == "qwen2":
        return {"tie_word_embeddings": True}
    if family == "llama":
        return {"tie_word_embeddings": False}  # Llama 3.1 8B; its 1B/3B tie, as qwen2 here does
    if family == "qwen3":
        # q/k RMSNorm, and heads wider than hidden_size / heads (Qwen3-0.6B: 1024 hidden, 16 heads of 128).
        return {"tie_word_embeddings": True, "head_dim": 2 * head_dim}
    if family == "gemma3":
        # Embeddings scaled by sqrt(hidden), (1 + w) RMSNorms, q/k norms, sliding layers with their own RoPE base
        # between full ones (Gemma 3 1B: window 512, five sliding to one full; here every other layer).
        layer_types = ["full_attention" if layer % 2 else "sliding_attention" for layer in range(num_layers)]
        return {
            "tie_word_embeddings": True,
            "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,
            "sliding_window": sliding_window,
            "layer_types": layer_types,
        }
    if family == "qwen3_moe":
        # Qwen3's attention and a mixture of experts in each layer (Qwen3-30B-A3B: 2048 hidden, 32 heads of 128).
        return {"tie_word_embeddings": False, "head_dim": 2 * head_dim, **_experts(intermediate_size)}
    if family == "qwen3_next":
        return _qwen3_next(head_dim, num_layers, intermediate_size)
    if family == "seed_oss":
        # Biases on q, k and v but not o, heads wider than hidden_size / heads (Seed-OSS-36B: 5120 hidden, 80 heads
        # of 128); its config's dropout of 0.1 on attention and residuals stays, as training applies it.
        return {"tie_word_embeddings": False, "head_dim": 2 * head_dim, "attention_bias": True}
    # mistral: every layer slides (Mistral 7B v0.1: window 4096).
    return {"tie_word_embeddings": False, "sliding_window": sliding_window}


def _qwen3_next(head_dim: int, num_layers: int, intermediate_size: int) -> dict:
    """Linear-attention (gated delta rule) layers between full-attention ones, experts beside a shared expert
    (Qwen3-Next-80B-A3B: three linear layers to one full, 16 key and 32 value heads of 128, attention heads of 256).
    Here every other layer is linear, its heads of 128 as there (vLLM's CPU kernel of the rule takes no other
    width), 2 key and 4 value heads so that tensor parallelism of 2 splits them."""
    layer_types = ["full_attention" if layer % 2 else "linear_attention" for layer in range(num_layers)]
    return {
        "tie_word_embeddings": False,
        "head_dim": 2 * head_dim,
        "layer_types": layer_types,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "shared_expert_intermediate_size": intermediate_size // 4,
        **_experts(intermediate_size),
    }


def _experts(intermediate_size: int) -> dict:
    """A router sending each token to 2 of 4 experts, together as wide as the dense MLP, their outputs weighted by
    the renormalised router probabilities (Qwen3-30B-A3B: 8 of 128 experts of 768)."""
    return {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": intermediate_size // 4,
        "norm_topk_prob": True,
    }
