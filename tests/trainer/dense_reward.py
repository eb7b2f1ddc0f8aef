"""A dense test reward for an untrained tiny model: the share of response characters with an even code point.

A random model almost never answers arithmetic right, so the task's own 0/1 score would give all-zero
advantages; this one varies between samples, so losses, gradients and KL are non-zero.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    even = sum(ord(ch) % 2 == 0 for ch in solution_str)
    return {"score": even / max(len(solution_str), 1), "acc": float(solution_str.strip() == str(ground_truth))}
