"""Checkpoints of the actor: exact resumption, atomic saves, and Hugging Face export."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pickle
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.filesystem import FileSystem
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hybridflow.checkpoints.manager import CheckpointError, CheckpointManager
from hybridflow.distributed.worker_host import WorkerHost
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.tracking import metric_names as names
from hybridflow.workers import ActorRolloutRefWorker
from hybridflow.workers import checkpoint as checkpoint_module
from hybridflow.workers.checkpoint import CheckpointContentError, read_manifest
from tests.float_bounds import longest_reduction, model_output_bound

from .helpers import actor_rollout_ref_config, full_parameters, rollout_batch

pytestmark = pytest.mark.usefixtures("process_group")

# Two mini-batches per update, shuffled; warmup then cosine: every piece of state matters for the next step.
RESUME_OVERRIDES = {
    "actor": {
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 2,
        "shuffle": True,
        "optim": {"warmup_style": "cosine", "lr_warmup_steps": 1, "total_training_steps": 4, "min_lr_ratio": 0.1},
    }
}


def make_worker(model_dir, **overrides) -> ActorRolloutRefWorker:
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, **overrides), "actor")
    worker.init_model()
    return worker


def training_batches(worker):
    batches = []
    for seed in (10, 11):
        batch = rollout_batch(8, seed=seed)
        batches.append(batch.union(worker.compute_log_prob(batch)))
    return batches


def test_save_load_then_update_is_bit_identical_to_an_uninterrupted_run(tiny_model_dir, tmp_path):
    uninterrupted = make_worker(tiny_model_dir, **RESUME_OVERRIDES)
    first, second = training_batches(uninterrupted)
    uninterrupted.update_actor(first)
    expected_metrics = uninterrupted.update_actor(second).meta_info["metrics"]

    interrupted = make_worker(tiny_model_dir, **RESUME_OVERRIDES)
    interrupted.update_actor(first)
    interrupted.save_checkpoint(str(tmp_path / "actor"), global_step=1)
    del interrupted
    resumed = make_worker(tiny_model_dir, **RESUME_OVERRIDES)
    manifest = resumed.load_checkpoint(str(tmp_path / "actor"))
    metrics = resumed.update_actor(second).meta_info["metrics"]

    assert manifest["global_step"] == 1 and set(manifest["contents"]) == {"model", "optimizer", "extra"}
    assert without_memory(metrics) == without_memory(expected_metrics)
    expected = full_parameters(uninterrupted.parts["actor"].module)
    for name, tensor in full_parameters(resumed.parts["actor"].module).items():
        assert torch.equal(tensor, expected[name]), name


def test_a_crash_mid_save_leaves_the_previous_checkpoint_usable(tiny_model_dir, tmp_path, monkeypatch):
    worker = make_worker(tiny_model_dir)
    batch = training_batches(worker)[0]
    worker.update_actor(batch)
    saved = full_parameters(worker.parts["actor"].module)
    worker.save_checkpoint(str(tmp_path / "actor"), global_step=1)
    worker.update_actor(batch)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.dcp, "save", crash)
    for target in ("actor", "actor_step2"):
        with pytest.raises(OSError, match="disk full"):
            worker.save_checkpoint(str(tmp_path / target), global_step=2)
    monkeypatch.undo()

    assert not (tmp_path / "actor_step2").exists()
    assert read_manifest(tmp_path / "actor")["global_step"] == 1
    with pytest.raises(CheckpointContentError, match="not a complete checkpoint"):
        worker.load_checkpoint(str(tmp_path / "actor_step2"))
    worker.load_checkpoint(str(tmp_path / "actor"))
    for name, tensor in full_parameters(worker.parts["actor"].module).items():
        assert torch.equal(tensor, saved[name]), name


def _second_save_refused(host: WorkerHost, manager: CheckpointManager) -> tuple[pathlib.Path, str]:
    """Save step 2 through the worker as the driver does, the worker's error pickled as Ray ships it; the step
    folder and the driver's one line."""
    with pytest.raises(CheckpointError) as raised:
        with manager.saving(2) as step_dir:
            try:
                host.execute("actor", "save_checkpoint", (str(step_dir / "actor"),), {"global_step": 2})
            except Exception as error:
                raise pickle.loads(pickle.dumps(error)) from None
    return step_dir, str(raised.value)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_in_a_worker_reaches_the_driver_as_one_line(tiny_model_dir, tmp_path, monkeypatch):
    """DCP's shard writes meet a real ENOSPC (/dev/full); the worker's error, as Ray hands it to the driver,
    becomes the driver's one line, the partial step folder goes and the previous checkpoint stays latest."""
    host = WorkerHost("actor_rollout", 0)
    host.construct({"actor": (ActorRolloutRefWorker, (actor_rollout_ref_config(tiny_model_dir), "actor"), {})}, {})
    host.execute("actor", "init_model", (), {})
    manager = CheckpointManager(tmp_path, "auto")
    with manager.saving(1) as step_dir:
        host.execute("actor", "save_checkpoint", (str(step_dir / "actor"),), {"global_step": 1})

    @contextlib.contextmanager
    def full_disk(self, path, mode):
        with (pathlib.Path("/dev/full") if "w" in mode else pathlib.Path(path)).open(mode) as stream:
            yield stream

    monkeypatch.setattr(FileSystem, "create_stream", full_disk)
    step_dir, message = _second_save_refused(host, manager)
    assert message.startswith(f"disk full while writing checkpoint {step_dir} (") and "\n" not in message
    assert "the previous checkpoint global_step_1 is kept" in message
    assert not step_dir.exists() and manager.resume_dir() == tmp_path / "global_step_1"


