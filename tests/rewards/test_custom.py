import sys
import textwrap

import pytest
from ray import cloudpickle

from hybridflow.rewards.custom import CustomRewardError, load_custom_reward_function

USER_FILE = """
from dataclasses import dataclass


@dataclass
class Verdict:
    score: float


def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return {"score": Verdict(float(solution_str == ground_truth)).score + bonus, "length": len(solution_str)}


def _private():
    pass


NOT_A_FUNCTION = 3
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(USER_FILE))
    return path


def test_loads_the_named_function_with_bound_kwargs(user_file):
    plain = load_custom_reward_function(user_file)
    assert plain("ds", "ab", "ab", None) == {"score": 1.0, "length": 2}
    with_bonus = load_custom_reward_function(str(user_file), "compute_score", reward_kwargs={"bonus": 0.5})
    assert with_bonus("ds", "ab", "xy", None)["score"] == 0.5


def test_the_function_pickles_by_value_for_ray_workers(user_file):
    function = load_custom_reward_function(user_file)
    payload = cloudpickle.dumps(function)
    # A Ray worker has never imported the user's file: drop the module and unpickle.
    del sys.modules[function.__module__]
    assert cloudpickle.loads(payload)("ds", "a", "a") == {"score": 1.0, "length": 1}


def test_a_missing_file_is_named_with_the_fix(tmp_path):
    missing = tmp_path / "nowhere.py"
    with pytest.raises(CustomRewardError) as error:
        load_custom_reward_function(missing, "compute_score")
    message = str(error.value)
    assert f"custom_reward_function.path={str(missing)!r} does not exist" in message
    assert "compute_score(data_source, solution_str, ground_truth, extra_info)" in message


def test_a_missing_function_names_the_file_and_what_it_defines(user_file):
    with pytest.raises(CustomRewardError) as error:
        load_custom_reward_function(user_file, "score_it")
    message = str(error.value)
    assert f"custom_reward_function.name='score_it' is not defined in {user_file}" in message
    assert "['compute_score']" in message
    with pytest.raises(CustomRewardError, match="'NOT_A_FUNCTION' is not callable"):
        load_custom_reward_function(user_file, "NOT_A_FUNCTION")


def test_a_syntax_error_is_named_by_file_and_line(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\ndef compute_score(:\n    return 1\n")
    with pytest.raises(CustomRewardError, match=rf"{broken}:2 failed: SyntaxError"):
        load_custom_reward_function(broken)


def test_a_file_that_fails_to_import_is_reported(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_real_module_xyz\n")
    expected = r"importing custom_reward_function.path .*broken.py failed: ModuleNotFoundError"
    with pytest.raises(CustomRewardError, match=expected):
        load_custom_reward_function(broken)


def test_the_same_unchanged_file_runs_its_top_level_once(tmp_path):
    """The config check and the trainer both load the reward function: a file that loads a judge does it once."""
    counter = tmp_path / "imports.txt"
    reward = tmp_path / "reward.py"
    reward.write_text(f"open({str(counter)!r}, 'a').write('x')\ndef compute_score(*args):\n    return 1.0\n")
    first, second = load_custom_reward_function(reward), load_custom_reward_function(reward)
    assert first is second and counter.read_text() == "x"
