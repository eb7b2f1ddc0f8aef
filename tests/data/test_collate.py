import numpy as np
import pytest
import torch

from hybridflow.data.collate import collate_to_dataproto

PAD = 0


def item(ids, **columns):
    return {"input_ids": torch.tensor(ids), **columns}


def test_prompts_are_left_padded_with_masks_and_positions():
    batch = collate_to_dataproto([item([5, 6, 7], a="x"), item([1, 2, 3, 4, 9], a="y")], pad_token_id=PAD)
    assert len(batch) == 2
    assert batch.batch["input_ids"].tolist() == [[0, 0, 5, 6, 7], [1, 2, 3, 4, 9]]
    assert batch.batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert batch.batch["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert batch.non_tensor_batch["a"].tolist() == ["x", "y"]


def test_nested_columns_stay_one_entry_per_row():
    messages = [{"role": "user", "content": "hi"}]
    items = [item([1], raw_prompt=messages, reward_model={"ground_truth": "1"}, index=3) for _ in range(2)]
    batch = collate_to_dataproto(items, pad_token_id=PAD)
    raw = batch.non_tensor_batch["raw_prompt"]
    assert raw.shape == (2,) and raw.dtype == object and raw[1] == messages
    assert batch.non_tensor_batch["reward_model"][0] == {"ground_truth": "1"}
    assert batch.non_tensor_batch["index"].tolist() == [3, 3]


def test_pad_to_length_fixes_the_width():
    batch = collate_to_dataproto([item([4, 5])], pad_token_id=9, pad_to_length=4)
    assert batch.batch["input_ids"].tolist() == [[9, 9, 4, 5]]
    with pytest.raises(ValueError, match="shorter than the longest prompt"):
        collate_to_dataproto([item([1, 2, 3])], pad_token_id=PAD, pad_to_length=2)


def test_items_with_different_keys_or_no_items_are_refused():
    with pytest.raises(ValueError, match="item 1 has keys"):
        collate_to_dataproto([item([1], a=1), item([2], b=1)], pad_token_id=PAD)
    with pytest.raises(ValueError, match="empty"):
        collate_to_dataproto([], pad_token_id=PAD)


def test_collated_batch_from_the_dataset_matches_its_items(tokenizer, write_rows):
    from hybridflow.data.rl_dataset import RLDataset

    from .conftest import verl_row

    dataset = RLDataset(write_rows([verl_row("a"), verl_row("longer prompt")]), tokenizer, max_prompt_length=64)
    batch = dataset.collate([dataset[0], dataset[1]])
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    assert (ids[0][mask[0].bool()] == dataset[0]["input_ids"]).all()
    assert (ids[0][~mask[0].bool()] == tokenizer.pad_token_id).all()
    assert set(batch.non_tensor_batch) == {
        "data_source",
        "reward_model",
        "extra_info",
        "ability",
        "index",
        "tools_kwargs",
        "raw_prompt",
    }
    assert isinstance(batch.non_tensor_batch["data_source"], np.ndarray)
