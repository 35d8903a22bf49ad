"""The hard stops a model cannot talk its way past, and the running budget that enforces them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from looptrace.runtime.result import RunStatus, Usage


@dataclass(frozen=True, slots=True)
class Limits:
    """Stops for one run. ``None`` switches a limit off; every limit crossed ends the run with its own status.

    Token and cost budgets are checked after each response, as the model can only be stopped between calls. Each
    request's ``max_tokens`` is lowered to what the budgets leave, so a response cannot run past them by its output:
    the run overshoots a budget by at most the input of its last request (whose size is known only once it is sent).
    """

    max_turns: int | None = 10  # model calls, the OpenAI Agents SDK's default
    max_total_tokens: int | None = None  # input + output + cache read + cache creation, summed over the run
    max_cost_usd: float | None = None
    timeout_s: float | None = None  # wall clock for the whole run, while it runs (not while it waits for a person)
    tool_timeout_s: float | None = 60.0  # per tool call
    # What one loop may burn: a run whose current loop (an anomaly's streak, from its first repeated turn) has cost
    # more than this stops at that turn with status loop_budget, whatever the anomaly policy says. Checked each time
    # the loop's anomaly fires (every turn of a repeated call or failing tool, every round of a cycle).
    max_loop_cost_usd: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_total_tokens", "max_cost_usd", "timeout_s", "tool_timeout_s",
                     "max_loop_cost_usd"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"Limits.{name} must be positive or None, got {value!r}")


class Budget:
    """What a run has used so far, measured against its Limits."""

    def __init__(self, limits: Limits, *, clock=time.monotonic, running_s: float = 0.0) -> None:
        """``running_s``: the time a resumed run already ran before its pause, which its timeout counts on from."""
        self.limits = limits
        self.usage = Usage()
        self.cost_usd: float | None = 0.0
        self.turns = 0
        self._clock = clock
        self._started = clock() - running_s
        self._deadline = None if limits.timeout_s is None else self._started + limits.timeout_s

    def exclude(self, seconds: float) -> None:
        """Time the run spent waiting (for a person's decision), not running: its clock does not count it."""
        self._started += seconds
        if self._deadline is not None:
            self._deadline += seconds

    def running_s(self) -> float:
        """Seconds the run has been running, the time before a pause included and the pause itself not."""
        return self._clock() - self._started

    def charge(self, usage: Usage, cost_usd: float | None) -> None:
        self.usage.add(usage)
        # One response of unknown price makes the run's cost unknown: a partial sum would look like a real figure.
        if cost_usd is None or self.cost_usd is None:
            self.cost_usd = None
        else:
            self.cost_usd += cost_usd

    def spent(self) -> RunStatus | None:
        """The budget status the run has reached, if any (tokens first, as the seed loop checks them)."""
        limits = self.limits
        if limits.max_total_tokens is not None and self.usage.total_tokens >= limits.max_total_tokens:
            return RunStatus.TOKEN_BUDGET
        if limits.max_cost_usd is not None and self.cost_usd is not None and self.cost_usd >= limits.max_cost_usd:
            return RunStatus.COST_BUDGET
        return None

    def output_tokens_left(self, output_usd_per_token: float | None) -> int | None:
        """The largest output the next response may have within the token and cost budgets, or None when neither is
        set. At least 1 (the API's minimum): a run with nothing left has already stopped on its budget."""
        limits = self.limits
        left: list[float] = []
        if limits.max_total_tokens is not None:
            left.append(limits.max_total_tokens - self.usage.total_tokens)
        if limits.max_cost_usd is not None and self.cost_usd is not None and output_usd_per_token:
            left.append((limits.max_cost_usd - self.cost_usd) / output_usd_per_token)
        return max(int(min(left) + 1e-6), 1) if left else None  # the epsilon: 0.01 / 1e-5 is 999.99... in floats

    def remaining_s(self) -> float | None:
        """Seconds of wall clock left, or None without a timeout."""
        return None if self._deadline is None else self._deadline - self._clock()

    def timed_out(self) -> bool:
        remaining = self.remaining_s()
        return remaining is not None and remaining <= 0

    def tool_timeout_s(self) -> float | None:
        """The per-tool timeout, shortened to what is left of the run's wall clock."""
        remaining = self.remaining_s()
        per_tool = self.limits.tool_timeout_s
        if remaining is None:
            return per_tool
        return max(remaining, 0.0) if per_tool is None else max(min(per_tool, remaining), 0.0)
