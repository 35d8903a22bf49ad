"""The detector's thresholds, bounds and options (`DetectorConfig`), checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .judge import DEFAULT_JUDGE_MAX_CALLS, Judge


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds of the four rules, bounds of the detector's memory, and what its anomalies may quote."""

    repeat_threshold: int = 3
    cycle_min_period: int = 2
    cycle_max_period: int = 5
    cycle_repeats: int = 3
    failing_tool_threshold: int = 5  # 0 turns the rule off
    ignored_error_stop_reasons: tuple[str, ...] = ("end_turn", "stop")
    text_repeat_turns: int = 3  # repeated_text: the same paragraph in this many consecutive turns (0 turns it off)
    sentence_repeats: int = 5  # repeated_text: one sentence this many times in one response (0 turns it off)
    assume_unknown_results_unchanged: bool = True
    max_calls_per_turn: int = 128  # further calls in one turn only count towards its signature
    max_tools_with_errors: int = 64  # unresolved errors are tracked for at most this many tools
    max_errors_per_tool: int = 5  # ... and this many errors each (the most recent)
    max_call_ids: int = 20  # call ids kept per streak and reported per anomaly
    max_argument_chars: int = 500  # canonical arguments longer than this are cut in anomalies
    max_kept_anomalies: int = 1000  # `LoopDetector.anomalies` keeps the most recent streaks
    repeat_window: int = 10  # turns in which 3 identical failing calls are a repeated_call, other calls between
    capture_content: bool = True  # False: messages name tools and counts only, never arguments or error text
    # Confirms an ignored_error before it is reported: a callable taking a JudgeRequest and returning True (ignored),
    # False (not ignored) or None (no opinion). A str is a model name the agent turns into such a callable.
    judge: Judge | str | None = field(default=None, compare=False)
    # Judge calls per run at most; the questions over it are not asked (counted as left unjudged). None: the
    # settings' LOOPTRACE_JUDGE_MAX_CALLS when an Agent builds the detector, else DEFAULT_JUDGE_MAX_CALLS.
    judge_max_calls: int | None = None

    @property
    def judge_cap(self) -> int:
        """The per-run cap on judge calls in force."""
        return DEFAULT_JUDGE_MAX_CALLS if self.judge_max_calls is None else self.judge_max_calls

    # Worked out once per config, not once per detector: watch and detect make a detector for every run they judge.
    # (cached_property writes the instance's __dict__ directly, which a frozen dataclass allows.)
    @cached_property
    def ending_reasons(self) -> frozenset[str]:
        """`ignored_error_stop_reasons` in lower case: the stop reasons at which ignored_error gives its verdict."""
        return frozenset(reason.lower() for reason in self.ignored_error_stop_reasons)

    @cached_property
    def cycle_window(self) -> int:
        """The turn signatures cycle keeps: enough for the longest period repeated, and two more than that period (the
        turn a period back, and the one before it, whose signature then leaves the rule's index)."""
        return max(self.cycle_max_period * self.cycle_repeats, self.cycle_max_period + 2)

    def __post_init__(self) -> None:
        # 1: not even one identical call in a row (the second is reported before it runs: LoopDetector.before_calls)
        _require(self.repeat_threshold >= 1, "repeat_threshold must be at least 1")
        _require(
            2 <= self.cycle_min_period <= self.cycle_max_period,
            "need 2 <= cycle_min_period <= cycle_max_period (period 1 is repeated_call's job)",
        )
        _require(self.cycle_repeats >= 2, "cycle_repeats must be at least 2")
        _require(self.failing_tool_threshold >= 0, "failing_tool_threshold must be >= 0 (0 = off)")
        _require(self.text_repeat_turns == 0 or self.text_repeat_turns >= 2,
                 "text_repeat_turns must be 0 (off) or at least 2 (one turn repeats nothing)")
        _require(self.sentence_repeats == 0 or self.sentence_repeats >= 2,
                 "sentence_repeats must be 0 (off) or at least 2 (one sentence once repeats nothing)")
        for name in ("max_calls_per_turn", "max_tools_with_errors", "max_errors_per_tool",
                     "max_call_ids", "max_argument_chars", "max_kept_anomalies", "repeat_window"):
            _require(getattr(self, name) >= 1, f"{name} must be at least 1")
        _require(self.judge_max_calls is None or self.judge_max_calls >= 1, "judge_max_calls must be at least 1")


_DEFAULT: DetectorConfig | None = None


def default_config() -> DetectorConfig:
    """The default config, validated once and shared: it is frozen, so every detector made without one can use it."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = DetectorConfig()
    return _DEFAULT


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"DetectorConfig: {message}")
