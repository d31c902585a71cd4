"""`CallGate`: user coroutines (tools, interactions) run each in a thread of its own with its own
event loop, at most `workers` at once, each given `timeout` seconds. A call that raises or runs
past its time gives an `Outcome` saying so; a hung call's thread is left behind (a daemon) and
no longer holds a worker, so no call can stop the rollout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A call's result: status "ok" (with `value`), "error" or "timeout" (with `message`), and
    the seconds it took."""

    status: str
    value: Any = None
    message: str = ""  # the failure with its type ("ValueError: ...")
    seconds: float = 0.0
    error: str = ""  # the exception's own text (str(err)), as verl writes it into a turn

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class CallGate:
    def __init__(self, workers: int, timeout: float):
        self.workers, self.timeout = workers, timeout
        # One semaphore per event loop: each rollout call runs its own loop (`asyncio.run`).
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    async def call(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, **kwargs: Any):
        """`await fn(*args, **kwargs)` contained: an `Outcome`, never an exception."""
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots = {loop: asyncio.Semaphore(self.workers)}  # the earlier loops are done
        async with self._slots[loop]:
            result: concurrent.futures.Future = concurrent.futures.Future()

            def target() -> None:
                # Running, the future can no longer be cancelled: a call that outlives its
                # timeout sets its result on a future nobody waits for, not on a cancelled one.
                if not result.set_running_or_notify_cancel():
                    return
                try:
                    result.set_result(asyncio.run(fn(*args, **kwargs)))
                except BaseException as err:  # the caller gets every failure as an outcome
                    result.set_exception(err)

            start = time.perf_counter()
            threading.Thread(target=target, name="jrl-agent-call", daemon=True).start()
            try:
                value = await asyncio.wait_for(asyncio.wrap_future(result), self.timeout)
            except TimeoutError:
                return Outcome("timeout", message=f"no answer within {self.timeout:g} s")
            except Exception as err:
                seconds = time.perf_counter() - start
                message = f"{type(err).__name__}: {err}"
                return Outcome("error", message=message, seconds=seconds, error=str(err))
            return Outcome("ok", value, seconds=time.perf_counter() - start)
