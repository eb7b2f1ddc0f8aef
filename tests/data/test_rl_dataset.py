import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.data.rl_dataset import DatasetError, PromptTooLongError, RLDataset
from hybridflow.models.loading import load_tokenizer

from .conftest import verl_row


def chat_text(tokenizer, content, **options):
    messages = [{"role": "user", "content": content}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **options)


def test_items_hold_the_templated_prompt_and_verl_columns(tokenizer, write_rows):
    extra = {"split": "train", "index": 7, "tools_kwargs": {"calc": {"create_kwargs": {"x": 1}}}}
    rows = [verl_row("What is 2+3?", ground_truth="5", extra_info=extra), verl_row("Sort 3 1", "sorting", "1 3")]
    path = write_rows(rows)
    dataset = RLDataset(path, tokenizer, max_prompt_length=128)
    assert len(dataset) == 2 and dataset.data_sources() == ["arithmetic", "sorting"]
    item = dataset[0]
    expected = chat_text(tokenizer, "What is 2+3?")
    assert expected.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(item["input_ids"]) == expected
    assert item["input_ids"].dtype == torch.long and item["input_ids"].dim() == 1
    assert item["data_source"] == "arithmetic" and item["ability"] == "math"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "5"}
    assert item["index"] == 7
    assert item["tools_kwargs"] == {"calc": {"create_kwargs": {"x": 1}}}
    assert item["raw_prompt"] == [{"role": "user", "content": "What is 2+3?"}]
    assert dataset[1]["tools_kwargs"] is not None
    assert dataset.num_filtered == 0 and dataset.num_truncated == 0


def test_string_prompts_and_missing_extra_info_get_defaults(tokenizer, tmp_path):
    path = tmp_path / "plain.parquet"
    rows = [{"data_source": "gsm8k", "prompt": "Hi", "reward_model": {"ground_truth": "1"}}] * 2
    pq.write_table(pa.Table.from_pylist(rows), path)
    dataset = RLDataset(path, tokenizer, max_prompt_length=64, return_raw_chat=False)
    item = dataset[1]
    assert tokenizer.decode(item["input_ids"]) == chat_text(tokenizer, "Hi")
    assert item["index"] == 1  # the row's position, since extra_info has no index
    assert item["extra_info"] == {} and item["tools_kwargs"] == {} and item["ability"] == ""
    assert "raw_prompt" not in item


def test_several_files_are_read_in_order(tokenizer, write_rows):
    first = write_rows([verl_row("a"), verl_row("b")], "first.parquet")
    second = write_rows([verl_row("c", "countdown", {"target": 3, "numbers": [1, 2]})], "second.parquet")
    dataset = RLDataset([first, second], tokenizer, max_prompt_length=64)
    assert [dataset[i]["raw_prompt"][0]["content"] for i in range(3)] == ["a", "b", "c"]
    assert dataset[2]["reward_model"]["ground_truth"] == {"target": 3, "numbers": [1, 2]}


def test_tools_are_rendered_by_the_chat_template(tokenizer, write_rows):
    tools = [{"type": "function", "function": {"name": "calc", "description": "add", "parameters": {}}}]
    dataset = RLDataset(write_rows([verl_row("1+1")]), tokenizer, max_prompt_length=512, tools=tools)
    text = tokenizer.decode(dataset[0]["input_ids"])
    assert text == chat_text(tokenizer, "1+1", tools=tools) and '"name": "calc"' in text


@pytest.fixture
def mixed_lengths(write_rows):
    """Rows 0 and 2 are short; row 1 is far over a 40-token limit."""
    return write_rows([verl_row("short"), verl_row("x" * 80 + "END"), verl_row("tiny")], "mixed.parquet")


def test_overlong_prompts_raise_by_default_naming_file_row_and_fixes(tokenizer, mixed_lengths):
    with pytest.raises(PromptTooLongError) as error:
        RLDataset(mixed_lengths, tokenizer, max_prompt_length=40)
    message = str(error.value)
    assert f"{mixed_lengths} row 1" in message and "1 of 3 prompts" in message
    assert "data.max_prompt_length=40" in message
    assert "data.filter_overlong_prompts=True" in message and "data.truncation" in message


def test_filtering_drops_and_counts_overlong_prompts(tokenizer, mixed_lengths, caplog):
    with caplog.at_level(logging.INFO, logger="hybridflow.data.rl_dataset"):
        dataset = RLDataset(mixed_lengths, tokenizer, max_prompt_length=40, filter_overlong_prompts=True)
    assert len(dataset) == 2 and dataset.num_filtered == 1 and dataset.num_truncated == 0
    assert [dataset[i]["raw_prompt"][0]["content"] for i in range(2)] == ["short", "tiny"]
    assert [dataset[i]["index"] for i in range(2)] == [0, 0]  # from extra_info
    assert "1 over-long prompts filtered" in caplog.text
    same = RLDataset(mixed_lengths, tokenizer, max_prompt_length=40, truncation="filter")
    assert same.num_filtered == 1


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_cuts_to_the_limit_and_counts(tokenizer, mixed_lengths, mode, caplog):
    with caplog.at_level(logging.WARNING, logger="hybridflow.data.rl_dataset"):
        dataset = RLDataset(mixed_lengths, tokenizer, max_prompt_length=40, truncation=mode)
    assert len(dataset) == 3 and dataset.num_truncated == 1 and dataset.num_filtered == 0
    assert "1 truncated" in caplog.text
    full = tokenizer(chat_text(tokenizer, "x" * 80 + "END"), add_special_tokens=False)["input_ids"]
    kept = dataset[1]["input_ids"].tolist()
    assert len(kept) == 40
    expected = {"left": full[-40:], "right": full[:40], "middle": full[:20] + full[-20:]}[mode]
    assert kept == expected
    if mode == "left":
        assert tokenizer.decode(kept).endswith("END<|im_end|>\n<|im_start|>assistant\n")


