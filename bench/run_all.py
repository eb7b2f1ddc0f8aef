"""Run every benchmark under bench/ in one go and print a side-by-side summary.

Each benchmark runs in its own process (so peak memory and thread settings don't leak between them) and
prints its own table; the summary adds wall time, CPU-seconds of the child and the load average, because
this machine is shared and a wall time alone says little.
"""

from __future__ import annotations

import argparse
import os
import pkgutil
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def discover() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(BENCH_DIR)]) if m.name.startswith("bench_"))


def run_one(name: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", f"bench.{name}"], cwd=BENCH_DIR.parent)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "name": name,
        "ok": proc.returncode == 0,
        "wall_s": wall,
        "cpu_s": cpu,
        "load": (load_before + os.getloadavg()[0]) / 2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("only", nargs="*", help="benchmark module names (default: all bench_* modules)")
    args = parser.parse_args()
    names = args.only or discover()
    results = []
    for name in names:
        print(f"\n=== {name}", flush=True)
        results.append(run_one(name))
    print(f"\n{'benchmark':<28}{'status':>8}{'wall s':>10}{'cpu s':>10}{'load1':>8}")
    for r in results:
        status = "ok" if r["ok"] else "FAILED"
        print(f"{r['name']:<28}{status:>8}{r['wall_s']:>10.1f}{r['cpu_s']:>10.1f}{r['load']:>8.2f}")
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
