"""A model's own log-probs of a rollout's response tokens, to compare with the engine's."""

import torch


def response_log_probs(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """[B, R] log softmax(logits / temperature) of each response token under ``model``, from a rollout's batch
    (``input_ids``, ``attention_mask``, ``position_ids``, ``prompts``, ``responses``)."""
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
    width = batch["prompts"].shape[1]
    log_softmax = torch.log_softmax(logits[:, width - 1 : -1].float() / temperature, dim=-1)
    return log_softmax.gather(-1, batch["responses"][..., None])[..., 0]


def teacher_forced_log_probs(model, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """[T] log softmax of each of ``token_ids`` under ``model``, given the prompt and the tokens before it."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0]
