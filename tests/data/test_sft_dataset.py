"""SFTDataset: which tokens the loss sees for {prompt, response} and multi-turn rows, and its errors."""

import pytest
import torch

from hybridflow.data.rl_dataset import DatasetError
from hybridflow.data.sft_dataset import SFTDataset, collate_sft, conversation_tokens


def masked_text(tokenizer, item):
    ids = item["input_ids"][item["loss_mask"].bool()]
    return tokenizer.decode(ids)


def unmasked_text(tokenizer, item):
    return tokenizer.decode(item["input_ids"][~item["loss_mask"].bool()])


def test_prompt_response_rows_train_only_on_the_response_and_eos(tokenizer, write_rows):
    path = write_rows([{"prompt": "Sort 3 1 2 ascending.", "response": "#### 1 2 3"}])
    item = SFTDataset(path, tokenizer, max_length=128)[0]
    assert masked_text(tokenizer, item) == "#### 1 2 3<|im_end|>"
    expected_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Sort 3 1 2 ascending."}], add_generation_prompt=True, tokenize=False
    )
    assert unmasked_text(tokenizer, item) == expected_prompt


def test_dict_keys_read_the_rl_parquets_question_and_answer(tokenizer, write_rows):
    row = {"extra_info": {"question": "What is 2+2?", "answer": "#### 4"}, "prompt": [{"role": "user", "content": "x"}]}
    dataset = SFTDataset(
        write_rows([row]), tokenizer, max_length=128, prompt_key="extra_info", prompt_dict_keys=["question"],
        response_key="extra_info", response_dict_keys=["answer"],
    )
    assert masked_text(tokenizer, dataset[0]) == "#### 4<|im_end|>"
    assert "What is 2+2?" in unmasked_text(tokenizer, dataset[0])


def test_multiturn_rows_train_on_every_assistant_turn_and_nothing_else(tokenizer, write_rows):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    item = SFTDataset(write_rows([{"messages": messages}]), tokenizer, max_length=256, multiturn=True)[0]
    assert masked_text(tokenizer, item) == "Hello<|im_end|>4<|im_end|>"
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    # The whole conversation is there, minus the template's newline after the last end-of-turn token.
    assert tokenizer.decode(item["input_ids"]) == full.rstrip("\n")


def test_a_conversation_without_an_assistant_turn_is_refused(tokenizer):
    with pytest.raises(DatasetError, match="no assistant turn"):
        conversation_tokens(tokenizer, [{"role": "user", "content": "hi"}], "row 3")


def test_overlong_examples_error_filter_or_truncate(tokenizer, write_rows):
    path = write_rows([{"prompt": "short", "response": "ok"}, {"prompt": "x" * 200, "response": "ok"}])
    with pytest.raises(DatasetError, match="row 1.*data.max_length=64"):
        SFTDataset(path, tokenizer, max_length=64)
    filtered = SFTDataset(path, tokenizer, max_length=64, truncation="filter")
    assert (len(filtered), filtered.num_filtered) == (1, 1)
    right = SFTDataset(path, tokenizer, max_length=64, truncation="right")
    assert len(right[1]["input_ids"]) == 64 and right.num_truncated == 1
    left = SFTDataset(path, tokenizer, max_length=64, truncation="left")
    # Keeping the end keeps the response.
    assert masked_text(tokenizer, left[1]) == "ok<|im_end|>"


def test_missing_columns_name_the_row_and_the_setting(tokenizer, write_rows):
    path = write_rows([{"question": "q", "answer": "a"}])
    with pytest.raises(DatasetError, match="row 0: column 'prompt' is missing.*data.prompt_key"):
        SFTDataset(path, tokenizer, max_length=64)
    with pytest.raises(DatasetError, match="'question.text' is missing"):
        SFTDataset(
            path, tokenizer, max_length=64, prompt_key="question", prompt_dict_keys=["text"], response_key="answer"
        )


def test_collate_right_pads_and_positions_count_real_tokens():
    items = [
        {"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1])},
        {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([1])},
    ]
    batch = collate_sft(items, pad_token_id=0).batch
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
