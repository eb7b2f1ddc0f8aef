"""The docs stay true to the code.

- docs/config_reference.md equals a fresh run of docs/gen_config_reference.py;
- every code block the docs mark ``<!-- example: PATH -->`` or ``<!-- example: PATH::test_name -->`` is that
  file or that test function, verbatim, and every file under docs/examples/ is shown somewhere;
- the examples run: each has a test below (the estimator, loss and scoring function are registered into
  copies of the registries, so other tests never see them);
- the shell blocks marked ``<!-- run by tests/test_docs.py -->`` run as written (slow: they train).
"""

import asyncio
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

from hybridflow.algos import advantage_registry, get_adv_estimator_fn, get_policy_loss_fn
from hybridflow.algos.policy_losses import POLICY_LOSSES, PolicyLossConfig
from hybridflow.rewards import (
    SCORING_FUNCTIONS,
    check_data_sources,
    default_compute_score,
    load_custom_reward_function,
    load_reward_manager_class,
)
from hybridflow.rewards.response_batch import ResponseBatch
from hybridflow.rewards.timed_calls import CallOutcome
from hybridflow.rollout.tools import load_tools
from tests.trainer.cli import HANG_GUARD_S

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
EXAMPLES = DOCS / "examples"
RUN_MARKER = "<!-- run by tests/test_docs.py -->"
REGENERATE = "python docs/gen_config_reference.py"


def _load_file(path: pathlib.Path, module_name: str):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------- config reference
def test_config_reference_is_current():
    generator = _load_file(DOCS / "gen_config_reference.py", "gen_config_reference")
    fresh = generator.generate()
    committed = (DOCS / "config_reference.md").read_text()
    assert committed == fresh, f"docs/config_reference.md is stale (the YAML or the schema changed); run: {REGENERATE}"


def test_reference_adds_schema_keys_missing_from_the_yaml_and_refuses_keys_without_help(tmp_path):
    generator = _load_file(DOCS / "gen_config_reference.py", "gen_config_reference")
    text = (REPO / "hybridflow/config/yaml/ppo_trainer.yaml").read_text()
    without_seed = tmp_path / "no_seed.yaml"
    without_seed.write_text(re.sub(r"\n  seed: 1  #[^\n]*", "", text, count=1))
    assert "| `data.seed` | `1` | Seed of the shuffle." in generator.generate(without_seed)
    undocumented = tmp_path / "undocumented.yaml"
    undocumented.write_text(text.replace("data:\n", "data:\n  made_up_key: 3\n", 1))
    with pytest.raises(generator.MissingHelpError, match="data.made_up_key"):
        generator.generate(undocumented)


@pytest.mark.parametrize(
    "config_name, schema_path",
    [
        ("ppo_trainer", "hybridflow.config.schema:PPOTrainerConfig"),
        ("sft_trainer", "hybridflow.config.sft:SFTTrainerConfig"),
    ],
)
def test_each_yaml_comment_is_its_keys_schema_help(config_name, schema_path):
    """One text per key: the YAML's inline comment (what a reader of the YAML sees) is the schema field's help
    (what errors and the reference quote), in both trainers' YAMLs, so the two cannot drift apart."""
    import importlib

    import yaml

    generator = _load_file(DOCS / "gen_config_reference.py", "gen_config_reference")
    module, name = schema_path.split(":")
    schema = generator.schema_entries(getattr(importlib.import_module(module), name))
    text = (REPO / f"hybridflow/config/yaml/{config_name}.yaml").read_text()
    lines = text.splitlines()
    drifted = []

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            if isinstance(value_node, yaml.MappingNode) and value_node.value:
                walk(value_node, f"{key}.")
                continue
            comment = generator._comment(lines[value_node.end_mark.line][value_node.end_mark.column :])
            help_text = schema.get(key, ("", None))[1]
            if comment and help_text and comment != help_text:
                drifted.append(f"{key}: yaml {comment!r} != help {help_text!r}")

    walk(yaml.compose(text), "")
    assert not drifted, "\n".join(drifted)


