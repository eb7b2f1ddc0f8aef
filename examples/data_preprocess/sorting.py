"""Write synthetic sorting prompts (sort a few numbers or letters ascending) as verl-schema parquet files.

python examples/data_preprocess/sorting.py --local_dir ~/data/sorting --num_train 1000 --num_test 100
"""

from __future__ import annotations

import argparse
import pathlib

from hybridflow.data.parquet_io import write_train_test
from hybridflow.data.synthetic import sorting_problems, train_test_rows


def main(argv: list[str] | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/sorting", help="folder for train.parquet and test.parquet")
    parser.add_argument("--num_train", type=int, default=1000, help="number of training prompts")
    parser.add_argument("--num_test", type=int, default=100, help="number of test prompts (disjoint from train)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    parser.add_argument("--length", type=int, default=4, help="items per list (difficulty)")
    parser.add_argument("--items", choices=["digits", "letters"], default="digits", help="what to sort")
    parser.add_argument("--max_value", type=int, default=9, help="largest number when --items digits")
    args = parser.parse_args(argv)
    problems = sorting_problems(args.num_train + args.num_test, args.seed, args.length, args.items, args.max_value)
    train_rows, test_rows = train_test_rows(problems, args.num_test, data_source="sorting", ability="logic")
    paths = write_train_test(train_rows, test_rows, args.local_dir)
    print(f"wrote {len(train_rows)} train and {len(test_rows)} test rows to {paths[0].parent}")
    return paths


if __name__ == "__main__":
    main()
