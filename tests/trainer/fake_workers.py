"""In-process stand-ins for the worker groups, so the driver's logic is tested in milliseconds without Ray.

They keep the worker contract (DataProto in, DataProto out, metrics in ``meta_info["metrics"]``) and record
every call. Responses are seeded by ``meta_info["seed"]``; a prompt whose row number in its batch is odd gets
the same response for all its samples (a group DAPO must drop); the samples of an even row differ in their
first character. With ``rollout.calculate_log_probs`` the engine's log-probs sit below the actor's by
:func:`rollout_log_ratio` per token: ``log pi_actor - log pi_rollout = 0.1 * (response token % 3)``.
"""

import pathlib

import numpy as np
import torch

from hybridflow.protocol import DataProto, Part, join_parts
from hybridflow.trainer.worker_groups import WorkerGroups


class PendingFake:
    """A submitted fake call: it runs when ``get()`` is called, so a test sees when the driver waited."""

    def __init__(self, run):
        self._run = run

    def get(self, timeout=None):
        return self._run()


class group_method:
    """A fake worker method as a group's: called, it runs; ``.submit(...)`` records ``("submit", name)`` and
    returns a ``PendingFake``."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, worker, owner=None):
        bound = self.fn.__get__(worker, owner)

        def call(*args, **kwargs):
            return bound(*args, **kwargs)

        def submit(*args, **kwargs):
            worker.calls.append(("submit", self.fn.__name__))
            return PendingFake(lambda: bound(*args, **kwargs))

        call.submit = submit
        return call


class FakePartStream:
    """The fake rollout's rows in two parts, odd rows first, as a group's ``PartStream`` hands them over;
    ``read`` counts the parts handed over so far."""

    def __init__(self, whole):
        rows = np.arange(len(whole))
        self.parts = [Part(whole[part_rows], part_rows, len(whole)) for part_rows in (rows[1::2], rows[0::2])]
        self.read = 0

    def __iter__(self):
        for part in self.parts[self.read :]:
            self.read += 1
            yield part

    def get(self):
        return join_parts(self.parts)


def _log_probs(responses, version):
    return -(responses % 7).float() / 10 - 0.01 * version


def rollout_log_ratio(responses):
    """``log pi_actor - log pi_rollout`` of the fake engine's tokens (before any update)."""
    return 0.1 * (responses % 3).float()


