"""Fixtures for the rollout tests: the tiny model's tokenizer, an engine factory, and a tiny model trained to call
the calculator tool (so a real engine drives a real multi-turn rollout)."""

import pytest
import torch

from hybridflow.models.loading import load_causal_lm, load_tokenizer
from hybridflow.rollout import HFRolloutEngine, RolloutConfig
from hybridflow.rollout.tool_messages import ToolMessageEncoder
from tests.overfit import overfit
from tests.rollout.prompts import FINAL_ANSWER_TEXT, TOOL_CALL_TEXT, TOOL_QUESTION


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The machine is shared: one intra-op thread per test process."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def make_engine(tiny_model_dir, tokenizer):
    """Build HF engines from the tiny model; every engine built is closed after the test."""
    engines = []

    def build(model_dir=None, **config_values):
        config = RolloutConfig.from_dict(config_values)
        engine = HFRolloutEngine.from_pretrained(model_dir or tiny_model_dir, config, tokenizer=tokenizer)
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close()


@pytest.fixture(scope="session")
def tool_calling_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model overfit on one conversation: ask 2+3 -> calculator call -> tool says 5 -> answer.

    Greedy decoding then reproduces the calls, so the agent loop can be checked end to end on a real engine.
    """
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": TOOL_QUESTION}], add_generation_prompt=True, tokenize=False
    )
    first = tokenizer.encode(prompt + TOOL_CALL_TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    tool_turn = ToolMessageEncoder(tokenizer).encode(["5"], ended_with_eos=True)
    second = tokenizer.encode(FINAL_ANSWER_TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    sequence = torch.tensor([first + tool_turn + second])
    overfit(model, sequence, sequence, "the tool-calling fixture")
    out_dir = tmp_path_factory.mktemp("tool_calling_model")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
