"""The tool errors ignored_error weighs: which of a run's failures still stand, and what happened after each.

An error stands until a later success of the same tool on the same target resolves it (for a command, later successes
that ran its operations again: `git commit`, `pytest`). Kept with it: how often the same call failed, the operation an
answer would claim done (`verbs.py`), and whether a later call of another tool reported it (a hand-off, a ticket). The
errors a run leaves standing are kept for the next runs of the session.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator

from .answers import FoldedText, free_text_in, names_or_quotes
from .calls import ObservedCall, observe_call
from .commands import command_of, operations
from .config import DetectorConfig, default_config
from .facts import UnresolvedToolError
from .identity import call_targets, normal_text
from .types import FedCall
from .verbs import OperationWords, operation_words

# Plain classes with slots rather than dataclasses, for start-up time: calls.py says why.


class UnresolvedError:
    """A failed call no later success has resolved."""

    __slots__ = ("arguments", "call_id", "error_text", "failures", "first_turn", "how_reported", "key", "operation",
                 "programs", "reported", "targets", "turn")

    def __init__(self, turn: int, call_id: str | None, arguments: str, error_text: str, key: str,
                 targets: frozenset[str], failures: int = 1, *, first_turn: int = 0,
                 operation: OperationWords | None = None, programs: frozenset[str] | None = None) -> None:
        self.turn = turn
        self.call_id = call_id
        self.arguments = arguments
        self.error_text = error_text
        self.key = key  # tool + canonical arguments
        self.targets = targets  # identifier-like argument values: what the call acted on
        self.failures = failures  # times this same call failed in the run without a success between
        self.reported = False  # a later successful call named its target or quoted its error (a ticket, a hand-off)
        self.how_reported: str | None = None  # set as the run ends: "answer", "model", "handed on" (the facts' word)
        self.first_turn = first_turn  # where this call first failed: anything the model said after that may report it
        self.operation = operation  # how an answer would state its operation done, if it names one (`verbs.py`)
        # For a command: the operations it ran (`git commit`, `pytest`) that no later success has run since; None
        # for a call that runs no command, or one whose code is inline (`python -c`): only the same call resolves it.
        self.programs = programs

    def resolved_by(self, success_key: str, success_targets: frozenset[str],
                    success_programs: frozenset[str] = frozenset()) -> bool:
        """A later success resolves the error when it is the same call, or the same operation retried on the same
        target with a minority of its arguments corrected: more than half of the failed call's targets unchanged.
        For a command, the target is its operation: later successes that between them ran every operation of the
        failed command (`git commit -m "fix"` failed, `git commit -m "fix: parser"` went through) resolve it."""
        if self.key == success_key:
            return True
        if self.programs is not None:
            self.programs -= success_programs
            return not self.programs
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
                                    error.turn, error.call_id, error.failures, error.how_reported)
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

    def observe(self, observed: ObservedCall) -> None:
        """A call came back: it may report or resolve standing errors, or be a new one."""
        turn = observed.turn
        self.calls_this_run += 1
        if not observed.is_error:
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
                                                 first_turn=same.first_turn, operation=same.operation,
                                                 programs=same.programs))
            return
        errors.total += 1
        errors.recent.append(UnresolvedError(turn, observed.call_id, observed.arguments, observed.error_text,
                                             observed.key, call_targets(observed.raw_arguments), first_turn=turn,
                                             operation=operation_words(observed.tool, observed.raw_arguments),
                                             programs=programs_of(observed.tool, observed.raw_arguments)))

    def _resolve(self, observed: ObservedCall) -> None:
        """A success resolves the errors of its tool that it repeats, or retries on the same target."""
        errors = self._unresolved.get(observed.tool)
        if errors is not None:
            targets = call_targets(observed.raw_arguments)
            programs = programs_of(observed.tool, observed.raw_arguments) or frozenset()
            kept = [e for e in errors.recent if not e.resolved_by(observed.key, targets, programs)]
            errors.total -= len(errors.recent) - len(kept)
            errors.recent = deque(kept, maxlen=self.config.max_errors_per_tool)
            if not kept:
                del self._unresolved[observed.tool]

    def _resolve_earlier(self, observed: ObservedCall) -> None:
        targets = call_targets(observed.raw_arguments)
        programs = programs_of(observed.tool, observed.raw_arguments) or frozenset()
        kept = [(tool, e) for tool, e in self.earlier
                if tool != observed.tool or not e.resolved_by(observed.key, targets, programs)]
        if len(kept) != len(self.earlier):
            self.earlier = deque(kept, maxlen=self.config.max_errors_per_tool)

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


def programs_of(tool: str, arguments: object) -> frozenset[str] | None:
    """The operations a command call runs (`git commit`, `pytest`), what a later success must run again to resolve
    its failure; None for a call that runs no command, runs none we can name, or runs inline code (`python -c`,
    `node -e`), which only the same call again resolves."""
    command = command_of(tool, arguments)
    if command is None:
        return None
    ran = operations(command)
    if not ran or any(operation.subcommand == "-c" for operation in ran):
        return None
    return frozenset(operation.name for operation in ran)


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

    def observe(self, call: FedCall) -> None:
        """A tool call came back (a `ToolCall`, or anything with its fields)."""
        if not self._ledger and not getattr(call, "is_error", False):
            return  # a success with no error standing changes nothing here: not even reduced
        turn = getattr(call, "turn", 0)
        self._ledger.observe(observe_call(call, turn if isinstance(turn, int) else 0, self.config, 0))

    def unresolved_errors(self) -> list[UnresolvedToolError]:
        return self._ledger.unresolved()
