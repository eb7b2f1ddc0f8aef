"""Loading a user's scoring function from a Python file (``custom_reward_function.path`` / ``.name``).

The function keeps verl's signature ``compute_score(data_source, solution_str, ground_truth, extra_info)
-> float | dict`` (a dict carries the reward under ``"score"``); ``custom_reward_function.reward_kwargs``
are bound as extra keyword arguments. The file is imported under a private module name and marked for
Ray's cloudpickle to ship by value, so the function also works inside Ray actors that cannot import the file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import pathlib
import sys
from typing import Any, Callable

from hybridflow.errors import HybridflowError


class CustomRewardError(HybridflowError, ValueError):
    """The custom reward file or function named in the config cannot be used."""


def load_custom_reward_function(
    path: str | pathlib.Path, name: str = "compute_score", reward_kwargs: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """Import ``path`` and return its function ``name`` (with ``reward_kwargs`` bound, if any)."""
    file = pathlib.Path(path).expanduser()
    if not file.is_file():
        raise CustomRewardError(
            f"custom_reward_function.path={str(path)!r} does not exist (looked for {file.resolve()}); "
            f"point it at a .py file that defines {name}(data_source, solution_str, ground_truth, extra_info)"
        )
    module = import_file(file, "custom_reward_function.path")
    function = getattr(module, name, None)
    if function is None or not callable(function):
        defined = sorted(
            key
            for key, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not key.startswith("_")
        )
        problem = "is not defined" if function is None else "is not callable"
        raise CustomRewardError(
            f"custom_reward_function.name={name!r} {problem} in {file}; functions defined there: {defined}"
        )
    return functools.partial(function, **reward_kwargs) if reward_kwargs else function


def import_file(file: pathlib.Path, key: str) -> Any:
    """The module of the Python ``file`` that the config key ``key`` names, imported once per file version."""
    stat = file.stat()
    digest = hashlib.sha1(f"{file.resolve()}:{stat.st_mtime_ns}:{stat.st_size}".encode()).hexdigest()[:10]
    module_name = f"hybridflow_custom_reward_{file.stem}_{digest}"
    if module_name in sys.modules:  # the config check imported this very file already: run its top level once
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise CustomRewardError(f"{key}={str(file)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before executing so dataclasses and pickling inside the file can find their module.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        where = f"{file}:{error.lineno}" if isinstance(error, SyntaxError) else str(file)
        reason = error.msg if isinstance(error, SyntaxError) else error
        raise CustomRewardError(
            f"importing {key} {where} failed: {type(error).__name__}: {reason}; fix the file"
        ) from error
    import cloudpickle
    from ray import cloudpickle as ray_cloudpickle  # Ray's own copy pickles tasks and actor arguments

    # By value: Ray workers and the scoring processes have no module of this name to import.
    ray_cloudpickle.register_pickle_by_value(module)
    cloudpickle.register_pickle_by_value(module)
    return module
