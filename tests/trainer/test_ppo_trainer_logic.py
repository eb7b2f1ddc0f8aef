"""The driver's step logic against in-process fake workers: which phases run, what they receive, DAPO dynamic
sampling, the ReMax baseline, KL in the reward, rollout correction, validation, rollout dumps, resuming, and the
steps with NaN/inf values or failed scoring."""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.config.load import load_config
from hybridflow.protocol.columns import ACTOR_UPDATE_INPUTS
from hybridflow.rewards import SampleScoring
from hybridflow.rewards.failures import RewardFunctionError
from hybridflow.tracking import metric_names as names
from hybridflow.tracking.trackers import read_metrics
from hybridflow.trainer.main_ppo import build_trainer
from hybridflow.trainer.nonfinite import NonFiniteError
from hybridflow.trainer.rollout_collection import DynamicSamplingError

from .cli import DENSE_REWARD
from .fake_workers import FakeActorRollout, FakePartStream, FakeWorkers, rollout_log_ratio
from .helpers import compose_config, tiny_run_overrides


@pytest.fixture()
def run(tiny_model_dir, tiny_parquet, tmp_path):
    """``run(estimator, *overrides)`` -> (trainer, fakes) after fit() with fake workers."""

    def run_with(estimator="grpo", *overrides, run_dir=None, reward=DENSE_REWARD):
        base = (
            tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir or tmp_path / "run", estimator)
            + ["trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.peak_flops_per_device=1e9"]
            + ([f"custom_reward_function.path={reward}"] if reward else [])
        )
        trainer = build_trainer(load_config(compose_config(base + list(overrides))))
        fakes = FakeWorkers()
        trainer.init_workers(start_workers=fakes)
        trainer.hooks.append(StepBatches(fakes.step_batches))
        try:
            trainer.fit()
        finally:
            trainer.shutdown()
        assert fakes.shut_down
        return trainer, fakes

    return run_with


class StepBatches:
    """A step hook that keeps each step's whole batch (every column, every sample)."""

    def __init__(self, batches):
        self.batches = batches

    def after_step(self, global_step, batch, metrics):
        self.batches.append(batch)


def _updates(fakes):
    """What update_actor received, call by call: (the columns it reads, its keyword arguments)."""
    return [(call[1], call[2]) for call in fakes.calls if call[0] == "update_actor"]


def _step_batches(fakes):
    """Each step's whole batch, every column."""
    return fakes.step_batches


def test_grpo_runs_only_the_phases_it_needs(run, tmp_path):
    _, fakes = run("grpo")
    step = ["generate_sequences_stream", "compute_log_prob", "update_actor", "update_weights"]
    assert fakes.names() == ["init_model", "update_weights"] + step + step
    assert fakes.calls[0] == ("init_model", "actor_rollout")  # no reference part is built
    assert fakes.plan.role_pool == {"actor_rollout_ref": "global_pool"}
    batch = _step_batches(fakes)[0]
    assert len(batch) == 8
    uids = list(batch.non_tensor_batch["uid"])
    assert uids == [uid for uid in dict.fromkeys(uids) for _ in range(2)]  # the 2 samples of a prompt are adjacent
    assert (batch.batch["token_level_rewards"] == batch.batch["token_level_scores"]).all()
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["actor/grad_norm"] == 2.0  # the worker's list of per-step values, averaged
    assert names.timing("ref") not in records[0] and names.timing("values") not in records[0]
    assert records[0][names.timing("update_weights")] > 0  # phase 8, timed by the driver
    assert records[0][names.PERF_MFU_ACTOR] > 0


