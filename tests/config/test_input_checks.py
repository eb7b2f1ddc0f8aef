"""The input-file and value-range checks on real broken files (the command-line cases are in test_failures_inputs)."""

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.config.input_checks import model_folder_errors, parquet_errors, run_folder_errors
from hybridflow.config.range_checks import SFT_RANGES, range_errors
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.sft import SFTTrainerConfig, _sft_columns

KEY = "actor_rollout_ref.model.path"


@pytest.fixture()
def model(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def test_a_valid_model_folder_passes(model):
    assert model_folder_errors(KEY, str(model)) == []


def test_a_sharded_model_names_the_shard_its_index_lists_but_the_folder_lacks(model):
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    errors = model_folder_errors(KEY, str(model))
    assert errors == [
        f"{KEY}: {model / 'model-00002-of-00002.safetensors'} is missing (named in model.safetensors.index.json); "
        "copy it there"
    ]


def test_a_safetensors_file_cut_inside_its_header_or_its_data_is_named_with_its_sizes(model):
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    header_length = int.from_bytes(data[:8], "little")
    weights.write_bytes(data[: 8 + header_length + 10])  # the header whole, 10 bytes of the data
    [error] = model_folder_errors(KEY, str(model))
    assert f"{weights} is truncated ({8 + header_length + 10} bytes, its header describes {len(data)})" in error
    weights.write_bytes(data[:100])
    [error] = model_folder_errors(KEY, str(model))
    assert f"{weights} is truncated (100 bytes, shorter than its own header)" in error


def _write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


PROMPT = [{"role": "user", "content": "1+1?"}]


def test_a_prompt_that_is_not_chat_messages_is_named_by_its_row(tmp_path):
    path = _write(tmp_path / "t.parquet", [{"prompt": PROMPT}, {"prompt": PROMPT}, {"prompt": [{"text": "hi"}]}])
    errors = parquet_errors("data.train_files", [str(path)], lambda _: {"data.prompt_key": "prompt"}, "prompt")
    assert len(errors) == 1 and f"{path} row 2: 'prompt' is a list, not a list of" in errors[0]


def test_an_sft_file_needs_its_messages_or_its_prompt_and_response(tmp_path):
    data = SFTTrainerConfig().data
    conversations = _write(tmp_path / "c.parquet", [{"messages": PROMPT}])
    pairs = _write(tmp_path / "p.parquet", [{"prompt": "1+1?"}])
    assert parquet_errors("data.train_files", str(conversations), _sft_columns(data)) == []
    assert parquet_errors("data.train_files", str(pairs), _sft_columns(data)) == [
        f"data.response_key='response' is not a column of {pairs} (columns: ['prompt']); set data.response_key"
    ]
    data.multiturn.enable = True
    assert parquet_errors("data.train_files", str(pairs), _sft_columns(data)) == [
        f"data.multiturn.messages_key='messages' is not a column of {pairs} (columns: ['prompt']); "
        "set data.multiturn.messages_key"
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_run_folder_is_refused(tmp_path):
    tmp_path.chmod(0o500)
    try:
        [error] = run_folder_errors("trainer.default_local_dir", str(tmp_path / "run"))
    finally:
        tmp_path.chmod(0o700)
    assert f"({tmp_path} is read-only for this user)" in error


def test_a_run_folder_that_exists_or_can_be_created_passes(tmp_path):
    assert run_folder_errors("trainer.default_local_dir", str(tmp_path / "a" / "b")) == []
    assert run_folder_errors("trainer.default_local_dir", str(tmp_path)) == []


def test_each_value_out_of_its_range_is_one_line_with_the_range():
    config = PPOTrainerConfig()
    assert range_errors(config) == []
    config.actor_rollout_ref.actor.optim.lr = -1e-6
    config.actor_rollout_ref.actor.grad_clip = 0.0
    config.algorithm.gamma = float("nan")
    assert range_errors(config) == [
        "actor_rollout_ref.actor.optim.lr=-1e-06 is out of range; it must satisfy 0 <= lr",
        "actor_rollout_ref.actor.grad_clip=0.0 is out of range; it must satisfy 0 < grad_clip",
        "algorithm.gamma=nan is out of range; it must satisfy 0 <= gamma <= 1",
    ]


def test_the_sft_ranges_hold_for_its_defaults_and_catch_a_zero_clip():
    config = SFTTrainerConfig()
    assert range_errors(config, SFT_RANGES) == []
    config.optim.clip_grad = 0
    assert range_errors(config, SFT_RANGES) == ["optim.clip_grad=0 is out of range; it must satisfy 0 < clip_grad"]


def test_more_gpus_per_node_than_this_machine_has_is_refused_unless_a_cluster_is_joined(monkeypatch):
    import torch

    from hybridflow.config.environment import gpu_count_errors

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # this CPU machine has none to count
    assert gpu_count_errors(2) == []
    assert gpu_count_errors(8) == [
        "trainer.n_gpus_per_node=8 but this machine has 2 GPU(s); set trainer.n_gpus_per_node=2 "
        "(or join a cluster with ray_kwargs.ray_init.address)"
    ]
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert gpu_count_errors(8) == []
