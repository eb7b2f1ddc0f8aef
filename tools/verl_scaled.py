"""Run one of verl's launch commands on this CPU, scaled down by one rule: ``verl_surface.py run``'s stand-in trainer.

    python tools/verl_scaled.py <hybridflow trainer module> <the script's arguments after verl's module>

The script's own arguments stay as they are; after them come, and win:

- **models**: every model path (``*.model.path``, ``*.model.tokenizer_path``, a teacher's ``model_path``) becomes a
  tiny random model of the same family (``hybridflow.models.tiny``: its family's traits, a byte-level tokenizer),
  with room for the script's prompt and response lengths; a reward model's becomes the tiny reward model; a LoRA
  adapter to start from, an adapter of the tiny model at the script's rank and target modules;
- **data**: every data file becomes a small parquet of verl's schema for the data set its path names (gsm8k,
  MATH, full_hh_rlhf: 32 training rows, 8 validation rows of arithmetic in that data set's prompt form and
  data_source);
- **scale**: the cluster becomes one node of 2 processes (every ``nnodes`` >= 1 becomes 1 and every
  ``n_gpus_per_node`` 2; with a teacher's or rollout's pool of its own, the processes share the CPUs through
  ``trainer.cpus_per_worker``), every parallel size p becomes min(p, 2), and every batch size counted in prompts b
  becomes max(2, round(b / f)) with f = data.train_batch_size / 8 (a 1024-prompt step becomes 8 prompts and its
  256-prompt mini-batches 2); a per-process micro-batch size becomes the largest size up to it that divides
  what one process gets of a mini-batch (of a step, for the log-prob passes);
- **vLLM on CPU**: its CPU build reads ``gpu_memory_utilization`` as a share of the machine's memory per process,
  so it gets a KV cache for one step's samples at full length instead (``engine_kwargs.vllm.kv_cache_memory_bytes``),
  ``enforce_eager=false`` (CUDA graphs on a GPU) would compile the model there: it runs eager; and chunked
  prefill, which that build cannot do on seeded requests, is off (``max_num_batched_tokens`` at least a sequence),
  and with it prefix caching for a model with recurrent layers, which vLLM does only chunked; such a model rolls
  out in bfloat16, verl's default rollout dtype (hybridflow's is float32), the one that build's kernel of its
  layers takes;
- **length**: 2 steps (``trainer.total_training_steps=2``).

Nothing else changes: the algorithm, its losses, ``rollout.n``, lengths, engines, other dtypes, offload, checkpointing
and loggers are the script's. A model or data set with no stand-in here (a multimodal model, a family
``hybridflow.models.tiny`` cannot build, data whose path names no data set of verl's examples) stops with one line
starting ``no stand-in:``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROCESSES = 2
COMMAND_FILE = "verl_command.json"
PROMPTS_PER_STEP = 8
STEPS = 2
CONFIG_NAMES = {
    "hybridflow.trainer.main_ppo": "ppo_trainer",
    "hybridflow.experimental.one_step_off_policy.main_ppo": "one_step_off_ppo_trainer",
    "hybridflow.experimental.fully_async_policy.fully_async_main": "fully_async_ppo_trainer",
}
# A model's family from its name (the first pattern that matches); None: no tiny stand-in can be built.
FAMILY_PATTERNS = (
    (r"vl\b|vl-|-v\d|\d+v\b|\dv-|omni|minicpm-o|llava|video", None),  # multimodal
    (r"qwen3[._-]?5", None),  # multimodal gated-delta-net hybrids
    (r"qwen3[._-]?next", "qwen3_next"),
    (r"qwen3.*-a\d+b|qwen3.*moe", "qwen3_moe"),
    (r"qwen3", "qwen3"),
    (r"qwen2|qwq|deepseek-r1-distill-qwen", "qwen2"),
    (r"llama", "llama"),
    (r"mistral", "mistral"),
    (r"gemma-?3", "gemma3"),
    (r"seed-oss", "seed_oss"),
)
# verl's example data sets (examples/data_preprocess): (path pattern, data_source, the instruction its prompts end
# with, how an answer is written in the ground truth).
DATA_SETS = (
    ("gsm8k", "openai/gsm8k", 'Let\'s think step by step and output the final answer after "####".'),
    # DAPO's sets (DAPO-Math-17k, and AIME 2024 as DAPO ships it), scored by verl's math_dapo rule
    ("dapo-math|aime", "math_dapo", 'Remember to put your answer on its own line after "Answer:".'),
    (
        "math",
        "DigitalLearningGmbH/MATH-lighteval",
        "Let's think step by step and output the final answer within \\boxed{}.",
    ),
    ("full_hh_rlhf", "Dahoas/full-hh-rlhf", "Answer briefly."),  # verl scores it with a reward model
)
MODEL_KEYS = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path",
    "critic.model.tokenizer_path",
)
ADAPTER_KEY = "actor_rollout_ref.model.lora_adapter_path"
REWARD_MODEL_KEYS = ("reward_model.model.path", "reward.reward_model.model_path")
DATA_KEYS = ("data.train_files", "data.val_files")
PROMPT_BATCH_KEYS = (
    "data.train_batch_size",
    "data.gen_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "critic.ppo_mini_batch_size",
)
# A micro-batch key and the mini-batch it splits
MINI_BATCH_MICRO_KEYS = {
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "critic.ppo_micro_batch_size_per_gpu": "critic.ppo_mini_batch_size",
}
STEP_MICRO_KEYS = (
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size_per_gpu",
)
PARALLEL_SIZE = re.compile(
    r"(tensor_model_parallel_size|ulysses_sequence_parallel_size|tensor_parallel_size|"
    r"expert_parallel_size|data_parallel_size|context_parallel_size|fsdp_size)$"
)


class NoStandIn(Exception):
    """A model or data set of the script that this tool has no small stand-in for."""


def composed(module: str, args: list[str]):
    """The script's config as hybridflow composes it (its own keys, verl's compatible keys, the defaults)."""
    from hydra import compose, initialize_config_dir

    from hybridflow.config.command_line import hydra_arguments, split_hydra_flags

    hydra_args, _ = hydra_arguments(args)
    flags, overrides = split_hydra_flags(hydra_args)
    name = CONFIG_NAMES[module]
    for position, flag in enumerate(flags):
        if flag.startswith(("--config-name", "-cn")):
            name = flag.split("=", 1)[1] if "=" in flag else flags[position + 1]
    with initialize_config_dir(str(REPO / "hybridflow/config/yaml"), version_base=None):
        return compose(config_name=name.removesuffix(".yaml"), overrides=overrides)


def model_family(path: str) -> str:
    from hybridflow.models.tiny import FAMILIES

    name = pathlib.PurePath(str(path).rstrip("/")).name.lower()
    for pattern, family in FAMILY_PATTERNS:
        if re.search(pattern, name):
            if family not in FAMILIES:
                raise NoStandIn(f"model {name}: hybridflow.models.tiny builds no model of its family")
            return family
    raise NoStandIn(f"model {name}: its family is not one hybridflow.models.tiny builds")


def tiny_model(cache: pathlib.Path, family: str, positions: int) -> str:
    from hybridflow.models.tiny import build_tiny_model

    folder = cache / f"{family}-{positions}"
    if not (folder / "config.json").is_file():
        build_tiny_model(folder, family=family, max_position_embeddings=positions)
    return str(folder)


def tiny_adapter(cache: pathlib.Path, model_dir: str, rank: int, targets) -> str:
    """A peft LoRA adapter of the tiny model at the script's rank and target modules (zero B: the model as is)."""
    from peft import LoraConfig, get_peft_model

    from hybridflow.models.loading import load_causal_lm

    folder = cache / f"adapter-{pathlib.Path(model_dir).name}-r{rank}"
    if not (folder / "adapter_config.json").is_file():
        modules = targets if isinstance(targets, str) else list(targets)
        lora = LoraConfig(r=max(rank, 1), lora_alpha=2 * max(rank, 1), target_modules=modules, task_type="CAUSAL_LM")
        get_peft_model(load_causal_lm(model_dir), lora).save_pretrained(folder)
    return str(folder)


