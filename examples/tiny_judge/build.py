"""Build the demo's judge: a tiny reward model that says whether a response sorts the prompt's digits.

    python examples/tiny_judge/build.py                  # writes examples/tiny_judge/model (~2 MB)
    python examples/tiny_judge/build.py --steps 20 --out /tmp/judge   # a quick, inaccurate one

No download: everything is made here, from a seed.

1. A random 0.53M-parameter Qwen2 with a one-label token-classification head (hidden 128, 3 layers), the form
   ``reward_model.model.path`` loads (``hybridflow.models.value_model.load_reward_model``). It shares the demo
   base model's tokenizer and chat template, so it reads the policy's token ids as they are.
2. Pairs: every sorting problem except the demo's 200 validation prompts (9,800), each with 2 samples of the
   base model at temperature 1 (the policy's first answers: 16% right), its correct answer and one near miss
   (shuffled, a digit changed, dropped or added, two swapped), labelled by the sorting rule
   (``hybridflow.rewards.scoring``).
3. Training: balanced batches (half right, half wrong) of 128, binary cross-entropy on the score at the last
   real token, computed by ``forward_reward_scores``, the function the reward-model worker runs; AdamW lr 1e-3,
   100 warmup steps, linear decay.
4. Held out: the 200 validation prompts, with 8 base-model samples each (the mix a run starts from) and, apart,
   each prompt's correct answer and a near miss. A score above 0 means "sorted". Accuracies go to
   ``build_info.json`` beside the model.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import time
from dataclasses import dataclass

import torch
from transformers import Qwen2Config, Qwen2ForTokenClassification

from hybridflow.data.synthetic import Problem, sorting_problems
from hybridflow.models.loading import load_causal_lm, load_tokenizer
from hybridflow.models.value_model import forward_reward_scores
from hybridflow.rewards.scoring import default_compute_score

HERE = pathlib.Path(__file__).resolve().parent
BASE_MODEL = HERE.parent / "tiny_base_model" / "model"
NUM_PROBLEMS = 10_000  # every distinct "sort four digits" prompt


@dataclass(frozen=True)
class Pair:
    problem: Problem
    response_ids: tuple[int, ...]  # ends with EOS when the answer ended, as in a rollout
    right: bool


class PairMaker:
    """Prompts and responses as the policy's token ids, labelled by the sorting rule."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id
        self._prompts: dict[str, list[int]] = {}

    def prompt_text(self, problem: Problem) -> str:
        chat = [{"role": "user", "content": problem.question}]
        return self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)

    def prompt_ids(self, problem: Problem) -> list[int]:
        if problem.question not in self._prompts:
            self._prompts[problem.question] = self.tokenizer(self.prompt_text(problem), add_special_tokens=False)[
                "input_ids"
            ]
        return self._prompts[problem.question]

    def pair(self, problem: Problem, response_ids: list[int]) -> Pair:
        text = self.tokenizer.decode([i for i in response_ids if i != self.eos])
        right = default_compute_score("sorting", text, problem.ground_truth)["score"] == 1.0
        return Pair(problem, tuple(response_ids), right)

    def answer(self, problem: Problem, items: list[str]) -> Pair:
        ids = self.tokenizer("#### " + " ".join(items), add_special_tokens=False)["input_ids"] + [self.eos]
        return self.pair(problem, ids)

    def near_miss(self, problem: Problem, rng: random.Random) -> Pair:
        items = problem.ground_truth.split()
        kind = rng.randrange(6)
        if kind == 0:
            rng.shuffle(items)
        elif kind == 1:
            items[rng.randrange(len(items))] = str(rng.randrange(10))
        elif kind == 2:
            i = rng.randrange(len(items) - 1)
            items[i], items[i + 1] = items[i + 1], items[i]
        elif kind == 3:
            del items[rng.randrange(len(items))]
        elif kind == 4:
            items.insert(rng.randrange(len(items) + 1), str(rng.randrange(10)))
        else:
            items = [str(rng.randrange(10)) for _ in items]
        if kind in (1, 4, 5):
            items.sort(key=int)
        return self.answer(problem, items)

    @torch.no_grad()
    def base_samples(self, problems: list[Problem], per_prompt: int, batch_size: int = 500) -> list[Pair]:
        """The base model's answers at temperature 1, up to 16 tokens, cut after EOS."""
        model = load_causal_lm(BASE_MODEL).eval()
        flat = [problem for problem in problems for _ in range(per_prompt)]
        pairs = []
        for start in range(0, len(flat), batch_size):
            chunk = flat[start : start + batch_size]
            inputs = self.tokenizer(
                [self.prompt_text(p) for p in chunk], return_tensors="pt", padding=True, add_special_tokens=False
            )
            output = model.generate(
                **inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=16,
                pad_token_id=self.tokenizer.pad_token_id,
            )  # fmt: skip
            for problem, row in zip(chunk, output[:, inputs["input_ids"].shape[1] :].tolist()):
                pairs.append(self.pair(problem, row[: row.index(self.eos) + 1] if self.eos in row else row))
        return pairs

    def batch(self, pairs: list[Pair]) -> tuple[torch.Tensor, ...]:
        """Right-padded ``input_ids``, ``attention_mask``, ``position_ids`` and the labels (1.0 = right)."""
        rows = [self.prompt_ids(p.problem) + list(p.response_ids) for p in pairs]
        width = max(map(len, rows))
        input_ids = torch.full((len(rows), width), self.tokenizer.pad_token_id)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, : len(row)] = torch.tensor(row)
            attention_mask[index, : len(row)] = 1
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        labels = torch.tensor([float(p.right) for p in pairs])
        return input_ids, attention_mask, position_ids, labels


