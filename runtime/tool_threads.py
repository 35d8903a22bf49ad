"""Running a tool call under its time limit: sync calls on kept daemon threads the run can leave behind, async
calls as tasks, and a sync call with no limit at all on the caller's own thread.

A hung call is never waited for past its limit: its thread (or task) is left to finish on its own, and the run goes on
with a ToolTimeout. A call's SystemExit is that tool's failure (ToolRaisedBaseException), not the end of the process;
so is its KeyboardInterrupt on a tool thread, where it cannot be the user's Ctrl-C (on the caller's thread it is).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeAlias

from looptrace.runtime.tools import Tool, ToolError, ToolRaisedBaseException, ToolTimeout

__all__ = ["run_async", "run_sync"]


def run_sync(t: Tool, kwargs: dict[str, Any], timeout_s: float | None) -> object:
    """Call a tool from synchronous code. Waits at most ``timeout_s``; a hung tool is left behind, never waited for.

    With no time limit at all (``tool_timeout_s=None`` and no run ``timeout_s``) there is nothing to leave behind, so
    a plain function runs on the calling thread: handing a call to another thread and back costs two thread switches,
    tens of microseconds of CPU, more than most tools take."""
    _refuse_when_out_of_time(t, timeout_s)
    if timeout_s is None and not t.is_async:  # an async tool gets an event loop of its own on a tool thread
        return _run_here(t, kwargs)
    box = _start_in_daemon_thread(t, kwargs)
    if not box.wait(timeout_s):
        raise ToolTimeout(_timeout_message(t, timeout_s))
    return box.outcome()


async def run_async(t: Tool, kwargs: dict[str, Any], timeout_s: float | None) -> object:
    """Call a tool from a coroutine: async tools as tasks, sync tools on a daemon thread, both under the timeout."""
    _refuse_when_out_of_time(t, timeout_s)
    if t.is_async:
        task = asyncio.ensure_future(t.fn(**kwargs))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
        except asyncio.CancelledError:  # the run was cancelled: so is the call it was waiting for
            task.cancel()
            raise
        if not done:
            # Cancel but do not await: a coroutine that swallows cancellation must not hang the run.
            task.cancel()
            raise ToolTimeout(_timeout_message(t, timeout_s))
        if task.cancelled():  # the tool cancelled itself (or something it awaited): its failure, not the run's
            raise ToolError(f"{t.name} was cancelled before it returned")
        error = task.exception()
        if error is not None and not isinstance(error, Exception):
            raise ToolRaisedBaseException(error)
        return task.result()
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    box = _start_in_daemon_thread(t, kwargs, on_done=lambda: _wake(loop, future))
    try:
        await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError:
        raise ToolTimeout(_timeout_message(t, timeout_s)) from None
    return box.outcome()


def _run_here(t: Tool, kwargs: dict[str, Any]) -> object:
    """The call on this thread, in a copy of its context as on a tool thread (a tool's context changes stay its own).
    A KeyboardInterrupt here is the user's Ctrl-C, as anywhere else on this thread; SystemExit and the like are the
    tool's failure."""
    try:
        return contextvars.copy_context().run(t.fn, **kwargs)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise ToolRaisedBaseException(exc) from exc


class _Outcome:
    """What a call on a tool thread returned or raised, and a latch its caller waits on until it is known."""

    __slots__ = ("_pending", "error", "value")

    def __init__(self) -> None:
        # A lock held until the call is over, rather than an Event: an Event's wait builds a Condition and a lock on
        # every call, twice the cost of this handoff, and each sync tool call makes one.
        self._pending = threading.Lock()
        self._pending.acquire()
        self.value: object = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        self._pending.release()

    def wait(self, timeout_s: float | None) -> bool:
        """Whether the call finished within ``timeout_s`` (None: however long it takes). Called once."""
        return self._pending.acquire(True, -1 if timeout_s is None else max(timeout_s, 0.0))

    def outcome(self) -> object:
        if isinstance(self.error, Exception):
            raise self.error
        if self.error is not None:
            raise ToolRaisedBaseException(self.error)
        return self.value


def _start_in_daemon_thread(t: Tool, kwargs: dict[str, Any], on_done: Callable[[], None] | None = None) -> _Outcome:
    box = _Outcome()
    context = contextvars.copy_context()  # the tool's own spans nest under its execute_tool span

    def call() -> None:
        try:
            if t.is_async:
                box.value = context.run(asyncio.run, t.fn(**kwargs))
            else:
                box.value = context.run(t.fn, **kwargs)
        except BaseException as exc:  # a tool's SystemExit or KeyboardInterrupt is its failure, not ours
            box.error = exc

    _TOOL_THREADS.run(call, box, on_done, f"looptrace-tool-{t.name}")
    return box


_Job: TypeAlias = "tuple[Callable[[], None], _Outcome, Callable[[], None] | None, str]"
"""What a tool thread's inbox receives: the call, where its outcome goes, whom to wake after, the thread's name."""


class _ToolThreads:
    """The daemon threads sync tool calls run on: a thread whose call returned waits for the next call.

    Daemon threads rather than a ThreadPoolExecutor: the executor's workers are joined at interpreter exit, so one tool
    that never returns would keep the process alive forever. Kept rather than started per call: starting a thread and
    waiting until it runs costs more CPU than most tools take (about 90 µs against 20 for handing a waiting thread the
    call). A call that hangs keeps its thread and the next call gets another; at most ``keep`` threads wait, the rest
    end when their call returns."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._idle: list[queue.SimpleQueue[_Job]] = []  # the inbox of each waiting thread
        self._lock = threading.Lock()

    def run(self, call: Callable[[], None], box: _Outcome, on_done: Callable[[], None] | None, name: str) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name=name, daemon=True).start()
        inbox.put((call, box, on_done, name))

    def _serve(self, inbox: queue.SimpleQueue[_Job]) -> None:
        thread = threading.current_thread()
        while True:
            call, box, on_done, name = inbox.get()
            thread.name = name
            call()
            with self._lock:  # waiting again before the caller hears of the result: its next call finds this thread
                stays = len(self._idle) < self.keep
                if stays:
                    self._idle.append(inbox)
            box.finish()
            if on_done is not None:
                on_done()
            if not stays:
                return

    def forget(self) -> None:
        """In a forked child: the parent's threads do not exist there."""
        self._idle = []
        self._lock = threading.Lock()


_TOOL_THREADS = _ToolThreads()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TOOL_THREADS.forget)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
    # An abandoned tool may finish after its event loop has closed; nobody is waiting then.
    try:
        loop.call_soon_threadsafe(_settle, future)
    except RuntimeError:
        pass


def _refuse_when_out_of_time(t: Tool, timeout_s: float | None) -> None:
    """A call is not started once the run's clock has run out: its side effects would happen unseen."""
    if timeout_s is not None and timeout_s <= 0:
        raise ToolTimeout(f"{t.name} was not run: the run's time limit was reached")


def _timeout_message(t: Tool, timeout_s: float | None) -> str:
    return (f"{t.name} did not finish within {timeout_s:g} s and was abandoned; "
            "try simpler arguments or another approach")
