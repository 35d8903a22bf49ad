"""ignored_error: a run that ends presenting its work as done while a tool error was never resolved nor dealt with.

Judged once, at the end of a run with a stop reason in `ignored_error_stop_reasons`. The rule fires on its own only
where the structure shows the failure was passed over (it persisted after a retry, or the answer stated the failed
operation as done while using the results beside it); the other cases are the judge's, if one is configured.
DESIGN.md has the full reasoning.
"""

from __future__ import annotations

from collections import deque

from .answers import (
    ANSWER_SCAN_CHARS,
    FoldedText,
    answer_addresses,
    draws_on,
    fold,
    names_or_quotes,
    states_operation,
)
from .calls import ObservedCall
from .config import DetectorConfig
from .errors import ErrorLedger, UnresolvedError
from .identity import shorten
from .judge import JudgeRequest, Judging
from .rule import OpenTurn, Rule, RunEnd
from .types import IGNORED_ERROR, Anomaly

_MAX_SAID_TURNS = 32  # texts beside tool calls kept per run, the most recent
_NEITHER = "a final answer that neither names what failed nor asks the user"
_PASSED_OVER = ("a final answer that states the failed operation as done while using the results that came back "
                "beside it")
_EARLIER_RUN = ("an earlier run of this conversation left it standing; this run called no tool and its answer presents "
                "the work as done (the judge's verdict)")

Ignored = list[tuple[str, UnresolvedError]]  # (tool, error), oldest first


