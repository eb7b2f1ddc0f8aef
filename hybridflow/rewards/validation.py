"""Validation metrics per data_source, as verl computes and names them (verl PR #927: ``process_validation_metrics``
in verl/trainer/ppo/metric_utils.py, the names from ``_val_metrics_update`` in verl/trainer/ppo/ray_trainer.py).

Per prompt (uid) with N samples and per numeric variable (``reward``, ``score``, ``acc``, ...): ``mean@N`` and
``std@N`` over its samples; for every subset size n in 2, 4, 8, ... below N and N itself, bootstrap estimates
over 1000 resamples of n samples drawn with replacement: ``best@n/mean``, ``best@n/std``, ``worst@n/mean``,
``worst@n/std`` and, when the samples carry a ``pred``, ``maj@n/mean``, ``maj@n/std`` (the value of the most
frequent pred, the first-seen one on a tie, and its first sample's value). Every number is averaged over the
data_source's prompts and named ``val-core/<data_source>/<var>/<metric>`` for the core variable's mean, maj and
best at the largest n, ``val-aux/...`` for the rest. The core variable is ``acc`` when reported, else ``reward``.

The resamples come from ``np.random.RandomState(seed)`` drawn exactly as verl draws them, so the numbers equal
verl's. Differs from verl: verl reseeds numpy's global generator (validation then changes the random stream of
everything after it); ``pred`` is never averaged (it is a vote), and non-numeric variables are skipped.
"""

from __future__ import annotations

import numbers
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

N_BOOTSTRAP = 1000
_CORE_PREFIXES = ("mean", "maj", "best")


def process_validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Any], infos: dict[str, Sequence[Any]], seed: int = 42
) -> dict[str, float]:
    """``{val-core|val-aux/<data_source>/<var>/<metric>: value}`` for samples grouped by (data_source, uid).

    ``data_sources`` and ``sample_uids`` have one entry per sample (the samples of one prompt share a uid);
    ``infos`` maps a variable name to its per-sample values, as the reward ``extra`` plus ``reward``.
    """
    groups: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        groups[source][uid].append(index)
    preds = infos.get("pred")
    numeric = [
        name
        for name, values in infos.items()
        if name != "pred" and all(isinstance(value, numbers.Real) for value in values)
    ]
    metrics = {}
    for source, uids in groups.items():
        per_var = {name: _source_metrics(uids.values(), infos[name], preds, seed) for name in numeric}
        metrics.update(_named(source, per_var))
    return metrics


def _source_metrics(prompts: Any, values: Sequence[float], preds: Sequence[Any] | None, seed: int) -> dict[str, float]:
    """One variable's metrics for one data_source: each prompt's metrics, averaged over the prompts."""
    collected: dict[str, list[float]] = defaultdict(list)
    for indices in prompts:
        group_values = np.asarray([values[i] for i in indices], dtype=np.float64)
        group_preds = None if preds is None else [preds[i] for i in indices]
        for name, value in _prompt_metrics(group_values, group_preds, seed).items():
            collected[name].append(value)
    return {name: float(np.mean(prompt_values)) for name, prompt_values in collected.items()}


def _prompt_metrics(values: np.ndarray, preds: list[Any] | None, seed: int) -> dict[str, float]:
    count = len(values)
    metrics = {f"mean@{count}": float(np.mean(values))}
    if count < 2:
        return metrics
    metrics[f"std@{count}"] = float(np.std(values))
    for n in subset_sizes(count):
        resamples = np.random.RandomState(seed).choice(count, size=(N_BOOTSTRAP, n), replace=True)
        estimates = {"best": values[resamples].max(axis=1), "worst": values[resamples].min(axis=1)}
        if preds is not None:
            estimates["maj"] = majority_values(values, preds, resamples)
        for stat, per_resample in estimates.items():
            metrics[f"{stat}@{n}/mean"] = float(np.mean(per_resample))
            metrics[f"{stat}@{n}/std"] = float(np.std(per_resample))
    return metrics


def subset_sizes(count: int) -> list[int]:
    """The bootstrap subset sizes for ``count`` samples: powers of two from 2 below ``count``, then ``count``."""
    sizes, n = [], 2
    while n < count:
        sizes.append(n)
        n *= 2
    return [*sizes, count] if count > 1 else []


def majority_values(values: np.ndarray, preds: Sequence[Any], resamples: np.ndarray) -> np.ndarray:
    """Per resample (a row of sample indices): the value of the first sample whose pred is the most frequent in
    the row, ties going to the pred seen first in the row (verl's ``calc_maj_val``)."""
    code_of: dict[Any, int] = {}  # preds compare as dict keys, as in verl's vote count
    codes = np.asarray([code_of.setdefault(pred, len(code_of)) for pred in preds])
    row_codes = codes[resamples]  # [resamples, n]
    counts = np.stack([(row_codes == code).sum(axis=1) for code in range(len(code_of))], axis=1)
    count_at = np.take_along_axis(counts, row_codes, axis=1)  # how often each position's pred occurs in its row
    winner = np.argmax(count_at == count_at.max(axis=1, keepdims=True), axis=1)  # first position of a top pred
    return values[resamples[np.arange(len(resamples)), winner]]


def _named(source: str, per_var: dict[str, dict[str, float]]) -> dict[str, float]:
    core = "acc" if "acc" in per_var else "reward"
    named = {}
    for var, metrics in per_var.items():
        largest = max(map(_subset_size, metrics))
        for name, value in metrics.items():
            is_core = var == core and name.startswith(_CORE_PREFIXES) and _subset_size(name) == largest
            named[f"{'val-core' if is_core else 'val-aux'}/{source}/{var}/{name}"] = value
    return named


def _subset_size(metric: str) -> int:
    return int(metric.split("@")[1].split("/")[0])