def _folder_bytes(folder: pathlib.Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


@pytest.fixture()
def small_filesystem(tmp_path):
    """``mount(bytes)``: a tmpfs of that size, as a user's small disk; skipped where this machine does not let the
    test mount one (it needs root)."""
    mounted = []

    def mount(size: int) -> pathlib.Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)]
        result = subprocess.run(command, capture_output=True)
        if result.returncode:
            pytest.skip(f"cannot mount a small filesystem here: {result.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_a_disk_that_fills_during_a_workers_save_is_one_line(tiny_model_dir, tmp_path, small_filesystem):
    """A real filesystem fills while DCP writes the shard: torch's zip writer says only "unexpected pos" (the
    issue's 98 lines); the worker names it ENOSPC and the driver says it in one line. The disk holds one
    checkpoint and a half, so step 1 fits and step 2, beside it, does not."""
    host = WorkerHost("actor_rollout", 0)
    host.construct({"actor": (ActorRolloutRefWorker, (actor_rollout_ref_config(tiny_model_dir), "actor"), {})}, {})
    host.execute("actor", "init_model", (), {})
    host.execute("actor", "save_checkpoint", (str(tmp_path / "measure" / "actor"),), {"global_step": 1})
    disk = small_filesystem(_folder_bytes(tmp_path / "measure") * 3 // 2)
    manager = CheckpointManager(disk, "auto")
    with manager.saving(1) as step_dir:
        host.execute("actor", "save_checkpoint", (str(step_dir / "actor"),), {"global_step": 1})
    step_dir, message = _second_save_refused(host, manager)
    assert message.startswith(f"disk full while writing checkpoint {step_dir} (") and "\n" not in message
    assert f" MiB free on {disk}); the previous checkpoint global_step_1 is kept" in message
    assert not step_dir.exists() and manager.resume_dir() == disk / "global_step_1"


@pytest.mark.parametrize("model", [{}, {"lora_rank": 4, "lora_alpha": 8}], ids=["full", "lora"])
def test_exported_folder_loads_with_from_pretrained_and_matches_the_actor(tiny_model_dir, tmp_path, model):
    worker = make_worker(tiny_model_dir, model=model)
    batch = training_batches(worker)[0]
    worker.update_actor(batch)
    trained = worker.compute_log_prob(batch).batch["old_log_probs"]
    folder = worker.export_hf(str(tmp_path / "hf"))

    assert not any("lora" in key for key in load_file(f"{folder}/model.safetensors"))
    exported = AutoModelForCausalLM.from_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder).eos_token == "<|im_end|>"
    tensors = batch.batch
    with torch.no_grad():
        log_probs, _ = forward_log_probs(
            exported, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"], response_length=5
        )
    # The same weights unsharded, in one batch: the same sums in other orders (tests/float_bounds.py).
    bound = model_output_bound(trained, longest_reduction(exported.config))
    torch.testing.assert_close(log_probs, trained, rtol=0, atol=bound)


def test_hf_model_in_save_contents_writes_an_exported_folder(tiny_model_dir, tmp_path):
    worker = make_worker(tiny_model_dir, actor={"checkpoint": {"save_contents": ["model", "hf_model"]}})
    worker.save_checkpoint(str(tmp_path / "actor"), global_step=3)
    manifest = json.loads((tmp_path / "actor" / "manifest.json").read_text())
    assert manifest["contents"] == ["model"] and manifest["global_step"] == 3
    assert (tmp_path / "actor" / "huggingface" / "model.safetensors").is_file()
    with pytest.raises(CheckpointContentError, match=r"holds \['model'\], not \['extra'\]"):
        worker.load_checkpoint(str(tmp_path / "actor"))


@pytest.mark.parametrize("model", [{}, {"lora_rank": 4, "lora_alpha": 8}], ids=["full", "lora"])
def test_a_checkpoint_describes_its_model_and_loads_in_one_process(tiny_model_dir, tmp_path, model):
    from peft import LoraConfig, get_peft_model

    worker = make_worker(tiny_model_dir, model=model)
    worker.update_actor(training_batches(worker)[0])
    worker.save_checkpoint(str(tmp_path / "actor"), global_step=1)
    folder = tmp_path / "actor"
    assert AutoTokenizer.from_pretrained(folder / "huggingface").eos_token == "<|im_end|>"
    assert not (folder / "huggingface" / "model.safetensors").exists()  # weights only with hf_model
    assert (folder / "adapter_config.json").is_file() == bool(model)

    rebuilt = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder / "huggingface"))
    if model:
        rebuilt = get_peft_model(rebuilt, LoraConfig.from_pretrained(folder))
    assert checkpoint_module.model_dtype_offline(folder) == torch.float32
    assert checkpoint_module.load_model_offline(folder, rebuilt)["global_step"] == 1
    loaded = dict(rebuilt.named_parameters())
    for name, tensor in full_parameters(worker.parts["actor"].module).items():
        assert torch.equal(loaded[name], tensor), name


def without_memory(metrics):
    """An update's metrics but those measuring the machine's memory."""
    return {name: value for name, value in metrics.items() if name not in names.PERF_MEMORY}
