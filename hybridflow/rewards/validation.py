"""Validation metrics per data_source: mean@n, std@n, best@n, worst@n and maj@n over n samples per prompt.

Names follow verl: ``val-core/<data_source>/<var>/<stat>@<n>`` for the headline numbers (the core variable's
mean, maj and best) and ``val-aux/...`` for the rest. The core variable is ``acc`` when the scoring functions
report it, else ``score``. ``best@n`` is the plain maximum over a prompt's n samples, ``maj@n`` the value of
the most common ``pred`` (ties go to the earliest sample); both are averaged over prompts.
"""

from __future__ import annotations

import numbers
from collections import Counter, defaultdict
from typing import Any, Sequence

import numpy as np

_CORE_STATS = ("mean", "maj", "best")


def process_validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Any], infos: dict[str, Sequence[Any]]
) -> dict[str, float]:
    """Group samples by (data_source, uid) and aggregate each numeric variable in ``infos``.

    ``data_sources`` and ``sample_uids`` have one entry per sample (the samples of one prompt share a uid);
    ``infos`` maps a variable name (``score``, ``acc``, ``pred``, ...) to its per-sample values, as in a
    reward manager's ``extra``. Non-numeric variables other than ``pred`` are ignored.
    """
    groups: dict[tuple[str, Any], list[int]] = defaultdict(list)
    for index, key in enumerate(zip(data_sources, sample_uids)):
        groups[key].append(index)
    preds = infos.get("pred")
    numeric = [
        name
        for name, values in infos.items()
        if name != "pred" and all(isinstance(value, numbers.Real) for value in values)
    ]
    core = "acc" if "acc" in numeric else "score"
    collected: dict[str, list[float]] = defaultdict(list)
    for (source, _uid), indices in groups.items():
        group_preds = [preds[i] for i in indices] if preds is not None else None
        for name in numeric:
            values = [float(infos[name][i]) for i in indices]
            for stat, value in _group_stats(values, group_preds).items():
                section = "val-core" if name == core and stat in _CORE_STATS else "val-aux"
                collected[f"{section}/{source}/{name}/{stat}@{len(indices)}"].append(value)
    return {name: float(np.mean(values)) for name, values in collected.items()}


def _group_stats(values: list[float], preds: list[Any] | None) -> dict[str, float]:
    stats = {"mean": float(np.mean(values))}
    if len(values) > 1:
        stats.update(std=float(np.std(values)), best=max(values), worst=min(values))
        if preds is not None:
            majority = Counter(preds).most_common(1)[0][0]
            stats["maj"] = values[preds.index(majority)]
    return stats
