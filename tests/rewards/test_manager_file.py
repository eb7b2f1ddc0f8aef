"""Loading a user's reward manager class from a file, and the traits it takes from the class it derives from."""

import textwrap

import pytest

from hybridflow.rewards import (
    BatchRewardManager,
    CustomRewardError,
    NaiveRewardManager,
    RemoteJudgeManager,
    load_reward_manager_class,
    manager_class_traits,
)


def test_the_class_is_loaded_from_the_file(tmp_path):
    path = tmp_path / "managers.py"
    path.write_text(
        textwrap.dedent(
            """
            from hybridflow.rewards import NaiveRewardManager

            class MyManager(NaiveRewardManager):
                pass
            """
        )
    )
    manager_class = load_reward_manager_class(str(path), "MyManager")
    assert manager_class.__name__ == "MyManager" and issubclass(manager_class, NaiveRewardManager)


def test_a_file_that_fails_to_import_is_one_line_naming_the_key(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import no_such_module_here\n")
    with pytest.raises(CustomRewardError) as caught:
        load_reward_manager_class(str(path), "MyManager")
    message = str(caught.value)
    assert message.startswith(f"importing reward.reward_manager.module.path {path} failed: ModuleNotFoundError")
    assert message.endswith("; fix the file") and "\n" not in message


class PlainSubclass(NaiveRewardManager):
    pass


class OwnCall(NaiveRewardManager):
    def __call__(self, data):
        return super().__call__(data)


class BatchSubclass(BatchRewardManager):
    pass


class JudgeSubclass(RemoteJudgeManager):
    pass


@pytest.mark.parametrize(
    ("manager_class", "each_sample", "with_function"),
    [
        (PlainSubclass, True, True),
        (OwnCall, False, True),  # scoring in parts while generating would bypass its __call__
        (BatchSubclass, False, True),
        (JudgeSubclass, True, False),
    ],
)
def test_traits_come_from_the_nearest_registered_class(manager_class, each_sample, with_function):
    traits = manager_class_traits(manager_class)
    assert traits["scores_each_sample"] is each_sample
    assert traits["scores_with_function"] is with_function
