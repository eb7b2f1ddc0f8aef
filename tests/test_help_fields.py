from dataclasses import dataclass, fields

from omegaconf import OmegaConf

from hybridflow.help_fields import option, section


@dataclass
class _Optim:
    lr: float = option(1e-6, "Peak learning rate.")
    betas: list = option([0.9, 0.999], "AdamW betas.")
    override: dict = option({"nested": [1]}, "Keys to override.")


@dataclass
class _Actor:
    optim: _Optim = section(_Optim, "Optimizer.")


def test_every_field_carries_its_help():
    assert {f.name: f.metadata["help"] for f in fields(_Optim)} == {
        "lr": "Peak learning rate.",
        "betas": "AdamW betas.",
        "override": "Keys to override.",
    }
    assert fields(_Actor)[0].metadata["help"] == "Optimizer."


def test_mutable_defaults_and_sections_are_fresh_per_instance():
    first, second = _Actor(), _Actor()
    first.optim.betas.append(0.5)
    first.optim.override["nested"].append(2)
    assert second.optim.betas == [0.9, 0.999] and second.optim.override == {"nested": [1]}
    assert first.optim is not second.optim


def test_works_as_an_omegaconf_schema():
    merged = OmegaConf.merge(OmegaConf.structured(_Actor), {"optim": {"lr": 3e-6}})
    assert OmegaConf.to_object(merged) == _Actor(_Optim(lr=3e-6))