def test_gae_with_kl_in_reward_uses_critic_and_reference(run, tmp_path):
    _, fakes = run("gae", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.5")
    step = ["generate_sequences_stream", "compute_log_prob", "compute_ref_log_prob", "compute_values"]
    step += ["update_critic", "update_actor", "update_weights"]
    assert fakes.names() == ["init_model", "init_model", "update_weights"] + step + step
    assert fakes.plan.role_pool == {"actor_rollout_ref": "global_pool", "critic": "global_pool"}
    batch = _step_batches(fakes)[0]
    mask = batch.batch["response_mask"]
    # old - ref = 0.01 on every token before the first update: r = score - 0.5 * 0.01 per response token.
    expected = batch.batch["token_level_scores"] - 0.5 * 0.01 * mask
    assert batch.batch["token_level_rewards"] == pytest.approx(expected, abs=1e-6)
    record = read_metrics(tmp_path / "run")[0]
    assert record[names.KL_IN_REWARD] == pytest.approx(0.01, abs=1e-6)
    assert record[names.KL_COEF_IN_REWARD] == 0.5
    assert record["critic/vf_loss"] == 1.0 and record["critic/values/mean"] == 0.25


def test_kl_loss_needs_the_reference_but_not_in_the_reward(run):
    _, fakes = run("grpo", "actor_rollout_ref.actor.use_kl_loss=true")
    step = ["generate_sequences_stream", "compute_log_prob", "compute_ref_log_prob", "update_actor", "update_weights"]
    assert fakes.names() == ["init_model", "update_weights"] + step + step
    assert fakes.calls[0] == ("init_model", "actor_rollout_ref")
    batch = _step_batches(fakes)[0]
    assert "ref_log_prob" in batch.batch.keys()
    assert (batch.batch["token_level_rewards"] == batch.batch["token_level_scores"]).all()


def test_dynamic_sampling_keeps_only_groups_whose_scores_vary(run, tmp_path):
    _, fakes = run("grpo", "algorithm.filter_groups.enable=true")
    generations = fakes.names().count("generate_sequences_stream")
    assert generations == 4  # half of each batch's groups are identical, so 2 batches per step
    for batch in _step_batches(fakes):
        assert len(batch) == 8
        scores = batch.batch["token_level_scores"].sum(-1).view(4, 2)
        assert (scores[:, 0] != scores[:, 1]).all()
    record = read_metrics(tmp_path / "run")[0]
    assert record[names.NUM_GEN_BATCHES] == 2 and record[names.NUM_KEPT_GROUPS] == 4


def test_dynamic_sampling_stops_at_its_budget(run):
    with pytest.raises(DynamicSamplingError, match="algorithm.filter_groups.max_num_gen_batches=1"):
        run("grpo", "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=1")


def test_remax_generates_a_greedy_baseline(run):
    _, fakes = run("remax")
    greedy = [
        call[1] for call in fakes.calls if call[0] == "generate_sequences_stream" and call[1].get("do_sample") is False
    ]
    assert len(greedy) == 2  # one per step
    batch = _step_batches(fakes)[0]
    baselines = batch.batch["reward_baselines"]
    assert baselines.shape == (8,) and (baselines[0::2] == baselines[1::2]).all()


def test_rollout_seeds_count_generation_calls(run):
    _, fakes = run("grpo", "actor_rollout_ref.rollout.seed=100", "trainer.val_before_train=true")
    seeds = [call[1]["seed"] for call in fakes.calls if call[0] == "generate_sequences_stream"]
    assert seeds == [100, 101, 102]  # validation, step 1, step 2


def test_validation_before_training_and_on_schedule(run, tmp_path):
    _, fakes = run(
        "grpo", "trainer.val_before_train=true", "trainer.test_freq=1", "actor_rollout_ref.rollout.val_kwargs.n=2"
    )
    validations = [
        call[1] for call in fakes.calls if call[0] == "generate_sequences_stream" and call[1].get("validate")
    ]
    assert len(validations) == 3
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    for step in (0, 1, 2):
        assert "val-core/arithmetic/acc/mean@2" in records[step]
        assert 0 <= records[step]["val-aux/arithmetic/score/mean@2"] <= 1
    assert names.timing("testing") in records[1]


def test_a_reward_model_scores_instead_of_the_rules(run, tiny_model_dir):
    _, fakes = run("grpo", "reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}")
    assert fakes.names().count("compute_rm_score") == 2
    assert fakes.plan.role_pool == {"actor_rollout_ref": "global_pool", "reward_model": "global_pool"}
    batch = _step_batches(fakes)[0]
    assert (batch.batch["token_level_scores"].sum(-1) == 0.75).all()


def test_with_a_reward_model_validation_has_its_scores_and_the_rules_columns(run, tiny_model_dir, tmp_path):
    overrides = (
        "reward_model.enable=true",
        f"reward_model.model.path={tiny_model_dir}",
        "trainer.val_before_train=true",
    )
    _, fakes = run("grpo", *overrides, "trainer.test_freq=2", reward=None)
    assert fakes.names().count("compute_rm_score") == 4  # two training steps, two validations (as in verl)
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    for step in (0, 2):  # the fake reward model's 0.75 is the reward; the arithmetic rule's accuracy stands beside it
        assert records[step]["val-aux/arithmetic/reward/mean@1"] == 0.75
        assert records[step]["val-core/arithmetic/acc/mean@1"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert "val-aux/arithmetic/score/mean@1" not in records[step]  # the score is the model's alone


def test_with_a_reward_model_a_validation_source_without_a_rule_is_scored_by_the_model(
    run, tiny_model_dir, tiny_parquet, tmp_path, capsys
):
    table = pq.read_table(tiny_parquet[1])
    sources = pa.array(["Dahoas/full-hh-rlhf"] * len(table))
    pq.write_table(
        table.set_column(table.schema.get_field_index("data_source"), "data_source", sources),
        val := tmp_path / "val.parquet",
    )
    overrides = ("reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}", f"data.val_files={val}")
    run("grpo", *overrides, "trainer.val_before_train=true", reward=None)
    assert "validation is scored by the reward model alone: no rule scores data_source ['Dahoas/full-hh-rlhf']" in (
        capsys.readouterr().out
    )
    validation = next(r for r in read_metrics(tmp_path / "run") if r["step"] == 0)
    assert validation["val-core/Dahoas/full-hh-rlhf/reward/mean@1"] == 0.75


def test_rollout_dump_every_n_steps(run, tmp_path):
    run("grpo", f"trainer.rollout_data_dir={tmp_path / 'dumps'}", "trainer.rollout_dump_freq=2")
    assert [p.name for p in (tmp_path / "dumps").iterdir()] == ["step_2.jsonl"]
    lines = [json.loads(line) for line in (tmp_path / "dumps" / "step_2.jsonl").read_text().splitlines()]
    assert len(lines) == 8
    assert lines[0]["data_source"] == "arithmetic" and "What is" in lines[0]["prompt"]
    assert 0 <= lines[0]["score"] <= 1 and "acc" in lines[0] and lines[0]["uid"] == lines[1]["uid"]
    assert isinstance(lines[0]["index"], int) and lines[0]["index"] == lines[1]["index"]  # the prompt's row


def test_split_placement_gives_each_role_its_pool_and_overlaps_the_critic_with_the_actor(run, tmp_path):
    _, fakes = run("gae", "trainer.placement=split", "algorithm.use_kl_in_reward=true")
    assert fakes.plan.role_pool == {"actor_rollout_ref": "actor_rollout_ref_pool", "critic": "critic_pool"}
    # Each group of calls is submitted before the driver waits on any (a fake call runs when awaited): 3 and 4
    # are awaited in order, 7 before 6 (so the actor's update is timed alone).
    step = [
        "generate_sequences_stream",
        "submit",
        "submit",
        "submit",
        "compute_log_prob",
        "compute_ref_log_prob",
        "compute_values",
        "submit",
        "submit",
        "update_actor",
        "update_critic",
        "update_weights",
    ]
    assert fakes.names() == ["init_model", "init_model", "update_weights"] + step + step
    submitted = [call[1] for call in fakes.calls if call[0] == "submit"][:5]
    assert submitted == ["compute_log_prob", "compute_ref_log_prob", "compute_values", "update_critic", "update_actor"]
    # The same numbers as colocated, where each call runs when started
    _, colocated = run("gae", "algorithm.use_kl_in_reward=true", run_dir=tmp_path / "colocated")
    for split_batch, colocated_batch in zip(_step_batches(fakes), _step_batches(colocated), strict=True):
        for key in ("old_log_probs", "ref_log_prob", "values", "advantages", "returns"):
            assert torch.equal(split_batch.batch[key], colocated_batch.batch[key]), key
    # In local mode every pool is the driver's process: nothing to overlap, each call runs (and is timed) in turn
    _, local = run("gae", "trainer.placement=split", "trainer.local_mode=true", run_dir=tmp_path / "local")
    assert "submit" not in local.names()


def test_each_rollout_part_is_scored_as_it_arrives_unless_the_manager_scores_whole_batches(run, monkeypatch):
    events = []
    read_parts, add = FakePartStream.__iter__, SampleScoring.add

    def reading(stream):
        for part in read_parts(stream):
            events.append(("rollout part", part.rows.tolist()))
            yield part

    def scoring(self, rows, part):
        events.append(("scored", list(rows)))
        add(self, rows, part)

    monkeypatch.setattr(FakePartStream, "__iter__", reading)
    monkeypatch.setattr(SampleScoring, "add", scoring)
    _, fakes = run("grpo")
    # 4 prompts x 2 samples: the odd rows arrive first and are scored before the even rows arrive
    odd, even = [1, 3, 5, 7], [0, 2, 4, 6]
    step = [("rollout part", odd), ("scored", odd), ("rollout part", even), ("scored", even)]
    assert events == step + step
    streamed = _step_batches(fakes)
    events.clear()
    _, whole = run("grpo", "reward_model.reward_manager=batch", reward=None)
    assert events == [] and whole.names().count("generate_sequences") == 2
    # The same samples either way, scored alike (both by the registered arithmetic scorer here)
    assert torch.equal(streamed[0].batch["responses"], _step_batches(whole)[0].batch["responses"])


def test_resume_continues_where_the_saved_run_stopped(run, tmp_path):
    _, uninterrupted = run("grpo", "trainer.total_training_steps=4", run_dir=tmp_path / "a")
    run("grpo", "trainer.save_freq=1", run_dir=tmp_path / "b")
    _, resumed = run("grpo", "trainer.total_training_steps=4", "trainer.save_freq=1", run_dir=tmp_path / "b")
    assert ("load_checkpoint", str(tmp_path / "b" / "global_step_2" / "actor")) in resumed.calls
    for before, after in zip(_step_batches(uninterrupted)[2:], _step_batches(resumed)):
        assert list(before.non_tensor_batch["uid"]) == list(after.non_tensor_batch["uid"])
        assert (before.batch["input_ids"] == after.batch["input_ids"]).all()  # same prompts, same samples
        assert (before.batch["advantages"] == after.batch["advantages"]).all()

    def without_timing(run_dir):
        return [{k: v for k, v in r.items() if not names.is_timing(k)} for r in read_metrics(run_dir)]

    assert without_timing(tmp_path / "a") == without_timing(tmp_path / "b")
    assert (tmp_path / "b" / "latest").read_text().strip() == "global_step_4"


ONE_MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size=4"  # on-policy: one optimizer step per batch


def test_an_on_policy_grpo_step_skips_the_old_log_prob_pass_and_the_samples_without_signal(run, tmp_path):
    _, fakes = run("grpo", ONE_MINI_BATCH)
    assert (
        fakes.names()
        == ["init_model", "update_weights"] + ["generate_sequences_stream", "update_actor", "update_weights"] * 2
    )
    for batch, arguments in _updates(fakes):
        assert arguments["old_log_probs_from_update"] is True and "old_log_probs" not in batch.batch.keys()
        # The fakes' odd prompts get one response for all their samples: those groups have no signal.
        assert len(batch) == 4 and (batch.batch["advantages"].abs().sum(-1) > 0).all()
        counts = arguments["loss_counts"]
        assert counts["global_seq_count"] == 8 and counts["global_token_count"] > batch.batch["response_mask"].sum()
        # Only what the update reads travels: no scores, uids or prompts' other columns.
        assert sorted(batch.batch.keys()) == sorted(ACTOR_UPDATE_INPUTS) and not batch.non_tensor_batch
    record = read_metrics(tmp_path / "run")[0]
    assert record[names.ZERO_SIGNAL_FRAC] == 0.5
    assert names.timing("old_log_prob") not in record and names.timing("adv") in record
    assert record["critic/advantages/min"] < 0 < record["critic/advantages/max"]


def test_a_step_without_any_signal_still_calls_the_update(run, tmp_path):
    _, fakes = run("grpo", ONE_MINI_BATCH, reward=None)  # the arithmetic score: 0 for every fake response
    assert (
        fakes.names()
        == ["init_model", "update_weights"] + ["generate_sequences_stream", "update_actor", "update_weights"] * 2
    )
    assert [len(batch) for batch, _ in _updates(fakes)] == [0, 0]
    assert read_metrics(tmp_path / "run")[0][names.ZERO_SIGNAL_FRAC] == 1.0


def test_the_shortcuts_switch_off_one_at_a_time(run):
    _, fakes = run("grpo", ONE_MINI_BATCH, "algorithm.skip_zero_signal_samples=false")
    update, arguments = _updates(fakes)[0]
    assert "compute_log_prob" not in fakes.names() and len(update) == 8 and arguments["loss_counts"] is None
    _, fakes = run("grpo", ONE_MINI_BATCH, "actor_rollout_ref.actor.skip_old_log_prob=false")
    assert fakes.names().count("compute_log_prob") == 2
    update, arguments = _updates(fakes)[0]
    assert len(update) == 4 and "old_log_probs" in update.batch.keys()
    assert arguments["old_log_probs_from_update"] is False


def _rank_tokens(batch, ranks):
    """Real tokens of each rank's equal slice of ``batch``, as the dispatch hands them out."""
    return batch.batch["attention_mask"].sum(-1).view(ranks, -1).sum(-1).tolist()


def _samples(batch):
    """The samples' (uid, response tokens) and advantage sums, sorted by the former: equal for two orders."""
    tensors = batch.batch
    rows = sorted(
        zip(
            zip(batch.non_tensor_batch["uid"], map(tuple, tensors["responses"].tolist())),
            tensors["advantages"].sum(-1).tolist(),
        )
    )
    return [key for key, _ in rows], [advantage for _, advantage in rows]


def test_balancing_gives_the_ranks_about_the_same_tokens_and_keeps_the_groups(run, tmp_path):
    _, unbalanced = run("grpo", "trainer.n_gpus_per_node=2", "trainer.balance_batch=false", run_dir=tmp_path / "off")
    _, balanced = run("grpo", "trainer.n_gpus_per_node=2", run_dir=tmp_path / "on")
    for before, after, record in zip(_step_batches(unbalanced), _step_batches(balanced), read_metrics(tmp_path / "on")):
        # The same samples with the same advantages (GRPO groups by uid, whatever rank a sample lands on;
        # a group's statistics may sum its n = 2 samples in another order: float32 rounding, n * 2**-24).
        (keys, advantages), (expected_keys, expected) = _samples(after), _samples(before)
        assert keys == expected_keys and advantages == pytest.approx(expected, rel=2 * 2**-24, abs=1e-12)
        tokens_before, tokens_after = _rank_tokens(before, 2), _rank_tokens(after, 2)
        assert max(tokens_after) - min(tokens_after) <= max(tokens_before) - min(tokens_before)
        assert (record["global_seqlen/min"], record["global_seqlen/max"]) == (min(tokens_before), max(tokens_before))
        assert (record["global_seqlen/balanced_min"], record["global_seqlen/balanced_max"]) == (
            min(tokens_after),
            max(tokens_after),
        )
    assert any(
        _rank_tokens(b, 2) != _rank_tokens(a, 2) for b, a in zip(_step_batches(unbalanced), _step_batches(balanced))
    )
    assert "global_seqlen/min" not in read_metrics(tmp_path / "off")[0]


def test_critic_warmup_trains_only_the_critic_for_its_steps(run, tmp_path):
    _, fakes = run("gae", "trainer.critic_warmup=1")
    step = ["generate_sequences_stream", "compute_log_prob", "compute_values", "update_critic"]
    assert fakes.names() == ["init_model", "init_model", "update_weights"] + step + ["update_weights"] + step + [
        "update_actor",
        "update_weights",
    ]
    warmup, trained = read_metrics(tmp_path / "run")
    assert warmup["critic/vf_loss"] == trained["critic/vf_loss"] == 1.0
    assert not any(key.startswith("actor/") for key in warmup) and names.timing("update_actor") not in warmup
    assert names.PERF_MFU_ACTOR not in warmup and names.PERF_MFU_ACTOR in trained
    assert trained["actor/grad_norm"] == 2.0


def test_actor_and_critic_checkpoints_are_kept_to_their_own_counts(run, tmp_path):
    run(
        "gae",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=2",
        "trainer.max_critic_ckpt_to_keep=1",
    )
    saved = {
        path.name: sorted(p.name for p in path.iterdir()) for path in sorted((tmp_path / "run").glob("global_step_*"))
    }
    assert saved == {
        "global_step_2": ["actor", "driver_state.pt", "manifest.json"],
        "global_step_3": ["actor", "critic", "driver_state.pt", "manifest.json"],
    }


def test_validation_samples_are_logged_as_a_table_and_dumped_per_validation(run, tmp_path):
    run(
        "grpo",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
        "trainer.log_val_generations=3",
        f"trainer.validation_data_dir={tmp_path / 'val'}",
        "trainer.logger=[jsonl]",
    )
    tables = [json.loads(line) for line in (tmp_path / "run" / "val_generations.jsonl").read_text().splitlines()]
    assert [table["step"] for table in tables] == [0, 2]  # before training, then at test_freq
    for table in tables:
        assert len(table["val/generations"]) == 3
        assert all("What is" in row["input"] and 0 <= row["score"] <= 1 for row in table["val/generations"])
    assert tables[0]["val/generations"] != tables[1]["val/generations"]  # each validation logs its own samples
    assert sorted(path.name for path in (tmp_path / "val").iterdir()) == ["0.jsonl", "2.jsonl"]
    dumped = [json.loads(line) for line in (tmp_path / "val" / "2.jsonl").read_text().splitlines()]
    assert len(dumped) == 4  # the 4 validation prompts, one greedy sample each
    assert {"input", "output", "gts", "score", "step", "reward", "acc"} <= set(dumped[0]) and dumped[0]["step"] == 2
    chosen = {(row["input"], row["output"]) for row in tables[1]["val/generations"]}
    assert chosen <= {(row["input"], row["output"]) for row in dumped}


ENGINE_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=true"
CORRECTION = "algorithm.rollout_correction"


def test_decoupled_rollout_correction_weighs_and_masks_the_update_batch(run, tmp_path):
    # log r = 0.1 * (token % 3): weights e^0, e^0.1 = 1.105 and e^0.2 = 1.221, truncated at 1.15; token_k2 at
    # 0.01 rejects (0.2)^2 / 2 = 0.02 and keeps (0.1)^2 / 2 = 0.005.
    _, fakes = run(
        "grpo",
        ENGINE_LOG_PROBS,
        f"{CORRECTION}.rollout_is=token",
        f"{CORRECTION}.rollout_is_threshold=1.15",
        f"{CORRECTION}.rollout_rs=token_k2",
        f"{CORRECTION}.rollout_rs_threshold=0.01",
    )
    assert fakes.names().count("compute_log_prob") == 2  # decoupled: the old-log-prob pass runs
    batch = _step_batches(fakes)[0].batch
    width = batch["responses"].shape[1]
    engine_mask = batch["attention_mask"][:, -width:]
    log_ratio = rollout_log_ratio(batch["responses"])
    torch.testing.assert_close(batch["rollout_is_weights"], log_ratio.exp().clamp(max=1.15) * engine_mask)
    rejected = (batch["responses"] % 3 == 2) & engine_mask.bool()
    assert rejected.any() and torch.equal(batch["response_mask"], engine_mask * ~rejected)
    assert (batch["advantages"][rejected] == 0).all()  # the estimator saw the corrected mask
    record = read_metrics(tmp_path / "run")[0]
    tokens = engine_mask.bool()
    assert record["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(
        rejected.sum().item() / tokens.sum().item()
    )
    assert record["rollout_corr/kl"] == pytest.approx(-log_ratio[tokens].mean().item(), rel=1e-5)
    assert "rollout_corr/rollout_is_eff_sample_size" in record and names.timing("old_log_prob") in record


def test_bypass_mode_takes_the_engines_log_probs_as_old_ones_without_a_pass(run, tmp_path):
    _, fakes = run("grpo", ENGINE_LOG_PROBS, f"{CORRECTION}.bypass_mode=true", f"{CORRECTION}.loss_type=reinforce")
    assert (
        fakes.names()
        == ["init_model", "update_weights"] + ["generate_sequences_stream", "update_actor", "update_weights"] * 2
    )
    for batch in _step_batches(fakes):
        assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
        assert "rollout_is_weights" not in batch.batch.keys()
    assert all(arguments["old_log_probs_from_update"] is False for _, arguments in _updates(fakes))
    record = read_metrics(tmp_path / "run")[0]
    assert names.timing("old_log_prob") not in record
    assert not any(key.startswith(("training/rollout_probs_diff", "rollout_corr/")) for key in record)


def test_the_actor_is_built_with_bypass_modes_loss(run):
    trainer, _ = run(
        "grpo",
        ENGINE_LOG_PROBS,
        f"{CORRECTION}.bypass_mode=true",
        f"{CORRECTION}.rollout_rs=seq_max_k3",
        f"{CORRECTION}.rollout_rs_threshold=0.5",
    )
    bypass = trainer.actor_rollout.bypass
    assert bypass.loss_type == "ppo_clip" and bypass.settings.rejections[0].option == "seq_max_k3"
    trainer, _ = run("grpo", ENGINE_LOG_PROBS)
    assert trainer.actor_rollout.bypass is None


def _checkpoints(run_dir):
    return sorted(path.name for path in run_dir.glob("global_step_*"))


def test_non_finite_scores_train_nothing_are_never_saved_and_stop_the_run_past_the_limit(run, tmp_path):
    reward = tmp_path / "nan_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return float('nan')\n"
    )
    with pytest.raises(NonFiniteError, match=r"^step 2: the reward of 8 of 8 samples is not finite"):
        run("grpo", "trainer.max_nonfinite_steps=1", "trainer.save_freq=1", reward=reward)
    records = read_metrics(tmp_path / "run")
    assert [(r["step"], r[names.NONFINITE_SKIP], r[names.NONFINITE_STEPS]) for r in records] == [(1, 1.0, 1)]
    assert not any(key.startswith((names.ACTOR_PREFIX, "critic/advantages")) for key in records[0])
    assert _checkpoints(tmp_path / "run") == [] and not (tmp_path / "run" / "latest").exists()


def test_steps_whose_update_was_not_finite_are_logged_but_never_saved(run, tmp_path, monkeypatch):
    """Steps 2 and 3 (the last) skip an optimizer step on a NaN grad norm: the latest checkpoint stays step 1's."""
    update = FakeActorRollout.update_actor

    def nan_from_step_2(self, data, **arguments):
        output = update(self, data, **arguments)
        if self.version >= 2:
            output.meta_info["metrics"].update(grad_norm=[1.0, float("nan")], nonfinite_skip_frac=[0.0, 1.0])
        return output

    monkeypatch.setattr(FakeActorRollout, "update_actor", nan_from_step_2)
    run("grpo", "trainer.total_training_steps=3", "trainer.save_freq=1")
    records = read_metrics(tmp_path / "run")
    assert [(r[names.NONFINITE_SKIP], r[names.NONFINITE_STEPS]) for r in records] == [(0.0, 0), (1.0, 1), (1.0, 2)]
    assert records[1]["actor/grad_norm"] == "nan" and records[1]["actor/nonfinite_skip_frac"] == 0.5
    assert _checkpoints(tmp_path / "run") == ["global_step_1"]
    assert (tmp_path / "run" / "latest").read_text().strip() == "global_step_1"


def test_a_reward_function_failing_on_every_sample_stops_training_and_validation(run, tmp_path):
    reward = tmp_path / "raising_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    raise KeyError('answer')\n"
    )
    expected = rf"^the reward function compute_score in {reward}:1 failed on 8 of 8 samples, .* KeyError: 'answer'"
    with pytest.raises(RewardFunctionError, match=expected):
        run("grpo", reward=reward)
    assert not (tmp_path / "run" / "metrics.jsonl").read_text()  # stopped in step 1's scoring
    with pytest.raises(RewardFunctionError, match=r"^the reward function compute_score in .* failed on 4 of 4 samples"):
        run("grpo", "trainer.val_before_train=true", reward=reward)  # the 4 validation prompts, before step 1


