"""Multi-turn rollouts with tools: a scripted engine for exact checks, the real engine end to end."""

import asyncio
import collections
import json
import time

import numpy as np
import pytest
import torch

from hybridflow.rollout import GenerationResult, HFRolloutEngine, RolloutConfig, RolloutEngine
from hybridflow.rollout.agent_loop import AgentLoop, AgentState, Trajectory
from hybridflow.rollout.tool_messages import ToolMessageEncoder
from hybridflow.rollout.tools import BaseTool, ToolResult, build_tools
from tests.rollout.prompts import FINAL_ANSWER_TEXT, TOOL_CALL_TEXT, TOOL_QUESTION, left_padded


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedEngine(RolloutEngine):
    """Answers the k-th turn of each conversation with ``script[k]`` (the last entry repeats) plus EOS."""

    def __init__(self, tokenizer, config, script):
        super().__init__(config, tokenizer)
        self.script = script
        self.turns = collections.Counter()

    @classmethod
    def from_pretrained(cls, model_path, config, **kwargs):
        raise TypeError("ScriptedEngine is built directly by the tests")

    @property
    def eos_token_ids(self):
        return {self.tokenizer.eos_token_id}

    async def generate(self, request):
        turn = self.turns[request.request_id]
        self.turns[request.request_id] += 1
        ids = self.tokenizer.encode(self.script[min(turn, len(self.script) - 1)]) + [self.tokenizer.eos_token_id]
        limit = request.sampling.max_new_tokens
        await asyncio.sleep(0)
        return GenerationResult(ids[:limit], [-0.5] * min(len(ids), limit), "eos" if len(ids) <= limit else "length")

    def generate_batch(self, requests):
        async def all_of_them():
            return await asyncio.gather(*(self.generate(r) for r in requests))

        return asyncio.run(all_of_them())

    def load_weights(self, named_tensors):
        """A script has no weights."""

    def weights_checksum(self, adapter_only):
        """A script has no weights."""
        return None

    def sleep(self):
        """A script holds no cache."""

    def wake(self):
        """A script holds no cache."""


class FailingTool(BaseTool):
    name = "broken"

    async def execute(self, instance_id, arguments):
        raise RuntimeError("disk on fire")


class SlowTool(BaseTool):
    name = "slow"

    async def execute(self, instance_id, arguments):
        await asyncio.sleep(10)
        return ToolResult("too late")


class BlockingTool(BaseTool):
    """Blocks its thread, as a synchronous client inside ``execute`` would."""

    name = "blocking"

    async def execute(self, instance_id, arguments):
        time.sleep(30)
        return ToolResult("too late")


class AnswerChecker(BaseTool):
    """Rewards a submitted answer equal to the sample's ground truth (from tools_kwargs.create_kwargs)."""

    name = "submit"

    async def execute(self, instance_id, arguments):
        correct = str(arguments.get("answer")) == str(self.create_kwargs(instance_id)["ground_truth"])
        return ToolResult("correct" if correct else "wrong", reward=1.0 if correct else 0.0)


def _tool_yaml(tmp_path, body="  - name: calculator\n"):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n" + body)
    return str(path)


def _scripted(tokenizer, script, tools=None, length=256, **multi_turn):
    config = RolloutConfig.from_dict({"response_length": length, "multi_turn": {"enable": True, **multi_turn}})
    engine = ScriptedEngine(tokenizer, config, script)
    return engine, AgentLoop(
        engine, tokenizer, tools or build_tools([{"name": "calculator"}]), config.multi_turn, length
    )


def _run(loop, prompt_ids=(1, 2, 3), tools_kwargs=None):
    trajectory = Trajectory(list(prompt_ids), seed=0, instance_id="t", tools_kwargs=tools_kwargs or {})
    return asyncio.run(loop.run(trajectory, RolloutConfig().sampling()))