def tiny_reward_model(cache: pathlib.Path) -> str:
    from hybridflow.models.tiny_reward_model import build_tiny_reward_model

    folder = cache / "reward-model"
    if not (folder / "config.json").is_file():
        build_tiny_reward_model(folder)
    return str(folder)


def data_file(cache: pathlib.Path, path: str, split: str) -> str:
    from hybridflow.data.parquet_io import write_parquet_rows
    from hybridflow.data.synthetic import arithmetic_problems, to_verl_rows

    found = [entry for entry in DATA_SETS if re.search(entry[0], str(path).lower())]
    if not found:
        raise NoStandIn(
            f"data {path}: its path names none of verl's example data sets ({', '.join(p for p, *_ in DATA_SETS)})"
        )
    pattern, data_source, instruction = found[0]
    target = cache / pattern / f"{split}.parquet"
    if not target.is_file():
        problems = arithmetic_problems(32 if split == "train" else 8, seed=0 if split == "train" else 1)
        problems = [dataclasses.replace(problem, question=f"{problem.question} {instruction}") for problem in problems]
        write_parquet_rows(to_verl_rows(problems, data_source, "math", split), target)
    return str(target)


def _values(config, keys) -> dict:
    from omegaconf import OmegaConf

    found = {key: OmegaConf.select(config, key, default=None) for key in keys}
    return {key: value for key, value in found.items() if value not in (None, "")}