def test_one_step_off_trains_each_step_on_samples_one_update_old(run):
    """hybridflow.trainer.one_step_off.OneStepOffCollector: step k+1's generation starts before step k trains, and
    the pool's load of update k's weights is queued behind it (waited for with it); no generation starts and no
    weights are synced after the last step."""
    trainer, fakes = run(
        "grpo",
        "actor_rollout_ref.hybrid_engine=false",
        "trainer.total_training_steps=3",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    )
    assert fakes.plan.role_pool == {"actor_rollout_ref": "global_pool", "rollout": "rollout_pool"}
    assert fakes.calls[:2] == [("init_model", "actor"), ("init_model", "rollout")]
    train = ["compute_log_prob", "update_actor"]
    sync = ["share_weights", "submit"]  # the load is queued: it runs when waited for, after the generation
    steps = [
        ["submit", "generate_sequences", "submit", *train, *sync],
        ["generate_sequences", "load_shared_weights", "submit", *train, *sync],
        ["generate_sequences", "load_shared_weights", *train],
    ]
    assert fakes.names()[2:] == sum(steps, [])
    assert [call[1] for call in fakes.calls if call[0] == "load_shared_weights"] == [1, 2]
    # The engine's log-probs tell which weights drew each step's samples: the model folder's twice, then update 1's.
    for batch, version in zip(_step_batches(fakes), (0, 0, 1)):
        responses, mask = batch.batch["responses"], batch.batch["response_mask"]
        expected = (-(responses % 7).float() / 10 - 0.01 * version - rollout_log_ratio(responses)) * mask
        torch.testing.assert_close(batch.batch["rollout_log_probs"], expected)
    assert names.timing("sync_rollout_weights") in read_metrics(trainer.run_dir)[1]


