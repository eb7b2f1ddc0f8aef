"""RayClassWithInitArgs keeps the class and its constructor arguments; verl-style ray.remote classes work too."""

import pytest
import ray

from hybridflow.distributed import RayClassWithInitArgs

from .sample_workers import ActorRole


def test_keeps_class_and_arguments():
    spec = RayClassWithInitArgs(ActorRole, 2.0)
    assert (spec.cls, spec.args, spec.kwargs) == (ActorRole, (2.0,), {})
    assert set(spec.registered_methods()) == {"pid", "whoami", "score", "sleep", "sleep_span"}


def test_unwraps_a_ray_remote_class():
    assert RayClassWithInitArgs(ray.remote(ActorRole), scale=1.0).cls is ActorRole


def test_refuses_an_instance():
    with pytest.raises(TypeError, match="expected a worker class"):
        RayClassWithInitArgs(ActorRole.__new__(ActorRole))
