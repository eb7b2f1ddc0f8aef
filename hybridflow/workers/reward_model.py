"""The reward-model worker: a learned scalar score per sample, placed on its last response token.

The reward model reads the policy's token ids as they are when it shares the policy's tokenizer and chat template.
With ``reward_model.model.input_tokenizer`` (the policy's tokenizer) naming a tokenizer that differs from the
reward model's own, each sample is re-tokenized first, as verl does: its prompt messages (``raw_prompt``) and
decoded response rendered by the reward model's chat template (:mod:`hybridflow.data.reward_model_inputs`). The
score still lands on the policy's last response token.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.data.reward_model_inputs import ChatTemplateSwitch, same_tokenizer
from hybridflow.distributed import Dispatch, Worker, register
from hybridflow.models.layouts import Layout, choose_layout
from hybridflow.models.loading import load_tokenizer
from hybridflow.models.value_model import forward_reward_scores, load_reward_model
from hybridflow.protocol import DataProto
from hybridflow.workers.config import RewardModelConfig, WorkerConfigError, as_config
from hybridflow.workers.fsdp import build_device_mesh, move_model, parameters_on
from hybridflow.workers.model_setup import shard_frozen
from hybridflow.workers.training import MicroBatching, run_in_micro_batches

SCORE_INPUTS = ("input_ids", "attention_mask", "position_ids")


def place_on_last_response_token(scores: torch.Tensor, response_attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` scores -> ``[B, R]`` zeros with each score at its sample's last real response token
    (column 0 for an empty response)."""
    columns = torch.arange(response_attention_mask.shape[1])
    last = (columns * response_attention_mask.bool()).argmax(dim=1)
    placed = torch.zeros(response_attention_mask.shape, dtype=torch.float32)
    placed[torch.arange(scores.shape[0]), last] = scores.float()
    return placed


class RewardModelWorker(Worker):
    """SPMD worker over the ``reward_model`` config section: ``compute_rm_score`` -> ``rm_scores``."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = as_config(RewardModelConfig, config)
        self.module: torch.nn.Module | None = None
        self.switch: ChatTemplateSwitch | None = None  # set by init_model when the tokenizers differ
        self.batching = MicroBatching(
            self.config.micro_batch_size_per_gpu, self.config.use_dynamic_bsz, self.config.forward_max_token_len_per_gpu
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_config = self.config.model
        if not model_config.path:
            raise WorkerConfigError("reward_model.model.path is empty: set it to the reward model's folder")
        model = load_reward_model(
            model_config.path, model_config.dtype, trust_remote_code=model_config.trust_remote_code
        )
        mesh = build_device_mesh(model_config.fsdp_config.fsdp_size, self.device)
        self.module = shard_frozen(model, model_config.fsdp_config, mesh, self.device)
        if model_config.fsdp_config.param_offload:
            move_model(self.module, torch.device("cpu"))
        self.switch = chat_template_switch(self.config)

    def _layout(self, inputs: DataProto, response_length: int) -> Layout | None:
        """The pass's layout: prompts shared where cheaper; None for re-tokenized samples (no response columns)."""
        if self.switch is not None:
            return None
        batch = inputs.batch
        use_remove_padding = self.config.model.use_remove_padding
        return choose_layout(
            self.module, batch["input_ids"], batch["attention_mask"], response_length, None, use_remove_padding
        )

    def _scores(self, micro: DataProto, layout: Layout | None, response_length: int) -> torch.Tensor:
        batch = micro.batch
        return forward_reward_scores(
            self.module,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            use_remove_padding=self.config.model.use_remove_padding,
            layout=layout,
            response_length=response_length,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` [B, R]: the reward model's score of each whole sequence, on its last response token."""
        if self.module is None:
            raise RuntimeError("RewardModelWorker: call init_model before compute_rm_score")
        inputs = self.reward_model_inputs(data)
        response_length = data.batch["responses"].shape[1]
        layout = self._layout(inputs, response_length)
        with parameters_on(self.module, self.device, self.config.model.fsdp_config.param_offload):
            (scores,) = run_in_micro_batches(
                inputs, self.batching, self.device, lambda micro: self._scores(micro, layout, response_length)
            )
        response_attention = data.batch["attention_mask"][:, -response_length:]
        return DataProto.from_dict({"rm_scores": place_on_last_response_token(scores.cpu(), response_attention)})

    def reward_model_inputs(self, data: DataProto) -> DataProto:
        """What the reward model reads: the policy's tokens, or the samples re-tokenized by its own template."""
        if self.switch is None:
            return data.select(batch_keys=list(SCORE_INPUTS))
        if "raw_prompt" not in data.non_tensor_batch:
            raise WorkerConfigError(
                "reward_model.model.input_tokenizer re-tokenizes from each prompt's messages, but the batch has no "
                "raw_prompt column; set data.return_raw_chat=true"
            )
        batch = data.batch
        inputs = self.switch(data.non_tensor_batch["raw_prompt"], batch["responses"], batch["attention_mask"])
        return DataProto.from_dict(inputs)


def chat_template_switch(config: RewardModelConfig) -> ChatTemplateSwitch | None:
    """The re-tokenizing of ``model.input_tokenizer``'s samples for the reward model, or None: no input tokenizer,
    or one the same as the reward model's (its tokens are read as they are)."""
    model_config = config.model
    if not model_config.input_tokenizer:
        return None
    trust = model_config.trust_remote_code
    policy_tokenizer = load_tokenizer(model_config.input_tokenizer, trust_remote_code=trust)
    reward_tokenizer = load_tokenizer(model_config.path, trust_remote_code=trust)
    if same_tokenizer(policy_tokenizer, reward_tokenizer):
        return None
    return ChatTemplateSwitch(policy_tokenizer, reward_tokenizer, config.max_length)
