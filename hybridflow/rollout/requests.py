"""One generation request and its result: what every engine's ``generate`` takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.rollout.config import SamplingParams

FINISH_EOS = "eos"  # the tokenizer's EOS (or a stop token id) was generated
FINISH_STOP = "stop"  # a stop string appeared in the generated text
FINISH_LENGTH = "length"  # max_new_tokens was reached
FINISH_ABORT = "abort"  # ended by ``abort()`` before finishing (the V1 trainers' partial rollout continues it)


@dataclass
class GenerationRequest:
    """Continue ``prompt_ids`` (unpadded token ids) with the given sampling parameters."""

    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str | None = None


@dataclass
class GenerationResult:
    """The generated tokens, each token's log-probability, and why generation ended.

    ``log_probs[t]`` is log softmax(logits / temperature) of ``token_ids[t]`` (temperature 1 for greedy), taken
    before top-k/top-p filtering: the same quantity the actor computes for ``old_log_probs``.
    ``weight_versions[t]``: the version of the weights that drew ``token_ids[t]`` (``RolloutEngine.loading_weights``);
    empty from an engine that does not track them.
    """

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    request_id: str | None = None
    weight_versions: list[int] = field(default_factory=list)
