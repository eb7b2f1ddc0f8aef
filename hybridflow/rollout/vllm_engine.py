"""Optional rollout engine on vLLM ("vllm"), for GPU users: ``pip install 'hybridflow[vllm]'``.

Written against vLLM's offline ``LLM`` API (``LLM.generate`` with token prompts, ``SamplingParams``,
``sleep``/``wake_up`` with ``enable_sleep_mode``). Weight sync copies each tensor through the model's own
``load_weights`` inside the engine process, so vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and
with tensor parallel size 1. Not exercised on the CPU-only machines this project is built on: the test in
tests/rollout/test_vllm_engine.py runs only where vllm is installed.

Log-probs are vLLM's own (its ``logprobs_mode``; by default before temperature), unlike the "hf" engine's.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Iterable

import torch

from hybridflow.rollout.base import ROLLOUT_ENGINES, MissingExtraError, RolloutEngine
from hybridflow.rollout.config import RolloutConfig, SamplingParams
from hybridflow.rollout.requests import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, GenerationRequest, GenerationResult


def import_vllm() -> Any:
    """The ``vllm`` module, or ``MissingExtraError`` saying how to install it."""
    try:
        import vllm
    except ImportError as error:
        raise MissingExtraError(
            "actor_rollout_ref.rollout.name='vllm' needs the vllm package: pip install 'hybridflow[vllm]' "
            "(on a CPU-only machine use actor_rollout_ref.rollout.name=hf)"
        ) from error
    return vllm


@ROLLOUT_ENGINES.register("vllm")
class VLLMRolloutEngine(RolloutEngine):
    """Wraps one in-process ``vllm.LLM``; concurrent ``generate`` calls are gathered into one ``LLM.generate``."""

    def __init__(self, llm: Any, tokenizer: Any, config: RolloutConfig):
        super().__init__(config, tokenizer)
        self.llm = llm
        self._waiting: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._flushing = False

    @classmethod
    def from_pretrained(
        cls, model_path: str | os.PathLike, config: RolloutConfig, tokenizer: Any = None, device: str | None = None
    ) -> "VLLMRolloutEngine":
        """vLLM places the model itself (``device`` is not used) and keeps its own copy of the tokenizer."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = import_vllm()
        llm = vllm.LLM(model=str(model_path), **engine_arguments(config))
        return cls(llm, tokenizer if tokenizer is not None else llm.get_tokenizer(), config)

    @property
    def eos_token_ids(self) -> set[int]:
        return {self.tokenizer.eos_token_id}

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        vllm = import_vllm()
        prompts = [vllm.TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        params = [_sampling_params(vllm, r.sampling, self.config.ignore_eos) for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        return [_result(output, request) for output, request in zip(outputs, requests)]

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if not self._flushing:
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._flush()))
            self._flushing = True
        return await future

    async def _flush(self) -> None:
        """Run everything waiting as one batch (off the event loop), then whatever arrived meanwhile."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                results = await asyncio.to_thread(self.generate_batch, [request for request, _ in batch])
            except Exception as error:  # noqa: BLE001 - every waiting caller gets the error
                for _, future in batch:
                    future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results):
                future.set_result(result)
        self._flushing = False

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        for name, tensor in named_tensors:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            model.load_weights([(name, tensor)])
            del tensor

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()


def engine_arguments(config: RolloutConfig) -> dict[str, Any]:
    """``vllm.LLM``'s keyword arguments from verl's rollout keys, then ``engine_kwargs.vllm`` on top."""
    arguments = dict(
        dtype=config.dtype,
        seed=config.seed,
        gpu_memory_utilization=config.gpu_memory_utilization,
        tensor_parallel_size=config.tensor_model_parallel_size,
        pipeline_parallel_size=config.pipeline_model_parallel_size,
        data_parallel_size=config.data_parallel_size,
        enable_expert_parallel=config.expert_parallel_size > 1,
        max_model_len=config.max_model_len or config.prompt_length + config.response_length,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        enforce_eager=config.enforce_eager,
        enable_chunked_prefill=config.enable_chunked_prefill,
        enable_prefix_caching=config.enable_prefix_caching,
        disable_log_stats=config.disable_log_stats,
        scheduling_policy=config.scheduling_policy,
        quantization=config.quantization,
        logprobs_mode=config.logprobs_mode,
        enable_sleep_mode=True,
    )
    if config.cudagraph_capture_sizes:
        arguments["compilation_config"] = {"cudagraph_capture_sizes": list(config.cudagraph_capture_sizes)}
    # The model loads its real weights here; verl's 'dummy' relies on a sync before the first rollout.
    if config.load_format != "dummy":
        arguments["load_format"] = config.load_format
    return {**arguments, **dict(config.engine_kwargs.get("vllm") or {})}


def _sampling_params(vllm: Any, sampling: SamplingParams, ignore_eos: bool = False) -> Any:
    return vllm.SamplingParams(
        ignore_eos=ignore_eos,
        n=1,
        temperature=0.0 if sampling.greedy else sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        max_tokens=sampling.max_new_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        include_stop_str_in_output=True,
        seed=sampling.seed,
        logprobs=0,
    )


def _result(output: Any, request: GenerationRequest) -> GenerationResult:
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    log_probs = [entry[token].logprob for entry, token in zip(completion.logprobs or [], token_ids)]
    if completion.finish_reason == "length":
        reason = FINISH_LENGTH
    else:
        reason = FINISH_STOP if isinstance(completion.stop_reason, str) else FINISH_EOS
    return GenerationResult(token_ids, log_probs or [0.0] * len(token_ids), reason, request.request_id)
