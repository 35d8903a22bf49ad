"""The tool errors ignored_error weighs: which of a run's failures still stand, and what happened after each.

An error stands until a later success of the same tool on the same target resolves it. Kept with it: how often the
same call failed, whether the model went on to other calls, whether a later call of another tool reported it (a
hand-off, a ticket), and the successes that came back beside it. The errors a run leaves standing are kept for the
next runs of the session.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from typing import Any

from .answers import FoldedText, free_text_in, names_or_quotes
from .calls import ObservedCall, observe_call
from .config import DetectorConfig, default_config
from .facts import UnresolvedToolError
from .identity import call_targets, normal_text
from .rule import OpenTurn

_MAX_BATCH_RESULTS = 8  # successful results kept per turn while an error of that turn stands


# Plain classes with slots rather than dataclasses, for start-up time: calls.py says why.


class Batch:
    """The successful results of a turn that returned an error, kept while an error of that turn is unresolved. Made
    at the turn's first error (a turn without errors makes none), from the successes the turn had returned so far."""

    __slots__ = ("results", "turn")

    def __init__(self, turn: int) -> None:
        self.turn = turn
        self.results: list[tuple[str, Any]] = []  # (tool, its result as given: a reference, no copy)

    def add(self, observed: ObservedCall) -> None:
        if len(self.results) < _MAX_BATCH_RESULTS and observed.raw_result is not None:
            self.results.append((observed.tool, observed.raw_result))


class UnresolvedError:
    """A failed call no later success has resolved."""

    __slots__ = ("arguments", "batch", "call_id", "error_text", "failures", "first_turn", "key", "moved_on",
                 "reported", "targets", "turn")

    def __init__(self, turn: int, call_id: str | None, arguments: str, error_text: str, key: str,
                 targets: frozenset[str], failures: int = 1, *, moved_on: bool = False, first_turn: int = 0,
                 batch: Batch | None = None) -> None:
        self.turn = turn
        self.call_id = call_id
        self.arguments = arguments
        self.error_text = error_text
        self.key = key  # tool + canonical arguments
        self.targets = targets  # identifier-like argument values: what the call acted on
        self.failures = failures  # times this same call failed in the run without a success between
        self.moved_on = moved_on  # another call in a later turn: the model saw the failure and went on with other work
        self.reported = False  # a later successful call named its target or quoted its error (a ticket, a hand-off)
        self.first_turn = first_turn  # where this call first failed: anything the model said after that may report it
        self.batch = batch  # the calls that came back with this failure (a parallel batch)

    def resolved_by(self, success_key: str, success_targets: frozenset[str]) -> bool:
        """A later success resolves the error when it is the same call, or the same operation retried on the same
        target with a minority of its arguments corrected: more than half of the failed call's targets unchanged."""
        if self.key == success_key:
            return True
        return bool(self.targets) and 2 * len(self.targets & success_targets) > len(self.targets)


class _ToolErrors:
    """A tool's errors since its last success: all of them counted, the most recent kept."""

    __slots__ = ("recent", "total")

    def __init__(self, recent: deque[UnresolvedError]) -> None:
        self.recent = recent
        self.total = 0


