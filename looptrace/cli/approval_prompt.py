"""Asking a person at the terminal: approve a tool call, or say whether a run that hit an anomaly goes on.

The questions go to stderr (stdout holds only the outcome) and the answers come from stdin. Arguments are shown
redacted, as the spans hold them: a terminal is output too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from looptrace.cli.views import LiveView
    from looptrace.runtime import ApprovalRequest, Decision, RunResult

MAX_SHOWN_ARGUMENTS = 2000


class TerminalApprover:
    """``Agent(approver=...)`` for `looptrace run`: asks per call, unless its tool was approved for the whole run
    (``--approve TOOL``, ``--approve-all``, or the answer "always"). ``view``, the run's live view, is paused while a
    question waits for its answer, so that its live line never writes over the question."""

    def __init__(self, answers: TextIO, out: TextIO, *, approve_tools: Iterable[str] = (),
                 approve_all: bool = False, ask: bool = True, view: LiveView | None = None) -> None:
        self.answers = answers
        self.out = out
        self.approved_tools = set(approve_tools)
        self.approve_all = approve_all
        self.ask = ask  # False: no one to ask (stdin is no terminal); an undecided call pauses the run
        self.view = view

    def _asking(self) -> contextlib.AbstractContextManager[None]:
        return self.view.paused() if self.view is not None else contextlib.nullcontext()

    def decides(self, tool: str) -> bool:
        return self.approve_all or tool in self.approved_tools

    def __call__(self, request: ApprovalRequest) -> Decision | None:
        from looptrace.runtime import approve

        name = request.tool.name
        if self.decides(name):
            return approve()
        if not self.ask:
            return None  # nobody at a terminal: the run pauses with this call pending
        with self._asking():
            return self._ask_about(request)

    def _ask_about(self, request: ApprovalRequest) -> Decision:
        from looptrace.runtime import approve, reject

        name = request.tool.name
        self.out.write(f"\nlooptrace: {name} wants to run (call {request.call_id}, turn {request.turn}):\n"
                       f"  {shown_arguments(request.arguments)}\n")
        while True:
            answer = self._read(f"approve? [y]es / [n]o, reject / [a]lways approve {name} in this run: ").lower()
            if answer in ("y", "yes"):
                return approve()
            if answer in ("a", "always"):
                self.approved_tools.add(name)
                return approve()
            if answer in ("n", "no"):
                reason = self._read("reason (the model reads it): ") or "rejected at the terminal"
                return reject(reason)
            self.out.write("  answer y, n or a\n")

    def go_on(self, result: RunResult) -> tuple[bool, str | None]:
        """For a run paused by an anomaly whose policy said "ask": go on (with an optional message) or stop."""
        with self._asking():
            return self._ask_go_on(result)

    def _ask_go_on(self, result: RunResult) -> tuple[bool, str | None]:
        anomaly = result.pending_anomaly
        assert anomaly is not None
        self.out.write(f"\nlooptrace: the run paused on a {anomaly.type} anomaly (turn {anomaly.turn}): "
                       f"{anomaly.message}\n")
        while True:
            answer = self._read("go on? [y]es / [m]essage the model and go on / [s]top: ").lower()
            if answer in ("y", "yes"):
                return True, None
            if answer in ("m", "message"):
                return True, self._read("message for the model: ") or None
            if answer in ("s", "stop", "n", "no"):
                return False, None
            self.out.write("  answer y, m or s\n")

    def _read(self, question: str) -> str:
        self.out.write(question)
        self.out.flush()
        line = self.answers.readline()
        if not line:  # end of input: nobody is there to answer
            raise EOFError("no answer: stdin was closed")
        return line.strip()


def shown_arguments(arguments: Any) -> str:
    """A call's arguments on one line, redacted, cut at a length a terminal can take."""
    from looptrace.instrumentation.recording import redact

    text = json.dumps(redact(arguments), ensure_ascii=False, default=str)
    return text if len(text) <= MAX_SHOWN_ARGUMENTS else text[: MAX_SHOWN_ARGUMENTS - 1] + "…"
