"""Small workers for the distributed tests; pickled by value so Ray actors need not import the tests."""

import os
import sys
import threading
import time

import numpy as np
import ray
import torch
import torch.distributed as dist

from hybridflow.distributed import Dispatch, Execute, Worker, register
from hybridflow.protocol import DataProto, Part

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CollectiveWorker(Worker):
    """Exercises every dispatch mode and the process group."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_sum(self, value: float) -> float:
        tensor = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(tensor)
        return tensor.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self) -> dict:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "master": (self.master_addr, self.master_port),
            "backend": dist.get_backend(),
            "torch_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "onednn_cache": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
            "ideep_cache": os.environ.get("LRU_CACHE_CAPACITY"),
            "pid": os.getpid(),
        }

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add_rank(self, value: int, offset: int = 0) -> int:
        return value + offset + 100 * self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto, factor: int = 2) -> DataProto:
        rows = len(data)
        return DataProto.from_dict(
            tensors={"doubled": data.batch["x"] * factor, "rank": torch.full((rows,), self.rank)},
            non_tensors={"uid": data.non_tensor_batch["uid"]},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def count_rows(self, data: DataProto) -> int:
        return len(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, stream=True)
    def double_in_parts(self, data: DataProto, go_on_file: str = "", fail_after_first: bool = False):
        """``double``'s rows in two parts, odd rows first; the second waits (up to 20 s) until ``go_on_file``
        exists and says whether it appeared: a caller that creates it on receiving a first part can tell
        that the part reached it while the method was still running."""
        rows = np.arange(len(data))
        for index, part_rows in enumerate((rows[1::2], rows[0::2])):
            if index == 1 and fail_after_first:
                raise ValueError(f"deliberate failure on rank {self.rank} after the first part")
            doubled = self.double(data[part_rows])
            doubled.meta_info = {"metrics": {"parts_rank": self.rank}} if index == 0 else {}
            if index == 1 and go_on_file:
                deadline = time.monotonic() + 20
                while not os.path.exists(go_on_file) and time.monotonic() < deadline:
                    time.sleep(0.01)
                doubled.meta_info["saw_go_on"] = os.path.exists(go_on_file)
            yield Part(doubled, part_rows, len(data))

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_echo(self, value):
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def rank_zero_world_size(self) -> tuple:
        return (self.rank, dist.get_world_size())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_span(self, seconds: float) -> tuple[float, float]:
        """Sleep; return the wall-clock (start, end) (one clock for every process on this machine)."""
        return _sleep_span(seconds)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def raise_on_rank(self, bad_rank: int) -> int:
        if self.rank == bad_rank:
            raise ValueError(f"deliberate failure on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on_rank_while_peers_all_reduce(self, bad_rank: int) -> float:
        if self.rank == bad_rank:
            os._exit(3)
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        return tensor.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def raise_on_rank_while_peers_all_reduce(self, bad_rank: int) -> float:
        if self.rank == bad_rank:
            raise RuntimeError(f"rank {self.rank} gave up before the all-reduce")
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        return tensor.item()


class FailingInitWorker(Worker):
    """Rank 1 fails in its constructor, before joining the process group its peers wait in."""

    def __init__(self):
        if int(os.environ["RANK"]) == 1:
            raise OSError("rank 1 could not load its model")
        super().__init__()


class RoleWorker(Worker):
    """One role of a colocated worker: reports its process and keeps a per-role counter."""

    role_name = "role"

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple:
        return (self.role_name, self.rank, dist.get_world_size())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def score(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={f"{self.role_name}_score": data.batch["x"] * self.scale})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_span(self, seconds: float) -> tuple[float, float]:
        return _sleep_span(seconds)


def _sleep_span(seconds: float) -> tuple[float, float]:
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


class ActorRole(RoleWorker):
    role_name = "actor"


class CriticRole(RoleWorker):
    role_name = "critic"


class RefRole(RoleWorker):
    role_name = "ref"


class FlagWorker(Worker):
    """A call that waits for a flag, and a concurrent one that raises it."""

    def __init__(self):
        super().__init__()
        self.flag = threading.Event()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wait_for_flag(self, timeout: float) -> bool:
        return self.flag.wait(timeout)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, concurrent=True)
    def raise_flag(self) -> None:
        self.flag.set()


class StuckPeerWorker(Worker):
    """A rank that stops answering while its peers wait for it in a collective."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stuck_on_rank_while_peers_all_reduce(self, bad_rank: int, seconds: float) -> float:
        if self.rank == bad_rank:
            time.sleep(seconds)
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        return tensor.item()
