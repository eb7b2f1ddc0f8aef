"""Broken inputs a new user brings (model folders, parquet files, reward files, tool configs, run folders, values),
through the real command line: each is named in one line with exit 2, before Ray or any worker starts.

Each case copies a valid input into ``tmp_path``, breaks one thing, and runs ``main_ppo`` up to the end of its
config check in this process. The assertions name the culprit (key, file, row), never the wording of the fix.
"""

import json
import os
import pathlib
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .failure_harness import assert_refused, check_in_process


def _model_copy(tiny_model_dir, tmp_path) -> pathlib.Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    return folder


def _rows(tiny_parquet) -> list[dict]:
    return pq.read_table(tiny_parquet[0]).to_pylist()


def _write(rows, path) -> pathlib.Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _run(base, overrides, capsys, monkeypatch, tmp_path):
    return check_in_process("main_ppo", base + overrides, capsys, monkeypatch, tmp_path / "cwd")


def _model_case(break_it):
    def case(tiny_model_dir, tiny_parquet, tmp_path):
        folder = _model_copy(tiny_model_dir, tmp_path)
        culprit = break_it(folder)
        return [f"actor_rollout_ref.model.path={folder}"], [str(culprit)]

    return case


def _corrupt_config(folder):
    (folder / "config.json").write_text('{"model_type": "qwen2", ')
    return folder / "config.json"


def _config_without_type(folder):
    config = json.loads((folder / "config.json").read_text())
    config.pop("model_type")
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "config.json"


def _no_weights(folder):
    (folder / "model.safetensors").unlink()
    return folder


def _truncated_weights(folder):
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return weights


def _no_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)
    return folder


def _tokenizer_json_missing(folder):
    (folder / "tokenizer.json").unlink()
    return folder


def _vocabulary_four_times_the_tokenizer(folder):
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] *= 4  # a tokenizer from another model: far fewer tokens than the embedding rows
    (folder / "config.json").write_text(json.dumps(config))
    return f"vocab_size={config['vocab_size']}"


def _data_case(break_it, key="data.train_files"):
    def case(tiny_model_dir, tiny_parquet, tmp_path):
        path = tmp_path / "train.parquet"
        culprit = break_it(path, _rows(tiny_parquet))
        return [f"{key}={path}"], [str(culprit)]

    return case


def _csv_renamed(path, rows):
    path.write_text("prompt,answer\nwhat is 1+1,2\n")
    return path


def _truncated_parquet(path, rows):
    _write(rows, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _empty_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows).slice(0, 0), path)
    return path


def _no_prompt_column(path, rows):
    _write([{k: v for k, v in row.items() if k != "prompt"} for row in rows], path)
    return "prompt"


def _prompt_not_messages(path, rows):
    _write([{**row, "prompt": "What is 1+1?"} for row in rows], path)
    return path


def _prompt_key_case(tiny_model_dir, tiny_parquet, tmp_path):
    return ["data.prompt_key=question"], ["data.prompt_key", "question"]


def _every_prompt_too_long(filtered: bool):
    def case(tiny_model_dir, tiny_parquet, tmp_path):
        return ["data.max_prompt_length=4", f"data.filter_overlong_prompts={str(filtered).lower()}"], [
            "data.max_prompt_length"
        ]

    return case


def _unscored_data_source(tiny_model_dir, tiny_parquet, tmp_path):
    path = _write([{**row, "data_source": "my_new_task"} for row in _rows(tiny_parquet)], tmp_path / "t.parquet")
    return [f"data.train_files={path}"], ["my_new_task"]


def _reward_case(source: str, name: str = "compute_score", culprit: str = "{path}"):
    def case(tiny_model_dir, tiny_parquet, tmp_path):
        path = tmp_path / "my_reward.py"
        path.write_text(source)
        return [f"custom_reward_function.path={path}", f"custom_reward_function.name={name}"], [
            culprit.format(path=path, name=name)
        ]

    return case


def _tool_case(text: str, culprit: str = "{path}"):
    def case(tiny_model_dir, tiny_parquet, tmp_path):
        path = tmp_path / "tools.yaml"
        path.write_text(text)
        return [
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}",
        ], [culprit.format(path=path)]

    return case


def _missing_tool_file(tiny_model_dir, tiny_parquet, tmp_path):
    return [
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'no_tools.yaml'}",
    ], [str(tmp_path / "no_tools.yaml")]


