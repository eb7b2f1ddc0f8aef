"""verl's merger command line: merge and test, --backend fsdp accepted, megatron refused in one line."""

import pytest

from hybridflow.model_merger.cli import main
from tests.model_merger.test_merge import LORA, train_one_step_and_save

pytestmark = pytest.mark.usefixtures("process_group")


def test_merge_and_test_as_verl_spells_them(tiny_model_dir, tmp_path, capsys):
    train_one_step_and_save(tiny_model_dir, tmp_path / "actor", LORA)
    actor, merged = str(tmp_path / "actor"), str(tmp_path / "merged")
    assert main(["merge", "--backend", "fsdp", "--local_dir", actor, "--target_dir", merged]) == 0
    assert (tmp_path / "merged" / "config.json").is_file()
    assert main(["test", "--backend", "fsdp", "--local_dir", actor, "--test_hf_dir", merged]) == 0
    assert f"merged checkpoint matches {merged}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "backend, message",
    [
        ("megatron", "error: --backend megatron: hybridflow trains with FSDP2 only and writes no Megatron checkpoints"),
        ("deepspeed", "error: --backend 'deepspeed' is not a checkpoint format hybridflow writes; use --backend fsdp"),
    ],
)
def test_other_backends_are_refused_in_one_line(tmp_path, capsys, backend, message):
    assert main(["merge", "--backend", backend, "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "m")]) == 1
    assert capsys.readouterr().err == message + "\n"
    assert not (tmp_path / "m").exists()


def test_a_folder_that_is_not_a_checkpoint_is_one_line(tmp_path, capsys):
    assert main(["merge", "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "m")]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {tmp_path} has no huggingface/config.json")
