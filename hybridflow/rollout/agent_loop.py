"""Multi-turn rollouts with tools: one coroutine per sample, all sharing one engine.

Each sample is a small state machine, ``PENDING -> RUNNING -> TOOL_CALLING -> RUNNING ... -> COMPLETED``:

1. RUNNING: the engine continues ``prompt + response so far`` (``engine.generate``; every sample in flight
   joins the engine's running batch, so their decode steps share forwards).
2. The new text is parsed for tool calls (``multi_turn.format``, default Hermes ``<tool_call>{json}</tool_call>``).
   No call -> COMPLETED. Turn limit reached -> COMPLETED.
3. TOOL_CALLING: the calls run (at most ``max_parallel_calls`` at once, each bounded by its tool's ``timeout``
   plus ``TOOL_TIMEOUT_GRACE_S``);
   a failure, timeout, unknown tool or malformed call becomes the text of its tool message.
4. The tool messages are rendered through the chat template and appended with ``response_mask`` 0, then back
   to 1, until the response reaches ``response_length``.

Generated tokens have mask 1 and their log-probs; tool-result tokens have mask 0 and log-prob 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybridflow.protocol import DataProto
from hybridflow.rollout.config import MultiTurnConfig, SamplingParams
from hybridflow.rollout.off_loop import run_off_loop
from hybridflow.rollout.requests import FINISH_LENGTH, GenerationRequest
from hybridflow.rollout.sequences import SampleOutput, prompt_token_lists, sample_seed
from hybridflow.rollout.tool_messages import ToolMessageEncoder
from hybridflow.rollout.tool_parser import TOOL_PARSERS, ParsedOutput, ToolCall
from hybridflow.rollout.tools import BaseTool, load_tools

# Tools that enforce their own time limit (the python executor) get to report it before the loop's bound cuts in.
TOOL_TIMEOUT_GRACE_S = 1.0


class AgentState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    TOOL_CALLING = "tool_calling"
    COMPLETED = "completed"


@dataclass
class Trajectory:
    """One sample's conversation as tokens, with its loss mask and the states it went through."""

    prompt_ids: list[int]
    seed: int
    instance_id: str
    tools_kwargs: dict[str, Any] = field(default_factory=dict)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    states: list[AgentState] = field(default_factory=lambda: [AgentState.PENDING])
    assistant_turns: int = 0
    user_turns: int = 0
    tool_reward: float = 0.0
    finish_reason: str = ""

    @property
    def state(self) -> AgentState:
        return self.states[-1]

    def move(self, state: AgentState) -> None:
        self.states.append(state)

    def extend(self, token_ids: list[int], mask: int, log_probs: list[float] | None = None) -> None:
        self.response_ids += token_ids
        self.response_mask += [mask] * len(token_ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(token_ids)

    def output(self) -> SampleOutput:
        return self.response_ids, self.response_mask, self.log_probs


class AgentLoop:
    """Runs samples through the state machine above on ``engine`` (anything with ``async generate``)."""

    def __init__(
        self, engine: Any, tokenizer: Any, tools: dict[str, BaseTool], multi_turn: MultiTurnConfig, response_length: int
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools
        self.multi_turn = multi_turn
        self.response_length = response_length
        self.parse = TOOL_PARSERS.get(multi_turn.format)
        self.encoder = ToolMessageEncoder(tokenizer)

    @classmethod
    def from_engine(cls, engine: Any) -> "AgentLoop":
        """Tools from ``multi_turn.tool_config_path``; lengths and limits from the engine's config."""
        config = engine.config
        tools = load_tools(config.multi_turn.tool_config_path)
        return cls(engine, engine.tokenizer, tools, config.multi_turn, config.response_length)

    async def generate(
        self, prompts: DataProto, n: int, sampling: SamplingParams, seed: int, first_prompt: int = 0
    ) -> tuple[list[SampleOutput], dict[str, np.ndarray]]:
        """All ``B * n`` samples concurrently (samples of one prompt adjacent) -> outputs and extra columns."""
        token_lists = prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"])
        kwargs_column = _tools_kwargs_column(prompts)
        runs = []
        for index, prompt_ids in enumerate(token_lists):
            for sample in range(n):
                row = (first_prompt + index) * n + sample
                trajectory = Trajectory(prompt_ids, sample_seed(seed, row), f"{seed}-{row}", kwargs_column[index])
                runs.append(self.run(trajectory, sampling))
        trajectories = await asyncio.gather(*runs)
        extras = {
            "num_turns": np.array([t.assistant_turns + t.user_turns for t in trajectories], dtype=np.int64),
            "tool_rewards": np.array([t.tool_reward for t in trajectories], dtype=np.float32),
        }
        return [t.output() for t in trajectories], extras

    async def run(self, trajectory: Trajectory, sampling: SamplingParams) -> Trajectory:
        """Drive one sample to COMPLETED; tool instances are created first and always released."""
        for name, tool in self.tools.items():
            await tool.create(trajectory.instance_id, **trajectory.tools_kwargs.get(name, {}).get("create_kwargs", {}))
        try:
            trajectory.finish_reason = await self._turns(trajectory, sampling)
        finally:
            for tool in self.tools.values():
                trajectory.tool_reward += await tool.calc_reward(trajectory.instance_id)
                await tool.release(trajectory.instance_id)
            trajectory.move(AgentState.COMPLETED)
        return trajectory

    async def _turns(self, trajectory: Trajectory, sampling: SamplingParams) -> str:
        while True:
            budget = self.response_length - len(trajectory.response_ids)
            if budget <= 0:
                return FINISH_LENGTH
            trajectory.move(AgentState.RUNNING)
            params = dataclasses.replace(
                sampling, max_new_tokens=budget, seed=sample_seed(trajectory.seed, trajectory.assistant_turns)
            )
            request = GenerationRequest(trajectory.prompt_ids + trajectory.response_ids, params, trajectory.instance_id)
            result = await self.engine.generate(request)
            trajectory.extend(result.token_ids, 1, result.log_probs)
            trajectory.assistant_turns += 1
            if result.finish_reason == FINISH_LENGTH:
                return FINISH_LENGTH
            parsed = self.parse(self.tokenizer.decode(result.token_ids, skip_special_tokens=True))
            if not parsed.has_calls:
                return "stop"
            if self._turn_limit_reached(trajectory):
                return "max_turns"
            trajectory.move(AgentState.TOOL_CALLING)
            texts = await self._call_tools(trajectory, parsed)
            ended_with_eos = bool(result.token_ids) and result.token_ids[-1] == self.tokenizer.eos_token_id
            tool_tokens = self.encoder.encode(texts, ended_with_eos)
            room = self.response_length - len(trajectory.response_ids)
            trajectory.extend(tool_tokens[:room], 0)
            trajectory.user_turns += 1

    def _turn_limit_reached(self, trajectory: Trajectory) -> bool:
        limits = self.multi_turn
        assistant_done = (
            limits.max_assistant_turns is not None and trajectory.assistant_turns >= limits.max_assistant_turns
        )
        user_done = limits.max_user_turns is not None and trajectory.user_turns >= limits.max_user_turns
        return assistant_done or user_done

    async def _call_tools(self, trajectory: Trajectory, parsed: ParsedOutput) -> list[str]:
        """One tool message per call (in order), then one per malformed call."""
        limit = asyncio.Semaphore(self.multi_turn.max_parallel_calls)

        async def bounded(call: ToolCall) -> str:
            async with limit:
                return await self._call_tool(trajectory, call)

        texts = await asyncio.gather(*(bounded(call) for call in parsed.tool_calls))
        return [self._clip(text) for text in [*texts, *(f"Error: {error}" for error in parsed.errors)]]

    async def _call_tool(self, trajectory: Trajectory, call: ToolCall) -> str:
        tool = self.tools.get(call.name)
        if tool is None:
            return f"Error: unknown tool {call.name!r}; available tools: {sorted(self.tools)}"
        try:
            bound = tool.timeout + TOOL_TIMEOUT_GRACE_S
            # On a thread of its own: a tool that blocks (time.sleep, a blocking client) cannot stall the rollout.
            result = await run_off_loop(
                tool.execute(trajectory.instance_id, call.arguments), bound, f"tool-{call.name}"
            )
        except asyncio.TimeoutError:
            return f"Error: tool {call.name!r} did not answer within {tool.timeout:g} s"
        except Exception as error:  # noqa: BLE001 - a failing tool must not crash the rollout
            return f"Error: tool {call.name!r} failed: {type(error).__name__}: {error}"
        tool.record_reward(trajectory.instance_id, result.reward)
        return result.text

    def _clip(self, text: str) -> str:
        limit = self.multi_turn.max_tool_response_length
        return text if len(text) <= limit else text[:limit] + "...(truncated)"


def _tools_kwargs_column(prompts: DataProto) -> list[dict[str, Any]]:
    """Per-row ``tools_kwargs``: the column of that name, else ``extra_info['tools_kwargs']``, else empty."""
    rows = len(prompts)
    columns = prompts.non_tensor_batch
    if "tools_kwargs" in columns:
        return [dict(value or {}) for value in columns["tools_kwargs"]]
    if "extra_info" in columns:
        return [dict((info or {}).get("tools_kwargs") or {}) for info in columns["extra_info"]]
    return [{} for _ in range(rows)]
