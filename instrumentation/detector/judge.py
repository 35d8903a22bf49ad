"""The judge: an optional second opinion on ignored_error, what it is shown, and how its verdicts are taken.

`Judging` is the one place a judge is asked. It holds the per-run cap on judge calls (`DetectorConfig.judge_max_calls`):
a question over the cap is not put, and neither is one when no judge is configured; both are counted, so that a run
can say how many of its errors were left unjudged and why. It also adds up what the judge's answers cost
(`JudgeVerdict`), which is shown beside the run's cost and never charged to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .identity import safe_text, shorten
from .types import Anomaly

DEFAULT_JUDGE_MAX_CALLS = 3  # per run: a judge is a model call, and a run with many failures must not fan out


@dataclass(frozen=True, slots=True)
class JudgeRequest:
    """What a judge is shown: the rule's finding, the failed call and the final answer."""

    anomaly: Anomaly
    tool: str
    arguments: str  # canonical arguments of the most recent ignored error
    error_text: str  # its start
    final_text: str


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    """A judge's answer with what asking cost: what a model judge returns (a plain bool or None will do for others).

    ``ignored``: True the answer ignored the failure, False it did not, None no opinion. ``cost_usd`` is None when the
    judge's model has no price."""

    ignored: bool | None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0


Judge = Callable[[JudgeRequest], "bool | JudgeVerdict | None"]
"""True: the answer ignored the failure; False: it did not; None: no opinion (or a JudgeVerdict saying so)."""


@dataclass(frozen=True, slots=True)
class JudgeSummary:
    """What the judge did in one run: the calls made (failed ones included), their tokens and cost, and the questions
    left unasked, because no judge is configured or because the run's cap was reached."""

    configured: bool = False
    max_calls: int = DEFAULT_JUDGE_MAX_CALLS
    calls: int = 0
    failures: int = 0  # calls that raised (timed out, HTTP error): the rule's own verdict stood
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0  # None: some call's cost is unknown (its model has no price)
    unjudged_no_judge: int = 0
    unjudged_over_cap: int = 0

    @property
    def unjudged(self) -> int:
        """Errors the judge would have been asked about and was not."""
        return self.unjudged_no_judge + self.unjudged_over_cap

    def to_dict(self) -> dict[str, object]:
        return {"configured": self.configured, "max_calls": self.max_calls, "calls": self.calls,
                "failures": self.failures, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost_usd": self.cost_usd, "unjudged": self.unjudged, "unjudged_no_judge": self.unjudged_no_judge,
                "unjudged_over_cap": self.unjudged_over_cap}


class Judging:
    """Asks the configured judge, if any, within the per-run cap, and keeps count of what it did.

    A judge that raises or answers something other than a bool gives no verdict, so the rule's own stands; a failure
    is passed to `on_failure` (the detector keeps it as its last internal error). `begin_run` starts a run's counts
    (and its cap) afresh; `failures` and `silenced` count over the detector's whole life, as before.
    """

    def __init__(self, judge: object, on_failure: Callable[[str], None],
                 max_calls: int = DEFAULT_JUDGE_MAX_CALLS) -> None:
        self._judge: Callable[[JudgeRequest], object] | None = judge if callable(judge) else None
        self._on_failure = on_failure
        self.max_calls = max_calls
        self.failures = 0
        self.silenced = 0
        self._run = _RunTally()

    @property
    def available(self) -> bool:
        """Whether a judge is configured (a model name the agent did not turn into a callable is none)."""
        return self._judge is not None

    def begin_run(self) -> None:
        """A new run: its calls, cost and unjudged questions are counted from zero, and its cap is full again."""
        self._run = _RunTally()

    def summary(self) -> JudgeSummary:
        """What the judge did in the current (or last) run."""
        tally = self._run
        return JudgeSummary(configured=self.available, max_calls=self.max_calls, calls=tally.calls,
                            failures=tally.failures, input_tokens=tally.input_tokens,
                            output_tokens=tally.output_tokens, cost_usd=tally.cost_usd,
                            unjudged_no_judge=tally.no_judge, unjudged_over_cap=tally.over_cap)

    def verdicts(self, requests: list[JudgeRequest]) -> bool | None:
        """The judge's verdict on several errors of one answer, asked in order until one is said to be ignored:
        True if one was, False if every one was asked and none was, else None (no judge, the cap reached before all
        were asked, or an answer with no opinion). The questions not asked are counted as left unjudged."""
        if self._judge is None:
            self._run.no_judge += len(requests)
            return None
        undecided = False
        for position, request in enumerate(requests):
            if self._run.calls >= self.max_calls:
                self._run.over_cap += len(requests) - position
                return None
            verdict = self._ask(self._judge, request)
            if verdict is True:
                return True
            undecided = undecided or verdict is None
        if undecided or not requests:
            return None
        self.silenced += 1
        return False

    def verdict(self, request: JudgeRequest) -> bool | None:
        """The judge's verdict on one error: True ignored, False not ignored, None no judge, the cap reached or no
        usable answer."""
        return self.verdicts([request])

    def _ask(self, judge: Callable[[JudgeRequest], object], request: JudgeRequest) -> bool | None:
        """One judge call, counted against the cap; a judge that raises gives no verdict."""
        tally = self._run
        tally.calls += 1
        try:
            answer = judge(request)
        except Exception as exc:  # a judge is a model call: it may time out or fail, and must not stop the detector
            self.failures += 1
            tally.failures += 1
            self._on_failure(shorten(f"judge: {type(exc).__name__}: {safe_text(exc)}", 300))
            return None
        return tally.add(answer)


class _RunTally:
    """One run's judge calls and what they cost."""

    __slots__ = ("calls", "cost_usd", "failures", "input_tokens", "no_judge", "output_tokens", "over_cap")

    def __init__(self) -> None:
        self.calls = self.failures = self.input_tokens = self.output_tokens = self.no_judge = self.over_cap = 0
        self.cost_usd: float | None = 0.0

    def add(self, answer: object) -> bool | None:
        """Count an answer's tokens and cost; returns its verdict (None unless a bool)."""
        if isinstance(answer, JudgeVerdict):
            self.input_tokens += _count(answer.input_tokens)
            self.output_tokens += _count(answer.output_tokens)
            cost = answer.cost_usd
            if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0:
                self.cost_usd = None if self.cost_usd is None else self.cost_usd + float(cost)
            else:  # one call of unknown cost makes the total unknown, as the run's own cost is without a price
                self.cost_usd = None
            answer = answer.ignored
        return answer if isinstance(answer, bool) else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
