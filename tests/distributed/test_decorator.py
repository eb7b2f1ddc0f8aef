"""@register: the recorded modes, their defaults and the combinations it refuses."""

import pytest

from hybridflow.distributed import Dispatch, Execute, Worker, register
from hybridflow.distributed.decorator import MethodSpec, registered_methods


class Base:
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data):
        return data

    def helper(self):
        return None


class Child(Base):
    @register(dispatch_mode=Dispatch.RANK_ZERO, blocking=False)
    def save(self, path):
        return path


def test_registered_methods_include_inherited_ones_and_skip_plain_methods():
    assert registered_methods(Child) == {
        "compute": MethodSpec(Dispatch.DP_COMPUTE_PROTO, Execute.ALL, True),
        "save": MethodSpec(Dispatch.RANK_ZERO, Execute.RANK_ZERO, False),
    }
    assert registered_methods(Worker) == {}


def test_register_leaves_the_method_callable_as_is():
    assert Child().save("x") == "x"


def test_default_is_all_to_all_on_every_rank_blocking():
    @register()
    def method(self):
        return None

    cls = type("C", (), {"method": method})
    assert registered_methods(cls)["method"] == MethodSpec(Dispatch.ALL_TO_ALL, Execute.ALL, True)


@pytest.mark.parametrize(
    "dispatch_mode, execute_mode, message",
    [
        (Dispatch.DP_COMPUTE_PROTO, Execute.RANK_ZERO, "cannot run with execute_mode=RANK_ZERO"),
        (Dispatch.ALL_TO_ALL, Execute.RANK_ZERO, "cannot run with execute_mode=RANK_ZERO"),
        (Dispatch.RANK_ZERO, Execute.ALL, "cannot run with execute_mode=ALL"),
    ],
)
def test_contradictory_modes_are_refused(dispatch_mode, execute_mode, message):
    with pytest.raises(ValueError, match=message):
        register(dispatch_mode=dispatch_mode, execute_mode=execute_mode)


def test_bare_decorator_and_strings_are_refused_with_the_fix():
    with pytest.raises(TypeError, match="with parentheses"):
        register(lambda self: None)
    with pytest.raises(TypeError, match=r"must be a Dispatch member \(one of \['ONE_TO_ALL'"):
        register(dispatch_mode="dp_compute_proto")
