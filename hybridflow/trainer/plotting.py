"""Plot a run's ``metrics.jsonl``: reward and validation accuracy per step, as a PNG a person can look at."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from hybridflow.tracking import metric_names as names

REWARD_KEY = names.stat(names.SCORE, "mean")


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file, one dict per logged step."""
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def validation_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The ``val-core/<data_source>/<metric>/mean@<n>`` accuracy keys present in the run."""
    return sorted({key for row in rows for key in row if key.startswith("val-core/") and "/mean@" in key})


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(row["step"], row[key]) for row in rows if key in row]
    return [step for step, _ in points], [value for _, value in points]


def plot_run(metrics_path: str | pathlib.Path, png_path: str | pathlib.Path, title: str = "") -> pathlib.Path:
    """Write a two-panel PNG: mean training reward per step, and each validation accuracy per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    figure, (reward_axis, val_axis) = plt.subplots(1, 2, figsize=(11, 4))
    reward_axis.plot(*series(rows, REWARD_KEY), color="tab:blue", linewidth=1)
    reward_axis.set(title="training reward (critic/score/mean)", xlabel="step", ylabel="reward")
    for key in validation_keys(rows):
        steps, values = series(rows, key)
        val_axis.plot(steps, [100 * v for v in values], marker="o", label=key)
    val_axis.set(title="validation accuracy", xlabel="step", ylabel="%", ylim=(0, 100))
    val_axis.legend(fontsize=7, loc="lower right")
    for axis in (reward_axis, val_axis):
        axis.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    png_path = pathlib.Path(png_path)
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return png_path
