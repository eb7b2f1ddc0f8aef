"""The advantage-estimator registry, keyed by ``algorithm.adv_estimator``, and what each estimator needs.

Every estimator is called with keyword arguments: ``token_level_rewards [B,T]``, ``response_mask [B,T]``,
``config`` (the ``algorithm`` section: dataclass, dict or DictConfig) and the batch inputs it declared at
registration from :data:`ESTIMATOR_INPUTS`. It returns ``(advantages [B,T], returns [B,T])``, both 0
wherever ``response_mask`` is 0. The trainer asks :func:`estimator_inputs` / :func:`needs_critic` instead
of branching on names: a new estimator is one decorated function.
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Iterable

from hybridflow.registry import Registry

AdvantageEstimatorFn = Callable[..., tuple]

ESTIMATOR_INPUTS = (
    "values", "index", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights", "non_tensor_batch"
)
"""Batch inputs an estimator may ask for: critic ``values [B,T]``, the per-sample ``uid`` array as
``index [B]``, ReMax's greedy-response reward ``reward_baselines [B]``, the actor's log-prob pass outputs
``old_log_probs [B,T]`` and ``sum_pi_squared [B,T]`` (the optimal token baseline's), the rollout
correction's ``rollout_is_weights [B,T]`` (None in a run without importance weights), and the batch's
per-sample columns ``non_tensor_batch`` (the scoring function's extra outputs among them; GDPO's)."""

ADV_ESTIMATORS: Registry[AdvantageEstimatorFn] = Registry("advantage estimator", "algorithm.adv_estimator")
_REQUIRED_INPUTS: dict[str, frozenset[str]] = {}


def _as_name(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(
    name_or_enum: str | Enum, *aliases: str, requires: Iterable[str] = ()
) -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Decorator registering an advantage estimator under a name (verl's ``register_adv_est``).

    ``requires`` lists the batch inputs from :data:`ESTIMATOR_INPUTS` the estimator cannot work without.
    """
    requires = frozenset(requires)
    unknown = sorted(requires - set(ESTIMATOR_INPUTS))
    if unknown:
        raise ValueError(
            f"register_adv_est({name_or_enum!r}, requires=...) got unknown inputs {unknown}; "
            f"choose from {list(ESTIMATOR_INPUTS)}"
        )
    names = (_as_name(name_or_enum), *aliases)

    def decorator(fn: AdvantageEstimatorFn) -> AdvantageEstimatorFn:
        ADV_ESTIMATORS.register(*names)(fn)
        for name in names:
            _REQUIRED_INPUTS[name] = requires
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | Enum) -> AdvantageEstimatorFn:
    """The estimator registered as ``name``; an unknown name raises listing every registered one."""
    return ADV_ESTIMATORS.get(_as_name(name_or_enum))


def estimator_inputs(name_or_enum: str | Enum) -> frozenset[str]:
    """The batch inputs (subset of :data:`ESTIMATOR_INPUTS`) the named estimator needs."""
    name = _as_name(name_or_enum)
    ADV_ESTIMATORS.get(name)
    return _REQUIRED_INPUTS.get(name, frozenset())


def needs_critic(name_or_enum: str | Enum) -> bool:
    """True when the named estimator reads critic ``values`` (so the trainer must build a critic)."""
    return "values" in estimator_inputs(name_or_enum)
