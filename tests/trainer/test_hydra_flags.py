"""Hydra's own flags on main_ppo's command line, as Hydra documents them: printing the composed config
(``--cfg job|hydra|all``, ``-c``, ``--resolve``), ``--info``, ``--help``, choosing the config (``-cn``/``-cp``) and
sweeping (``-m``); each in this process, up to the config check."""

import pathlib
import sys

import pytest

import hybridflow.trainer.main_ppo as main_ppo
from hybridflow.config.command_line import CONFIG_CHECK_ENV, split_hydra_flags

YAML_DIR = pathlib.Path(main_ppo.__file__).parents[1] / "config" / "yaml"


def _run(argv, capsys, monkeypatch, tmp_path) -> tuple[int | None, str]:
    """``python -m hybridflow.trainer.main_ppo <argv>`` with the surface check: exit code (None: returned), output."""
    monkeypatch.setenv(CONFIG_CHECK_ENV, "surface")
    monkeypatch.setattr(sys, "argv", ["main_ppo"])
    monkeypatch.chdir(tmp_path)  # Hydra's output folders
    capsys.readouterr()
    code = None
    try:
        main_ppo.cli(list(argv))
    except SystemExit as stopped:
        code = stopped.code
    out = capsys.readouterr()
    return code, out.out + out.err


def test_flags_and_their_values_are_told_from_overrides():
    argv = ["--cfg", "job", "a=1", "-cn", "ppo_trainer", "--info", "b=2", "--resolve", "-m", "--config-path=/x", "c=3"]
    assert split_hydra_flags(argv) == (
        ["--cfg", "job", "-cn", "ppo_trainer", "--info", "--resolve", "-m", "--config-path=/x"],
        ["a=1", "b=2", "c=3"],
    )
    # An optional value is taken only when the next argument is one.
    assert split_hydra_flags(["--info", "config", "a=1"]) == (["--info", "config"], ["a=1"])


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["-c", "job"], ["--cfg=job"]])
def test_the_composed_job_config_is_printed_and_nothing_runs(flag, base, capsys, monkeypatch, tmp_path):
    code, out = _run(base + flag + ["trainer.total_training_steps=7"], capsys, monkeypatch, tmp_path)
    assert code in (None, 0) and "total_training_steps: 7" in out and "config check passed" not in out
    assert "rollout_n: ${actor_rollout_ref.rollout.n}" in out  # as written, interpolations unresolved


def test_resolve_hydra_and_all(base, capsys, monkeypatch, tmp_path):
    _, resolved = _run(base + ["--cfg", "job", "--resolve"], capsys, monkeypatch, tmp_path)
    assert "rollout_n: 2" in resolved and "${actor_rollout_ref.rollout.n}" not in resolved
    _, hydra = _run(base + ["--cfg", "hydra"], capsys, monkeypatch, tmp_path)
    assert hydra.lstrip().startswith("hydra:") and "actor_rollout_ref:" not in hydra
    _, both = _run(base + ["--cfg", "all"], capsys, monkeypatch, tmp_path)
    assert "hydra:" in both and "actor_rollout_ref:" in both


def test_info_and_help(capsys, monkeypatch, tmp_path):
    _, info = _run(["--info", "config"], capsys, monkeypatch, tmp_path)
    assert "Config search path" in info
    code, help_text = _run(["--help"], capsys, monkeypatch, tmp_path)
    assert code in (None, 0) and "powered by Hydra" in help_text and "Configuration groups" in help_text


def test_the_config_is_chosen_by_name_and_path(base, capsys, monkeypatch, tmp_path):
    for flags in (
        ["-cn", "ppo_trainer"],
        ["--config-name", "ppo_trainer"],
        ["-cp", str(YAML_DIR), "-cn", "ppo_trainer"],
    ):
        _, out = _run(base + flags + ["--cfg", "job"], capsys, monkeypatch, tmp_path)
        assert "actor_rollout_ref:" in out, flags
    _, out = _run(
        base + ["-cp", str(YAML_DIR), "-cn", "one_step_off_ppo_trainer", "--cfg", "job"], capsys, monkeypatch, tmp_path
    )
    assert "bypass_mode: true" in out  # one_step_off_ppo_trainer.yaml over ppo_trainer.yaml
    code, out = _run(["-cn", "ppo_megatron_trainer"], capsys, monkeypatch, tmp_path)
    assert code != 0 and "-cn ppo_megatron_trainer needs the Megatron training engine" in out


@pytest.mark.parametrize("path", [["--config-path=config"], ["-cp", "config"], ["--config-path", "config"]])
def test_verls_own_config_folder_is_hybridflows(path, base, capsys, monkeypatch, tmp_path):
    # verl's scripts name their entry point's config folder, relative to it, and a file of it
    flags = path + ["--config-name=fully_async_ppo_trainer.yaml", "--cfg", "job"]
    _, out = _run(base + flags, capsys, monkeypatch, tmp_path)
    assert "total_rollout_steps: 100" in out, out[-2000:]  # set by fully_async_ppo_trainer.yaml


def test_a_sweep_runs_one_run_after_another_each_in_its_own_folder(base, capsys, monkeypatch, tmp_path):
    base = [arg for arg in base if not arg.startswith("trainer.default_local_dir=")]
    sweep = ["-m", "trainer.total_training_steps=1,2"]
    code, out = _run(base + sweep, capsys, monkeypatch, tmp_path)
    assert code != 0 and "each would resume from the one before" in out and "\n" not in out.strip()
    folders = []
    load = main_ppo.load_config_with_notes

    def recorded(cfg, check_environment):
        config, notes = load(cfg, check_environment)
        folders.append((config.trainer.total_training_steps, config.trainer.default_local_dir))
        return config, notes

    monkeypatch.setattr(main_ppo, "load_config_with_notes", recorded)
    _, out = _run(base + sweep + ["trainer.default_local_dir=runs/${hydra:job.num}"], capsys, monkeypatch, tmp_path)
    assert out.count("config check passed") == 2
    assert folders == [(1, "runs/0"), (2, "runs/1")]
