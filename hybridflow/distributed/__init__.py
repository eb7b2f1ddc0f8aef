"""The single controller: worker groups of Ray actors driven from one Python process (arXiv 2409.19256).

``init_local_ray`` starts or joins Ray; a ``ResourcePool`` reserves processes (placement groups); a
``RayWorkerGroup`` runs a ``Worker`` subclass on each of them and exposes its ``@register``-ed methods;
``create_colocated_worker_cls`` fuses several roles into one process per rank; a ``PartStream`` hands over a
streamed method's parts as ranks yield them; ``share`` puts a value in the object store for the workers of
another group; a ``LocalWorkerGroup`` runs the same workers in the driver's own process, without Ray. The
names load their modules (and Ray) on first use.
"""

from hybridflow.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "class_with_init": ["RayClassWithInitArgs"],
        "colocate": ["ColocatedClassWithInitArgs", "WorkerGroupView", "create_colocated_worker_cls"],
        "decorator": ["Dispatch", "Execute", "register"],
        "errors": ["InsufficientResourcesError", "StalledRanksError", "WorkerError", "WorkerTimeoutError"],
        "futures": ["GroupFuture"],
        "streams": ["PartStream"],
        "local_group": ["LocalWorkerGroup"],
        "ray_init": ["init_local_ray"],
        "resource_pool": ["RayResourcePool", "ResourcePool"],
        "shared_objects": ["SharedObject", "share"],
        "worker": ["Worker"],
        "worker_group": ["RayWorkerGroup"],
    },
)
