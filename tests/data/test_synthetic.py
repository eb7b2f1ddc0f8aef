import pytest

from hybridflow.data.synthetic import (
    arithmetic_problems,
    countdown_problems,
    sorting_problems,
    to_verl_rows,
    train_test_rows,
)
from hybridflow.rewards.scoring import default_compute_score
from hybridflow.rewards.scoring.expression import evaluate_expression

GENERATORS = {
    "arithmetic": lambda seed: arithmetic_problems(60, seed, num_operands=3, max_value=9),
    "countdown": lambda seed: countdown_problems(60, seed, num_numbers=3, max_number=9),
    "sorting": lambda seed: sorting_problems(60, seed, length=4),
}


@pytest.mark.parametrize("task", sorted(GENERATORS))
def test_reference_answers_score_full_marks_and_prompts_are_short(task):
    problems = GENERATORS[task](0)
    assert len({problem.question for problem in problems}) == 60
    for problem in problems:
        assert "####" in problem.question  # the answer convention is stated in the prompt
        assert len(problem.question) <= 70 and len(problem.answer) <= 25
        result = default_compute_score(task, problem.answer, problem.ground_truth)
        assert result["score"] == 1.0, (problem, result)


@pytest.mark.parametrize("task", sorted(GENERATORS))
def test_the_same_seed_gives_the_same_problems(task):
    assert GENERATORS[task](5) == GENERATORS[task](5)
    assert GENERATORS[task](5) != GENERATORS[task](6)


def test_arithmetic_multiplies_before_adding():
    for problem in arithmetic_problems(40, seed=1, num_operands=4, max_value=12):
        expression = problem.question.removeprefix("What is ").split("?")[0]
        value, _ = evaluate_expression(expression)
        assert str(value) == problem.ground_truth


def test_countdown_references_use_every_number_once():
    for problem in countdown_problems(40, seed=2, num_numbers=4, max_number=12, max_target=200):
        value, used = evaluate_expression(problem.answer.removeprefix("#### "))
        assert sorted(used) == problem.ground_truth["numbers"]
        assert value == problem.ground_truth["target"] and 1 <= value <= 200


def test_letters_are_sorted_too():
    problem = sorting_problems(1, seed=0, items="letters", length=5)[0]
    letters = problem.question.removeprefix("Sort ").split(" ascending")[0].split()
    assert problem.ground_truth == " ".join(sorted(letters))


def test_too_small_a_task_space_names_the_knobs():
    with pytest.raises(ValueError, match=r"widen the task \(num_operands, max_value, operators\)"):
        arithmetic_problems(50, seed=0, num_operands=2, max_value=2, operators="+")
    with pytest.raises(ValueError, match="operators drawn from"):
        arithmetic_problems(5, operators="+^")


def test_rows_follow_verls_schema_and_splits_do_not_overlap():
    problems = sorting_problems(10, seed=0)
    train, test = train_test_rows(problems, 3, data_source="sorting", ability="logic")
    assert len(train) == 7 and len(test) == 3
    assert not {row["prompt"][0]["content"] for row in train} & {row["prompt"][0]["content"] for row in test}
    row = to_verl_rows(problems[:1], "sorting", "logic", "train")[0]
    assert row == {
        "data_source": "sorting",
        "prompt": [{"role": "user", "content": problems[0].question}],
        "ability": "logic",
        "reward_model": {"style": "rule", "ground_truth": problems[0].ground_truth},
        "extra_info": {"split": "train", "index": 0, "question": problems[0].question, "answer": problems[0].answer},
    }
