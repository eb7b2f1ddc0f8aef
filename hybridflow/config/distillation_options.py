"""``distillation.*``: verl's on-policy distillation, read once. A single teacher (``teacher_models.teacher_model``)
runs as a role of its own, ``teacher``, on a pool of ``distillation.nnodes x distillation.n_gpus_per_node``
processes: a frozen FSDP-sharded model that scores each sample's response tokens (its top-k log-probs for
``forward_kl_topk``, else the sampled token's), micro-batched and sharded like the reference
(``actor_rollout_ref.ref.*``). verl serves teachers from inference servers on that pool; the servers' settings
(``inference.*`` but ``dtype``, and ``num_replicas``) change how fast the log-probs come, not what they are, and are
listed at start-up as not read.

Several teachers (verl's multi-teacher distillation, MOPD): each entry of ``teacher_models`` names the rows it
scores by ``key``, the value of the row field ``teacher_key`` (``data_source`` by default); every teacher is sharded
over the whole teacher pool (verl splits the pool between them; the log-probs are the same), and each step's rows go
to their own teacher. A training row whose value names no teacher is refused before the workers start.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Callable

from hybridflow.config.schema import TEACHER_FOLLOWS_ROLLOUT, TEACHER_SERVER, PPOTrainerConfig

KEY = "distillation"
TEACHER_ROLE = "teacher"
DEFAULT_TEACHER = "teacher_model"
TEACHER_FIELDS = ("key", "model_path", "num_replicas", "inference")
DTYPES = ("float32", "bfloat16", "float16")
# The row fields a teacher can be picked by: the string columns every dataset row carries into the batch
ROUTING_FIELDS = ("data_source", "ability")


@dataclass(frozen=True)
class TeacherModel:
    """One teacher: its folder, its weights' dtype, and (with several) the ``teacher_key`` value of its rows."""

    model_path: str
    dtype: str
    key: str | None = None


@dataclass(frozen=True)
class TeacherSpec:
    """What the teacher's workers read: the teachers, how many log-probs per position (None: the sampled token's
    only), and the row field that picks each row's teacher (None: one teacher scores every row)."""

    models: tuple[TeacherModel, ...]
    topk: int | None
    route_by: str | None = None

    def keys(self) -> list[str]:
        return [model.key for model in self.models]


def distills(config: PPOTrainerConfig) -> bool:
    return config.distillation.enabled


def teacher_entries(config: PPOTrainerConfig) -> dict[str, dict]:
    """The teachers as verl resolves them: ``teacher_model`` alone, or every other entry once one is added."""
    entries = dict(config.distillation.teacher_models)
    if len(entries) > 1:
        entries.pop(DEFAULT_TEACHER, None)
    return entries


def teacher_spec(config: PPOTrainerConfig) -> TeacherSpec:
    entries = list(teacher_entries(config).values())
    routed = len(entries) > 1
    loss = config.distillation.distillation_loss
    models = tuple(
        TeacherModel(
            model_path=str(entry["model_path"]),
            dtype=(entry.get("inference") or {}).get("dtype") or config.actor_rollout_ref.rollout.dtype,
            key=str(entry["key"]) if routed else None,
        )
        for entry in entries
    )
    route_by = config.distillation.teacher_key if routed else None
    return TeacherSpec(models, topk=loss.topk if loss.uses_topk else None, route_by=route_by)


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
    for name, entry in entries.items():
        errors += _entry_errors(f"{KEY}.teacher_models.{name}", entry, routed=len(entries) > 1)
    if len(entries) > 1:
        errors += _routing_errors(section.teacher_key, entries)
    if section.distillation_loss.uses_topk and config.actor_rollout_ref.actor.ulysses_sequence_parallel_size > 1:
        errors.append(
            f"{KEY}.distillation_loss.loss_mode=forward_kl_topk with actor_rollout_ref.actor."
            "ulysses_sequence_parallel_size > 1 needs top-k log-probs under Ulysses, which hybridflow does not have; "
            "use loss_mode=k3, or sequence parallel size 1"
        )
    return errors


