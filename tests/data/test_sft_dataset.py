"""SFTDataset: which tokens the loss sees for {prompt, response} and multi-turn rows, and its errors."""

import copy

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
        write_rows([row]),
        tokenizer,
        max_length=128,
        prompt_key="extra_info",
        prompt_dict_keys=["question"],
        response_key="extra_info",
        response_dict_keys=["answer"],
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


# ------------------------------------------------------------------ verl's sft_trainer data options
CONVERSATION = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
# Says which template arguments it got, before the turns, so every prefix of a conversation renders the same.
MARKING_TEMPLATE = (
    "{% if enable_thinking is defined %}[thinking={{ enable_thinking }}]{% endif %}"
    "{% if tools %}[tools={{ tools | map(attribute='name') | join(',') }}]{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def marking_tokenizer(tokenizer):
    marking = copy.deepcopy(tokenizer)
    marking.chat_template = MARKING_TEMPLATE
    return marking


def test_rows_with_a_messages_column_are_conversations_unless_told_otherwise(tokenizer, write_rows):
    conversations = write_rows([{"messages": CONVERSATION}], "messages.parquet")
    dataset = SFTDataset(conversations, tokenizer, max_length=128)
    assert dataset.multiturn and masked_text(tokenizer, dataset[0]) == "4<|im_end|>"
    assert "multi-turn messages" in dataset.summary()
    pairs = write_rows([{"prompt": "2+2?", "response": "4"}], "pairs.parquet")
    assert not SFTDataset(pairs, tokenizer, max_length=128).multiturn
    with pytest.raises(DatasetError, match="column 'prompt' is missing"):
        SFTDataset(conversations, tokenizer, max_length=128, multiturn=False)


def test_max_samples_keeps_the_first_rows_across_files(tokenizer, write_rows):
    first = write_rows([{"prompt": f"q{i}", "response": f"a{i}"} for i in range(3)], "first.parquet")
    second = write_rows([{"prompt": "q3", "response": "a3"}], "second.parquet")
    dataset = SFTDataset([first, second], tokenizer, max_length=128, max_samples=4)
    assert [masked_text(tokenizer, dataset[i]) for i in range(4)] == [f"a{i}<|im_end|>" for i in range(4)]
    dataset = SFTDataset([first, second], tokenizer, max_length=128, max_samples=2)
    assert [masked_text(tokenizer, dataset[i]) for i in range(len(dataset))] == ["a0<|im_end|>", "a1<|im_end|>"]
    assert len(SFTDataset([first, second], tokenizer, max_length=128, max_samples=-1)) == 4


def test_a_conversations_tools_and_thinking_reach_the_chat_template(marking_tokenizer, write_rows):
    tools = [{"name": "calc", "description": "adds"}]
    rows = [
        {"messages": CONVERSATION, "tools": tools, "enable_thinking": False},
        {"messages": CONVERSATION, "tools": None, "enable_thinking": None},
    ]
    path = write_rows(rows)
    dataset = SFTDataset(path, marking_tokenizer, max_length=256, enable_thinking_default=True)
    assert unmasked_text(marking_tokenizer, dataset[0]).startswith("[thinking=False][tools=calc]<|im_start|>user")
    # No tools in the row; no enable_thinking in the row, so the default.
    assert unmasked_text(marking_tokenizer, dataset[1]).startswith("[thinking=True]<|im_start|>user")
    assert masked_text(marking_tokenizer, dataset[0]) == "4<|im_end|>"
    plain = SFTDataset(write_rows([{"messages": CONVERSATION}], "plain.parquet"), marking_tokenizer, max_length=256)
    assert unmasked_text(marking_tokenizer, plain[0]).startswith("<|im_start|>user")


def test_apply_chat_template_kwargs_reach_single_turn_prompts(marking_tokenizer, write_rows):
    path = write_rows([{"prompt": "2+2?", "response": "4"}])
    dataset = SFTDataset(path, marking_tokenizer, max_length=128, apply_chat_template_kwargs={"enable_thinking": True})
    assert (
        unmasked_text(marking_tokenizer, dataset[0])
        == "[thinking=True]<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_pad_mode_right_pads_every_batch_to_max_length(tokenizer, write_rows):
    path = write_rows([{"prompt": "a", "response": "b"}, {"prompt": "abc", "response": "d"}])
    right = SFTDataset(path, tokenizer, max_length=64, pad_mode="right")
    lengths = [len(right[0]["input_ids"]), len(right[1]["input_ids"])]
    batch = right.collate([right[0], right[1]])
    assert batch.batch["input_ids"].shape == (2, 64)
    assert batch.batch["attention_mask"].sum(-1).tolist() == lengths
    no_padding = SFTDataset(path, tokenizer, max_length=64)
    assert no_padding.collate([no_padding[0], no_padding[1]]).batch["input_ids"].shape == (2, max(lengths))
    with pytest.raises(DatasetError, match="data.pad_mode='left'"):
        SFTDataset(path, tokenizer, max_length=64, pad_mode="left")
