"""The single controller: worker groups of Ray actors driven from one Python process (arXiv 2409.19256).

``init_local_ray`` starts or joins Ray; a ``ResourcePool`` reserves processes (placement groups); a
``RayWorkerGroup`` runs a ``Worker`` subclass on each of them and exposes its ``@register``-ed methods;
``create_colocated_worker_cls`` fuses several roles into one process per rank.
"""

from hybridflow.distributed.class_with_init import RayClassWithInitArgs
from hybridflow.distributed.colocate import ColocatedClassWithInitArgs, WorkerGroupView, create_colocated_worker_cls
from hybridflow.distributed.decorator import Dispatch, Execute, register
from hybridflow.distributed.errors import InsufficientResourcesError, WorkerError, WorkerTimeoutError
from hybridflow.distributed.futures import GroupFuture
from hybridflow.distributed.ray_init import init_local_ray
from hybridflow.distributed.resource_pool import RayResourcePool, ResourcePool
from hybridflow.distributed.worker import Worker
from hybridflow.distributed.worker_group import RayWorkerGroup

__all__ = [
    "ColocatedClassWithInitArgs",
    "Dispatch",
    "Execute",
    "GroupFuture",
    "InsufficientResourcesError",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePool",
    "Worker",
    "WorkerError",
    "WorkerGroupView",
    "WorkerTimeoutError",
    "create_colocated_worker_cls",
    "init_local_ray",
    "register",
]
