"""Fixtures for the data tests: the tiny tokenizer and a helper that writes verl-schema parquet rows."""

import pytest

from hybridflow.data.parquet_io import write_parquet_rows
from hybridflow.models.loading import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def verl_row(content, data_source="arithmetic", ground_truth="5", extra_info=None, ability="math"):
    """One row in verl's schema with a single user message."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info if extra_info is not None else {"split": "train", "index": 0},
    }


@pytest.fixture
def write_rows(tmp_path):
    """``write_rows(rows, name="rows.parquet") -> path`` inside the test's tmp folder."""

    def write(rows, name="rows.parquet"):
        return write_parquet_rows(rows, tmp_path / name)

    return write