def test_tool_result_is_in_the_sequence_with_response_mask_zero(tokenizer, tmp_path):
    config = RolloutConfig.from_dict(
        {
            "n": 2,
            "response_length": 200,
            "calculate_log_probs": True,
            "multi_turn": {"enable": True, "tool_config_path": _tool_yaml(tmp_path)},
        }
    )
    engine = ScriptedEngine(tokenizer, config, [call("calculator", expression="2+3"), FINAL_ANSWER_TEXT])
    prompts = left_padded(tokenizer, [TOOL_QUESTION, "Say something"])
    out = engine.generate_sequences(prompts)
    eos = [tokenizer.eos_token_id]
    assistant_1 = tokenizer.encode(call("calculator", expression="2+3")) + eos
    tool_turn = ToolMessageEncoder(tokenizer).encode(["5"], ended_with_eos=True)
    assistant_2 = tokenizer.encode(FINAL_ANSWER_TEXT) + eos
    expected = assistant_1 + tool_turn + assistant_2
    expected_mask = [1] * len(assistant_1) + [0] * len(tool_turn) + [1] * len(assistant_2)
    width = prompts.batch["input_ids"].shape[1]
    for row in range(4):
        length = int(out.batch["attention_mask"][row, width:].sum())
        assert out.batch["responses"][row, :length].tolist() == expected
        assert out.batch["response_mask"][row, :length].tolist() == expected_mask
        assert out.batch["input_ids"][row, width : width + length].tolist() == expected
        log_probs = out.batch["rollout_log_probs"][row, :length]
        assert torch.all(log_probs[torch.tensor(expected_mask) == 1] == -0.5) and torch.all(
            log_probs[torch.tensor(expected_mask) == 0] == 0
        )
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(tool_turn)
    assert out.non_tensor_batch["num_turns"].tolist() == [3, 3, 3, 3]


def test_states_go_pending_running_tool_calling_running_completed(tokenizer):
    _, loop = _scripted(tokenizer, [call("calculator", expression="1+1"), "done"])
    trajectory = _run(loop)
    assert trajectory.states == [
        AgentState.PENDING,
        AgentState.RUNNING,
        AgentState.TOOL_CALLING,
        AgentState.RUNNING,
        AgentState.COMPLETED,
    ]
    assert trajectory.finish_reason == "stop"


@pytest.mark.parametrize(
    "limits, assistant_turns, user_turns", [({"max_assistant_turns": 3}, 3, 2), ({"max_user_turns": 1}, 2, 1)]
)
def test_turns_are_bounded(tokenizer, limits, assistant_turns, user_turns):
    _, loop = _scripted(tokenizer, [call("calculator", expression="1+1")], **limits)
    trajectory = _run(loop)
    assert (trajectory.assistant_turns, trajectory.user_turns, trajectory.finish_reason) == (
        assistant_turns,
        user_turns,
        "max_turns",
    )


def test_the_response_length_bounds_a_model_that_never_stops_calling(tokenizer):
    _, loop = _scripted(tokenizer, [call("calculator", expression="1+1")])
    trajectory = _run(loop)
    assert len(trajectory.response_ids) == 256 == len(trajectory.response_mask) == len(trajectory.log_probs)
    assert trajectory.finish_reason == "length" and trajectory.state == AgentState.COMPLETED


def test_python_timeout_becomes_a_tool_message(tokenizer):
    tools = build_tools([{"name": "python", "config": {"timeout": 1}}])
    # Sleeping code, so only the tool's wall-clock limit can end it (a broken limit lets it end normally).
    _, loop = _scripted(tokenizer, [call("python", code="import time\ntime.sleep(60)"), "gave up"], tools=tools)
    trajectory = _run(loop)
    text = tokenizer.decode(trajectory.response_ids)
    assert "did not finish within 1 s" in text and text.endswith("gave up<|im_end|>")


def test_tool_failures_unknown_tools_malformed_calls_and_slow_tools_become_tool_messages(tokenizer):
    tools = {"broken": FailingTool(), "slow": SlowTool({"timeout": 0.2}), **build_tools([{"name": "calculator"}])}
    turn = (
        call("nope")
        + call("broken")
        + call("slow")
        + call("calculator", expression="2*21")
        + "<tool_call>{oops</tool_call>"
    )
    _, loop = _scripted(tokenizer, [turn, "done"], tools=tools, length=1024, max_parallel_calls=2)
    text = tokenizer.decode(_run(loop).response_ids)
    responses = [part.split("\n</tool_response>")[0] for part in text.split("<tool_response>\n")[1:]]
    assert responses[0].startswith("Error: unknown tool 'nope'")
    assert responses[1] == "Error: tool 'broken' failed: RuntimeError: disk on fire"
    assert responses[2] == "Error: tool 'slow' did not answer within 0.2 s"
    assert responses[3] == "42"
    assert responses[4].startswith("Error: tool call 5 could not be parsed: invalid JSON")


