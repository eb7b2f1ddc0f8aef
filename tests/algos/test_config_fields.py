from dataclasses import dataclass

from omegaconf import OmegaConf

from hybridflow.algos.config_fields import pick_option, read_field


@dataclass
class _AlgoConfig:
    gamma: float = 0.9
    lam: float | None = None


def test_read_field_from_dataclass_dict_and_dictconfig():
    for config in (_AlgoConfig(), {"gamma": 0.9, "lam": None}, OmegaConf.create({"gamma": 0.9, "lam": None})):
        assert read_field(config, "gamma") == 0.9
        assert read_field(config, "lam", 0.95) == 0.95  # None counts as absent
        assert read_field(config, "missing", "default") == "default"


def test_read_field_from_none_config_gives_default():
    assert read_field(None, "gamma", 1.0) == 1.0


def test_pick_option_precedence_explicit_then_config_then_default():
    assert pick_option("gamma", 0.5, _AlgoConfig(), 1.0) == 0.5
    assert pick_option("gamma", None, _AlgoConfig(), 1.0) == 0.9
    assert pick_option("gamma", None, None, 1.0) == 1.0
    assert pick_option("flag", False, {"flag": True}, True) is False
