"""vLLM's CPU build made to see a small machine: its reading of the NUMA node's memory replaced, in this process.

vLLM's CPU worker reads the node's total and available memory (``vllm.utils.cpu_resource_utils``) to size its KV
cache; :func:`report_node_memory` makes that reading return the given sizes, wherever vLLM (or hybridflow's
``rollout.vllm_memory``) looks it up, so a test sees what a user's run sees on a machine with that little memory.
"""

import sys


def report_node_memory(total: int, available: int) -> None:
    """Every later reading of any NUMA node's memory by vLLM gives ``total`` and ``available`` bytes."""
    from vllm.utils import cpu_resource_utils

    def small_node(node_id: int = 0):
        return cpu_resource_utils.MemoryNodeInfo(total_memory=total, available_memory=available)

    cpu_resource_utils.get_memory_node_info = small_node
    for module in ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu.shm"):
        if module in sys.modules:
            sys.modules[module].get_memory_node_info = small_node