def test_all_prompts_filtered_is_an_error(tokenizer, write_rows):
    path = write_rows([verl_row("y" * 100)])
    with pytest.raises(DatasetError, match="no prompts left"):
        RLDataset(path, tokenizer, max_prompt_length=10, filter_overlong_prompts=True)


def test_missing_parquet_file_is_named(tokenizer, tmp_path):
    missing = tmp_path / "nope" / "train.parquet"
    with pytest.raises(DatasetError) as error:
        RLDataset([missing], tokenizer, max_prompt_length=32)
    assert str(missing) in str(error.value) and "does not exist" in str(error.value)
    assert "data.train_files" in str(error.value)


def test_a_file_without_a_required_column_names_file_row_and_column(tokenizer, tmp_path):
    path = tmp_path / "no_reward.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "gsm8k", "prompt": "hi"}]), path)
    with pytest.raises(DatasetError) as error:
        RLDataset(path, tokenizer, max_prompt_length=32)
    assert f"{path} row 0" in str(error.value) and "'reward_model'" in str(error.value)


def test_a_row_with_an_empty_required_column_names_file_row_and_column(tokenizer, write_rows):
    rows = [verl_row("fine"), verl_row("fine too")]
    rows[1]["prompt"] = None
    path = write_rows(rows)
    with pytest.raises(DatasetError) as error:
        RLDataset(path, tokenizer, max_prompt_length=64)
    assert f"{path} row 1: required column 'prompt' is empty" in str(error.value)


def test_a_reward_model_without_ground_truth_names_the_nested_column(tokenizer, write_rows):
    row = verl_row("fine")
    row["reward_model"] = {"style": "model"}
    path = write_rows([row])
    with pytest.raises(DatasetError) as error:
        RLDataset(path, tokenizer, max_prompt_length=64)
    assert f"{path} row 0" in str(error.value) and "'reward_model.ground_truth'" in str(error.value)


def test_prompts_that_are_not_chat_messages_are_refused(tokenizer, tmp_path):
    path = tmp_path / "bad_prompt.parquet"
    row = {"data_source": "x", "prompt": [1, 2], "reward_model": {"ground_truth": 1}}
    pq.write_table(pa.Table.from_pylist([row]), path)
    with pytest.raises(DatasetError, match=r"row 0: column 'prompt' must be a non-empty list of chat messages"):
        RLDataset(path, tokenizer, max_prompt_length=64)


def test_bad_options_are_refused(tokenizer, write_rows):
    path = write_rows([verl_row("a")])
    with pytest.raises(DatasetError, match=r"data.truncation='sideways' is not one of"):
        RLDataset(path, tokenizer, max_prompt_length=64, truncation="sideways")
    with pytest.raises(DatasetError, match=r"data.max_prompt_length=0 must be a positive integer"):
        RLDataset(path, tokenizer, max_prompt_length=0)


def test_items_are_copies_so_batches_cannot_edit_the_dataset(tokenizer, write_rows):
    dataset = RLDataset(write_rows([verl_row("a")]), tokenizer, max_prompt_length=64)
    item = dataset[0]
    item["extra_info"]["index"] = 99
    item["raw_prompt"][0]["content"] = "changed"
    assert dataset[0]["index"] == 0 and dataset[0]["raw_prompt"][0]["content"] == "a"


def test_a_custom_chat_template_and_its_kwargs_reach_the_prompt(tiny_model_dir, write_rows):
    path = write_rows([verl_row("What is 2+3?")])
    template = "{{ greeting }}|{% for m in messages %}{{ m['content'] }}{% endfor %}"
    templated = load_tokenizer(tiny_model_dir, chat_template=template)
    dataset = RLDataset(path, templated, max_prompt_length=128, apply_chat_template_kwargs={"greeting": "Hello"})
    assert templated.decode(dataset[0]["input_ids"]) == "Hello|What is 2+3?"


def test_max_samples_keeps_the_first_rows_or_a_seeded_draw(tokenizer, write_rows):
    path = write_rows([verl_row(f"Sort {i} 0", "sorting", f"0 {i}") for i in range(6)])
    first = RLDataset(path, tokenizer, max_prompt_length=128, max_samples=2)
    assert [item["reward_model"]["ground_truth"] for item in (first[0], first[1])] == ["0 0", "0 1"]
    drawn = [RLDataset(path, tokenizer, max_prompt_length=128, max_samples=3, shuffle=True, seed=5) for _ in range(2)]
    truths = [[d[i]["reward_model"]["ground_truth"] for i in range(3)] for d in drawn]
    assert len(drawn[0]) == 3 and truths[0] == truths[1] and len(set(truths[0])) == 3
    assert len(RLDataset(path, tokenizer, max_prompt_length=128, max_samples=-1)) == 6
