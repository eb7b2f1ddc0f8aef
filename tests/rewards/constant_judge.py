"""A tiny judge whose answer is known: it repeats one character whatever it reads.

Built from the tiny Llama (its LM head untied from its embedding) with every layer's output projections zeroed (the
residual stream keeps each token's embedding), every embedding's first coordinate set to 1, the final norm keeping
that coordinate alone, and the LM head reading it into one token's logit: that token is the argmax at every
position, so greedy decoding answers it.
"""

import pathlib

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.models.tiny import build_tiny_model


def build_constant_judge(out_dir: pathlib.Path, answer: str) -> pathlib.Path:
    build_tiny_model(out_dir, seed=0, family="llama")  # untied: its LM head is not its embedding
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    (token,) = tokenizer.encode(answer, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(out_dir)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[token, 0] = 10.0
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
