"""Which runs are drawn in full when there are more than the page should hold: the bound on drawn runs.

Every run is counted in the overview; at most ``limit`` keep their spans for a view of their own. The runs kept are
the most telling: the looping runs first, costliest first; then the runs that ended in trouble (a tool error left
unresolved, an error, a limit); then the latest. Memory holds the kept runs' spans only.
"""

from __future__ import annotations

import heapq
import itertools

from .overview import loop_rank
from .runs import NOT_RECORDED, RunRecord

DEFAULT_MAX_RUNS = 100
CALM_STATUSES = frozenset({"done", NOT_RECORDED})


def priority(run: RunRecord) -> tuple[bool, tuple[float, int], bool, int]:
    """A run's claim to be drawn: looped, what its loops cost, ended in trouble, how recent."""
    cost = run.loop_cost
    spent = loop_rank(cost.usd, cost.total_tokens) if cost is not None else (-1.0, 0)
    troubled = bool(run.verdict.unresolved_errors) or run.status not in CALM_STATUSES
    return run.looped, spent, troubled, run.start_ns


class DrawnRuns:
    """The runs whose spans are kept, at most ``limit`` of them; a run left out has its ``facts`` set to None."""

    def __init__(self, limit: int = DEFAULT_MAX_RUNS) -> None:
        self.limit = max(limit, 0)
        self.offered = 0
        self._heap: list[tuple[tuple[bool, tuple[float, int], bool, int], int, RunRecord]] = []
        self._order = itertools.count()

    def offer(self, run: RunRecord) -> None:
        self.offered += 1
        entry = (priority(run), next(self._order), run)
        if len(self._heap) < self.limit:
            heapq.heappush(self._heap, entry)
        elif self._heap and entry[:2] > self._heap[0][:2]:
            heapq.heapreplace(self._heap, entry)[2].facts = None
        else:
            run.facts = None

    def runs(self) -> list[RunRecord]:
        """The runs drawn, latest first, each with an id of its own on the page (a trace whose root came twice
        holds two runs of one key: the later is numbered)."""
        drawn = sorted((run for _, _, run in self._heap), key=lambda run: run.start_ns, reverse=True)
        seen: set[str] = set()
        for run in reversed(drawn):
            anchor, number = run.anchor, 1
            while anchor in seen:
                number += 1
                anchor = f"{run.anchor}-{number}"
            run.anchor = anchor
            seen.add(anchor)
        return drawn

    @property
    def left_out(self) -> int:
        return self.offered - len(self._heap)
