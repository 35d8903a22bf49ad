"""Sync tool calls run on daemon threads that are kept for the next call: a finished call's thread takes the next one,
a hung call keeps its own and the next call gets another, and the call still sees its caller's context. With no time
limit at all, a plain function runs on the calling thread instead, as isolated as on a tool thread."""

from __future__ import annotations

import contextvars
import threading

import pytest

from looptrace.runtime.tool_threads import run_sync
from looptrace.runtime.tools import ToolRaisedBaseException, ToolTimeout, tool

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")


@tool
def which_thread() -> str:
    """The thread the call ran on, and the context value it saw."""
    current = threading.current_thread()
    return f"{current.ident}|{current.name}|{current.daemon}|{where.get()}"


release = threading.Event()


@tool
def hang() -> str:
    """Waits until the test lets it go."""
    release.wait(10)
    return "late"


def test_a_finished_calls_thread_takes_the_next_call() -> None:
    first = run_sync(which_thread, {}, 5.0).split("|")
    second = run_sync(which_thread, {}, 5.0).split("|")
    assert first[0] == second[0]
    assert first[1] == "looptrace-tool-which_thread" and first[2] == "True"
    assert threading.current_thread().ident != int(first[0])


def test_a_hung_call_keeps_its_thread_and_the_next_call_runs_on_another() -> None:
    release.clear()
    try:
        with pytest.raises(ToolTimeout):
            run_sync(hang, {}, 0.05)
        next_call = run_sync(which_thread, {}, 5.0).split("|")
        one_more = run_sync(which_thread, {}, 5.0).split("|")
        assert next_call[0] == one_more[0]  # the calls after it share a thread of their own
    finally:
        release.set()


def test_each_call_sees_its_callers_context() -> None:
    token = where.set("first")
    try:
        assert run_sync(which_thread, {}, 5.0).endswith("|first")
    finally:
        where.reset(token)
    assert run_sync(which_thread, {}, 5.0).endswith("|unset")  # nothing left over from the previous call


@tool
def change_context() -> str:
    """Sets the context value and says where it ran."""
    where.set("changed by the tool")
    return str(threading.current_thread().ident)


@tool
def exit_the_process() -> str:
    """Calls sys.exit."""
    raise SystemExit(3)


@tool
async def async_which_thread() -> str:
    """An async tool: it needs an event loop of its own."""
    return str(threading.current_thread().ident)


def test_with_no_time_limit_a_plain_tool_runs_on_the_calling_thread_in_a_copy_of_its_context() -> None:
    token = where.set("caller's")
    try:
        ident, name, _, seen = run_sync(which_thread, {}, None).split("|")
        assert int(ident) == threading.current_thread().ident and seen == "caller's"
        assert run_sync(change_context, {}, None) == str(threading.current_thread().ident)
        assert where.get() == "caller's"  # what the tool set stayed in its own copy
    finally:
        where.reset(token)


def test_with_no_time_limit_a_tools_system_exit_is_still_its_own_failure() -> None:
    with pytest.raises(ToolRaisedBaseException, match="SystemExit: 3"):
        run_sync(exit_the_process, {}, None)


def test_with_no_time_limit_an_async_tool_still_gets_a_thread_and_an_event_loop_of_its_own() -> None:
    assert run_sync(async_which_thread, {}, None) != str(threading.current_thread().ident)
