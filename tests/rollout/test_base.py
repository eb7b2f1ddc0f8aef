import importlib.util

import pytest

from hybridflow.registry import UnknownNameError
from hybridflow.rollout import ROLLOUT_ENGINES, MissingExtraError, RolloutConfig, create_rollout_engine


def test_engines_are_registered_by_name():
    assert {"hf", "vllm"} <= set(ROLLOUT_ENGINES.names())


def test_an_unknown_engine_name_lists_the_valid_ones(tiny_model_dir):
    with pytest.raises(UnknownNameError, match=r"actor_rollout_ref\.rollout\.name='tgi'.*hf.*vllm"):
        create_rollout_engine(RolloutConfig(name="tgi"), tiny_model_dir)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_choosing_vllm_without_it_names_the_extra_to_install(tiny_model_dir):
    with pytest.raises(MissingExtraError, match=r"pip install 'hybridflow\[vllm\]'"):
        create_rollout_engine(RolloutConfig(name="vllm"), tiny_model_dir)
