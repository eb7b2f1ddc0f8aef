"""A test reward with and without signal: dense_reward.py's score for the training prompts with index 0 and 1,
a constant for every other prompt (so their groups all score the same and their advantages are 0).

With ``data.shuffle=false`` and 4 prompts per step, step 1 mixes both kinds and step 2 has no signal at all.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if (extra_info or {}).get("index", 99) >= 2:
        return {"score": 0.5, "acc": 0.0}
    even = sum(ord(ch) % 2 == 0 for ch in solution_str)
    return {"score": even / max(len(solution_str), 1), "acc": float(solution_str.strip() == str(ground_truth))}
