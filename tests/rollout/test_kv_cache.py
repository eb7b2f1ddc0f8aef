"""RoomyLayer holds what transformers' DynamicLayer holds, writing new columns into spare room."""

import torch
from transformers.cache_utils import DynamicLayer

from hybridflow.rollout.kv_cache import RoomyLayer, cache_bytes, roomy_cache


def test_a_roomy_layer_holds_what_a_dynamic_layer_holds_through_growth_selection_and_trimming():
    roomy, dynamic = RoomyLayer(headroom=3), DynamicLayer()
    generator = torch.Generator().manual_seed(0)
    buffers = []
    for new in (5, 1, 1, 1, 1, 2, 1, 1):  # a prefill (5 + 3 columns), then decode steps; room runs out twice
        keys, values = torch.randn(4, 2, new, 8, generator=generator), torch.randn(4, 2, new, 8, generator=generator)
        got, expected = roomy.update(keys, values), dynamic.update(keys, values)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        buffers.append(roomy._key_buffer.data_ptr())
    assert len(set(buffers)) == 3, "a decode step writes into the room; only a full buffer is replaced"
    rows = torch.tensor([3, 1])
    roomy.reorder_cache(rows)
    dynamic.reorder_cache(rows)
    roomy.drop_left(2)
    assert torch.equal(roomy.keys, dynamic.keys[:, :, 2:]) and torch.equal(roomy.values, dynamic.values[:, :, 2:])
    step = torch.ones(2, 2, 1, 8)
    keys, values = roomy.update(step, step)
    assert keys.shape[2] == dynamic.get_seq_length() - 2 + 1 and torch.equal(keys[:, :, -1:], step)


def test_the_cache_counts_its_room_and_models_with_other_layers_keep_their_own(tiny_model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    cache = roomy_cache(config, headroom=10)
    cache.layers[0].update(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8))
    assert cache_bytes(cache) == 2 * (1 * 2 * 14 * 8) * 4
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    config.sliding_window = 16
    assert roomy_cache(config, headroom=10) is None
