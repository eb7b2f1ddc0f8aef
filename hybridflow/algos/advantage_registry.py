"""The advantage-estimator registry, keyed by ``algorithm.adv_estimator``, and what each estimator needs.

Every estimator is called with keyword arguments: ``token_level_rewards [B,T]``, ``response_mask [B,T]``,
the ``algorithm`` section's options under their config names (``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``,
``gdpo_reward_keys``, ``gdpo_reward_weights``; an estimator reads those it knows and takes the others in
``**kwargs``) and the batch inputs it declared at registration from :data:`ESTIMATOR_INPUTS`. It returns
``(advantages [B,T], returns [B,T])``, both 0 wherever ``response_mask`` is 0. Each entry carries two traits,
read as ``ADV_ESTIMATORS.traits(name)[...]``: ``requires`` (the declared inputs) and ``needs_critic``
(``"values"`` among them: the trainer must build a critic). The trainer reads them instead of branching on
names: a new estimator is one decorated function.
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Iterable

from hybridflow.registry import Registry

AdvantageEstimatorFn = Callable[..., tuple]

ESTIMATOR_INPUTS = (
    "values",
    "index",
    "reward_baselines",
    "old_log_probs",
    "sum_pi_squared",
    "rollout_is_weights",
    "non_tensor_batch",
)
"""Batch inputs an estimator may ask for: critic ``values [B,T]``, the per-sample ``uid`` array as
``index [B]``, ReMax's greedy-response reward ``reward_baselines [B]``, the actor's log-prob pass outputs
``old_log_probs [B,T]`` and ``sum_pi_squared [B,T]`` (the optimal token baseline's), the rollout
correction's ``rollout_is_weights [B,T]`` (None in a run without importance weights), and the batch's
per-sample columns ``non_tensor_batch`` (the scoring function's extra outputs among them; GDPO's)."""

ADV_ESTIMATORS: Registry[AdvantageEstimatorFn] = Registry(
    "advantage estimator", "algorithm.adv_estimator", traits={"requires": frozenset(), "needs_critic": False}
)


def _as_name(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(
    name_or_enum: str | Enum, *aliases: str, requires: Iterable[str] = ()
) -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Decorator registering an advantage estimator under a name (verl's ``register_adv_est``).

    ``requires`` lists the batch inputs from :data:`ESTIMATOR_INPUTS` the estimator cannot work without; it
    becomes the entry's ``requires`` trait (a frozenset), and ``needs_critic`` says whether ``"values"`` is one.
    """
    requires = frozenset(requires)
    unknown = sorted(requires - set(ESTIMATOR_INPUTS))
    if unknown:
        raise ValueError(
            f"register_adv_est({name_or_enum!r}, requires=...) got unknown inputs {unknown}; "
            f"choose from {list(ESTIMATOR_INPUTS)}"
        )
    name = _as_name(name_or_enum)
    return ADV_ESTIMATORS.register(name, *aliases, requires=requires, needs_critic="values" in requires)


def get_adv_estimator_fn(name_or_enum: str | Enum) -> AdvantageEstimatorFn:
    """The estimator registered as ``name``; an unknown name raises listing every registered one."""
    return ADV_ESTIMATORS.get(_as_name(name_or_enum))