# ------------------------------------------------------------------------------ examples shown verbatim
def _doc_examples() -> list[tuple[str, str, str | None, str]]:
    """(doc file, path, test function or None, code) for every example block of every doc."""
    sync = _load_file(DOCS / "sync_examples.py", "sync_examples")
    return [
        (doc.name, match["path"], match["function"], match["code"])
        for doc in sorted(DOCS.glob("*.md"))
        for match in sync.EXAMPLE_BLOCK.finditer(doc.read_text())
    ]


def test_docs_show_the_example_files_and_tests_verbatim():
    sync = _load_file(DOCS / "sync_examples.py", "sync_examples")
    examples = _doc_examples()
    assert len(examples) >= 9
    for doc, path, function, code in examples:
        shown = f"{path}::{function}" if function else path
        stale = f"docs/{doc} shows an old {shown}; run: python docs/sync_examples.py"
        assert code == sync.source_of(path, function), stale


def test_every_example_file_is_shown_in_a_doc():
    shown = {path for _, path, _, _ in _doc_examples()}
    for example in sorted(EXAMPLES.iterdir()):
        if example.suffix in (".py", ".yaml"):
            assert str(example.relative_to(REPO)) in shown, f"{example.name} is in docs/examples but no doc shows it"


# ---------------------------------------------------------------------------------------- the examples
@pytest.fixture
def registered_examples(monkeypatch):
    """The example estimator, loss and scoring function, registered into copies of the registries."""
    for registry in (advantage_registry.ADV_ESTIMATORS, POLICY_LOSSES, SCORING_FUNCTIONS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
        monkeypatch.setattr(registry, "_aliases", dict(registry._aliases))
        monkeypatch.setattr(registry, "_traits", dict(registry._traits))
    for name in ("batch_mean_advantage", "single_clip_policy_loss", "reverse_word_scoring"):
        _load_file(EXAMPLES / f"{name}.py", f"docs_example_{name}")


@pytest.mark.usefixtures("registered_examples")
def test_batch_mean_advantage_hand_computed():
    estimate = get_adv_estimator_fn("batch_mean")
    # The two samples score 1.0 and 0.0 (row sums), so the batch mean is 0.5.
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    advantages, returns = estimate(token_level_rewards=rewards, response_mask=mask, gamma=1.0)
    assert torch.equal(advantages, torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]))
    assert torch.equal(returns, advantages)
    assert advantage_registry.ADV_ESTIMATORS.traits("batch_mean")["requires"] == frozenset()  # no values, no uid groups


@pytest.mark.usefixtures("registered_examples")
def test_single_clip_policy_loss_hand_computed():
    loss_fn = get_policy_loss_fn("single_clip")
    old_log_prob = torch.zeros(1, 2)
    log_prob = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5
    advantages = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, metrics = loss_fn(old_log_prob, log_prob, advantages, mask, config=PolicyLossConfig())
    # Token 1: max(-1.5, -1.2) = -1.2. Token 2: max(0.5, 0.8) = 0.8. Token mean: -0.2. Both clipped.
    assert loss.item() == pytest.approx(-0.2)
    assert metrics["pg_clipfrac"] == 1.0


@pytest.mark.usefixtures("registered_examples")
def test_reverse_word_scoring():
    assert default_compute_score("reverse_word", "hello reversed is #### olleh", "olleh") == {
        "score": 1.0,
        "acc": 1.0,
        "pred": "olleh",
    }
    assert default_compute_score("reverse_word", "olleh", "olleh")["score"] == 0.0  # no '####'
    check_data_sources(["reverse_word"])  # what main_ppo checks before it starts


def test_length_reward_file():
    compute_score = load_custom_reward_function(EXAMPLES / "length_reward.py", "compute_score", {"target_length": 4})
    assert compute_score("arithmetic", "abcd", "7")["score"] == 1.0
    assert compute_score("arithmetic", "ab", "7")["score"] == 0.5
    assert compute_score("arithmetic", "7", "7") == {"score": 0.25, "acc": 1.0}


def test_bonus_reward_manager_file():
    manager_class = load_reward_manager_class(str(EXAMPLES / "bonus_reward_manager.py"), "BonusRewardManager")
    manager = manager_class(None, bonus=0.5)  # scoring results needs no tokenizer (decoding does)
    responses = ResponseBatch(["a", "b"], ["arithmetic"] * 2, ["1", "2"], [None, None], [1, 1], 1)
    results, _ = manager.score(responses, [CallOutcome("ok", 1.0), CallOutcome("ok", {"score": 0.0, "acc": 1.0})])
    manager.close()
    assert results == [{"score": 1.5}, {"score": 0.5, "acc": 1.0}]