def test_a_tool_that_blocks_its_thread_times_out_at_its_limit(tokenizer):
    """A blocking call used to stall the event loop, so its timeout never fired and the rollout hung."""
    tools = {"blocking": BlockingTool({"timeout": 0.5}), **build_tools([{"name": "calculator"}])}
    turn = call("blocking") + call("calculator", expression="6*7")
    _, loop = _scripted(tokenizer, [turn, "done"], tools=tools, length=1024)
    start = time.monotonic()
    text = tokenizer.decode(_run(loop).response_ids)
    assert time.monotonic() - start < 10  # the 0.5 s limit plus the 1 s grace, never the tool's 30 s
    assert "Error: tool 'blocking' did not answer within 0.5 s" in text and "42" in text


def test_tools_kwargs_reach_the_tools_and_rewards_come_back(tokenizer):
    config = RolloutConfig.from_dict({"response_length": 128, "multi_turn": {"enable": True}})
    engine = ScriptedEngine(tokenizer, config, [call("submit", answer=5), "ok"])
    engine._agent_loop = AgentLoop(engine, tokenizer, {"submit": AnswerChecker()}, config.multi_turn, 128)
    prompts = left_padded(tokenizer, ["a", "b"])
    prompts.non_tensor_batch["tools_kwargs"] = np.array(
        [{"submit": {"create_kwargs": {"ground_truth": 5}}}, {"submit": {"create_kwargs": {"ground_truth": 7}}}],
        dtype=object,
    )
    out = engine.generate_sequences(prompts)
    assert out.non_tensor_batch["tool_rewards"].tolist() == [1.0, 0.0]


def test_a_trained_tiny_model_calls_the_calculator_through_the_real_engine(tokenizer, tool_calling_model_dir, tmp_path):
    config = RolloutConfig.from_dict(
        {
            "response_length": 128,
            "do_sample": False,
            "multi_turn": {"enable": True, "max_assistant_turns": 4, "tool_config_path": _tool_yaml(tmp_path)},
        }
    )
    engine = HFRolloutEngine.from_pretrained(tool_calling_model_dir, config, tokenizer=tokenizer)
    try:
        out = engine.generate_sequences(left_padded(tokenizer, [TOOL_QUESTION]))
    finally:
        engine.close()
    length = int(out.batch["attention_mask"][0].sum()) - int(
        left_padded(tokenizer, [TOOL_QUESTION]).batch["attention_mask"].sum()
    )
    response = out.batch["responses"][0, :length].tolist()
    mask = out.batch["response_mask"][0, :length].tolist()
    first = tokenizer.encode(TOOL_CALL_TEXT) + [tokenizer.eos_token_id]
    tool_turn = ToolMessageEncoder(tokenizer).encode(["5"], ended_with_eos=True)
    assert response[: len(first) + len(tool_turn)] == first + tool_turn, "the tool ran and said 5"
    assert tokenizer.decode(response[len(first) + len(tool_turn) :]) == FINAL_ANSWER_TEXT + "<|im_end|>"
    assert mask == [1] * len(first) + [0] * len(tool_turn) + [1] * (length - len(first) - len(tool_turn))
    assert out.non_tensor_batch["num_turns"].tolist() == [3]


def test_32_concurrent_requests_finish_faster_than_32_sequential(make_engine, tokenizer):
    engine = make_engine(response_length=24)
    loop = AgentLoop(engine, tokenizer, {}, engine.config.multi_turn, 24)
    sampling = engine.config.sampling()
    prompt = tokenizer.encode("count to ten")
    trajectories = lambda: [Trajectory(prompt, seed=i, instance_id=str(i)) for i in range(32)]  # noqa: E731

    async def concurrent():
        return await asyncio.gather(*(loop.run(t, sampling) for t in trajectories()))

    async def sequential():
        return [await loop.run(t, sampling) for t in trajectories()]

    started = time.perf_counter()
    together = asyncio.run(concurrent())
    concurrent_s = time.perf_counter() - started
    started = time.perf_counter()
    one_by_one = asyncio.run(sequential())
    sequential_s = time.perf_counter() - started
    assert [t.response_ids for t in together] == [t.response_ids for t in one_by_one], "same seeds, same samples"
    assert concurrent_s < sequential_s, f"concurrent {concurrent_s:.2f}s vs sequential {sequential_s:.2f}s"