class IgnoredErrorRule(Rule):
    """Keeps the run's errors (`ErrorLedger`) and what the model said beside its calls; gives its verdict at the end."""

    def __init__(self, config: DetectorConfig, judging: Judging) -> None:
        self.config = config
        self._judging = judging
        self._errors = ErrorLedger(config)
        self._said: deque[tuple[int, str]] = deque(maxlen=_MAX_SAID_TURNS)  # what the model told the user, by turn
        self._ending_reasons = {r.lower() for r in config.ignored_error_stop_reasons}

    def begin_run(self) -> None:
        self._errors.begin_run()
        self._said.clear()

    def observe(self, call: ObservedCall, turn: OpenTurn) -> None:
        self._errors.observe(call, turn)

    def model_said(self, turn: int, text: str) -> None:
        self._said.append((turn, shorten(text, 2 * ANSWER_SCAN_CHARS)))

    def container_sizes(self) -> dict[str, int]:
        return self._errors.container_sizes()

    def end_run(self, end: RunEnd) -> list[Anomaly]:
        if end.stop_reason not in self._ending_reasons:
            return []  # max_tokens, refusal, limits: already failures with their own status
        if self._errors:
            return self._judge_run(end)
        if self._errors.earlier and not self._errors.calls_this_run:
            return self._judge_earlier_errors(end)
        return []

    def _judge_run(self, end: RunEnd) -> list[Anomaly]:
        text = end.final_text
        standing = [(tool, e) for tool, e in self._errors.standing() if not e.reported]
        ignored = [(tool, e) for tool, e in standing if not self._addressed(e, text)]
        # The rule's own verdict needs a failure the model knew about and then left behind: it retried the call, saw
        # it fail again, and went on to other calls. Any other unaddressed failure (above all a single one seen just
        # before the answer, which the answer is most likely about) is for a judge to decide.
        persistent = [(tool, e) for tool, e in ignored if e.failures > 1 and e.moved_on]
        passed_over = [(tool, e) for tool, e in standing if self._passed_over(tool, e, text)]
        if persistent or passed_over:
            why = _NEITHER
            if passed_over and not persistent:
                ignored = passed_over + [item for item in ignored if item not in passed_over]
                why = _PASSED_OVER
            anomaly = self._anomaly(end, ignored, why)
            return [anomaly] if self._judge_says(anomaly, ignored, text) is not False else []
        if ignored:
            anomaly = self._anomaly(end, ignored, _NEITHER)
            return [anomaly] if self._judge_says(anomaly, ignored, text) is True else []
        return []

    def _judge_earlier_errors(self, end: RunEnd) -> list[Anomaly]:
        """A run that called no tool and answered while a failure of an earlier run of the session stands: the user
        may have said "go ahead" and the model answered "done" without doing anything. Words alone cannot tell that
        from a polite goodbye, so only the judge decides, once per such run; without a judge nothing fires."""
        text = end.final_text
        if not text:
            return []
        # A question does not exempt the answer here: "Is there anything else?" closes a false "done" as often as not.
        answer = FoldedText(fold(text[:2 * ANSWER_SCAN_CHARS]))
        standing = [(tool, e) for tool, e in self._errors.earlier
                    if not names_or_quotes(answer, e.targets, e.error_text)]
        if not standing:
            return []
        anomaly = self._anomaly(end, standing, _EARLIER_RUN)
        return [anomaly] if self._judge_says(anomaly, standing, text) is True else []

    def _passed_over(self, tool: str, error: UnresolvedError, final_text: str | None) -> bool:
        """Whether the answer used the results that came back beside the failure and stated the failed operation as
        done: it draws on another tool's result of the same batch, one of its statements names the operation, and
        nothing the model said after the failure quotes the error or names what the call acted on.

        A batch where the same tool also succeeded (on another target: one of several candidate ids) is left out:
        the operation did succeed there, and a statement naming it may be about that success."""
        if not final_text or error.batch is None:
            return False
        if any(other == tool for other, _ in error.batch.results):
            return False
        beside = [text for _, text in error.batch.results]
        if not beside or not states_operation(final_text, tool) or not draws_on(final_text, beside):
            return False
        said = [text for turn, text in self._said if turn > error.first_turn]
        return not any(names_or_quotes(FoldedText(fold(text)), error.targets, error.error_text)
                       for text in [final_text, *said])

    def _addressed(self, error: UnresolvedError, final_text: str | None) -> bool:
        """Whether anything the model said after seeing the failure (the final answer, or text beside later tool
        calls) deals with it."""
        if answer_addresses(final_text, error.targets, error.error_text):
            return True
        return any(turn > error.first_turn and answer_addresses(said, error.targets, error.error_text)
                   for turn, said in self._said)

    def _judge_says(self, anomaly: Anomaly, ignored: Ignored, text: str | None) -> bool | None:
        """The judge's verdict on the ignored errors, each asked about apart, the most recent first, within the run's
        cap on judge calls (`Judging.verdicts`): True when it says one was ignored, False when it says none was, None
        without a judge, over the cap, or without a usable answer (Judging counts the questions left unjudged)."""
        return self._judging.verdicts([JudgeRequest(anomaly=anomaly, tool=tool, arguments=error.arguments,
                                                    error_text=error.error_text, final_text=text or "")
                                       for tool, error in reversed(ignored)])

    def _anomaly(self, end: RunEnd, ignored: Ignored, why: str) -> Anomaly:
        total = len(ignored) + self._errors.uncounted()
        tools = {tool for tool, _ in ignored}
        content = self.config.capture_content
        if content:
            listed = "; ".join(
                f"{tool}({e.arguments}) at turn {e.turn}" + (f": {e.error_text!r}" if e.error_text else "")
                for tool, e in ignored[-5:])
        else:
            listed = "; ".join(f"{tool} at turn {e.turn}" for tool, e in ignored[-5:])
        last_tool, last_error = ignored[-1]
        return Anomaly(
            type=IGNORED_ERROR,
            turn=end.turn,
            tool=last_tool if len(tools) == 1 else None,
            arguments=last_error.arguments if total == 1 and content else None,
            call_ids=tuple(e.call_id for _, e in ignored if e.call_id is not None)[-self.config.max_call_ids:],
            count=total,
            message=(f"The run ended ({end.stop_reason}) with {total} tool error(s) never resolved by a later success "
                     f"on the same target, and {why} "
                     f"({'the most recent: ' if total > len(ignored[-5:]) else ''}{listed}). Tell the user what "
                     "failed, or retry until it succeeds before finishing."),
            streak=f"ignored_error@t{end.turn}",
        )