class ErrorLedger:
    """The unresolved errors of the current run, by tool, and those earlier runs of the session left standing."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self._unresolved: dict[str, _ToolErrors] = {}
        self._batch: Batch | None = None  # the current turn's successful results, once the turn returned an error
        # Failures of earlier runs of the session still unresolved, the most recent; only the judge reads them.
        self.earlier: deque[tuple[str, UnresolvedError]] = deque(maxlen=config.max_errors_per_tool)
        self.calls_this_run = 0

    def begin_run(self) -> None:
        """What this run left standing joins the earlier runs' errors; the new run starts with none of its own."""
        ending = [(tool, e) for tool, kept in self._unresolved.items() for e in kept.recent]
        if ending:
            keys = {e.key for _, e in ending}
            self.earlier = deque([item for item in self.earlier if item[1].key not in keys] + ending,
                                 maxlen=self.config.max_errors_per_tool)
        self.calls_this_run = 0
        self._unresolved = {}
        self._batch = None

    def __bool__(self) -> bool:
        """Whether any error of this run stands."""
        return bool(self._unresolved)

    def standing(self) -> Iterator[tuple[str, UnresolvedError]]:
        """(tool, error) for every error of this run that stands, oldest tool first, the most recent kept of each."""
        for tool, kept in self._unresolved.items():
            for error in kept.recent:
                yield tool, error

    def unresolved(self) -> list[UnresolvedToolError]:
        """The errors of this run that stand, as plain records (the error text only when content may be captured)."""
        content = self.config.capture_content
        return [UnresolvedToolError(tool, _target_of(error), (error.error_text or None) if content else None,
                                    error.turn, error.call_id, error.failures)
                for tool, error in self.standing()]

    def uncounted(self) -> int:
        """Errors that still stand but were dropped from memory (beyond `max_errors_per_tool` of one tool)."""
        return sum(kept.total - len(kept.recent) for kept in self._unresolved.values())

    def container_sizes(self) -> dict[str, int]:
        return {
            "unresolved_error_tools": len(self._unresolved),
            "unresolved_errors": sum(len(e.recent) for e in self._unresolved.values()),
            "earlier_run_errors": len(self.earlier),
        }

    def observe(self, observed: ObservedCall, open_turn: OpenTurn) -> None:
        """A call came back: it may move on from, report or resolve standing errors, or be a new one."""
        turn = observed.turn
        if self._unresolved:
            self._note_later_call(observed, turn)
        self.calls_this_run += 1
        if self._batch is not None and self._batch.turn != turn:
            self._batch = None
        if not observed.is_error:
            if self._batch is not None:  # this turn already returned an error: its batch keeps this result too
                self._batch.add(observed)
            if self.earlier:
                self._resolve_earlier(observed)
            if self._unresolved:
                self._note_later_success(observed)
                self._resolve(observed)
            return
        errors = self._unresolved.get(observed.tool)
        if errors is None:
            if len(self._unresolved) >= self.config.max_tools_with_errors:
                del self._unresolved[next(iter(self._unresolved))]  # forget the oldest tool
            errors = _ToolErrors(deque(maxlen=self.config.max_errors_per_tool))
            self._unresolved[observed.tool] = errors
        same = next((e for e in errors.recent if e.key == observed.key), None)
        if same is not None:  # the same call failing again: one error, failed more than once
            errors.recent.remove(same)
            errors.recent.append(UnresolvedError(turn, observed.call_id, observed.arguments, observed.error_text,
                                                 observed.key, same.targets, same.failures + 1,
                                                 moved_on=same.moved_on, first_turn=same.first_turn))
            return
        errors.total += 1
        if self._batch is None:  # the turn's first error: its batch starts with the successes already returned
            self._batch = Batch(turn)
            for earlier in open_turn.calls:
                if not earlier.is_error:
                    self._batch.add(earlier)
        errors.recent.append(UnresolvedError(turn, observed.call_id, observed.arguments, observed.error_text,
                                             observed.key, call_targets(observed.raw_arguments), first_turn=turn,
                                             batch=self._batch))

    def _resolve(self, observed: ObservedCall) -> None:
        """A success resolves the errors of its tool that it repeats, or retries on the same target."""
        errors = self._unresolved.get(observed.tool)
        if errors is not None:
            targets = call_targets(observed.raw_arguments)
            kept = [e for e in errors.recent if not e.resolved_by(observed.key, targets)]
            errors.total -= len(errors.recent) - len(kept)
            errors.recent = deque(kept, maxlen=self.config.max_errors_per_tool)
            if not kept:
                del self._unresolved[observed.tool]

    def _resolve_earlier(self, observed: ObservedCall) -> None:
        targets = call_targets(observed.raw_arguments)
        kept = [(tool, e) for tool, e in self.earlier
                if tool != observed.tool or not e.resolved_by(observed.key, targets)]
        if len(kept) != len(self.earlier):
            self.earlier = deque(kept, maxlen=self.config.max_errors_per_tool)

    def _note_later_call(self, observed: ObservedCall, turn: int) -> None:
        for errors in self._unresolved.values():
            for error in errors.recent:
                if turn > error.turn and observed.key != error.key:
                    error.moved_on = True

    def _note_later_success(self, observed: ObservedCall) -> None:
        """A success of another tool after an error may report the failure: a hand-off or a ticket whose free text
        names what failed or quotes its error. (An id argument naming the same order is the next operation on it, and
        another call of the same tool is a retry: neither is a report.)"""
        text = None
        for errors in self._unresolved.values():
            for error in errors.recent:
                if not error.reported and errors is not self._unresolved.get(observed.tool):
                    if text is None:
                        text = FoldedText(free_text_in(observed.raw_arguments))
                    error.reported = names_or_quotes(text, error.targets, error.error_text)


def _target_of(error: UnresolvedError) -> str | None:
    """The targets of a failed call in the order of its canonical arguments (sorted keys), else sorted."""
    if not error.targets:
        return None
    try:
        arguments = json.loads(error.arguments)
    except (ValueError, RecursionError):  # cut for messages: no longer JSON
        arguments = None
    if isinstance(arguments, dict):
        ordered = [v for v in arguments.values() if isinstance(v, str) and normal_text(v) in error.targets]
        if ordered:
            return ", ".join(dict.fromkeys(normal_text(v) for v in ordered))
    return ", ".join(sorted(error.targets))


class ToolErrorFacts:
    """The ledger alone, without the rules: which tool errors of a run stand when it ends.

    For an agent whose detector is switched off: the facts are recorded all the same. Fed as a `LoopDetector` is
    (``observe(call)`` with a `ToolCall`); ``unresolved_errors()`` at the end of the run.
    """

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config if isinstance(config, DetectorConfig) else default_config()
        self._ledger = ErrorLedger(self.config)
        self._turn = OpenTurn()  # never filled: the batch an error came in is the rules' business

    def observe(self, call: Any) -> None:
        """A tool call came back (a `ToolCall`, or anything with its fields)."""
        if not self._ledger and not getattr(call, "is_error", False):
            return  # a success with no error standing changes nothing here: not even reduced
        turn = getattr(call, "turn", 0)
        self._ledger.observe(observe_call(call, turn if isinstance(turn, int) else 0, self.config, 0), self._turn)

    def unresolved_errors(self) -> list[UnresolvedToolError]:
        return self._ledger.unresolved()
