"""KL coefficient controllers, picked by ``algorithm.kl_ctrl.type``: fixed, or adaptive (Ziegler et al.).

A controller holds the current coefficient in ``.value``; the driver calls ``update(current_kl,
n_steps)`` once per training step with the measured KL and the number of samples in the step.
"""

from __future__ import annotations

import numpy as np

from hybridflow.registry import Registry

KL_CONTROLLERS: Registry[type] = Registry("KL controller", "algorithm.kl_ctrl.type")


class KLControllerConfigError(ValueError):
    """The ``algorithm.kl_ctrl`` section has a value a controller cannot use."""


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    @classmethod
    def from_options(cls, kl_coef: float, target_kl: float, horizon: float) -> "FixedKLController":
        """``kl_coef`` alone: a fixed coefficient has no target."""
        return cls(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient never changes."""


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al., arXiv:1909.08593), driving the KL to a target.

    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and ``beta <- beta * (1 + e * n_steps / horizon)``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if horizon <= 0:
            raise KLControllerConfigError(f"algorithm.kl_ctrl.horizon={horizon} must be > 0")
        if target_kl <= 0:
            raise KLControllerConfigError(f"algorithm.kl_ctrl.target_kl={target_kl} must be > 0")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    @classmethod
    def from_options(cls, kl_coef: float, target_kl: float, horizon: float) -> "AdaptiveKLController":
        """Starting at ``kl_coef``."""
        return cls(float(kl_coef), float(target_kl), float(horizon))

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient toward the value that keeps the KL at ``target_kl``."""
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(
    kl_ctrl_type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: float = 10000
) -> FixedKLController | AdaptiveKLController:
    """The controller registered as ``kl_ctrl_type`` with the ``algorithm.kl_ctrl`` section's options (the
    caller unpacks ``type``, ``kl_coef``, ``target_kl`` and ``horizon``; the defaults are verl's)."""
    return KL_CONTROLLERS.get(kl_ctrl_type).from_options(kl_coef, target_kl, horizon)
