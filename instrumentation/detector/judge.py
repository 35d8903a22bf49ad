"""The judge: an optional second opinion on ignored_error, what it is shown, and how its verdicts are taken."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .identity import safe_text, shorten
from .types import Anomaly


@dataclass(frozen=True, slots=True)
class JudgeRequest:
    """What a judge is shown: the rule's finding, the failed call and the final answer."""

    anomaly: Anomaly
    tool: str
    arguments: str  # canonical arguments of the most recent ignored error
    error_text: str  # its start
    final_text: str


Judge = Callable[[JudgeRequest], bool | None]
"""True: the answer ignored the failure; False: it did not; None: no opinion."""


class Judging:
    """Asks the configured judge, if any, and keeps count of its failures and of the findings it silenced.

    A judge that raises or answers something other than a bool gives no verdict, so the rule's own stands; a failure
    is passed to `on_failure` (the detector keeps it as its last internal error).
    """

    def __init__(self, judge: object, on_failure: Callable[[str], None]) -> None:
        self._judge: Judge | None = judge if callable(judge) else None
        self._on_failure = on_failure
        self.failures = 0
        self.silenced = 0

    @property
    def available(self) -> bool:
        """Whether a judge is configured (a model name the agent did not turn into a callable is none)."""
        return self._judge is not None

    def verdict(self, request: JudgeRequest) -> bool | None:
        """The judge's verdict: True ignored, False not ignored, None no judge or no usable answer."""
        if self._judge is None:
            return None
        try:
            verdict = self._judge(request)
        except Exception as exc:  # a judge is a model call: it may time out or fail, and must not stop the detector
            self.failures += 1
            self._on_failure(shorten(f"judge: {type(exc).__name__}: {safe_text(exc)}", 300))
            return None
        if verdict is False:
            self.silenced += 1
        return verdict if isinstance(verdict, bool) else None
