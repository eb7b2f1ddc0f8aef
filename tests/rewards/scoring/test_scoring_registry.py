import pytest

from hybridflow.rewards.scoring import (
    SCORING_FUNCTIONS,
    UnknownDataSourceError,
    check_data_sources,
    default_compute_score,
)


@pytest.mark.parametrize(
    "data_source, response, ground_truth",
    [
        ("openai/gsm8k", "#### 4", "4"),
        ("gsm8k", "#### 4", "4"),
        ("lighteval/MATH", r"\boxed{4}", "4"),
        ("math", r"\boxed{4}", "4"),
        ("arithmetic", "#### 4", "4"),
        ("countdown", "#### 2+2", {"target": 4, "numbers": [2, 2]}),
        ("sorting", "#### 1 4", "1 4"),
    ],
)
def test_each_data_source_reaches_its_function(data_source, response, ground_truth):
    assert data_source in SCORING_FUNCTIONS
    assert default_compute_score(data_source, response, ground_truth, {"index": 0})["score"] == 1.0


def test_an_unknown_data_source_names_the_choices_and_the_custom_function_fix():
    with pytest.raises(UnknownDataSourceError) as error:
        default_compute_score("my/private_set", "#### 4", "4")
    message = str(error.value)
    assert "data_source='my/private_set' is not a registered scoring function" in message
    assert "openai/gsm8k" in message and "countdown" in message
    assert "custom_reward_function.path" in message


def test_check_data_sources_lists_every_unknown_one():
    check_data_sources(["gsm8k", "sorting"])
    with pytest.raises(UnknownDataSourceError, match=r"\['a', 'b'\] has no registered scoring function"):
        check_data_sources(["b", "gsm8k", "a", "a"])
