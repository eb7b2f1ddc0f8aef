"""Prompt batches as the data layer hands them to the rollout, and the tool-calling script's texts."""

import torch

from hybridflow.protocol import DataProto

TOOL_QUESTION = "What is 2+3?"
TOOL_CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
FINAL_ANSWER_TEXT = "The answer is 5."


def left_padded(tokenizer, texts: list[str]) -> DataProto:
    """One user turn per text, chat-templated, as the data layer gives it: left-padded input_ids,
    attention_mask, position_ids [B, P]."""
    rows = []
    for text in texts:
        messages = [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        rows.append(tokenizer.encode(rendered, add_special_tokens=False))
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids})
