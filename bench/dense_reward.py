"""The benchmark's default reward, shared by both systems: dense, so every prompt group carries signal.

The share of the response's characters whose code point is even. A random tiny model almost never answers
the arithmetic right, so the task's 0/1 score leaves most groups with one score for all samples (advantages
of 0, which hybridflow skips); this score differs between a group's samples almost always, so each system
does a full step's work on every sample. ``--reward task`` measures with the task's own score instead.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return sum(ord(ch) % 2 == 0 for ch in solution_str) / max(len(solution_str), 1)
