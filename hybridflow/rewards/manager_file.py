"""A user's reward manager class loaded from a Python file (verl's ``reward.reward_manager.source=importlib``).

``reward.reward_manager.module.path`` names the file and ``reward.reward_manager.name`` the class in it, as in
verl's ``resolve_reward_manager_cls``. The class must subclass :class:`NaiveRewardManager` (or a manager
derived from it): that is the interface the driver calls (``__call__``, ``start_batch``, ``close``), and it
is built like the registered managers, with the tokenizer, ``compute_score``, ``num_examine`` and
``reward_kwargs``. Differs from verl: verl takes any class from the file; here one that is not such a
subclass is refused before anything starts.
"""

from __future__ import annotations

import inspect
import pathlib
from typing import Any, Mapping

from hybridflow.rewards.custom import CustomRewardError, import_file
from hybridflow.rewards.managers import REWARD_MANAGERS, NaiveRewardManager

PATH_KEY = "reward.reward_manager.module.path"
NAME_KEY = "reward.reward_manager.name"


def load_reward_manager_class(path: str, name: str) -> type[NaiveRewardManager]:
    """The class ``name`` defined in the file ``path``; raises :class:`CustomRewardError` in one line when the
    file is missing, does not import, lacks the class, or the class is no reward manager."""
    file = pathlib.Path(path).expanduser()
    if not file.is_file():
        raise CustomRewardError(
            f"{PATH_KEY}={path!r} does not exist (looked for {file.resolve()}); point it at a .py file that "
            f"defines class {name}(NaiveRewardManager)"
        )
    module = import_file(file, PATH_KEY)
    found = getattr(module, name, None)
    if found is None:
        defined = sorted(key for key, value in vars(module).items() if inspect.isclass(value) and key[0] != "_")
        raise CustomRewardError(f"{NAME_KEY}={name!r} is not defined in {file}; set it to one of its classes {defined}")
    if not (inspect.isclass(found) and issubclass(found, NaiveRewardManager)):
        raise CustomRewardError(
            f"{NAME_KEY}={name!r} in {file} is not a subclass of hybridflow.rewards.NaiveRewardManager; "
            "subclass it (or another registered manager's class) and override what you change"
        )
    return found


def manager_class_traits(manager_class: type) -> Mapping[str, Any]:
    """The registry traits of the nearest registered class ``manager_class`` derives from; a class that
    overrides ``__call__`` scores whole batches, since scoring in parts during generation would bypass it."""
    registered = {REWARD_MANAGERS.get(name): name for name in REWARD_MANAGERS.primary_names()}
    base = next(cls for cls in manager_class.__mro__ if cls in registered)
    traits = dict(REWARD_MANAGERS.traits(registered[base]))
    if manager_class.__call__ is not base.__call__:
        traits["scores_each_sample"] = False
    return traits
