"""Re-tokenizing the policy's samples for a reward model with its own tokenizer and chat template."""

import numpy as np
import torch

from hybridflow.data.reward_model_inputs import ChatTemplateSwitch, response_text, reward_model_chat, same_tokenizer
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.models.tiny_reward_model import build_reward_tokenizer

POLICY, REWARD = build_tiny_tokenizer(), build_reward_tokenizer()


def policy_samples(prompts: list[str], responses: list[list[int]], prompt_width: int = 4, response_width: int = 8):
    """``raw_prompt`` messages (one user turn each, as a numpy object column), right-padded response ids and the
    policy's attention mask ``[B, prompt_width + response_width]`` (the prompt's part all real)."""
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [np.array([{"role": "user", "content": prompt}], dtype=object) for prompt in prompts]
    ids = torch.full((len(responses), response_width), POLICY.pad_token_id)
    mask = torch.zeros((len(responses), prompt_width + response_width), dtype=torch.long)
    mask[:, :prompt_width] = 1
    for row, response in enumerate(responses):
        ids[row, : len(response)] = torch.tensor(response)
        mask[row, prompt_width : prompt_width + len(response)] = 1
    return raw, ids, mask


def test_the_two_tiny_tokenizers_differ_and_each_equals_itself():
    assert not same_tokenizer(POLICY, REWARD)
    assert same_tokenizer(POLICY, build_tiny_tokenizer()) and same_tokenizer(REWARD, build_reward_tokenizer())


def test_the_response_is_decoded_with_special_tokens_but_no_eos():
    ids = POLICY.encode("#### 5", add_special_tokens=False) + [POLICY.convert_tokens_to_ids("<|im_start|>")]
    assert response_text(POLICY, ids + [POLICY.eos_token_id]) == "#### 5<|im_start|>"


def test_inputs_are_the_reward_models_template_tokenized_and_right_padded():
    answer = POLICY.encode("#### 5", add_special_tokens=False) + [POLICY.eos_token_id]
    raw, responses, mask = policy_samples(["2+3?", "x"], [answer, POLICY.encode("ab", add_special_tokens=False)])
    inputs = ChatTemplateSwitch(POLICY, REWARD, max_length=40)(raw, responses, mask)
    texts = ["<s>[USER] 2+3?</s><s>[ASSISTANT] #### 5</s>", "<s>[USER] x</s><s>[ASSISTANT] ab</s>"]
    assert reward_model_chat(REWARD, [{"role": "user", "content": "x"}], "ab") == texts[1]
    for row, text in enumerate(texts):
        ids = REWARD(text, add_special_tokens=False)["input_ids"]
        assert ids[0] == REWARD.bos_token_id and ids[-1] == REWARD.eos_token_id
        assert inputs["input_ids"][row, : len(ids)].tolist() == ids
        assert inputs["input_ids"][row, len(ids) :].eq(REWARD.pad_token_id).all()
        assert inputs["attention_mask"][row].tolist() == [1] * len(ids) + [0] * (40 - len(ids))
        assert inputs["position_ids"][row, : len(ids)].tolist() == list(range(len(ids)))


def test_a_long_sample_is_cut_on_the_right_and_the_default_width_is_the_policys():
    raw, responses, mask = policy_samples(["2+3?"], [POLICY.encode("abcdef", add_special_tokens=False)])
    inputs = ChatTemplateSwitch(POLICY, REWARD)(raw, responses, mask)
    full = REWARD("<s>[USER] 2+3?</s><s>[ASSISTANT] abcdef</s>", add_special_tokens=False)["input_ids"]
    assert inputs["input_ids"].shape == (1, 12)  # the policy's 4 prompt + 8 response columns
    assert inputs["input_ids"][0].tolist() == full[:12] and inputs["attention_mask"].all()