FULLY_ASYNC = [
    "actor_rollout_ref.hybrid_engine=false",
    "async_training.enable=true",
    "async_training.partial_rollout=false",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "trainer.total_training_steps=null",
    # 2 prompts a step, a sync every 2 steps, at most int(2 x 1.5 x 2) = 6 prompts started per weight version,
    # 3 per generation call; 12 prompts in all: 6 steps
    "async_training.require_batches=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "async_training.trigger_parameter_sync_step=2",
    "async_training.staleness_threshold=0.5",
    "async_training.concurrent_samples_per_replica=3",
    "rollout.total_rollout_steps=12",
]


def test_fully_async_trains_from_a_bounded_queue_and_syncs_every_trigger_steps(run):
    """hybridflow.trainer.fully_async_collection.FullyAsyncCollector, its calls worked out by hand: step 1 starts
    call 0 (3 prompts, weights v0), waits for it, trains on 2 and starts call 1 (3 more: the version's budget of 6
    is spent); step 2 waits for call 1 and ends syncing update 2's weights (the new version's budget counts the 2
    prompts still queued). Step 3 trains on the queue and starts call 2 (3 prompts); step 4 waits for it, starts
    call 3 (1 prompt, the budget's rest), and ends waiting for call 3 and syncing update 4's weights; step 5
    starts call 4 (the run's last 2 prompts). No sync follows the last step."""
    trainer, fakes = run("grpo", *FULLY_ASYNC)
    assert fakes.role_classes["rollout"].kwargs["loads_in_flight"] is False  # syncs wait for the call in flight
    assert trainer.total_training_steps == 6
    train = ["update_actor"]  # one mini-batch of one epoch: on-policy for the update, no old-log-prob pass
    sync = ["share_weights", "load_shared_weights"]
    call = ["submit", "generate_sequences"]
    steps = [
        [*call, "submit", *train],
        ["generate_sequences", *train, *sync],
        ["submit", *train],
        ["generate_sequences", "submit", *train, "generate_sequences", *sync],
        ["submit", *train],
        ["generate_sequences", *train],
    ]
    assert fakes.names()[2:] == sum(steps, [])
    # The fake engine's log-probs tell which weights drew each sample (the actor's update count at the sync).
    for batch, version in zip(_step_batches(fakes), (0, 0, 0, 2, 2, 4)):
        responses, mask = batch.batch["responses"], batch.batch["response_mask"]
        expected = (-(responses % 7).float() / 10 - 0.01 * version - rollout_log_ratio(responses)) * mask
        torch.testing.assert_close(batch.batch["rollout_log_probs"], expected)
    uids = [uid for batch in _step_batches(fakes) for uid in dict.fromkeys(batch.non_tensor_batch["uid"])]
    assert len(uids) == len(set(uids)) == 12  # every prompt trained on once
    steps = {record["step"]: record for record in read_metrics(trainer.run_dir)}
    assert [steps[s][names.FULLY_ASYNC_PARAM_VERSION] for s in range(1, 7)] == [0, 0, 1, 1, 2, 2]
    assert [steps[s][names.FULLY_ASYNC_STALE_SAMPLES] for s in range(1, 7)] == [0, 0, 2, 2, 4, 4]
    assert [steps[s][names.FULLY_ASYNC_STALE_TRAJECTORIES] for s in range(1, 7)] == [0, 0, 4, 4, 8, 8]
    assert [steps[s][names.FULLY_ASYNC_GENERATED_SAMPLES] for s in range(1, 7)] == [6, 6, 9, 10, 12, 12]
    assert all(0 <= steps[s][names.FULLY_ASYNC_TRAINER_IDLE_RATIO] <= 1 for s in range(1, 7))


