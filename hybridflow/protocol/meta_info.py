"""How ``DataProto.concat`` merges the parts' ``meta_info`` (verl's ``DataProto.concat``, verl PR #3699).

Each part may carry its own ``metrics`` (a worker rank's, say): they are gathered, never dropped, into one
dict of per-part lists. Every other key describes the whole batch, so the parts that hold it must agree.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hybridflow.protocol.columns import values_equal
from hybridflow.protocol.errors import MetaInfoConflictError

METRICS_KEY = "metrics"


def merge_meta_info(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One meta_info for the concatenation of parts whose meta_info are ``metas`` (in order).

    ``metrics`` of each part (a dict, a list of dicts, or None) become ``{name: [value of each dict]}``,
    present only when some part reported metrics. Any other key is kept if the parts that hold it agree
    (``values_equal``: NaN equals NaN), else MetaInfoConflictError. Differs from verl: a metric that the
    first metrics dict lacks is kept, where verl's ``list_of_dict_to_dict_of_list`` raises on it.
    """
    merged: dict[str, Any] = {}
    first_holder: dict[str, int] = {}
    metric_dicts: list[Mapping[str, Any]] = []
    for number, meta in enumerate(metas):
        for key, value in meta.items():
            if key == METRICS_KEY:
                metric_dicts += _as_metric_dicts(value, number)
            elif key not in merged:
                merged[key], first_holder[key] = value, number
            elif not values_equal(merged[key], value):
                raise MetaInfoConflictError(
                    f"cannot concat: meta_info key {key!r} is {_short(merged[key])} in part {first_holder[key]} "
                    f"but {_short(value)} in part {number}; per-part values belong in meta_info['metrics']"
                )
    if metric_dicts:
        merged[METRICS_KEY] = _dict_of_lists(metric_dicts)
    return merged


def _as_metric_dicts(value: Any, number: int) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    dicts = value if isinstance(value, list) else [value]
    for item in dicts:
        if not isinstance(item, Mapping):
            raise MetaInfoConflictError(
                f"cannot concat: part {number}'s meta_info['metrics'] holds a {type(item).__name__}; give a "
                f"dict of metrics or a list of such dicts"
            )
    return dicts


def _dict_of_lists(dicts: list[Mapping[str, Any]]) -> dict[str, list]:
    merged: dict[str, list] = {}
    for metrics in dicts:
        for name, value in metrics.items():
            merged.setdefault(name, []).append(value)
    return merged


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
