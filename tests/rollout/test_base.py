import importlib.util

import pytest

from hybridflow.registry import UnknownNameError
from hybridflow.rollout import ROLLOUT_ENGINES, MissingExtraError, RolloutConfig, create_rollout_engine
from hybridflow.rollout.base import LoraAdapterUnsupportedError, RolloutEngine
from hybridflow.rollout.config import LORA_ADAPTER_ENGINES


def test_engines_are_registered_by_name():
    assert {"hf", "vllm"} <= set(ROLLOUT_ENGINES.names())


def test_an_unknown_engine_name_lists_the_valid_ones(tiny_model_dir):
    with pytest.raises(UnknownNameError, match=r"actor_rollout_ref\.rollout\.name='tgi'.*hf.*vllm"):
        create_rollout_engine(RolloutConfig(name="tgi"), tiny_model_dir)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_choosing_vllm_without_it_names_the_extra_to_install(tiny_model_dir):
    with pytest.raises(MissingExtraError, match=r"pip install 'hybridflow\[vllm\]'"):
        create_rollout_engine(RolloutConfig(name="vllm"), tiny_model_dir)


def test_lora_adapter_engines_are_those_that_add_adapters_and_the_others_name_lora_merge():
    adds_adapters = {
        name
        for name in ROLLOUT_ENGINES.names()
        if ROLLOUT_ENGINES.get(name).add_lora_adapter is not RolloutEngine.add_lora_adapter
    }
    assert adds_adapters == LORA_ADAPTER_ENGINES == {"hf", "vllm"}

    class FullWeightsOnly:
        add_lora_adapter = RolloutEngine.add_lora_adapter

    with pytest.raises(LoraAdapterUnsupportedError, match=r"FullWeightsOnly .*model\.lora\.merge=true"):
        FullWeightsOnly().add_lora_adapter(None)