def test_reverse_tool_from_the_yaml(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # what PYTHONPATH=docs/examples does for the workers
    tools = load_tools(EXAMPLES / "tools.yaml")
    assert sorted(tools) == ["calculator", "reverse"]
    reverse = tools["reverse"]
    assert reverse.schema["function"]["parameters"]["required"] == ["text"]

    async def one_sample():
        await reverse.create("sample-0", ground_truth="olleh")
        solved = await reverse.execute("sample-0", {"text": "hello"})
        unsolved = await reverse.execute("sample-0", {"text": "abc"})
        await reverse.release("sample-0")
        return solved, unsolved

    solved, unsolved = asyncio.run(one_sample())
    assert (solved.text, solved.reward) == ("olleh", 1.0)
    assert (unsolved.text, unsolved.reward) == ("cba", 0.0)


def test_reverse_word_data_loads_as_an_rl_dataset(tmp_path, tiny_model_dir):
    from hybridflow.data.rl_dataset import RLDataset
    from hybridflow.models.loading import load_tokenizer

    script = _load_file(EXAMPLES / "reverse_word_data.py", "docs_example_reverse_word_data")
    script.main(["--local_dir", str(tmp_path), "--num_train", "6", "--num_test", "2"])
    dataset = RLDataset(tmp_path / "train.parquet", load_tokenizer(tiny_model_dir), max_prompt_length=96)
    assert len(dataset) == 6 and dataset.data_sources() == ["reverse_word"]
    item = dataset[0]
    word = item["raw_prompt"][0]["content"].split()[1].rstrip(".")
    assert item["reward_model"]["ground_truth"] == word[::-1]
    assert item["tools_kwargs"] == {"reverse": {"create_kwargs": {"ground_truth": word[::-1]}}}
    assert len(RLDataset(tmp_path / "test.parquet", load_tokenizer(tiny_model_dir), max_prompt_length=96)) == 2


# ----------------------------------------------------------------------------------- commands that run
def _marked_shell_blocks(doc: pathlib.Path) -> list[str]:
    return re.findall(re.escape(RUN_MARKER) + r"\n```bash\n(.*?)```", doc.read_text(), re.S)


def _run_in_sandbox(blocks: list[str], tmp_path: pathlib.Path, home: pathlib.Path) -> pathlib.Path:
    """Run the blocks with bash from a folder that looks like the repository root; ``~`` is ``home``."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "docs"):
        (work / name).symlink_to(REPO / name)
    ray_tmp = tempfile.mkdtemp(prefix="hd", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": ray_tmp,
        "OMP_NUM_THREADS": "1",
        "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("RAY_ADDRESS", None)
    try:
        for block in blocks:
            command = ["bash", "-euo", "pipefail", "-c", block]
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
            assert done.returncode == 0, f"{block}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return work


def _logged_steps(run_dir: pathlib.Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_quickstart_commands_run(tmp_path):
    blocks = _marked_shell_blocks(DOCS / "quickstart.md")
    assert len(blocks) == 2
    home = tmp_path / "home"
    home.mkdir()
    work = _run_in_sandbox(blocks, tmp_path, home)
    run_dir = work / "checkpoints" / "hybridflow" / "grpo_arithmetic"
    assert _logged_steps(run_dir) == [0, 1, 2]
    assert (run_dir / "latest").read_text().strip() == "global_step_2"
    assert (run_dir / "global_step_2" / "driver_state.pt").is_file()
    assert (run_dir / "global_step_2" / "actor" / "huggingface" / "config.json").is_file()


@pytest.mark.slow
def test_extending_launcher_command_runs(tmp_path, tiny_model_dir):
    blocks = _marked_shell_blocks(DOCS / "extending.md")
    assert len(blocks) == 1
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / "tiny").symlink_to(tiny_model_dir)
    work = _run_in_sandbox(blocks, tmp_path, home)
    assert _logged_steps(work / "checkpoints" / "hybridflow" / "reverse_word") == [0, 1]
