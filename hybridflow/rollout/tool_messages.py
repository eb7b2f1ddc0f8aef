"""Tokens that carry tool results back to the model, rendered through the tokenizer's own chat template.

The template is rendered twice, for a conversation ending in an assistant turn and for the same conversation
plus the tool messages and the next generation prompt; the text after the assistant's end-of-turn marker is
the delta (for ChatML: ``\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n
<|im_start|>assistant\\n``). Appending the delta's tokens to the running sequence continues it exactly as the
template would have rendered the whole conversation.
"""

from __future__ import annotations

from typing import Any

from hybridflow.errors import HybridflowError


class ChatTemplateError(HybridflowError, ValueError):
    """The tokenizer's chat template cannot render tool messages after an assistant turn."""


class ToolMessageEncoder:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        self._before = self._render(base, add_generation_prompt=False)
        if self.end_of_turn is None or self.end_of_turn not in self._before:
            raise ChatTemplateError(
                f"the chat template does not end assistant turns with the tokenizer's EOS {self.end_of_turn!r}; "
                "multi-turn rollouts need a template whose assistant turns end with the EOS token"
            )
        self._base = base
        self._cut = self._before.rindex(self.end_of_turn) + len(self.end_of_turn)

    def encode(self, tool_texts: list[str], ended_with_eos: bool) -> list[int]:
        """Token ids of the tool messages plus the next assistant prompt.

        ``ended_with_eos``: whether the assistant turn just generated ended with the EOS token; if not (it hit a
        stop string), the end-of-turn marker is added first.
        """
        messages = self._base + [{"role": "tool", "content": text} for text in tool_texts]
        after = self._render(messages, add_generation_prompt=True)
        if not after.startswith(self._before[: self._cut]):
            raise ChatTemplateError("the chat template renders earlier turns differently once tool messages follow")
        delta = after[self._cut :]
        if not ended_with_eos:
            delta = self.end_of_turn + delta
        return self.tokenizer.encode(delta, add_special_tokens=False)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
