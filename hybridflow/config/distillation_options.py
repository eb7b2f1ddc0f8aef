"""``distillation.*``: verl's on-policy distillation, read once. A single teacher (``teacher_models.teacher_model``)
runs as a role of its own, ``teacher``, on a pool of ``distillation.nnodes x distillation.n_gpus_per_node``
processes: a frozen FSDP-sharded model that scores each sample's response tokens (its top-k log-probs for
``forward_kl_topk``, else the sampled token's), micro-batched and sharded like the reference
(``actor_rollout_ref.ref.*``). verl serves teachers from inference servers on that pool; the servers' settings
(``inference.*`` but ``dtype``) change how fast the log-probs come, not what they are, and are listed at start-up as
not read. Several teachers routed by ``teacher_key`` (verl's MOPD) are refused in one line.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from hybridflow.config.schema import TEACHER_FOLLOWS_ROLLOUT, TEACHER_SERVER, PPOTrainerConfig

KEY = "distillation"
TEACHER_ROLE = "teacher"
DEFAULT_TEACHER = "teacher_model"
TEACHER_FIELDS = ("key", "model_path", "num_replicas", "inference")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TeacherSpec:
    """What the teacher's workers read: its folder and weights' dtype, and how many log-probs per position (None:
    the sampled token's only)."""

    model_path: str
    dtype: str
    topk: int | None


def distills(config: PPOTrainerConfig) -> bool:
    return config.distillation.enabled


def teacher_entries(config: PPOTrainerConfig) -> dict[str, dict]:
    """The teachers as verl resolves them: ``teacher_model`` alone, or every other entry once one is added."""
    entries = dict(config.distillation.teacher_models)
    if len(entries) > 1:
        entries.pop(DEFAULT_TEACHER, None)
    return entries


def single_teacher(config: PPOTrainerConfig) -> tuple[str, dict] | None:
    """The one teacher's entry name and settings, where the run distills from exactly one (None otherwise)."""
    entries = teacher_entries(config) if distills(config) else {}
    return next(iter(entries.items())) if len(entries) == 1 else None


def teacher_spec(config: PPOTrainerConfig) -> TeacherSpec:
    (entry,) = teacher_entries(config).values()
    inference = entry.get("inference") or {}
    loss = config.distillation.distillation_loss
    return TeacherSpec(
        model_path=str(entry["model_path"]),
        dtype=inference.get("dtype") or config.actor_rollout_ref.rollout.dtype,
        topk=loss.topk if loss.uses_topk else None,
    )


def teacher_pool_shape(config: PPOTrainerConfig) -> tuple[int, int]:
    return config.distillation.nnodes, config.distillation.n_gpus_per_node


def teacher_pool_processes(config: PPOTrainerConfig) -> int:
    """Processes of the teacher's pool (0 without distillation)."""
    return config.distillation.nnodes * config.distillation.n_gpus_per_node if distills(config) else 0


def distillation_errors(config: PPOTrainerConfig) -> list[str]:
    """Everything about the section that cannot run, one line each (none when distillation is off)."""
    if not distills(config):
        return []
    section = config.distillation
    errors = section.distillation_loss.errors()
    if section.nnodes < 1 or section.n_gpus_per_node < 1:
        errors.append(
            f"{KEY}.nnodes={section.nnodes} x {KEY}.n_gpus_per_node={section.n_gpus_per_node}: the teacher needs a "
            "pool of at least one process; set both >= 1"
        )
    entries = teacher_entries(config)
    if len(entries) > 1:
        return errors + [
            f"{KEY}.teacher_models has {len(entries)} teachers ({', '.join(entries)}) routed by {KEY}.teacher_key "
            "(verl's MOPD), which hybridflow does not have; keep one, as teacher_models.teacher_model"
        ]
    ((name, entry),) = entries.items()
    prefix = f"{KEY}.teacher_models.{name}"
    unknown = sorted(set(entry) - set(TEACHER_FIELDS))
    if unknown:
        errors.append(f"{prefix} has unknown keys {unknown}; a teacher has {list(TEACHER_FIELDS)}")
    if not entry.get("model_path"):
        errors.append(f"{prefix}.model_path is empty: set it to the teacher's model folder")
    dtype = (entry.get("inference") or {}).get("dtype")
    if dtype is not None and dtype not in DTYPES:
        errors.append(f"{prefix}.inference.dtype={dtype!r}; choose one of {list(DTYPES)}")
    if section.distillation_loss.uses_topk and config.actor_rollout_ref.actor.ulysses_sequence_parallel_size > 1:
        errors.append(
            f"{KEY}.distillation_loss.loss_mode=forward_kl_topk with actor_rollout_ref.actor."
            "ulysses_sequence_parallel_size > 1 needs top-k log-probs under Ulysses, which hybridflow does not have; "
            "use loss_mode=k3, or sequence parallel size 1"
        )
    return errors


def teacher_model_key(config: PPOTrainerConfig) -> tuple[str, str] | None:
    """The teacher's folder key and path, where the run distills from one teacher that names a folder."""
    if (teacher := single_teacher(config)) is None:
        return None
    name, entry = teacher
    return (f"{KEY}.teacher_models.{name}.model_path", str(entry["model_path"])) if entry.get("model_path") else None


def teacher_vocabulary_errors(config: PPOTrainerConfig) -> list[str]:
    """The teacher reads the student's token ids: both folders' vocabularies must be the same size."""
    named = teacher_model_key(config)
    if named is None:
        return []
    key, path = named
    student_path = config.actor_rollout_ref.model.path
    teacher, student = _vocab_size(path), _vocab_size(student_path)
    if None in (teacher, student) or teacher == student:
        return []
    return [
        f"{key}={path!r} has vocab_size {teacher}, the student ({student_path}) {student}: the teacher reads the "
        "student's token ids; pick a teacher of the same tokenizer"
    ]


def _vocab_size(path: str) -> int | None:
    config_file = pathlib.Path(path).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    text = json.loads(config_file.read_text())
    return text.get("vocab_size", (text.get("text_config") or {}).get("vocab_size"))


def teacher_server_notes(config: PPOTrainerConfig) -> list[str]:
    """The start-up line for the teacher's keys that change nothing here: verl's server settings set away from
    verl's defaults (or, for those that follow the rollout's, away from the rollout's), ``key`` and
    ``num_replicas``."""
    if (teacher := single_teacher(config)) is None:
        return []
    name, entry = teacher
    rollout = config.actor_rollout_ref.rollout
    expected = {**TEACHER_SERVER, **{key: getattr(rollout, key) for key in TEACHER_FOLLOWS_ROLLOUT}}
    inference = entry.get("inference") or {}
    # None: a setting that follows the rollout's
    changed = [
        f"inference.{key}"
        for key in sorted(inference)
        if key != "dtype" and inference[key] is not None and inference[key] != expected.get(key)
    ]
    unread = [key for key in ("key", "num_replicas") if entry.get(key)] + changed
    if not unread:
        return []
    return [
        f"{KEY}.teacher_models.{name}: {', '.join(unread)} accepted, but not read: they size verl's teacher "
        f"inference servers; here the teacher is one FSDP group over the {KEY} pool, and its log-probs are the same"
    ]