def _flat_keys(config, prefix: str = "") -> list[str]:
    from omegaconf import DictConfig

    keys = []
    for key in config.keys():
        value = config._get_node(key)
        if isinstance(value, DictConfig):
            keys += _flat_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def sequence_tokens(config) -> int:
    """A sequence's longest length: prompt + response, or the rollout's max_model_len where that is longer."""
    data = config.data
    rollout_length = int(config.actor_rollout_ref.rollout.get("max_model_len") or 0)
    return max(rollout_length, int(data.max_prompt_length) + int(data.max_response_length))


def model_overrides(config, cache: pathlib.Path) -> list[str]:
    """Every model path of the script replaced by a tiny model of its family (a reward model's by the tiny one)."""
    from omegaconf import OmegaConf

    positions = max(1024, sequence_tokens(config))
    overrides = [
        f"{key}={tiny_model(cache, model_family(path), positions)}" for key, path in _values(config, MODEL_KEYS).items()
    ]
    teachers = OmegaConf.select(config, "distillation.teacher_models", default=None) or {}
    for name, teacher in teachers.items():
        if teacher.get("model_path"):
            family = model_family(teacher.model_path)
            overrides.append(f"distillation.teacher_models.{name}.model_path={tiny_model(cache, family, positions)}")
    model = config.actor_rollout_ref.model
    actor = tiny_model(cache, model_family(model.path), positions)
    if model.get("lora_adapter_path"):
        overrides.append(f"{ADAPTER_KEY}={tiny_adapter(cache, actor, int(model.lora_rank), model.target_modules)}")
    overrides += [f"{key}={tiny_reward_model(cache)}" for key in _values(config, REWARD_MODEL_KEYS)]
    return overrides + vllm_cpu_overrides(config, actor)


