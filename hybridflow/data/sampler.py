"""A seeded, resumable data loader: the same seed gives the same batches, and a resumed run sees exactly
the batches it would have seen had it not stopped.

The order of epoch ``e`` is a permutation drawn from ``numpy.random.default_rng([seed, e])``, so it depends
only on the seed and the epoch, never on what ran before. The state is ``(epoch, batches taken in that
epoch)``; batches are collated in the calling process (prompt batches are cheap to build, so there are no
worker processes to keep in step).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sized

import numpy as np

from hybridflow.data.rl_dataset import DatasetError
from hybridflow.protocol import DataProto


class EpochOrder:
    """The sample order of each epoch: seeded permutations, or 0..N-1 when ``shuffle`` is off."""

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0):
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed

    def indices(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)


class StatefulDataLoader:
    """Yields DataProto batches of ``batch_size`` samples; ``state_dict()``/``load_state_dict()`` resume it.

    Iterating yields the remaining batches of the current epoch, then moves to the next epoch, so a
    trainer runs ``for epoch in range(loader.epoch, total_epochs): for batch in loader: ...``.
    ``collate_fn`` defaults to ``dataset.collate``. With ``drop_last`` a final partial batch is skipped.
    """

    def __init__(
        self,
        dataset: Sized,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], DataProto] | None = None,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
        if drop_last and batch_size > len(dataset):
            raise DatasetError(
                f"batch_size={batch_size} is larger than the dataset ({len(dataset)} prompts after filtering), "
                f"so drop_last leaves no batch; lower data.train_batch_size or add prompts"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn or dataset.collate
        self.order = EpochOrder(len(dataset), shuffle=shuffle, seed=seed)
        self.epoch = 0
        self.batches_taken = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[DataProto]:
        indices = self.order.indices(self.epoch)
        while self.batches_taken < len(self):
            start = self.batches_taken * self.batch_size
            batch_indices = indices[start : start + self.batch_size]
            # Counted before yielding: a state_dict taken while the caller holds this batch resumes after it.
            self.batches_taken += 1
            yield self.collate_fn([self.dataset[int(i)] for i in batch_indices])
        self.epoch += 1
        self.batches_taken = 0

    def state_dict(self) -> dict[str, int | bool]:
        return {
            "epoch": self.epoch,
            "batches_taken": self.batches_taken,
            "seed": self.order.seed,
            "shuffle": self.order.shuffle,
            "num_samples": self.order.num_samples,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, int | bool]) -> None:
        """Resume from ``state_dict()``; refuses a state saved with another seed, dataset size or batch size."""
        current = self.state_dict()
        changed = [
            f"{key}: saved {state[key]!r}, now {current[key]!r}"
            for key in ("seed", "shuffle", "num_samples", "batch_size")
            if state.get(key) != current[key]
        ]
        if changed:
            raise DatasetError(
                f"the data loader state does not match this loader ({'; '.join(changed)}); resuming would "
                f"replay different batches; restore the original data settings or start a fresh run"
            )
        self.epoch = int(state["epoch"])
        self.batches_taken = int(state["batches_taken"])
