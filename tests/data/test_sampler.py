import pytest

from hybridflow.data.rl_dataset import DatasetError, RLDataset
from hybridflow.data.sampler import EpochOrder, StatefulDataLoader

from .conftest import verl_row


@pytest.fixture(scope="module")
def dataset(tokenizer, tmp_path_factory):
    from hybridflow.data.parquet_io import write_parquet_rows

    rows = [verl_row(f"q{i}", extra_info={"index": i}) for i in range(10)]
    path = write_parquet_rows(rows, tmp_path_factory.mktemp("sampler") / "ten.parquet")
    return RLDataset(path, tokenizer, max_prompt_length=64)


def indices_of(batches):
    return [batch.non_tensor_batch["index"].tolist() for batch in batches]


def take(loader, count):
    """The next ``count`` batches, crossing epoch boundaries as a trainer's epoch loop does."""
    taken = []
    while len(taken) < count:
        for batch in loader:
            taken.append(batch)
            if len(taken) == count:
                break
    return taken


def test_epoch_orders_are_seeded_permutations():
    order = EpochOrder(10, shuffle=True, seed=3)
    assert sorted(order.indices(0).tolist()) == list(range(10))
    assert order.indices(0).tolist() == EpochOrder(10, seed=3).indices(0).tolist()
    assert order.indices(0).tolist() != order.indices(1).tolist()
    assert order.indices(0).tolist() != EpochOrder(10, seed=4).indices(0).tolist()
    assert EpochOrder(4, shuffle=False).indices(5).tolist() == [0, 1, 2, 3]


def test_batches_cover_each_epoch_and_drop_the_remainder(dataset):
    loader = StatefulDataLoader(dataset, batch_size=4, seed=0)
    assert len(loader) == 2
    first_epoch = indices_of(list(loader))
    assert len(first_epoch) == 2 and len(set(sum(first_epoch, []))) == 8
    assert loader.epoch == 1 and loader.batches_taken == 0
    assert indices_of(list(loader)) != first_epoch  # a new permutation each epoch
    batch = next(iter(StatefulDataLoader(dataset, batch_size=4, seed=0)))
    assert batch.batch["input_ids"].shape[0] == 4 and "attention_mask" in batch.batch.keys()


def test_keeping_the_last_partial_batch():
    loader = StatefulDataLoader(list(range(10)), batch_size=4, shuffle=False, drop_last=False, collate_fn=list)
    assert len(loader) == 3 and list(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_a_resumed_loader_continues_with_exactly_the_same_batches(dataset, stop_after):
    reference = indices_of(take(StatefulDataLoader(dataset, batch_size=3, seed=7), 7))
    interrupted = StatefulDataLoader(dataset, batch_size=3, seed=7)
    assert indices_of(take(interrupted, stop_after)) == reference[:stop_after]
    state = interrupted.state_dict()
    resumed = StatefulDataLoader(dataset, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    assert indices_of(take(resumed, 7 - stop_after)) == reference[stop_after:]


def test_a_state_from_other_settings_is_refused(dataset):
    state = StatefulDataLoader(dataset, batch_size=3, seed=7).state_dict()
    with pytest.raises(DatasetError, match=r"seed: saved 7, now 8.*batch_size: saved 3, now 2"):
        StatefulDataLoader(dataset, batch_size=2, seed=8).load_state_dict(state)


def test_a_batch_larger_than_the_dataset_is_refused(dataset):
    with pytest.raises(DatasetError, match=r"batch_size=11 is larger than the dataset \(10 prompts"):
        StatefulDataLoader(dataset, batch_size=11)
