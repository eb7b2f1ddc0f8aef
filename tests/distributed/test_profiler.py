"""torch.profiler in a worker process: roles sharing the process share one trace, named by all of them; a rank
the request leaves out writes none."""

import json

import torch

from hybridflow.distributed.profiler import Profiled, TraceRequest


class _Role(Profiled):
    def __init__(self, rank):
        self.rank = rank


def _request(role, save_path, ranks=None, contents=()):
    return TraceRequest(role, "step2-3", str(save_path), ranks, contents)


def test_fused_roles_write_one_chrome_trace_named_by_both(tmp_path):
    actor, critic = _Role(0), _Role(0)
    actor.start_profile(_request("actor_rollout_ref", tmp_path, contents=("shapes",)))
    critic.start_profile(_request("critic", tmp_path))
    torch.ones(8, 8) @ torch.ones(8, 8)
    assert actor.stop_profile("actor_rollout_ref") is None  # the critic still traces
    path = critic.stop_profile("critic")
    assert path == str(tmp_path / "actor_rollout_ref+critic_step2-3_rank0.json")
    events = json.loads((tmp_path / "actor_rollout_ref+critic_step2-3_rank0.json").read_text())["traceEvents"]
    assert any(event.get("name") == "aten::matmul" for event in events)
    # The session ended: the next range starts a fresh one.
    actor.start_profile(_request("actor_rollout_ref", tmp_path / "next"))
    assert actor.stop_profile("actor_rollout_ref") == str(tmp_path / "next" / "actor_rollout_ref_step2-3_rank0.json")


def test_a_rank_left_out_writes_nothing(tmp_path):
    worker = _Role(1)
    worker.start_profile(_request("critic", tmp_path, ranks=(0,)))
    assert worker.stop_profile("critic") is None
    assert list(tmp_path.iterdir()) == []
