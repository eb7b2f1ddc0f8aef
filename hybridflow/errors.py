"""The base of every error hybridflow raises on purpose, so an entry point can tell them from bugs.

A :class:`HybridflowError` says in its message what is wrong, where (the key, file, row, worker) and the fix.
The entry points (``main_ppo``, ``main_sft``, the demo) print such an error as its lines alone and exit with its
``exit_code``; any other exception is a bug and keeps its traceback.
"""


class HybridflowError(Exception):
    """An error the user can fix from its message alone: what is wrong, where, and what to change."""

    exit_code = 1


class RunInterrupted(HybridflowError):
    """The user stopped the run (Ctrl-C); the message says where it stopped and what the same command resumes from."""

    exit_code = 130
