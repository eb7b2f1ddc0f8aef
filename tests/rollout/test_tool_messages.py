from hybridflow.rollout.tool_messages import ToolMessageEncoder


def test_delta_continues_the_conversation_exactly_as_the_template_renders_it(tokenizer):
    messages = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "calling"}]
    tools = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "done"}]
    before = tokenizer.apply_chat_template(messages, tokenize=False)
    full = tokenizer.apply_chat_template(messages + tools, tokenize=False, add_generation_prompt=True)
    # The model's turn ends at its EOS; the delta starts right after it.
    generated_prefix = before[: before.rindex(tokenizer.eos_token) + len(tokenizer.eos_token)]
    delta = ToolMessageEncoder(tokenizer).encode(["5", "done"], ended_with_eos=True)
    assert generated_prefix + tokenizer.decode(delta) == full
    assert tokenizer.decode(delta).endswith("<|im_start|>assistant\n")


def test_a_turn_cut_by_a_stop_string_gets_its_end_marker(tokenizer):
    delta = ToolMessageEncoder(tokenizer).encode(["5"], ended_with_eos=False)
    assert delta[0] == tokenizer.eos_token_id
