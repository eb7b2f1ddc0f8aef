"""The scripts in examples/data_preprocess/, run on local files (no network)."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.rl_dataset import RLDataset
from hybridflow.rewards.scoring import default_compute_score
from tests.trainer.cli import HANG_GUARD_S

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "data_preprocess"


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"preprocess_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(path):
    return pq.read_table(path).to_pylist()


@pytest.mark.parametrize("task", ["arithmetic", "countdown", "sorting"])
def test_synthetic_scripts_write_disjoint_loadable_splits(task, tmp_path, tokenizer):
    script = load_script(task)
    sizes = ["--num_train", "40", "--num_test", "10", "--seed", "3"]
    train_path, test_path = script.main(["--local_dir", str(tmp_path), *sizes])
    assert (train_path, test_path) == (tmp_path / "train.parquet", tmp_path / "test.parquet")
    train, test = read(train_path), read(test_path)
    assert len(train) == 40 and len(test) == 10
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in test}
    assert {r["extra_info"]["split"] for r in test} == {"test"}
    # Read back, the reference answers still score 1.0 (ground truths survive the parquet round trip).
    for row in train[:10]:
        answer, truth = row["extra_info"]["answer"], row["reward_model"]["ground_truth"]
        assert default_compute_score(row["data_source"], answer, truth)["score"] == 1.0
    dataset = RLDataset([train_path, test_path], tokenizer, max_prompt_length=128)
    assert len(dataset) == 50 and dataset.data_sources() == [task]
    script.main(["--local_dir", str(tmp_path / "again"), *sizes])
    assert read(tmp_path / "again" / "train.parquet") == train


def test_a_script_runs_from_the_command_line(tmp_path):
    completed = subprocess.run(
        [sys.executable, SCRIPTS / "sorting.py", "--local_dir", tmp_path, "--num_train", "5", "--num_test", "2"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert completed.returncode == 0, completed.stderr
    assert "wrote 5 train and 2 test rows" in completed.stdout
    assert len(read(tmp_path / "test.parquet")) == 2


GSM8K_RECORDS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,200 plus $34. Total?", "answer": "1200+34=1234\n#### 1,234"},
    {"question": "Half of 10?", "answer": "10/2=5\n#### 5"},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_gsm8k_from_github_jsonl(tmp_path, tokenizer):
    source = tmp_path / "gsm8k"
    source.mkdir()
    write_jsonl(source / "train.jsonl", GSM8K_RECORDS)
    write_jsonl(source / "test.jsonl", GSM8K_RECORDS[:1])
    args = ["--local_path", str(source), "--local_dir", str(tmp_path / "out")]
    train_path, test_path = load_script("gsm8k").main(args)
    train = read(train_path)
    assert [row["reward_model"]["ground_truth"] for row in train] == ["7", "1234", "5"]
    row = train[1]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user"
    content, record = row["prompt"][0]["content"], GSM8K_RECORDS[1]
    assert content.startswith(record["question"]) and "####" in content
    assert row["extra_info"] == {"split": "train", "index": 1, **record}
    # The reference solution scores 1.0 under the gsm8k rule.
    result = default_compute_score("openai/gsm8k", record["answer"], row["reward_model"]["ground_truth"])
    assert result["score"] == 1.0
    assert len(read(test_path)) == 1
    assert len(RLDataset(train_path, tokenizer, max_prompt_length=256)) == 3


def test_gsm8k_from_hugging_face_parquet_with_a_seeded_subset(tmp_path):
    source = tmp_path / "hf" / "main"
    source.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(GSM8K_RECORDS), source / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(GSM8K_RECORDS), source / "test-00000-of-00001.parquet")
    args = ["--local_path", str(tmp_path / "hf"), "--local_dir", str(tmp_path / "out")]
    args += ["--num_train", "2", "--seed", "1"]
    train_path, test_path = load_script("gsm8k").main(args)
    train = read(train_path)
    assert len(train) == 2 and len(read(test_path)) == 3
    questions = [record["question"] for record in GSM8K_RECORDS]
    assert [row["extra_info"]["question"] for row in train] == sorted(
        (row["extra_info"]["question"] for row in train), key=questions.index
    )


def test_gsm8k_reports_missing_files_and_bad_rows(tmp_path):
    script = load_script("gsm8k")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"expected one GSM8K train file .* found none"):
        script.main(["--local_path", str(tmp_path / "empty"), "--local_dir", str(tmp_path / "out")])
    bad = tmp_path / "bad"
    bad.mkdir()
    write_jsonl(bad / "train.jsonl", [{"question": "q", "answer": "no marker"}])
    write_jsonl(bad / "test.jsonl", GSM8K_RECORDS)
    with pytest.raises(ValueError, match=r"train.jsonl row 0: GSM8K rows need 'question' and an 'answer'"):
        script.main(["--local_path", str(bad), "--local_dir", str(tmp_path / "out")])
