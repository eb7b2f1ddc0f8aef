"""What happens to a prompt longer than ``data.max_prompt_length`` (``data.truncation``).

``error`` refuses the dataset, ``filter`` drops the prompt, ``left``/``right``/``middle`` cut it. Kept apart
from the dataset so that checking a config can list the modes without loading tensors.
"""

from __future__ import annotations

TRUNCATION_MODES = ("error", "left", "right", "middle", "filter")


def truncate_prompt(token_ids: list[int], limit: int, mode: str) -> list[int]:
    """``limit`` tokens of ``token_ids``: the end (``left``), the start (``right``) or both ends (``middle``)."""
    if mode == "left":
        return token_ids[-limit:]
    if mode == "right":
        return token_ids[:limit]
    head = limit // 2
    return token_ids[:head] + token_ids[len(token_ids) - (limit - head) :]
