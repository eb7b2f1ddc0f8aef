"""``python -m hybridflow.experimental.fully_async_policy.fully_async_main``: verl's fully async policy trainer."""