class FakeActorRollout:
    def __init__(self, config, role, calls, bypass=None):
        self.config, self.role, self.calls, self.bypass = config, role, calls, bypass
        self.version = 0

    def init_model(self):
        self.calls.append(("init_model", self.role))

    @group_method
    def generate_sequences(self, prompts):
        self.calls.append(("generate_sequences", dict(prompts.meta_info)))
        return self._rollout(prompts)

    def generate_sequences_stream(self, prompts):
        self.calls.append(("generate_sequences_stream", dict(prompts.meta_info)))
        return FakePartStream(self._rollout(prompts))

    def _rollout(self, prompts):
        meta = prompts.meta_info
        rollout = self.config.rollout
        n = rollout.val_kwargs.n if meta.get("validate") else rollout.n
        width = rollout.response_length
        generator = torch.Generator().manual_seed(int(meta["seed"]))
        prompt_ids = prompts.batch["input_ids"].repeat_interleave(n, dim=0)
        prompt_mask = prompts.batch["attention_mask"].repeat_interleave(n, dim=0)
        responses = torch.randint(40, 120, (len(prompt_ids), width), generator=generator)
        lengths = torch.randint(1, width + 1, (len(prompt_ids),), generator=generator)
        for row in range(0, len(prompt_ids), n):
            responses[row : row + n] = responses[row]
            lengths[row : row + n] = lengths[row]
            if (row // n) % 2 == 0 and meta.get("do_sample") is not False:
                # Sample j starts with an even or odd character: the dense test reward differs within the group.
                responses[row : row + n, 0] = 66 + torch.arange(n) % 2
        response_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        responses = responses.masked_fill(response_mask == 0, meta["pad_token_id"])
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        tensors = {
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        }
        if rollout.calculate_log_probs:
            log_probs = _log_probs(responses, self.version) - rollout_log_ratio(responses)
            tensors["rollout_log_probs"] = log_probs * response_mask
        return DataProto.from_dict(tensors)

    @group_method
    def compute_log_prob(self, data, calculate_entropy=False):
        self.calls.append(("compute_log_prob", len(data)))
        return DataProto.from_dict({"old_log_probs": _log_probs(data.batch["responses"], self.version)})

    @group_method
    def compute_ref_log_prob(self, data):
        self.calls.append(("compute_ref_log_prob", len(data)))
        return DataProto.from_dict({"ref_log_prob": -(data.batch["responses"] % 7).float() / 10 - 0.01})

    @group_method
    def update_actor(self, data, old_log_probs_from_update=False, loss_counts=None):
        arguments = {"old_log_probs_from_update": old_log_probs_from_update, "loss_counts": loss_counts}
        self.calls.append(("update_actor", data, arguments))
        self.version += 1
        advantages = data.batch["advantages"]
        metrics = {"pg_loss": [float(advantages.mean()), 0.0], "grad_norm": [1.0, 3.0], "lr": 0.1}
        return DataProto(meta_info={"metrics": metrics})

    def shard_layouts(self):
        """Each rank's: none, so weights are cut as the hf engine splits them (not recorded: asked once)."""
        return [None, None]

    def share_weights(self, bucket_megabytes, layouts=None):
        """Rank 0's buckets, then the other rank's none; a bucket here is the weights' version."""
        self.calls.append(("share_weights", self.version))
        return [([self.version], 0), ([], 0)]

    @group_method
    def load_shared_weights(self, buckets, version=0, checksum=None):
        self.calls.append(("load_shared_weights", buckets[0]))
        self.version = buckets[0]
        return [0.0]

    def update_weights(self):
        """The hybrid engine's weight sync: the fake rollout is the actor itself, so there is nothing to copy."""
        self.calls.append(("update_weights", self.version))
        return [0.0]

    def save_checkpoint(self, local_path, global_step=0):
        self.calls.append(("save_checkpoint", local_path))
        pathlib.Path(local_path).mkdir(parents=True)
        (pathlib.Path(local_path) / "version").write_text(str(self.version))

    def load_checkpoint(self, local_path):
        self.calls.append(("load_checkpoint", local_path))
        self.version = int((pathlib.Path(local_path) / "version").read_text())


class FakeCritic:
    def __init__(self, config, calls):
        self.config, self.calls = config, calls

    def init_model(self):
        self.calls.append(("init_model", "critic"))

    @group_method
    def compute_values(self, data):
        self.calls.append(("compute_values", len(data)))
        return DataProto.from_dict({"values": torch.full(data.batch["responses"].shape, 0.25)})

    @group_method
    def update_critic(self, data):
        self.calls.append(("update_critic", data))
        return DataProto(meta_info={"metrics": {"vf_loss": [0.5, 1.5], "grad_norm": 2.0}})

    def save_checkpoint(self, local_path, global_step=0):
        pathlib.Path(local_path).mkdir(parents=True)

    def load_checkpoint(self, local_path):
        pass


class FakeRewardModel:
    """Scores every sample 0.75 on its last response token."""

    def __init__(self, calls):
        self.calls = calls

    def init_model(self):
        self.calls.append(("init_model", "reward_model"))

    def compute_rm_score(self, data):
        self.calls.append(("compute_rm_score", len(data)))
        mask = data.batch["response_mask"]
        last = mask.sum(-1) - 1
        scores = torch.zeros(mask.shape)
        scores[torch.arange(len(mask)), last] = 0.75
        return DataProto.from_dict({"rm_scores": scores})


class FakeWorkerGroups(WorkerGroups):
    def __init__(self, roles, groups, plan, owner):
        super().__init__(roles, groups, plan)
        self.owner = owner

    def shutdown(self):
        self.owner.shut_down = True


class FakeWorkers:
    """A ``start_workers`` for ``RayPPOTrainer.init_workers``: records the plan and builds fakes."""

    def __init__(self):
        self.calls = []
        self.step_batches = []  # filled by a step hook where a test adds one
        self.plan = None
        self.shut_down = False

    def __call__(self, plan, role_classes):
        self.plan = plan
        self.role_classes = role_classes
        roles = {}
        for role, spec in role_classes.items():
            if role == "actor_rollout_ref":
                kwargs = spec.kwargs
                roles[role] = FakeActorRollout(kwargs["config"], kwargs["role"], self.calls, kwargs.get("bypass"))
            elif role == "rollout":
                roles[role] = FakeActorRollout(spec.kwargs["config"], "rollout", self.calls)
            elif role == "critic":
                roles[role] = FakeCritic(spec.kwargs["config"], self.calls)
            elif role == "reward_model":
                roles[role] = FakeRewardModel(self.calls)
        return FakeWorkerGroups(roles, [], plan, owner=self)

    def names(self):
        return [call[0] for call in self.calls]
