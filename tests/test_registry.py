import pytest

from hybridflow.registry import DuplicateNameError, Registry, UnknownNameError


def test_register_get_and_aliases():
    reg = Registry("advantage estimator", "algorithm.adv_estimator")

    @reg.register("grpo", "grpo_alias")
    def grpo():
        return 1

    assert reg.get("grpo") is grpo
    assert reg.get("grpo_alias") is grpo
    assert reg.names() == ["grpo", "grpo_alias"]
    assert "grpo" in reg and len(reg) == 2


def test_unknown_name_lists_valid_names_and_key():
    reg = Registry("advantage estimator", "algorithm.adv_estimator")
    reg.add("gae", lambda: 0)
    reg.add("grpo", lambda: 0)
    with pytest.raises(UnknownNameError) as err:
        reg.get("gpro")
    assert str(err.value) == (
        "algorithm.adv_estimator='gpro' is not a registered advantage estimator; choose one of [gae, grpo]"
    )


def test_duplicate_name_names_both():
    reg = Registry("policy loss")

    def first():
        pass

    def second():
        pass

    reg.add("vanilla", first)
    reg.add("vanilla", first)  # the same object again is harmless (module re-import)
    with pytest.raises(DuplicateNameError, match="first.*second"):
        reg.add("vanilla", second)
