"""How much does shipping a DataProto cost: torch tensors (naive pickling) vs the numpy path of DataProto.

A ~1.25 MiB PPO-shaped batch (64 rows, 256 prompt + 256 response tokens) goes through pickle, Ray's object
store, and a driver -> 2 actors -> driver round trip (the DP_COMPUTE_PROTO pattern: chunk, compute, concat).
"Naive" ships ``(batch, non_tensor_batch, meta_info)`` as they are, so the TensorDict pickles its torch
tensors; "DataProto" ships the DataProto, whose ``__getstate__`` hands numpy arrays to pickle.

Run: ``.venv/bin/python -m bench.bench_protocol`` (about 20-30 s; starts and stops its own Ray cluster).
Each row prints wall time per operation (median over the repeats), CPU seconds of this process for the
whole row (``time.process_time``, so Ray workers' CPU is not included) and the 1-minute load average.
"""

from __future__ import annotations

import os
import pickle
import statistics
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

from hybridflow.protocol import DataProto  # noqa: E402

ROWS, PROMPT_LEN, RESPONSE_LEN = 64, 256, 256


def ppo_batch() -> DataProto:
    """About 1.25 MiB of tensors with verl's key names, plus a uid column."""
    generator = torch.Generator().manual_seed(0)
    seq_len = PROMPT_LEN + RESPONSE_LEN
    return DataProto.from_dict(
        {
            "input_ids": torch.randint(0, 32000, (ROWS, seq_len), generator=generator),
            "attention_mask": torch.ones(ROWS, seq_len, dtype=torch.int64),
            "position_ids": torch.arange(seq_len).repeat(ROWS, 1),
            "prompts": torch.randint(0, 32000, (ROWS, PROMPT_LEN), generator=generator),
            "responses": torch.randint(0, 32000, (ROWS, RESPONSE_LEN), generator=generator),
            "response_mask": torch.ones(ROWS, RESPONSE_LEN, dtype=torch.int64),
            "old_log_probs": torch.randn(ROWS, RESPONSE_LEN, generator=generator),
            "advantages": torch.randn(ROWS, RESPONSE_LEN, generator=generator),
        },
        {"uid": [f"uid-{i // 4}" for i in range(ROWS)]},
        {"eos_token_id": 2, "temperature": 1.0},
    )


def naive_payload(dp: DataProto) -> tuple:
    return dp.batch, dp.non_tensor_batch, dp.meta_info


def measure(name: str, operation: Callable[[], Any], repeats: int, note: str = "") -> None:
    operation()  # warm-up
    cpu_start, walls = time.process_time(), []
    for _ in range(repeats):
        start = time.perf_counter()
        operation()
        walls.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu_start
    print(
        f"{name:<42} {statistics.median(walls) * 1e3:8.3f} ms/op  (mean {statistics.mean(walls) * 1e3:7.3f}, "
        f"n={repeats})  cpu {cpu:6.3f} s  load {os.getloadavg()[0]:5.2f}  {note}"
    )


def bench_pickle(dp: DataProto) -> None:
    naive, repeats = naive_payload(dp), 200
    for protocol in (4, 5):
        naive_size = len(pickle.dumps(naive, protocol=protocol))
        ours_size = len(pickle.dumps(dp, protocol=protocol))
        measure(
            f"pickle p{protocol} dumps+loads, naive",
            lambda protocol=protocol: pickle.loads(pickle.dumps(naive, protocol=protocol)),
            repeats,
            f"{naive_size / 2**20:.3f} MiB",
        )
        measure(
            f"pickle p{protocol} dumps+loads, DataProto",
            lambda protocol=protocol: pickle.loads(pickle.dumps(dp, protocol=protocol)),
            repeats,
            f"{ours_size / 2**20:.3f} MiB",
        )


def bench_ray(dp: DataProto) -> None:
    import ray

    from hybridflow.distributed.ray_init import init_local_ray

    init_local_ray(num_cpus=2, temp_dir=tempfile.mkdtemp(prefix="bench-protocol-ray-"))
    try:
        naive = naive_payload(dp)
        measure("ray.put+get in driver, naive", lambda: ray.get(ray.put(naive)), 100)
        measure("ray.put+get in driver, DataProto", lambda: ray.get(ray.put(dp)), 100)

        @ray.remote(num_cpus=0.5)
        class Echo:
            def echo(self, payload: Any) -> Any:
                return payload

        actors = [Echo.remote() for _ in range(2)]
        ray.get([actor.echo.remote(0) for actor in actors])  # wait for the actors to start
        naive_chunks = [naive_payload(chunk) for chunk in dp.chunk(2)]

        def naive_round_trip() -> None:
            parts = ray.get([actor.echo.remote(chunk) for actor, chunk in zip(actors, naive_chunks)])
            DataProto.concat([DataProto(*part) for part in parts])

        def round_trip() -> None:
            DataProto.concat(ray.get([actor.echo.remote(chunk) for actor, chunk in zip(actors, dp.chunk(2))]))

        measure("driver -> 2 actors -> driver, naive", naive_round_trip, 50)
        measure("driver -> 2 actors -> driver, DataProto", round_trip, 50)
    finally:
        ray.shutdown()


def main() -> None:
    torch.set_num_threads(1)
    dp = ppo_batch()
    tensor_bytes = sum(t.numel() * t.element_size() for t in dp.batch.values())
    print(f"batch: {len(dp)} rows, {tensor_bytes / 2**20:.3f} MiB of tensors, cpu count {os.cpu_count()}")
    bench_pickle(dp)
    bench_ray(dp)


if __name__ == "__main__":
    main()
