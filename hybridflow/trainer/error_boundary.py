"""One error boundary per entry point: an error hybridflow raises on purpose is its own lines, not a traceback.

``main_ppo``, ``main_sft`` and the demo run inside :func:`error_boundary`. A
:class:`~hybridflow.errors.HybridflowError` (config, data, checkpoint, tool, reward...), or a worker's failure
whose cause is one (or whose process died), is printed to stderr as ``hybridflow: error: <message>``, its
traceback written to a file in the run's Hydra output folder, and the process exits with the error's
``exit_code`` (2: the config, before anything started; 1: at run time; 130: Ctrl-C). ``HYBRIDFLOW_FULL_ERROR=1``
prints the traceback on the screen as well (as Hydra's ``HYDRA_FULL_ERROR`` does). Any other exception is a bug
and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from typing import TypeVar

from hybridflow.config.load import ConfigError
from hybridflow.distributed.errors import WorkerError
from hybridflow.errors import HybridflowError, RunInterrupted

FULL_ERROR_ENV = "HYBRIDFLOW_FULL_ERROR"
T = TypeVar("T")
PREFIX = "hybridflow: error: "
# Printed just before Ray and the workers start: a failure after it was not found by the config check.
WORKERS_STARTING = "[hybridflow] starting the workers"


def user_message(error: BaseException) -> str | None:
    """The message to show alone for an error the user can fix from it; None for a bug (keep the traceback)."""
    if isinstance(error, HybridflowError):
        return str(error)
    if isinstance(error, WorkerError) and (error.user_facing or error.process_died):
        return error.summary()
    return None


def found_before_start(build: Callable[[], T]) -> T:
    """``build()``: reading the run's inputs before Ray. An error it raises on purpose is a config error (exit 2)."""
    try:
        return build()
    except ConfigError:
        raise
    except HybridflowError as error:
        raise ConfigError([str(error)]) from error


def exit_code(error: BaseException) -> int:
    return error.exit_code if isinstance(error, HybridflowError) else 1


@contextlib.contextmanager
def error_boundary(entry: str) -> Iterator[None]:
    """Run the body; an error meant for the user ends the process with its message alone (see module doc)."""
    try:
        yield
    except KeyboardInterrupt:
        report(RunInterrupted("interrupted (Ctrl-C) before the run started"), entry)
    except Exception as error:
        if user_message(error) is None:
            raise
        report(error, entry)


def report(error: BaseException, entry: str) -> None:
    """Print ``error``'s message (and, under ``HYBRIDFLOW_FULL_ERROR=1``, its traceback) and exit."""
    trace = "".join(traceback.format_exception(error))
    if os.environ.get(FULL_ERROR_ENV) == "1":
        print(trace, file=sys.stderr, end="")
    elif not isinstance(error, ConfigError):  # a config error's traceback says nothing its lines do not
        log_file = _write_traceback(trace, entry)
        if log_file is not None:
            print(f"[hybridflow] traceback written to {log_file} ({FULL_ERROR_ENV}=1 prints it here)", flush=True)
    sys.stdout.flush()
    print(PREFIX + user_message(error), file=sys.stderr, flush=True)
    sys.exit(exit_code(error))


def _write_traceback(trace: str, entry: str) -> pathlib.Path | None:
    """The traceback in Hydra's output folder for this run, else a temp file; None if neither is writable."""
    hydra_dir = _hydra_output_dir()
    try:
        if hydra_dir is not None:
            path = hydra_dir / f"{entry}_error.log"
        else:
            handle, name = tempfile.mkstemp(prefix=f"hybridflow_{entry}_error_", suffix=".log")
            os.close(handle)
            path = pathlib.Path(name)
        path.write_text(trace)
    except OSError:
        return None
    return path


def _hydra_output_dir() -> pathlib.Path | None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    # None where Hydra was set up without a run (its compose API): no output folder then.
    output_dir = OmegaConf.select(HydraConfig.get(), "runtime.output_dir", throw_on_missing=False)
    return None if output_dir is None else pathlib.Path(output_dir)
