"""The generative judge's worker (``reward_model.judge.enable=true``): a causal LM served by a rollout engine that
answers each judge prompt the driver sends (``trainer/judge_scoring.py`` renders them and parses the answers).

Each prompt is the user message of a one-turn chat in the judge's own chat template, answered greedily by default
(``judge.temperature``). Where the judge shares its processes with the policy (``trainer.placement=colocated``) its
engine sleeps between scorings (``judge.free_cache_engine``): its KV cache is freed, and off the CPU its weights
leave the device while the policy trains.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hybridflow.distributed import Dispatch, Worker, register
from hybridflow.models.loading import load_model_config, load_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rollout import RolloutConfig, create_rollout_engine
from hybridflow.rollout.config import SamplingParams
from hybridflow.rollout.requests import GenerationRequest
from hybridflow.rollout.vllm_memory import kv_cache_bytes, max_model_len
from hybridflow.workers.config import RewardModelConfig, WorkerConfigError, as_config

PROMPTS, ANSWERS = "judge_prompt", "judge_answer"
JUDGE_SEQUENCES = 64  # judge prompts vLLM decodes together on CPU; its KV cache holds that many


class GenerativeJudgeWorker(Worker):
    """SPMD worker over the ``reward_model`` section: ``judge`` -> each prompt's answer text."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = as_config(RewardModelConfig, config)
        self.engine = None
        self.tokenizer = None
        self.asleep = False
        self.calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model, judge = self.config.model, self.config.judge
        if not model.path:
            raise WorkerConfigError("reward_model.model.path is empty: set it to the judge model's folder")
        self.tokenizer = load_tokenizer(model.path, trust_remote_code=model.trust_remote_code)
        engine_config = RolloutConfig(
            name=judge.engine,
            dtype=model.dtype,
            response_length=judge.response_length,
            temperature=judge.temperature,
            do_sample=judge.temperature > 0,
            free_cache_engine=judge.free_cache_engine,
        )
        if judge.engine == "vllm" and self.device.type == "cpu":
            engine_config = vllm_on_cpu(engine_config, model.path)
        self.engine = create_rollout_engine(
            engine_config, model.path, tokenizer=self.tokenizer, device=str(self.device)
        )
        self._sleep()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def judge(self, data: DataProto) -> DataProto:
        """``judge_answer``: the judge's decoded answer to each ``judge_prompt``."""
        if self.engine is None:
            raise RuntimeError("GenerativeJudgeWorker: call init_model before judge")
        if self.asleep:
            self.engine.wake()
            self.asleep = False
        judge = self.config.judge
        sampling = SamplingParams(
            max_new_tokens=judge.response_length, temperature=judge.temperature, do_sample=judge.temperature > 0
        )
        requests = []
        for index, prompt in enumerate(data.non_tensor_batch[PROMPTS]):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": str(prompt)}], add_generation_prompt=True, tokenize=False
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            seed = hash((self.calls, self.rank, index)) % 2**31
            requests.append(GenerationRequest(list(ids), sampling=dataclasses.replace(sampling, seed=seed)))
        self.calls += 1
        results = self.engine.generate_batch(requests)
        answers = [self.tokenizer.decode(result.token_ids, skip_special_tokens=True) for result in results]
        self._sleep()
        return DataProto(batch=data.batch, non_tensor_batch={ANSWERS: np.asarray(answers, dtype=object)})

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def engine_asleep(self) -> bool:
        return self.asleep

    def _sleep(self) -> None:
        if self.config.judge.free_cache_engine and not self.asleep:
            self.engine.sleep()
            self.asleep = True


def vllm_on_cpu(config: RolloutConfig, model_path: str) -> RolloutConfig:
    """vLLM's CPU build serving the judge: eager, prefills not split (its seeded requests refuse a split one), and
    a KV cache for ``JUDGE_SEQUENCES`` prompts at once instead of a share of the machine's memory."""
    cache = kv_cache_bytes(load_model_config(model_path), config.dtype, JUDGE_SEQUENCES, max_model_len(config))
    return dataclasses.replace(
        config,
        enforce_eager=True,
        enable_chunked_prefill=False,
        max_num_seqs=JUDGE_SEQUENCES,
        engine_kwargs={"vllm": {"kv_cache_memory_bytes": cache}},
    )
