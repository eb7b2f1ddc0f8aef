"""The package files one actor update runs code in: ``python -m tests.trainer.update_path OVERRIDES...`` runs
``main_ppo`` in this process (``trainer.local_mode=true``) and records, from the driver's ``update_actor`` call
to its return, every file of the ``hybridflow`` package whose functions were entered; after the run it prints them
as one JSON line ``{"files": [...], "lines": N}`` (their package-relative paths and their lines in all)."""

import json
import pathlib
import sys
import threading

import hybridflow
from hybridflow.distributed import local_group

PACKAGE = pathlib.Path(hybridflow.__file__).parent
FILES: set[str] = set()


def _record(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE)):
        FILES.add(frame.f_code.co_filename)


def _traced_run(run):
    def traced(self, role, method, public_name, plan):
        if public_name != "update_actor":
            return run(self, role, method, public_name, plan)
        sys.setprofile(_record)
        threading.setprofile(_record)
        try:
            return run(self, role, method, public_name, plan)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    return traced


def main(argv: list[str]) -> None:
    from hybridflow.trainer.main_ppo import cli

    local_group.LocalWorkerGroup._run = _traced_run(local_group.LocalWorkerGroup._run)
    try:
        cli([*argv, "trainer.local_mode=true"])
    except SystemExit as end:
        if end.code:
            raise
    files = sorted(str(pathlib.Path(name).relative_to(PACKAGE.parent)) for name in FILES)
    lines = sum(len(pathlib.Path(PACKAGE.parent, name).read_text().splitlines()) for name in files)
    print(json.dumps({"files": files, "lines": lines}))


if __name__ == "__main__":
    main(sys.argv[1:])
