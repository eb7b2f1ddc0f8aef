"""The phase objects' own logic: which samples go on to the update when zero-signal samples are skipped, and
how a batch is reordered so the data-parallel ranks get about the same number of tokens."""

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.phases import balance_batch, rows_with_signal
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


def test_balancing_reorders_the_rows_with_their_columns_and_logs_verls_seqlen_metrics():
    tokens = [10, 10, 10, 10, 1, 1, 1, 1]  # real tokens per sample: rank 0 would get 40, rank 1 gets 4
    attention_mask = (torch.arange(10)[None, :] < torch.tensor(tokens)[:, None]).long()
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    batch = DataProto.from_dict(
        {"attention_mask": attention_mask, "row": torch.arange(8)}, non_tensors={"uid": uids}, meta_info={"t": 1}
    )
    balanced, metrics = balance_batch(batch, num_ranks=2)
    assert balanced is batch  # reordered in place
    assert batch.batch["row"].tolist() == [0, 3, 5, 7, 1, 2, 4, 6]  # rows 0,3,5,7 (22 tokens) on rank 0
    assert list(batch.non_tensor_batch["uid"]) == ["a", "b", "c", "d", "a", "b", "c", "d"]
    assert batch.meta_info == {"t": 1}
    assert metrics == {
        "global_seqlen/min": 4, "global_seqlen/max": 40, "global_seqlen/minmax_diff": 36,
        "global_seqlen/balanced_min": 22, "global_seqlen/balanced_max": 22, "global_seqlen/mean": 22.0,
    }
    empty, no_metrics = balance_batch(batch[0:0], num_ranks=2)
    assert len(empty) == 0 and no_metrics == {}
