"""Running a coroutine on a thread of its own, so blocking code inside it cannot stall the caller's event loop.

A tool's ``execute`` is ``async``, but nothing stops it from calling ``time.sleep`` or a blocking HTTP client:
on the rollout's loop that would freeze every other sample and keep ``asyncio.wait_for``'s timeout from ever
firing. Here each call runs under ``asyncio.run`` on a new daemon thread and the caller awaits a future with
the timeout. A call still running at its limit is abandoned (Python cannot kill a thread): its thread ends when
the call returns, and being a daemon it never holds up the process's exit.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


async def run_off_loop(coroutine: Coroutine[Any, Any, T], timeout: float, name: str = "tool-call") -> T:
    """``await coroutine`` on its own thread and event loop; raises ``asyncio.TimeoutError`` past ``timeout``."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the caller timed out and cancelled it
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def hand_over(result: Any, error: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            if not loop.is_closed():
                raise  # an abandoned call that ends after the caller's loop closed has no one to tell

    def target() -> None:
        try:
            result = asyncio.run(coroutine)
        except BaseException as error:  # noqa: BLE001 - handed to the caller, who decides
            hand_over(None, error)
        else:
            hand_over(result, None)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await asyncio.wait_for(future, timeout)
