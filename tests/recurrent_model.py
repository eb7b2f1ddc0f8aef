"""A tiny random model with recurrent layers, for the tests of code that must keep samples apart."""

from transformers import Qwen3NextConfig


def qwen3_next_config(**overrides) -> Qwen3NextConfig:
    """Qwen3-Next's layout at toy size: a linear-attention (gated delta rule) layer, then a full-attention one,
    mixture-of-experts MLPs; the tiny tokenizer's 263-token vocabulary. ``overrides``: other config keys."""
    return Qwen3NextConfig(
        vocab_size=263,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        **overrides,
    )
