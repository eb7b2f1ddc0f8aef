"""The registry of rule-based scoring functions, keyed by a row's ``data_source``.

Every registered function has the signature ``fn(solution_str, ground_truth, extra_info=None) -> dict``
and returns at least ``{"score": float}``; the built-in ones also return ``acc`` (1.0 when the answer is
right) and ``pred`` (the answer they extracted, for majority voting in validation).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from hybridflow.registry import Registry, UnknownNameError

ScoringFunction = Callable[..., dict[str, Any]]

SCORING_FUNCTIONS: Registry[ScoringFunction] = Registry("scoring function", config_key="data_source")


class UnknownDataSourceError(UnknownNameError):
    """Rows carry a ``data_source`` that no scoring function is registered for."""


_CUSTOM_HINT = (
    "or set custom_reward_function.path=<your_file.py> (and custom_reward_function.name=<function>) "
    "to score these rows with your own function"
)


# verl scores every data_source that starts with "aime" by its math_dapo rule (utils/reward_score/__init__.py).
PREFIXES = {"aime": "math_dapo"}


def registered_name(data_source: str) -> str:
    """The name ``data_source`` is scored under: its own, or that of the prefix it starts with."""
    if data_source not in SCORING_FUNCTIONS:
        for prefix, name in PREFIXES.items():
            if data_source.startswith(prefix):
                return name
    return data_source


def resolve_scoring_function(data_source: str) -> ScoringFunction:
    """The registered scoring function for ``data_source``; UnknownDataSourceError if there is none."""
    try:
        return SCORING_FUNCTIONS.get(registered_name(data_source))
    except UnknownNameError as error:
        raise UnknownDataSourceError(f"{error}; {_CUSTOM_HINT}") from None


def unknown_data_sources(data_sources: Iterable[str]) -> list[str]:
    """The ones of ``data_sources`` that no scoring function is registered for, sorted."""
    return sorted({str(source) for source in data_sources if registered_name(str(source)) not in SCORING_FUNCTIONS})


def check_data_sources(data_sources: Iterable[str]) -> None:
    """Raise once, naming every data_source without a scoring function (call this before training starts)."""
    unknown = unknown_data_sources(data_sources)
    if unknown:
        raise UnknownDataSourceError(
            f"data_source {unknown} has no registered scoring function; registered: "
            f"[{', '.join(SCORING_FUNCTIONS.names())}]; {_CUSTOM_HINT}"
        )


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    """Score one response with the function registered for its ``data_source`` (verl's signature)."""
    return resolve_scoring_function(data_source)(solution_str, ground_truth, extra_info)