def _entry_errors(prefix: str, entry: dict, routed: bool) -> list[str]:
    errors = []
    unknown = sorted(set(entry) - set(TEACHER_FIELDS))
    if unknown:
        errors.append(f"{prefix} has unknown keys {unknown}; a teacher has {list(TEACHER_FIELDS)}")
    if not entry.get("model_path"):
        errors.append(f"{prefix}.model_path is empty: set it to the teacher's model folder")
    if routed and entry.get("key") in (None, ""):
        errors.append(
            f"{prefix}.key is empty: with several teachers each names the rows it scores by their {KEY}.teacher_key "
            "value (a data_source, say)"
        )
    dtype = (entry.get("inference") or {}).get("dtype")
    if dtype is not None and dtype not in DTYPES:
        errors.append(f"{prefix}.inference.dtype={dtype!r}; choose one of {list(DTYPES)}")
    return errors


def _routing_errors(teacher_key: str, entries: dict[str, dict]) -> list[str]:
    errors = []
    if teacher_key not in ROUTING_FIELDS:
        errors.append(
            f"{KEY}.teacher_key={teacher_key!r} is not a field every row carries into the batch; "
            f"pick a teacher by one of {list(ROUTING_FIELDS)}"
        )
    names_of: dict[str, list[str]] = {}
    for name, entry in entries.items():
        if entry.get("key") not in (None, ""):
            names_of.setdefault(str(entry["key"]), []).append(name)
    for key, names in names_of.items():
        if len(names) > 1:
            errors.append(
                f"{KEY}.teacher_models.{{{', '.join(names)}}} all have key={key!r}: a row's {teacher_key} picks one "
                "teacher; give each teacher a key of its own"
            )
    return errors


def teacher_route_errors(config: PPOTrainerConfig, field_values: Callable[[str], list[str]]) -> list[str]:
    """With several teachers, every training prompt's ``teacher_key`` value (``field_values(field)``: the training
    set's values of a row field, in its order) must name one; each value that names none is reported with its
    first prompt."""
    spec = teacher_spec(config) if distills(config) else None
    if spec is None or spec.route_by is None:
        return []
    keys, first = spec.keys(), {}
    for row, value in enumerate(field_values(spec.route_by)):
        if value not in keys:
            first.setdefault(value, row)
    return [
        f"data.train_files: {spec.route_by}={value!r} (prompt {row} of the training set, after filtering) names no "
        f"teacher ({KEY}.teacher_models keys: {keys}); add a teacher with key={value!r} or drop those rows"
        for value, row in first.items()
    ]


def teacher_model_keys(config: PPOTrainerConfig) -> list[tuple[str, str]]:
    """Each teacher's folder key and path, where the run distills (teachers that name no folder left out)."""
    if not distills(config):
        return []
    return [
        (f"{KEY}.teacher_models.{name}.model_path", str(entry["model_path"]))
        for name, entry in teacher_entries(config).items()
        if entry.get("model_path")
    ]


def teacher_vocabulary_errors(config: PPOTrainerConfig, named: tuple[str, str]) -> list[str]:
    """The teacher reads the student's token ids: both folders' vocabularies must be the same size."""
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
    """The start-up lines for each teacher's keys that change nothing here: verl's server settings set away from
    verl's defaults (or, for those that follow the rollout's, away from the rollout's), ``num_replicas``, and a
    lone teacher's ``key``."""
    entries = teacher_entries(config) if distills(config) else {}
    return [
        note for name, entry in entries.items() if (note := _server_note(config, name, entry, routed=len(entries) > 1))
    ]


def _server_note(config: PPOTrainerConfig, name: str, entry: dict, routed: bool) -> str | None:
    rollout = config.actor_rollout_ref.rollout
    expected = {**TEACHER_SERVER, **{key: getattr(rollout, key) for key in TEACHER_FOLLOWS_ROLLOUT}}
    inference = entry.get("inference") or {}
    # None: a setting that follows the rollout's
    changed = [
        f"inference.{key}"
        for key in sorted(inference)
        if key != "dtype" and inference[key] is not None and inference[key] != expected.get(key)
    ]
    unread = [key for key in ("key", "num_replicas") if entry.get(key) and not (routed and key == "key")]
    if not unread + changed:
        return None
    return (
        f"{KEY}.teacher_models.{name}: {', '.join(unread + changed)} accepted, but not read: they size verl's teacher "
        f"inference servers; here the teacher is one FSDP group over the {KEY} pool, and its log-probs are the same"
    )