def test_fully_async_saves_and_validates_on_weight_syncs_and_resumes_with_its_queue(run, tmp_path):
    """trainer.save_freq and test_freq count weight versions (2 steps each here); a checkpoint holds the queue,
    so the run resumed from step 2's trains on the samples the uninterrupted run trained on."""
    overrides = [*FULLY_ASYNC, "trainer.save_freq=1", "trainer.test_freq=2"]
    trainer, fakes = run("grpo", *overrides, run_dir=tmp_path / "whole")
    assert sorted(path.name for path in (tmp_path / "whole").glob("global_step_*")) == [
        "global_step_2",
        "global_step_4",
        "global_step_6",
    ]
    steps = {record["step"]: record for record in read_metrics(trainer.run_dir)}
    assert [s for s in steps if "val-core/arithmetic/acc/mean@1" in steps[s]] == [4, 6]
    whole = _step_batches(fakes)

    resumed_dir = tmp_path / "resumed"  # as if killed after step 2's checkpoint
    shutil.copytree(tmp_path / "whole" / "global_step_2", resumed_dir / "global_step_2")
    (resumed_dir / "latest").write_text("global_step_2\n")
    _, resumed_fakes = run("grpo", *overrides, run_dir=resumed_dir)
    resumed = _step_batches(resumed_fakes)
    assert len(resumed) == 4
    for mine, theirs in zip(resumed, whole[2:]):
        assert list(mine.non_tensor_batch["uid"]) == list(theirs.non_tensor_batch["uid"])
        torch.testing.assert_close(mine.batch["rollout_log_probs"], theirs.batch["rollout_log_probs"])


