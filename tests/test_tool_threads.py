"""Sync tool calls run on daemon threads that are kept for the next call: a finished call's thread takes the next one,
a hung call keeps its own and the next call gets another, and the call still sees its caller's context."""

from __future__ import annotations

import contextvars
import threading

import pytest

from looptrace.runtime.tools import ToolTimeout, run_sync, tool

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
