"""Fixtures of the trainer tests: a tiny parquet task and the Hydra-composed trainer config."""

import pytest

from hybridflow.data.parquet_io import write_train_test
from hybridflow.data.synthetic import arithmetic_problems, train_test_rows

from .helpers import tiny_run_overrides


@pytest.fixture(scope="session")
def tiny_parquet(tmp_path_factory):
    """(train, val) parquet files of short arithmetic prompts in verl's row schema: 16 train, 4 val."""
    problems = arithmetic_problems(20, seed=0, max_value=9)
    train_rows, val_rows = train_test_rows(problems, num_test=4, data_source="arithmetic", ability="math")
    return write_train_test(train_rows, val_rows, tmp_path_factory.mktemp("parquet"))


@pytest.fixture()
def base(tiny_model_dir, tiny_parquet, tmp_path):
    """The overrides of a small valid run (see ``tiny_run_overrides``), for tests that add one bad key."""
    return tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run")
