import pytest

from hybridflow.algos.kl_controllers import (
    AdaptiveKLController,
    FixedKLController,
    KLControllerConfigError,
    get_kl_controller,
)
from hybridflow.registry import UnknownNameError


def test_fixed_controller_never_moves():
    controller = get_kl_controller("fixed", kl_coef=0.05)
    controller.update(current_kl=100.0, n_steps=1000)
    assert isinstance(controller, FixedKLController) and controller.value == 0.05


def test_adaptive_controller_hand_case():
    controller = get_kl_controller("adaptive", kl_coef=0.1, target_kl=6, horizon=10000)
    assert isinstance(controller, AdaptiveKLController)
    controller.update(current_kl=12.0, n_steps=100)  # error clipped to +0.2: x (1 + 0.2 * 100 / 10000)
    assert controller.value == pytest.approx(0.1002)
    controller.update(current_kl=3.0, n_steps=100)  # error -0.5 clipped to -0.2
    assert controller.value == pytest.approx(0.1002 * 0.998)
    controller.update(current_kl=6.6, n_steps=100)  # error +0.1, unclipped
    assert controller.value == pytest.approx(0.1002 * 0.998 * 1.001)


def test_controller_options_default_to_verls():
    controller = get_kl_controller("adaptive")
    assert (controller.value, controller.target, controller.horizon) == (0.001, 0.1, 10000)


def test_bad_controller_config_errors_name_the_key():
    with pytest.raises(UnknownNameError, match="algorithm.kl_ctrl.type='pid'"):
        get_kl_controller("pid")
    with pytest.raises(KLControllerConfigError, match="algorithm.kl_ctrl.horizon=0.0 must be > 0"):
        get_kl_controller("adaptive", horizon=0)
