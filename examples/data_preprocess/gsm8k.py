"""Convert a local copy of GSM8K (arXiv 2110.14168) into verl-schema parquet files (no network needed).

--local_path is a folder holding the dataset's files, e.g. the Hugging Face layout
``main/train-00000-of-00001.parquet`` + ``main/test-00000-of-00001.parquet`` or the GitHub layout
``train.jsonl`` + ``test.jsonl`` (searched recursively; a file's split is read from its name). Rows have
``question`` and ``answer`` (a worked solution ending in ``#### 42``).

    python examples/data_preprocess/gsm8k.py --local_path ~/datasets/gsm8k --local_dir ~/data/gsm8k
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
from typing import Any

import pyarrow.parquet as pq

from hybridflow.data.parquet_io import write_train_test

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Think step by step, then give the final answer after "####".'
_SUFFIXES = (".parquet", ".jsonl", ".json")


def find_split_file(local_path: pathlib.Path, split: str) -> pathlib.Path:
    """The one data file under ``local_path`` whose name starts with ``split`` (``train``/``test``)."""
    matches = sorted(path for path in local_path.rglob(f"{split}*") if path.is_file() and path.suffix in _SUFFIXES)
    if len(matches) != 1:
        found = [str(path) for path in matches] or "none"
        raise FileNotFoundError(
            f"expected one GSM8K {split} file ({split}*.parquet or {split}*.jsonl) under {local_path}, found {found}"
        )
    return matches[0]


def read_records(path: pathlib.Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        records = pq.read_table(path).to_pylist()
    else:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for number, record in enumerate(records):
        if not isinstance(record.get("question"), str) or "####" not in str(record.get("answer", "")):
            raise ValueError(f"{path} row {number}: GSM8K rows need 'question' and an 'answer' ending in '#### <n>'")
    return records


def final_answer(solution: str) -> str:
    """``"... #### 1,234"`` -> ``"1234"``."""
    return solution.split("####")[-1].strip().replace(",", "")


def to_rows(records: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{record['question']} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": final_answer(record["answer"])},
            "extra_info": {"split": split, "index": index, "question": record["question"], "answer": record["answer"]},
        }
        for index, record in enumerate(records)
    ]


def subsample(records: list[dict[str, Any]], num: int | None, seed: int) -> list[dict[str, Any]]:
    """A seeded random ``num`` of the records, in their original order (all of them when ``num`` is None)."""
    if num is None or num >= len(records):
        return records
    keep = sorted(random.Random(seed).sample(range(len(records)), num))
    return [records[i] for i in keep]


def main(argv: list[str] | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_path", required=True, help="folder with the GSM8K train/test parquet or jsonl files")
    parser.add_argument("--local_dir", default="~/data/gsm8k", help="folder for train.parquet and test.parquet")
    parser.add_argument("--num_train", type=int, default=None, help="keep this many training rows (default: all)")
    parser.add_argument("--num_test", type=int, default=None, help="keep this many test rows (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed for choosing the kept rows")
    args = parser.parse_args(argv)
    local_path = pathlib.Path(args.local_path).expanduser()
    if not local_path.is_dir():
        parser.error(f"--local_path {str(local_path)!r} is not a folder")
    splits = {}
    for split, num in (("train", args.num_train), ("test", args.num_test)):
        records = subsample(read_records(find_split_file(local_path, split)), num, args.seed)
        splits[split] = to_rows(records, split)
    paths = write_train_test(splits["train"], splits["test"], args.local_dir)
    print(f"wrote {len(splits['train'])} train and {len(splits['test'])} test rows to {paths[0].parent}")
    return paths


if __name__ == "__main__":
    main()
