"""Write synthetic countdown prompts (reach a target from a few numbers with + - * /) as verl-schema parquet.

python examples/data_preprocess/countdown.py --local_dir ~/data/countdown --num_train 1000 --num_test 100
"""

from __future__ import annotations

import argparse
import pathlib

from hybridflow.data.parquet_io import write_train_test
from hybridflow.data.synthetic import countdown_problems, train_test_rows


def main(argv: list[str] | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/countdown", help="folder for train.parquet and test.parquet")
    parser.add_argument("--num_train", type=int, default=1000, help="number of training prompts")
    parser.add_argument("--num_test", type=int, default=100, help="number of test prompts (disjoint from train)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    parser.add_argument("--num_numbers", type=int, default=3, help="numbers given per problem (difficulty)")
    parser.add_argument("--max_number", type=int, default=20, help="largest given number")
    parser.add_argument("--max_target", type=int, default=100, help="largest target")
    args = parser.parse_args(argv)
    problems = countdown_problems(
        args.num_train + args.num_test, args.seed, args.num_numbers, args.max_number, args.max_target
    )
    train_rows, test_rows = train_test_rows(problems, args.num_test, data_source="countdown", ability="math")
    paths = write_train_test(train_rows, test_rows, args.local_dir)
    print(f"wrote {len(train_rows)} train and {len(test_rows)} test rows to {paths[0].parent}")
    return paths


if __name__ == "__main__":
    main()
