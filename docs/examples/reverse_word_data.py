"""Write "reverse this word" prompts as verl-schema parquet (data_source ``reverse_word``).

python docs/examples/reverse_word_data.py --local_dir ~/data/reverse_word --num_train 256 --num_test 32
"""

import argparse
import random

from hybridflow.data.parquet_io import write_train_test

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def make_row(word: str, split: str, index: int) -> dict:
    """One row: the columns RLDataset reads (``data_source``, ``prompt``, ``ability``, ``reward_model``,
    ``extra_info``); ``tools_kwargs`` reach the tools' ``create`` (see reverse_tool.py)."""
    answer = word[::-1]
    return {
        "data_source": "reverse_word",
        "prompt": [{"role": "user", "content": f"Reverse {word}. End with '#### <answer>'."}],
        "ability": "text",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split,
            "index": index,
            "tools_kwargs": {"reverse": {"create_kwargs": {"ground_truth": answer}}},
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="~/data/reverse_word", help="folder for train.parquet and test.parquet")
    parser.add_argument("--num_train", type=int, default=256, help="number of training prompts")
    parser.add_argument("--num_test", type=int, default=32, help="number of test prompts (disjoint from train)")
    parser.add_argument("--word_length", type=int, default=5, help="letters per word")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same files")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    words: dict[str, None] = {}  # distinct words, in the order drawn
    while len(words) < args.num_train + args.num_test:
        words["".join(rng.choice(LETTERS) for _ in range(args.word_length))] = None
    ordered = list(words)
    test = [make_row(word, "test", i) for i, word in enumerate(ordered[: args.num_test])]
    train = [make_row(word, "train", i) for i, word in enumerate(ordered[args.num_test :])]
    paths = write_train_test(train, test, args.local_dir)
    print(f"wrote {len(train)} train and {len(test)} test rows to {paths[0].parent}")


if __name__ == "__main__":
    main()