def test_fully_async_partial_rollout_syncs_without_waiting_for_the_call_in_flight(run):
    """async_training.partial_rollout=true: step 4's sync does not wait for call 3 (started in step 4 with the
    first synced weights); the fake pool runs a call when it is waited for, so call 3's prompt is drawn with the
    weights synced before it, update 4's, next to a queued prompt of update 2's; the budget counts it in flight."""
    trainer, fakes = run("grpo", *FULLY_ASYNC[:2], *FULLY_ASYNC[3:], "async_training.partial_rollout=true")
    assert fakes.role_classes["rollout"].kwargs["loads_in_flight"] is True  # a split engine agrees where they land
    train, sync, call = ["update_actor"], ["share_weights", "load_shared_weights"], ["submit", "generate_sequences"]
    steps = [
        [*call, "submit", *train],
        ["generate_sequences", *train, *sync],
        ["submit", *train],
        ["generate_sequences", "submit", *train, *sync],  # the sync does not wait for call 3
        ["generate_sequences", "submit", *train],
        ["generate_sequences", *train],
    ]
    assert fakes.names()[2:] == sum(steps, [])
    for batch, versions in zip(_step_batches(fakes), ([0] * 4, [0] * 4, [0] * 4, [2] * 4, [2, 2, 4, 4], [4] * 4)):
        responses, mask = batch.batch["responses"], batch.batch["response_mask"]
        version = torch.tensor(versions, dtype=torch.float32)[:, None]
        expected = (-(responses % 7).float() / 10 - 0.01 * version - rollout_log_ratio(responses)) * mask
        torch.testing.assert_close(batch.batch["rollout_log_probs"], expected)
    steps = {record["step"]: record for record in read_metrics(trainer.run_dir)}
    assert [steps[s][names.FULLY_ASYNC_STALE_SAMPLES] for s in range(1, 7)] == [0, 0, 2, 2, 4, 4]