def new_judge(tokenizer, hidden_size: int, num_layers: int, seed: int) -> Qwen2ForTokenClassification:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        num_labels=1,
        classifier_dropout=0.0,
        token_classification_bias=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForTokenClassification(config)


@torch.no_grad()
def accuracy(judge, maker: PairMaker, pairs: list[Pair]) -> dict[str, float]:
    """Share judged right (score > 0 means "sorted"), and of the right and the wrong pairs apart."""
    judge.eval()
    input_ids, attention_mask, position_ids, labels = maker.batch(pairs)
    said_right = forward_reward_scores(judge, input_ids, attention_mask, position_ids) > 0
    judge.train()
    right = labels == 1
    return {
        "pairs": len(pairs),
        "right_share": round(right.float().mean().item(), 4),
        "accuracy": round((said_right == right).float().mean().item(), 4),
        "accuracy_on_right": round(said_right[right].float().mean().item(), 4) if right.any() else None,
        "accuracy_on_wrong": round((~said_right[~right]).float().mean().item(), 4) if (~right).any() else None,
    }


def train(judge, maker: PairMaker, right: list[Pair], wrong: list[Pair], args, held_out: dict) -> float:
    """AdamW on balanced batches; prints the held-out accuracies every ``--eval_every`` steps; returns seconds."""
    rng = random.Random(args.seed)
    optimizer = torch.optim.AdamW(judge.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 100) * max(0.05, 1 - step / args.steps)
    )
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        half = args.batch_size // 2
        input_ids, attention_mask, position_ids, labels = maker.batch(rng.sample(right, half) + rng.sample(wrong, half))
        scores = forward_reward_scores(judge, input_ids, attention_mask, position_ids)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(scores, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(judge.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % args.eval_every == 0 or step == args.steps:
            report = {name: accuracy(judge, maker, pairs)["accuracy"] for name, pairs in held_out.items()}
            print(f"step {step}: loss {loss.item():.4f}, held-out accuracy {report}", flush=True)
    return time.perf_counter() - start


def split_problems(seed: int, num_train: int, num_val: int) -> tuple[list[Problem], list[Problem]]:
    """The training prompts (every sorting problem but the held-out ones, in seed + 1's order, the first
    ``num_train``) and the held-out ones (the demo's ``num_val`` validation prompts)."""
    val = sorting_problems(num_val, seed=0)
    excluded = {p.question for p in val}
    problems = [p for p in sorting_problems(NUM_PROBLEMS, seed=seed + 1) if p.question not in excluded]
    return problems[:num_train], val


def answer_pairs(maker: PairMaker, training: list[Problem], held_out: list[Problem], seed: int):
    """Each prompt's right answer, then a near miss of each, for the training prompts and then the held-out ones,
    the near misses drawn from one generator seeded by ``seed``."""
    rng = random.Random(seed)

    def of(problems: list[Problem]) -> list[Pair]:
        return [maker.answer(p, p.ground_truth.split()) for p in problems] + [maker.near_miss(p, rng) for p in problems]

    return of(training), of(held_out)


def build(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(BASE_MODEL, padding_side="left")
    maker = PairMaker(tokenizer)
    problems, val = split_problems(args.seed, args.num_train, args.num_val)
    torch.manual_seed(args.seed)
    pairs = maker.base_samples(problems, args.samples_per_prompt)
    trained_answers, held_out_answers = answer_pairs(maker, problems, val, args.seed)
    pairs += trained_answers
    right, wrong = [p for p in pairs if p.right], [p for p in pairs if not p.right]
    held_out = {"base_samples": maker.base_samples(val, 8), "right_answers_and_near_misses": held_out_answers}
    print(f"{len(right)} right and {len(wrong)} wrong training pairs; training {args.steps} steps", flush=True)
    judge = new_judge(tokenizer, args.hidden_size, args.num_layers, args.seed)
    seconds = train(judge, maker, right, wrong, args, held_out)
    out = pathlib.Path(args.out)
    judge.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    info = {
        "seed": args.seed,
        "parameters": sum(p.numel() for p in judge.parameters()),
        "training_pairs": {"right": len(right), "wrong": len(wrong)},
        "steps": args.steps,
        "training_seconds": round(seconds),
        "held_out": {name: accuracy(judge, maker, pairs) for name, pairs in held_out.items()},
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "model"), help="folder to write the judge to")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the pairs and their order")
    parser.add_argument("--hidden_size", type=int, default=128, help="model width (4 attention heads)")
    parser.add_argument("--num_layers", type=int, default=3, help="decoder layers")
    parser.add_argument("--num_train", type=int, default=NUM_PROBLEMS, help="training prompts (at most 9,800)")
    parser.add_argument("--samples_per_prompt", type=int, default=2, help="base-model samples per training prompt")
    parser.add_argument("--num_val", type=int, default=200, help="held-out prompts (the demo's validation set)")
    parser.add_argument("--steps", type=int, default=3000, help="training steps")
    parser.add_argument("--batch_size", type=int, default=128, help="pairs a step, half right and half wrong")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--eval_every", type=int, default=250, help="steps between held-out reports")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    info = build(args)
    print(f"judge written to {args.out}: {json.dumps(info)}")
    return info


if __name__ == "__main__":
    main()
