"""Colocated roles: actor, critic and ref fused into one process per rank."""

import pytest
import torch

from hybridflow.distributed import RayClassWithInitArgs, create_colocated_worker_cls
from hybridflow.protocol import DataProto

from .sample_workers import ActorRole


def test_all_roles_of_a_rank_share_one_process(colocated_group):
    views = colocated_group.spawn()
    assert set(views) == {"actor", "critic", "ref"}
    pids = {role: view.pid() for role, view in views.items()}
    assert pids["actor"] == pids["critic"] == pids["ref"]
    assert len(set(pids["actor"])) == 2
    assert [info["pid"] for info in colocated_group.worker_info()] == pids["actor"]


def test_fused_group_prefixes_each_role_and_views_use_plain_names(colocated_group):
    assert colocated_group.critic_whoami() == [("critic", 0, 2), ("critic", 1, 2)]
    assert colocated_group.spawn(prefix_set={"ref"})["ref"].whoami() == [("ref", 0, 2), ("ref", 1, 2)]
    batch = DataProto.from_dict(tensors={"x": torch.arange(3.0)})
    views = colocated_group.spawn()
    torch.testing.assert_close(views["critic"].score(batch).batch["critic_score"], torch.tensor([0.0, 10.0, 20.0]))
    torch.testing.assert_close(colocated_group.ref_score(batch).batch["ref_score"], torch.tensor([0.0, 100.0, 200.0]))
    assert not hasattr(colocated_group, "score")


def test_spawn_names_unknown_roles(colocated_group):
    with pytest.raises(ValueError, match=r"has no roles \['reward'\]; its roles are \['actor', 'critic', 'ref'\]"):
        colocated_group.spawn(prefix_set=["reward"])


def test_role_names_must_be_identifiers():
    with pytest.raises(ValueError, match="identifiers"):
        create_colocated_worker_cls({"actor-rollout": RayClassWithInitArgs(ActorRole, scale=1.0)})
