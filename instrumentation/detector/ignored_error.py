"""ignored_error: a verdict on the tool errors a run leaves unresolved, with the evidence it rests on.

Judged once, at the end of a run with a stop reason in `ignored_error_stop_reasons`. Every unresolved error that
nothing the model said reports (names its target, quotes or echoes the error, asks the user) is weighed; the rule
fires on its own where the structure shows the failure was passed over, and says which evidence it found:
- the answer states the failed operation as done (a statement names the operation by the words of the tool's name,
  and nothing the model said after the failure reports it);
- the model retried, saw the same failure and moved on (the same call failed again, and the run ended without a word
  on it).
The other cases are the judge's, if one is configured ("a judge said so"). DESIGN.md has the full reasoning.
"""

from __future__ import annotations

import json
from collections import deque

from .answers import (
    ANSWER_SCAN_CHARS,
    FoldedText,
    answer_addresses,
    asks_about,
    draws_on,
    echoes_error,
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
from .types import IGNORED_ERROR, Anomaly, StreakStart

_MAX_SAID_TURNS = 32  # texts beside tool calls kept per run, the most recent
_MAX_SUCCEEDED_TOOLS = 256  # tools with a success this run, kept to tell whose operation a statement may be about
_MAX_SAID_CHARS = 2 * ANSWER_SCAN_CHARS  # of each text, the start kept

# The evidence a firing rests on (Anomaly.evidence), most telling first.
CLAIMED_DONE = "the answer states the failed operation as done"
# Only ever with a judge's "ignored": a retry shows the model saw the failure, not that its answer passed over it.
RETRIED_AND_MOVED_ON = "a judge said so: the model retried, saw the same failure and answered without naming it"
JUDGE_SAID_SO = "a judge said so"
EARLIER_RUN = ("a judge said so: an earlier run of this conversation left it standing, and this run called no tool "
               "and answered as if the work were done")

Ignored = list[tuple[str, UnresolvedError]]  # (tool, error), oldest first


class IgnoredErrorRule(Rule):
    """Keeps the run's errors (`ErrorLedger`), what the model said beside its calls and which tools succeeded; gives
    its verdict at the end."""

    def __init__(self, config: DetectorConfig, judging: Judging) -> None:
        self.config = config
        self._judging = judging
        self._errors = ErrorLedger(config)
        self._said: deque[tuple[int, str]] = deque(maxlen=_MAX_SAID_TURNS)  # what the model told the user, by turn
        self._succeeded: set[str] = set()  # tools that succeeded this run (on any target)
        self._ending_reasons = config.ending_reasons

    def begin_run(self) -> None:
        self._errors.begin_run()
        self._said.clear()
        self._succeeded.clear()

    def observe(self, call: ObservedCall, turn: OpenTurn) -> None:
        self._errors.observe(call, turn)
        if not call.is_error and len(self._succeeded) < _MAX_SUCCEEDED_TOOLS:
            self._succeeded.add(call.tool)

    def model_said(self, turn: int, text: str) -> None:
        self._said.append((turn, text if len(text) <= _MAX_SAID_CHARS else shorten(text, _MAX_SAID_CHARS)))

    def container_sizes(self) -> dict[str, int]:
        return {**self._errors.container_sizes(), "succeeded_tools": len(self._succeeded)}

    def end_run(self, end: RunEnd) -> list[Anomaly]:
        if end.stop_reason not in self._ending_reasons:
            return []  # max_tokens, refusal, limits: already failures with their own status
        if self._errors:
            return self._judge_run(end)
        if self._errors.earlier and not self._errors.calls_this_run:
            return self._judge_earlier_errors(end)
        return []

    def _judge_run(self, end: RunEnd) -> list[Anomaly]:
        """Sorts every standing error by the evidence against it, then fires on the strongest (a judge, if any, may
        still say "not ignored"), or leaves the unevidenced ones to the judge."""
        text = end.final_text
        answer = FoldedText(fold(_scanned(text))) if text else None
        said = [(turn, FoldedText(fold(words))) for turn, words in self._said]
        claimed: Ignored = []
        unexplained: Ignored = []
        for tool, error in self._errors.standing():
            if error.reported:
                continue  # a later call of another tool handed it on (a ticket, a hand-off)
            if self._claims_done(tool, error, text, answer, said):
                claimed.append((tool, error))
            elif not self._reports(tool, error, text, answer, said):
                # Nothing said about it: a stop notice, an empty answer, an admission in the model's own words, or a
                # "done" that never names the operation. Structure cannot tell these apart; the judge can.
                unexplained.append((tool, error))
        if claimed:
            claimed.sort(key=lambda item: item[1].turn)
            ignored = unexplained + claimed  # the evidenced ones last: the judge is shown the most recent of them
            anomaly = self._anomaly(end, ignored, CLAIMED_DONE)
            return [anomaly] if self._judge_says(anomaly, ignored, text) is not False else []
        if unexplained:
            evidence = RETRIED_AND_MOVED_ON if any(_retried(e) for _, e in unexplained) else JUDGE_SAID_SO
            anomaly = self._anomaly(end, unexplained, evidence)
            return [anomaly] if self._judge_says(anomaly, unexplained, text) is True else []
        return []

    def _judge_earlier_errors(self, end: RunEnd) -> list[Anomaly]:
        """A run that called no tool and answered while a failure of an earlier run of the session stands: the user
        may have said "go ahead" and the model answered "done" without doing anything. Words alone cannot tell that
        from a polite goodbye, so only the judge decides, once per such run; without a judge nothing fires."""
        text = end.final_text
        if not text:
            return []
        # A question does not exempt the answer here: "Is there anything else?" closes a false "done" as often as not.
        answer = FoldedText(fold(_scanned(text)))
        standing = [(tool, e) for tool, e in self._errors.earlier
                    if not names_or_quotes(answer, e.targets, e.error_text)]
        if not standing:
            return []
        anomaly = self._anomaly(end, standing, EARLIER_RUN)
        return [anomaly] if self._judge_says(anomaly, standing, text) is True else []

    def _claims_done(self, tool: str, error: UnresolvedError, text: str | None, answer: FoldedText | None,
                     said: list[tuple[int, FoldedText]]) -> bool:
        """Whether the answer states the failed operation as done, after the model had seen the failure.

        One of its statements (a sentence without a question mark) names the operation by the words of the tool's
        name without echoing the error, and nothing the model said after the call last failed names its target or
        quotes its error; and the model had seen the failure before it answered, in one of two ways:
        - the failure came back beside other results and the answer draws on them (`draws_on`): here a question
          elsewhere in the answer does not count, since asking about the next step does not undo a statement that
          the failed step was done;
        - it retried the call, or went on to other calls, and the answer asks the user nothing.
        A failure right before an answer that asks nothing and is not built on results beside it is left to the
        judge: on the recorded runs such answers were plans or admissions in the model's own words.

        A tool that also succeeded in the run (on another target: one of several candidate ids, another file) is
        left out: the statement may be about that success. Text written before the last failure does not count: a
        report of an earlier attempt is not a report of how the retries ended."""
        if text is None or answer is None or tool in self._succeeded:
            return False
        if asks_about(text, tool, error.targets):
            return False  # asking about the operation hands the decision back: it presents nothing as done
        # A sentence that repeats a word the error used, beyond the operation's own words (the tool's name and its
        # arguments' names), says how the operation went ("the tests still fail"), even when that word is also one
        # of the values the call sent (`run_tests(only="failed")`).
        if not states_operation(text, tool, error.error_text, f"{tool} {_argument_names(error.arguments)}"):
            return False
        after = [answer, *(folded for turn, folded in said if turn > error.turn)]
        if any(names_or_quotes(folded, error.targets, error.error_text) for folded in after):
            return False
        if error.batch is not None and draws_on(text, [result for _, result in error.batch.results]):
            return True  # a question about the next step does not undo a statement that this one was done
        return (_retried(error) or error.moved_on) and not _asks(answer)

    def _reports(self, tool: str, error: UnresolvedError, text: str | None, answer: FoldedText | None,
                 said: list[tuple[int, FoldedText]]) -> bool:
        """Whether anything the model said after it first saw the failure (the final answer, or text beside later
        tool calls) deals with it: asks the user, names the target, quotes the error or echoes its words."""
        if answer is not None and (answer_addresses(text, error.targets) or self._names_or_echoes(tool, error, answer)):
            return True
        return any(turn > error.first_turn and (_asks(folded) or self._names_or_echoes(tool, error, folded))
                   for turn, folded in said)

    @staticmethod
    def _names_or_echoes(tool: str, error: UnresolvedError, text: FoldedText) -> bool:
        return (names_or_quotes(text, error.targets, error.error_text)
                or echoes_error(text, error.error_text, f"{tool} {error.arguments}"))

    def _judge_says(self, anomaly: Anomaly, ignored: Ignored, text: str | None) -> bool | None:
        """The judge's verdict on the ignored errors, each asked about apart, the most recent first, within the run's
        cap on judge calls (`Judging.verdicts`): True when it says one was ignored, False when it says none was, None
        without a judge, over the cap, or without a usable answer (Judging counts the questions left unjudged)."""
        return self._judging.verdicts([JudgeRequest(anomaly=anomaly, tool=tool, arguments=error.arguments,
                                                    error_text=error.error_text, final_text=text or "")
                                       for tool, error in reversed(ignored)])

    def _anomaly(self, end: RunEnd, ignored: Ignored, evidence: str) -> Anomaly:
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
                     f"on the same target, and nothing the model said reports them "
                     f"({'the most recent: ' if total > len(ignored[-5:]) else ''}{listed}). Why this fired: "
                     f"{evidence}. Tell the user what failed, or retry until it succeeds before finishing."),
            streak=f"ignored_error@t{end.turn}",
            evidence=evidence,
            # from the first failure the answer passed over (an earlier run's: this run's answer only)
            streak_start=StreakStart(end.turn if evidence == EARLIER_RUN else min(e.first_turn for _, e in ignored)),
        )


def _scanned(text: str) -> str:
    """The part of an answer that is read: all of it, or both ends of a huge one."""
    if len(text) > 2 * ANSWER_SCAN_CHARS:
        return text[:ANSWER_SCAN_CHARS] + "\n" + text[-ANSWER_SCAN_CHARS:]
    return text


def _argument_names(arguments: str) -> str:
    """The names of a call's top-level arguments (its canonical JSON), as words: they describe the operation, as the
    tool's name does."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):  # cut for messages, or not an object
        return ""
    return " ".join(str(name) for name in parsed) if isinstance(parsed, dict) else ""


def _retried(error: UnresolvedError) -> bool:
    """Whether the same call failed again in a later turn: the model had seen the failure when it retried (the same
    call twice in one parallel batch is not a retry)."""
    return error.turn > error.first_turn


def _asks(text: FoldedText) -> bool:
    return answer_addresses(text.folded, frozenset())