def _run_folder_under_a_file(tiny_model_dir, tiny_parquet, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    return [f"trainer.default_local_dir={blocker / 'run'}"], ["trainer.default_local_dir"]


def _values(*overrides_and_culprit):
    *overrides, culprit = overrides_and_culprit

    def case(tiny_model_dir, tiny_parquet, tmp_path):
        return list(overrides), [culprit]

    return case


RANKS_BEYOND_CORES = 4 * (os.cpu_count() or 1)

CASES = {
    "model config.json not JSON": _model_case(_corrupt_config),
    "model config.json without model_type": _model_case(_config_without_type),
    "model folder without weights": _model_case(_no_weights),
    "truncated safetensors": _model_case(_truncated_weights),
    "model folder without tokenizer files": _model_case(_no_tokenizer),
    "tokenizer.json missing, tokenizer_config.json kept": _model_case(_tokenizer_json_missing),
    "tokenizer far smaller than the model's vocabulary": _model_case(_vocabulary_four_times_the_tokenizer),
    "CSV renamed .parquet": _data_case(_csv_renamed),
    "truncated parquet": _data_case(_truncated_parquet),
    "empty parquet": _data_case(_empty_parquet),
    "parquet without the prompt column": _data_case(_no_prompt_column),
    "prompt not a list of messages": _data_case(_prompt_not_messages),
    "broken validation parquet": _data_case(_csv_renamed, key="data.val_files"),
    "prompt_key naming a missing column": _prompt_key_case,
    "every prompt too long": _every_prompt_too_long(filtered=False),
    "every prompt too long, filtered": _every_prompt_too_long(filtered=True),
    "fewer prompts than a batch": _values("data.train_max_samples=2", "data.train_batch_size"),
    "chat template that is not Jinja": _values(
        "actor_rollout_ref.model.custom_chat_template='{% if %}'", "model.custom_chat_template"
    ),
    "data_source without a scorer": _unscored_data_source,
    "reward file with a syntax error": _reward_case("def compute_score(:\n    return 1\n", culprit="{path}:1"),
    "reward file without the function": _reward_case("def other(**kwargs):\n    return 1.0\n", culprit="compute_score"),
    "reward function with the wrong signature": _reward_case(
        "def compute_score(text):\n    return 1.0\n", culprit="compute_score"
    ),
    "tool config missing": _missing_tool_file,
    "tool config not YAML": _tool_case("tools: [name: calculator\n"),
    "tool without a name or class": _tool_case("tools:\n  - config: {timeout: 5}\n"),
    "tool class not importable": _tool_case("tools:\n  - class_name: no_such_pkg.Tool\n", culprit="no_such_pkg.Tool"),
    "tool class not a tool": _tool_case(
        "tools:\n  - class_name: collections.OrderedDict\n", culprit="collections.OrderedDict"
    ),
    "run folder under a file": _run_folder_under_a_file,
    "negative learning rate": _values("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr"),
    "zero clip ratio": _values("actor_rollout_ref.actor.clip_ratio=0", "actor_rollout_ref.actor.clip_ratio"),
    "discount above 1": _values("algorithm.adv_estimator=gae", "algorithm.gamma=1.5", "algorithm.gamma"),
    "negative temperature": _values(
        "actor_rollout_ref.rollout.temperature=-1", "actor_rollout_ref.rollout.temperature"
    ),
    "top_p above 1": _values("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p"),
    "misspelled engine": _values("actor_rollout_ref.rollout.name=hff", "hff"),
    "two nodes on a local cluster": _values("trainer.nnodes=2", "trainer.nnodes"),
    # Four ranks per core, whatever the machine; the batch splits over them, so only the CPUs are short.
    "more worker CPUs than the machine": _values(
        f"trainer.n_gpus_per_node={RANKS_BEYOND_CORES}",
        f"data.train_batch_size={RANKS_BEYOND_CORES}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={RANKS_BEYOND_CORES}",
        "trainer.n_gpus_per_node",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_broken_input_is_named_before_anything_starts(
    case, base, tiny_model_dir, tiny_parquet, capsys, monkeypatch, tmp_path
):
    overrides, culprits = CASES[case](tiny_model_dir, tiny_parquet, tmp_path)
    error = assert_refused(_run(base, overrides, capsys, monkeypatch, tmp_path), *culprits)
    lines = error.splitlines()
    assert lines[0].startswith("invalid config: " if len(lines) == 1 else "invalid config ("), error
    assert all(culprit in line for line in lines[1:] for culprit in culprits), error


def test_a_vllm_engine_without_vllm_is_one_line(base, capsys, monkeypatch, tmp_path):
    if _installed("vllm"):
        pytest.skip("vLLM is installed here")
    outcome = _run(base, ["actor_rollout_ref.rollout.name=vllm"], capsys, monkeypatch, tmp_path)
    assert_refused(outcome, "actor_rollout_ref.rollout.name=vllm")


def test_six_broken_inputs_are_named_together(base, tiny_model_dir, tiny_parquet, capsys, monkeypatch, tmp_path):
    folder = _model_copy(tiny_model_dir, tmp_path)
    _truncated_weights(folder)
    train = tmp_path / "train.parquet"
    _csv_renamed(train, [])
    [run_folder], _ = _run_folder_under_a_file(tiny_model_dir, tiny_parquet, tmp_path)
    reward_overrides, [reward] = _reward_case("def compute_score(text):\n    return 1.0\n")(None, None, tmp_path)
    overrides = [
        f"actor_rollout_ref.model.path={folder}",
        f"data.train_files={train}",
        run_folder,
        "actor_rollout_ref.actor.optim.lr=-1",
        "actor_rollout_ref.rollout.name=hff",
        *reward_overrides,
    ]
    culprits = ["model.safetensors", str(train), "trainer.default_local_dir", "optim.lr", "hff", reward]
    error = assert_refused(_run(base, overrides, capsys, monkeypatch, tmp_path), *culprits)
    assert error.startswith("invalid config (6 problems):"), error


def test_five_broken_sft_inputs_are_named_together(tiny_model_dir, tiny_parquet, capsys, monkeypatch, tmp_path):
    from .test_sft import sft_overrides

    folder = _model_copy(tiny_model_dir, tmp_path)
    _truncated_weights(folder)
    val = _csv_renamed(tmp_path / "val.parquet", [])
    [run_folder], _ = _run_folder_under_a_file(tiny_model_dir, tiny_parquet, tmp_path)
    overrides = sft_overrides(folder, tiny_parquet, tmp_path / "run", steps=2) + [
        f"data.val_files={val}",
        "data.response_key=answer",
        "optim.lr=-1",
        run_folder,
    ]
    outcome = check_in_process("main_sft", overrides, capsys, monkeypatch, tmp_path / "cwd")
    culprits = ["model.safetensors", str(val), "data.response_key='answer'", "optim.lr=-1", "trainer.default_local_dir"]
    error = assert_refused(outcome, *culprits)
    assert error.startswith("invalid config (5 problems):"), error


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
