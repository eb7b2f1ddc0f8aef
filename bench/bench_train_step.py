"""One PPO actor step on CPU: old log-probs, the FSDP2 update, and the weight sync into the rollout engine.

Workload: 16 samples of 32 prompt + 96 response tokens (random ids, 1-32 / 1-96 real tokens), one
mini-batch of 16 in micro-batches of 4, one epoch, fp32, remove-padding on. Models: Qwen2-shaped, random,
vocabulary 263 like the tiny test model:
- ``tiny``: hidden 128, 2 layers (0.33M parameters, the test model);
- ``small``: hidden 512, 6 layers, intermediate 1536 (about 19M parameters).

Runs ``ActorRolloutRefWorker(role="actor_rollout")`` on one rank in this process (1 torch thread) and on
two Ray ranks (gloo, half a CPU and 1 thread each). Per phase: the median wall time of ``--steps``
repetitions after one warm-up; "cpu s" is this process's CPU time per repetition (one-rank runs only);
"load1" is the load average while the row ran. The sync is ``update_weights`` into a stale engine (one rank: the
engine is marked stale before each repetition; two ranks: it follows an update).
Run: ``.venv/bin/python -m bench.bench_train_step`` (about two minutes on a quiet machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from hybridflow.models.tiny import build_tiny_model  # noqa: E402
from hybridflow.protocol import DataProto  # noqa: E402

SIZES = {
    "tiny": {},
    "small": {
        "hidden_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 1536,
    },
}
SAMPLES, PROMPT_LENGTH, RESPONSE_LENGTH = 16, 32, 96


def build_batch(seed: int = 0) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(1, PROMPT_LENGTH + 1, (SAMPLES,), generator=generator)
    response_lengths = torch.randint(1, RESPONSE_LENGTH + 1, (SAMPLES,), generator=generator)
    prompt_mask = (torch.arange(PROMPT_LENGTH) >= PROMPT_LENGTH - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(RESPONSE_LENGTH) < response_lengths[:, None]).long()
    prompts = torch.randint(0, 256, (SAMPLES, PROMPT_LENGTH), generator=generator) * prompt_mask
    responses = torch.randint(0, 256, (SAMPLES, RESPONSE_LENGTH), generator=generator) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp_min(0),
            "response_mask": response_mask,
            "advantages": torch.randn(SAMPLES, 1, generator=generator) * response_mask,
        }
    )


def worker_config(model_dir: str) -> dict:
    return {
        "model": {"path": model_dir},
        "actor": {"ppo_mini_batch_size": SAMPLES, "ppo_micro_batch_size_per_gpu": 4, "optim": {"lr": 1e-5}},
        "rollout": {"response_length": 4, "prompt_length": PROMPT_LENGTH},
    }


def timed(fn, steps: int) -> tuple[float, float]:
    """Median wall seconds and mean CPU seconds of this process per call, after one warm-up call."""
    fn()
    walls, cpus = [], []
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.mean(cpus)


def one_rank(model_dir: str, steps: int) -> dict[str, tuple[float, float]]:
    import torch.distributed as dist

    from hybridflow.distributed.worker import find_free_port
    from hybridflow.workers import ActorRolloutRefWorker

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    worker = ActorRolloutRefWorker(worker_config(model_dir), "actor_rollout")
    worker.init_model()
    batch = build_batch()
    batch = batch.union(worker.compute_log_prob(batch))
    rollout = worker.parts["rollout"]

    def sync_stale_engine() -> None:
        rollout.synced_version = None  # as after an update: the whole model is copied
        worker.update_weights()

    return {
        "old_log_prob": timed(lambda: worker.compute_log_prob(batch), steps),
        "update_actor": timed(lambda: worker.update_actor(batch), steps),
        "update_weights": timed(sync_stale_engine, steps),
    }


def two_ranks(model_dir: str, steps: int) -> dict[str, tuple[float, float]]:
    from hybridflow.distributed import RayClassWithInitArgs, RayWorkerGroup, ResourcePool
    from hybridflow.workers import ActorRolloutRefWorker

    pool = ResourcePool([2], num_cpus_per_process=0.5, name_prefix="bench_train_step")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, worker_config(model_dir), "actor_rollout"))
    try:
        group.init_model()
        batch = build_batch()
        batch = batch.union(group.compute_log_prob(batch))
        syncs = []

        def update_then_sync():
            group.update_actor(batch)
            start = time.perf_counter()
            group.update_weights()
            syncs.append(time.perf_counter() - start)

        # The driver's CPU time says nothing about the ranks' work: no cpu column for Ray rows.
        results = {
            "old_log_prob": (timed(lambda: group.compute_log_prob(batch), steps)[0], float("nan")),
            "update_actor": (timed(lambda: group.update_actor(batch), steps)[0], float("nan")),
        }
        timed(update_then_sync, steps)
        results["update_weights"] = (statistics.median(syncs[1:]), float("nan"))
        return results
    finally:
        group.kill()
        pool.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--ranks", nargs="*", type=int, default=[1, 2], choices=[1, 2])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if 2 in args.ranks:
        from hybridflow.distributed import init_local_ray

        init_local_ray(num_cpus=2, temp_dir=tempfile.mkdtemp(prefix="ray_bench_"))
    print(f"{SAMPLES} samples x ({PROMPT_LENGTH} prompt + {RESPONSE_LENGTH} response) tokens, fp32, 1 thread per rank")
    print("| model | params | ranks | phase | wall s | cpu s | load1 |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for size in args.sizes:
        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix=f"bench_{size}_"), seed=0, **SIZES[size]))
        params = sum(tensor.numel() for tensor in load_file(f"{model_dir}/model.safetensors").values())
        for ranks in args.ranks:
            results = (one_rank if ranks == 1 else two_ranks)(model_dir, args.steps)
            load = os.getloadavg()[0]
            for phase, (wall, cpu) in results.items():
                cpu_text = "-" if cpu != cpu else f"{cpu:.3f}"
                print(f"| {size} | {params / 1e6:.2f}M | {ranks} | {phase} | {wall:.3f} | {cpu_text} | {load:.1f} |")


if __name__ == "__main__":
    main()
