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
    echoes_error,
    fold,
    names_or_quotes,
)
from .calls import ObservedCall
from .claims import admits, claiming_sentences
from .config import DetectorConfig
from .errors import ErrorLedger, UnresolvedError
from .identity import shorten
from .judge import JudgeRequest, Judging
from .rule import OpenTurn, Rule, RunEnd
from .types import IGNORED_ERROR, Anomaly, StreakStart
from .verbs import success_keys

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

# How a standing error was reported (`UnresolvedToolError.reported`).
IN_THE_ANSWER = "answer"
BY_THE_MODEL = "model"
HANDED_ON = "handed on"


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
        self._passed_over: list[UnresolvedError] = []  # the errors the run's ignored_error found passed over

    def begin_run(self) -> None:
        self._errors.begin_run()
        self._said.clear()
        self._succeeded.clear()

    def observe(self, call: ObservedCall, turn: OpenTurn) -> None:
        self._errors.observe(call)
        if not call.is_error and len(self._succeeded) < _MAX_SUCCEEDED_TOOLS:
            # By tool, and by what it did: a command's operation ("family:test" for any test runner), so that a
            # statement that may be about that success is not taken for a failed call of the same operation.
            self._succeeded.update(success_keys(call.tool, call.raw_arguments))

    def model_said(self, turn: int, text: str) -> None:
        self._said.append((turn, text if len(text) <= _MAX_SAID_CHARS else shorten(text, _MAX_SAID_CHARS)))

    def container_sizes(self) -> dict[str, int]:
        return {**self._errors.container_sizes(), "succeeded_tools": len(self._succeeded)}

    def end_run(self, end: RunEnd) -> list[Anomaly]:
        self._passed_over = []
        fired = self._verdict(end)
        if self._errors:
            self._note_reports(end.final_text, {id(e) for e in self._passed_over})
        return fired

    def _verdict(self, end: RunEnd) -> list[Anomaly]:
        if end.stop_reason not in self._ending_reasons:
            return []  # max_tokens, refusal, limits: already failures with their own status
        if self._errors:
            return self._judge_run(end)
        if self._errors.earlier and not self._errors.calls_this_run:
            return self._judge_earlier_errors(end)
        return []

    def _note_reports(self, text: str | None, passed_over: set[int]) -> None:
        """How each standing error was reported, for the run's facts (`UnresolvedToolError.reported`): in the final
        answer, by the model beside a later call, or handed on by a later call of another tool; None for one that
        nothing addressed, and for every error of a run whose answer the rule found passing over them."""
        answer = FoldedText(fold(_scanned(text))) if text else None
        said = [(turn, words, FoldedText(fold(words))) for turn, words in self._said]
        for tool, error in self._errors.standing():
            if id(error) in passed_over:
                error.how_reported = None
            elif error.reported:
                error.how_reported = HANDED_ON
            elif answer is not None and self._states_failure(tool, error, text or "", answer):
                error.how_reported = IN_THE_ANSWER
            elif any(turn > error.first_turn and self._states_failure(tool, error, words, folded)
                     for turn, words, folded in said):
                error.how_reported = BY_THE_MODEL

    def _states_failure(self, tool: str, error: UnresolvedError, text: str, folded: FoldedText) -> bool:
        """Whether a text tells of the failure: names its target, quotes or echoes its error, or admits it."""
        return (self._names_or_echoes(tool, error, folded)
                or (error.operation is not None and admits(_scanned(text), error.operation)))

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
            return self._fired(anomaly, ignored) if self._judge_says(anomaly, ignored, text) is not False else []
        if unexplained:
            evidence = RETRIED_AND_MOVED_ON if any(_retried(e) for _, e in unexplained) else JUDGE_SAID_SO
            anomaly = self._anomaly(end, unexplained, evidence)
            return self._fired(anomaly, unexplained) if self._judge_says(anomaly, unexplained, text) is True else []
        return []

    def _fired(self, anomaly: Anomaly, ignored: Ignored) -> list[Anomaly]:
        self._passed_over = [error for _, error in ignored]
        return [anomaly]

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
        """Whether the answer states the failed operation as done (`claims.py`): one of its statements says the
        operation was done, in the past or perfect tense or as a state ("committed", "booked", "deployed", "all tests
        pass", "the suite is green"), with no negation, no modal or future, no condition; and nothing the model said
        after the failure admits it (a word of failure, a negation beside the operation), names its target, quotes
        its error or echoes its words beyond the operation's own, and no question of the answer asks about it.

        After a single failure as after a retry: a plan ("I will commit"), an admission ("I wasn't able to commit"),
        a question or a stop notice never claims. A call whose operation also succeeded in the run (on another
        target, another command of the same family) is left out: the statement may be about that success."""
        operation = error.operation
        if text is None or answer is None or operation is None:
            return False
        if not operation.keys.isdisjoint(self._succeeded):
            return False
        scanned = _scanned(text)
        claims = claiming_sentences(scanned, operation)
        if not claims or asks_about(text, tool, error.targets):
            return False
        later = [(turn, words) for turn, words in self._said if turn > error.turn]
        if admits(scanned, operation) or any(admits(words, operation) for _, words in later):
            return False
        after = [answer, *(folded for turn, folded in said if turn > error.turn)]
        if any(names_or_quotes(folded, error.targets, error.error_text) for folded in after):
            return False
        # A statement that repeats a word only the error used says how the operation went ("the tests still fail"
        # after "FAILED ..."); the operation's own words ("tests" after a failed `pytest tests/`) do not count.
        attempted = " ".join((tool, error.arguments, *operation.words, *operation.done))
        return any(not echoes_error(FoldedText(fold(claim)), error.error_text, attempted) for claim in claims)

    def _reports(self, tool: str, error: UnresolvedError, text: str | None, answer: FoldedText | None,
                 said: list[tuple[int, FoldedText]]) -> bool:
        """Whether anything the model said after it first saw the failure (the final answer, or text beside later
        tool calls) deals with it: asks the user, names the target, quotes the error or echoes its words."""
        if answer is not None and (answer_addresses(text, error.targets)
                                   or self._states_failure(tool, error, text or "", answer)):
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
