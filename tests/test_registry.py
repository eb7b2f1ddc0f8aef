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
    assert reg.primary_names() == ["grpo"]
    assert reg.is_alias("grpo_alias") and not reg.is_alias("grpo")
    assert reg.canonical("grpo_alias") == reg.canonical("grpo") == "grpo"
    with pytest.raises(UnknownNameError):
        reg.is_alias("nope")


def test_alias_of_an_alias_stands_for_the_first_name():
    reg = Registry("kl estimator")
    reg.add("low_var_kl", abs)
    reg.add_alias("k3", "low_var_kl")
    reg.add_alias("k3_again", "k3")
    assert reg.get("k3_again") is abs and reg.canonical("k3_again") == "low_var_kl"
    with pytest.raises(UnknownNameError):
        reg.add_alias("k9", "nope")


def test_a_name_registered_twice_raises_even_as_an_alias():
    reg = Registry("advantage estimator")

    def grpo():
        pass

    def rloo():
        pass

    reg.register("grpo", "grpo_vectorized")(grpo)
    reg.register("grpo", "grpo_vectorized")(grpo)  # the same registration again is harmless (re-import)
    reg.add("rloo", rloo)
    with pytest.raises(DuplicateNameError, match="'grpo_vectorized' is registered twice: as an alias of 'grpo' and by"):
        reg.add("grpo_vectorized", rloo)
    with pytest.raises(DuplicateNameError, match="as an alias of 'grpo' and as an alias of 'rloo'"):
        reg.add_alias("grpo_vectorized", "rloo")
    with pytest.raises(DuplicateNameError, match="'rloo' is registered twice: by .*rloo and as an alias of 'grpo'"):
        reg.add_alias("rloo", "grpo")
    # The same object under the same name, but now as a name rather than an alias, is a second registration.
    with pytest.raises(DuplicateNameError, match="as an alias of 'grpo' and by .*grpo"):
        reg.add("grpo_vectorized", grpo)


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


def test_traits_ride_on_the_entry_with_defaults_and_are_shared_by_aliases():
    reg = Registry("advantage estimator", traits={"requires": frozenset(), "needs_critic": False})
    reg.register("gae", "gae_alias", requires=frozenset({"values"}), needs_critic=True)(lambda: 0)
    reg.register("grpo")(lambda: 0)
    assert reg.traits("gae_alias") == {"requires": {"values"}, "needs_critic": True} == reg.traits("gae")
    assert reg.traits("grpo") == {"requires": frozenset(), "needs_critic": False}
    with pytest.raises(TypeError):
        reg.traits("gae")["needs_critic"] = False  # read-only
    with pytest.raises(UnknownNameError, match="'nope' is not a registered advantage estimator"):
        reg.traits("nope")


def test_a_trait_the_registry_does_not_define_is_refused():
    reg = Registry("policy loss", traits={"zero_at_zero_advantage": False})
    with pytest.raises(ValueError, match=r"unknown traits \['zero_at_zero'\]; policy loss traits are \['zero_at_zero_"):
        reg.register("vanilla", zero_at_zero=True)(lambda: 0)
    assert "vanilla" not in reg
