"""The shape every trainer entry point (``main_ppo``, ``main_sft``) shares around its Hydra ``main``.

:func:`command_line` handles what comes before Hydra (verl's habits, arguments Hydra would refuse alone, unknown
keys set aside); :func:`checked_run` is the body of the Hydra ``main``: the config check (with the keys set
aside), the inputs read before Ray, then the run, all inside the error boundary. ``HYBRIDFLOW_CONFIG_CHECK``
stops after the check (``surface``: keys and values only; ``full``: also this machine and the inputs; ``plan``:
also prints the run plan, as ``main_ppo ... --plan`` does).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from hybridflow.config.command_line import CONFIG_CHECK_ENV, checked_with, hydra_arguments, print_check_outcome
from hybridflow.config.key_surface import Surface
from hybridflow.config.load import ConfigError
from hybridflow.trainer.error_boundary import error_boundary, found_before_start

# Set by command_line(): unknown keys, left out of Hydra's arguments and reported with the config's own problems.
UNKNOWN_KEYS: list[str] = []
PLAN_FLAG, PLAN_CHECK = "--plan", "plan"


def command_line(entry: str, argv: list[str], surface: Surface, schema: type, hydra_main: Callable[[], None]) -> None:
    """``python -m hybridflow.trainer.<entry> <argv>``: whole-line mistakes first, then Hydra's ``main``.
    ``--plan`` anywhere in ``argv``: check, print the run plan, and stop."""
    if PLAN_FLAG in argv:
        argv = [arg for arg in argv if arg != PLAN_FLAG]
        os.environ[CONFIG_CHECK_ENV] = PLAN_CHECK
    with error_boundary(entry):
        args, UNKNOWN_KEYS[:] = hydra_arguments(argv, surface, schema)
    sys.argv[1:] = args
    hydra_main()


def checked_run(
    entry: str,
    load: Callable[[bool], tuple[Any, list[str]]],
    build: Callable[[Any], Any],
    run: Callable[[Any, Any], Any],
    describe: Callable[[Any], list[str]] | None = None,
) -> None:
    """Check the config (``load(check_environment)``), ``build`` what is read before Ray, then ``run`` it;
    ``describe`` gives the lines of the built trainer's run plan (``--plan``)."""
    with error_boundary(entry):
        check = os.environ.get(CONFIG_CHECK_ENV)
        if check == PLAN_CHECK and describe is None:
            raise ConfigError([f"{PLAN_FLAG}: {entry} has no run plan to print; drop it"])
        config, unread = checked_with(UNKNOWN_KEYS, lambda: load(check != "surface"))
        # The data, tokenizer, reward function and tools are read before Ray starts, also by the full check.
        trainer = None if check == "surface" else found_before_start(lambda: build(config))
        if check == PLAN_CHECK:
            print("\n".join(f"[hybridflow] {line}" for line in describe(trainer)))
        print_check_outcome(unread, check)
        if not check:
            run(config, trainer)
