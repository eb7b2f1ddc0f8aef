"""The phase objects' own logic: which samples go on to the update when zero-signal samples are skipped."""

import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.phases import rows_with_signal
from hybridflow.workers.batching import LOSS_COUNTS_KEY


def _batch(advantages, response_mask):
    advantages, response_mask = torch.tensor(advantages), torch.tensor(response_mask)
    rows = torch.arange(len(advantages))
    return DataProto.from_dict(
        {"advantages": advantages, "response_mask": response_mask, "row": rows}, meta_info={"temperature": 0.7}
    )


def test_samples_with_signal_are_kept_in_order_and_padded_with_inert_rows():
    batch = _batch(
        [[1.0, 0.0], [0.0, 0.0], [0.0, -2.0], [0.0, 3.0], [0.5, 0.5]],
        [[1, 1], [1, 0], [1, 1], [1, 0], [1, 1]],  # row 3's advantage sits on a masked-out token: no signal
    )
    kept = rows_with_signal(batch, num_ranks=2)
    assert kept.batch["row"].tolist() == [0, 2, 4, 0]
    assert kept.batch["response_mask"][-1].sum() == 0 and kept.batch["advantages"][-1].abs().sum() == 0
    assert batch.batch["response_mask"][0].sum() == 2  # the padding copy is not a view of the batch
    assert kept.meta_info == {"temperature": 0.7, LOSS_COUNTS_KEY: {"global_token_count": 8.0, "global_seq_count": 5.0}}


def test_no_sample_with_signal_leaves_an_empty_batch_with_the_whole_counts():
    kept = rows_with_signal(_batch([[0.0, 0.0], [0.0, 0.0]], [[1, 1], [1, 0]]), num_ranks=2)
    assert len(kept) == 0 and kept.batch["advantages"].shape == (0, 2)
    assert kept.meta_info[LOSS_COUNTS_KEY] == {"global_token_count": 3.0, "global_seq_count": 2.0}