def vllm_cpu_overrides(config, model: str) -> list[str]:
    """What a GPU setting of vLLM means on its CPU build. gpu_memory_utilization is read as a share of the machine's
    memory node, per process, which a GPU's share does not scale to: vLLM gets a KV cache for one step's samples
    at full length in float32 instead, as hybridflow's own vLLM runs do. enforce_eager=false asks for CUDA graphs;
    the CPU build compiles the model with torch.compile instead (minutes per start on 2 cores): it runs eager.
    Chunked prefill (a scheduling choice) fails there on seeded requests: it is off, and a step's token budget at
    least a sequence; unchunked, vLLM caches no prefixes of a model with recurrent layers (Qwen3-Next's): off too.
    Its kernel of those layers' gated delta rule runs in bfloat16 only: such a model rolls out in bfloat16, verl's
    default rollout dtype, where the script keeps hybridflow's (float32)."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm":
        return []
    from hybridflow.models.layouts import recurrent_layer_types
    from hybridflow.models.loading import load_model_config
    from hybridflow.rollout.vllm_memory import KV_BYTES_KEY, kv_cache_bytes

    samples = PROMPTS_PER_STEP * int(rollout.n)
    length = sequence_tokens(config)
    model_config = load_model_config(model)
    cache = kv_cache_bytes(model_config, "float32", samples, length)
    eager = ["actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.rollout.enable_chunked_prefill=false"]
    if recurrent_layer_types(model_config):
        eager.append("actor_rollout_ref.rollout.enable_prefix_caching=false")
        if rollout.dtype == "float32":  # hybridflow's default, not the script's choice: verl's is bfloat16
            eager.append("actor_rollout_ref.rollout.dtype=bfloat16")
    # Unchunked, a whole sequence is one scheduling step's work
    budget = [f"actor_rollout_ref.rollout.max_num_batched_tokens={length}"]
    return [f"+{KV_BYTES_KEY}={cache}", *eager, *(budget if int(rollout.max_num_batched_tokens) < length else [])]


def data_overrides(config, cache: pathlib.Path) -> list[str]:
    overrides = []
    for key, files in _values(config, DATA_KEYS).items():
        split = "train" if key == "data.train_files" else "test"
        paths = [files] if isinstance(files, str) else list(files)
        stand_ins = list(dict.fromkeys(data_file(cache, path, split) for path in paths))
        overrides.append(f"{key}=[{','.join(stand_ins)}]")
    return overrides


def scale_overrides(config) -> list[str]:
    """The one rule: one node of 2 processes, parallel sizes within it, prompts per step 8, 2 steps."""
    keys = _flat_keys(config)
    values = _values(config, keys)
    overrides = [f"{key}=1" for key in keys if key.endswith("nnodes") and int(values.get(key) or 0) >= 1]
    overrides += [f"{key}={PROCESSES}" for key in keys if key.endswith("n_gpus_per_node")]
    for key in keys:
        if PARALLEL_SIZE.search(key) and isinstance(values.get(key), int) and values[key] > PROCESSES:
            overrides.append(f"{key}={PROCESSES}")
    factor = step_prompts(values) / PROMPTS_PER_STEP
    # At least 2 (a batch over 2 processes), never more than the script's (fully async's gen_batch_size=1); a key
    # at 0 is unset (fully async's train_batch_size: its steps are require_batches mini-batches)
    prompts = {
        key: max(min(2, int(values[key])), round(int(values[key]) / factor))
        for key in PROMPT_BATCH_KEYS
        if values.get(key)
    }
    overrides += [f"{key}={value}" for key, value in prompts.items()]
    n = int(values.get("actor_rollout_ref.rollout.n") or 1)
    caps = {key: prompts.get(mini, 0) for key, mini in MINI_BATCH_MICRO_KEYS.items()}
    caps.update(dict.fromkeys(STEP_MICRO_KEYS, PROMPTS_PER_STEP))
    for key, cap_prompts in caps.items():
        per_process = max(1, cap_prompts * n // PROCESSES)
        micro = int(values.get(key) or 0)
        if micro and per_process % micro:  # the largest size up to the script's that splits a process's share
            overrides.append(f"{key}={max(d for d in range(1, min(micro, per_process) + 1) if per_process % d == 0)}")
    return [*overrides, *cpu_share_overrides(config), f"trainer.total_training_steps={STEPS}"]


def step_prompts(values: dict) -> int:
    """The prompts a step trains on: data.train_batch_size, or under fully async (which does not read it)
    async_training.require_batches mini-batches of actor.ppo_mini_batch_size prompts."""
    if values.get("async_training.enable"):
        mini_batches = int(values.get("async_training.require_batches") or 1)
        return mini_batches * int(values["actor_rollout_ref.actor.ppo_mini_batch_size"])
    return int(values["data.train_batch_size"])


def cpu_share_overrides(config) -> list[str]:
    """A teacher's or a rollout's pool of its own adds 2 processes: the processes share this machine's CPUs."""
    from omegaconf import OmegaConf

    extra = bool(OmegaConf.select(config, "distillation.enabled", default=False))
    v1_mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    extra += not config.actor_rollout_ref.hybrid_engine or v1_mode == "separate_async"
    share = len(os.sched_getaffinity(0)) / (PROCESSES * (1 + extra))
    return [f"trainer.cpus_per_worker={share:g}"] if extra and share < config.trainer.cpus_per_worker else []


def main() -> None:
    module, args = sys.argv[1], sys.argv[2:]
    cache = pathlib.Path(os.environ.get("VERL_SCALED_CACHE", pathlib.Path.cwd() / "stand-ins"))
    # What the script ran, for verl_surface.py run --record (the sample that CI runs without verl's scripts)
    pathlib.Path(COMMAND_FILE).write_text(json.dumps({"module": module, "args": args}))
    from hybridflow.config.load import ConfigError

    try:
        config = composed(module, args)
    except ConfigError:  # a command line the trainer refuses alone: it says so in its own words
        os.execv(sys.executable, [sys.executable, "-m", module, *args])
    try:
        added = model_overrides(config, cache / "models") + data_overrides(config, cache / "data")
    except NoStandIn as missing:
        sys.exit(f"no stand-in: {missing}")
    added += scale_overrides(config)
    print("[verl_scaled] " + " ".join(added), flush=True)
    os.execv(sys.executable, [sys.executable, "-m", module, *args, *added])


if __name__ == "__main__":
    main()
