"""``python -m hybridflow.model_merger {merge,test}``: verl's model-merger command line, for FSDP checkpoints.

verl's flags that apply to FSDP checkpoints keep their names (``--backend``, ``--local_dir``,
``--target_dir``, ``--test_hf_dir``, ``--trust-remote-code``); ``--backend`` defaults to ``fsdp`` (verl
requires it) and ``megatron`` is refused, as hybridflow trains with FSDP2 only. verl's Megatron-only flags
(``--tie-word-embedding``, ``--is-value-model``, ``--use_cpu_initialization``) and the Hub upload
(``--hf_upload_path``, ``--private``) are not offered. ``--save_lora_adapter`` is hybridflow's (see merge.py).
"""

from __future__ import annotations

import argparse
import sys

from hybridflow.model_merger.merge import MergerError, compare_with_hf, merge
from hybridflow.models.adapter_files import LoraAdapterError
from hybridflow.workers.checkpoint import CheckpointContentError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.model_merger", description=__doc__.splitlines()[0])
    operations = parser.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", default="fsdp", help="Checkpoint format: fsdp (hybridflow's only one).")
    common.add_argument("--local_dir", required=True, help="Actor checkpoint folder: <run>/global_step_N/actor.")
    common.add_argument("--trust-remote-code", action="store_true", help="Allow model code from the checkpoint.")

    merge_parser = operations.add_parser("merge", parents=[common], help="Write a Hugging Face model folder.")
    merge_parser.add_argument("--target_dir", default="tmp", help="New (or empty) folder for the model.")
    merge_parser.add_argument(
        "--save_lora_adapter",
        action="store_true",
        help="LoRA: write the base weights and the adapter apart (target_dir/lora_adapter), as verl does.",
    )
    test_parser = operations.add_parser("test", parents=[common], help="Compare with a Hugging Face model folder.")
    test_parser.add_argument("--test_hf_dir", required=True, help="Hugging Face folder the merge must equal.")
    return parser.parse_args(argv)


def check_backend(backend: str) -> None:
    if backend == "megatron":
        raise MergerError("--backend megatron: hybridflow trains with FSDP2 only and writes no Megatron checkpoints")
    if backend != "fsdp":
        raise MergerError(f"--backend {backend!r} is not a checkpoint format hybridflow writes; use --backend fsdp")


def main(argv: list[str] | None = None) -> int:
    """Run one operation; a problem with the inputs is one line on stderr and exit status 1."""
    args = parse_args(argv)
    try:
        check_backend(args.backend)
        if args.operation == "merge":
            target = merge(args.local_dir, args.target_dir, args.save_lora_adapter, args.trust_remote_code)
            print(f"saved the merged model and tokenizer to {target}")
        else:
            count = compare_with_hf(args.local_dir, args.test_hf_dir, args.trust_remote_code)
            print(f"merged checkpoint matches {args.test_hf_dir} ({count} tensors)")
    except (MergerError, CheckpointContentError, LoraAdapterError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
