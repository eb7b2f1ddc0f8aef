"""Write synthetic arithmetic prompts (``7+3*12``, answer after ``####``) as verl-schema parquet files.

python examples/data_preprocess/arithmetic.py --local_dir ~/data/arithmetic --num_train 1000 --num_test 100
"""

from __future__ import annotations

import argparse
import pathlib

from hybridflow.data.parquet_io import write_train_test
from hybridflow.data.synthetic import arithmetic_problems, train_test_rows


def main(argv: list[str] | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/arithmetic", help="folder for train.parquet and test.parquet")
    parser.add_argument("--num_train", type=int, default=1000, help="number of training prompts")
    parser.add_argument("--num_test", type=int, default=100, help="number of test prompts (disjoint from train)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    parser.add_argument("--num_operands", type=int, default=2, help="numbers per expression (difficulty)")
    parser.add_argument("--max_value", type=int, default=50, help="largest operand (difficulty)")
    parser.add_argument("--operators", default="+-*", help="operators to draw from, a subset of '+-*'")
    args = parser.parse_args(argv)
    problems = arithmetic_problems(
        args.num_train + args.num_test, args.seed, args.num_operands, args.max_value, args.operators
    )
    train_rows, test_rows = train_test_rows(problems, args.num_test, data_source="arithmetic", ability="math")
    paths = write_train_test(train_rows, test_rows, args.local_dir)
    print(f"wrote {len(train_rows)} train and {len(test_rows)} test rows to {paths[0].parent}")
    return paths


if __name__ == "__main__":
    main()
