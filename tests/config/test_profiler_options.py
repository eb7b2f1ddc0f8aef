"""verl's profiler keys: torch.profiler over global_profiler.steps for the roles that enable it; other tools and
what torch.profiler is not asked to do here are refused in one line; keys set where nothing is traced are listed."""

import pytest

from hybridflow.config.load import ConfigError, load_config_with_notes
from hybridflow.config.plan import build_plan
from hybridflow.config.profiler_options import step_ranges
from tests.trainer.helpers import compose_config

TORCH = ["global_profiler.tool=torch", "global_profiler.steps=[1,2,5]"]


def _check(overrides):
    return load_config_with_notes(compose_config(overrides), check_environment=False)


def _errors(overrides):
    with pytest.raises(ConfigError) as caught:
        _check(overrides)
    return caught.value.errors


def test_steps_are_traced_one_by_one_or_in_runs_of_consecutive_steps():
    assert step_ranges([5, 1, 2], continuous=False) == ((1, 1), (2, 2), (5, 5))
    assert step_ranges([5, 1, 2], continuous=True) == ((1, 2), (5, 5))


def test_the_plan_traces_the_groups_whose_roles_enable_it(base):
    config, unread = _check(
        base
        + TORCH
        + [
            "global_profiler.profile_continuous_steps=true",
            "global_profiler.save_path=/traces",
            "actor_rollout_ref.ref.profiler.enable=true",
            "actor_rollout_ref.ref.profiler.ranks=[1]",
            "actor_rollout_ref.actor.profiler.enable=true",
            "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda,shapes]",
            "critic.profiler.enable=true",  # GRPO has no critic: nothing of it to trace
        ]
    )
    assert unread == []
    profile = build_plan(config, train_prompts=16).profile
    assert profile.ranges == ((1, 2), (5, 5)) and profile.save_path == "/traces"
    assert profile.groups == {"actor_rollout_ref": ((0, 1), ("cuda", "shapes"))}
    assert (
        profile.describe() == "torch.profiler over steps 1-2, 5 of actor_rollout_ref (ranks [0, 1]), traces in /traces"
    )


def test_a_reference_placed_apart_is_traced_in_its_own_group(base):
    layout = ["actor_rollout_ref.actor.use_kl_loss=true", "trainer.n_gpus_per_node=2", "trainer.cpus_per_worker=0.5"]
    layout += ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.placement=actor:1/ref:1"]
    config, _ = _check(base + TORCH + layout + ["actor_rollout_ref.ref.profiler.enable=true"])
    assert build_plan(config, train_prompts=16).profile.groups == {"ref": ((0,), ())}


def test_the_hybrid_engines_rollout_follows_the_actor_and_its_own_switch_traces_the_actors_processes(base):
    config, _ = _check(base + TORCH + ["actor_rollout_ref.actor.profiler.enable=true"])
    assert config.actor_rollout_ref.rollout.profiler.enable is True
    config, _ = _check(base + TORCH + ["actor_rollout_ref.rollout.profiler.all_ranks=true"])
    assert build_plan(config, train_prompts=16).profile is None  # enable is still false
    config, _ = _check(
        base
        + TORCH
        + ["actor_rollout_ref.rollout.profiler.enable=true", "actor_rollout_ref.rollout.profiler.all_ranks=true"]
    )
    assert build_plan(config, train_prompts=16).profile.groups == {"actor_rollout_ref": (None, ())}


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "global_profiler.tool=nsys",
            "global_profiler.tool=nsys needs the nsys profiler (global_profiler.tool=torch is torch.profiler), which "
            "hybridflow does not have",
        ),
        (
            "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true",
            "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True needs a trace per stage, which "
            "hybridflow does not have; set it to false (one trace per role and step range)",
        ),
        (
            "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2",
            "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2 needs a torch.profiler schedule "
            "over the update's mini-batches, which hybridflow does not have",
        ),
        (
            "global_profiler.finish_hook_cmd=upload",
            "global_profiler.finish_hook_cmd=upload needs a command run after the last profiled step "
            "(finish_hook_cmd), which hybridflow does not have",
        ),
        (
            "critic.profiler.tool_config.torch.contents=[gpu]",
            "critic.profiler.tool_config.torch.contents has ['gpu']; choose from ['cpu', 'cuda', 'memory', "
            "'shapes', 'stack']",
        ),
    ],
)
def test_what_torch_profiler_does_not_do_here_is_refused_in_one_line(base, override, line):
    assert _errors(base + TORCH + [override]) == [line]


def test_profiler_keys_set_where_nothing_is_traced_are_listed(base):
    _, unread = _check(base + ["actor_rollout_ref.actor.profiler.enable=true", "global_profiler.steps=[1]"])
    assert unread == [
        "actor_rollout_ref.actor.profiler.enable=True (global_profiler.tool is null: nothing is traced)",
        "actor_rollout_ref.rollout.profiler.enable=True (global_profiler.tool is null: nothing is traced)",
        "global_profiler.steps=[1] (global_profiler.tool is null: nothing is traced)",
    ]
    _, unread = _check(base + TORCH)
    assert unread == ["global_profiler.steps=[1, 2, 5] (no role's profiler.enable is true)"]
    _, unread = _check(base + ["global_profiler.relocate_results=true"])
    assert unread == [
        "global_profiler.relocate_results=True (each process writes its trace to global_profiler.save_path "
        "itself: nothing to move)"
    ]
