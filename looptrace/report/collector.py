"""From spans to a report, in one pass: each span goes to `looptrace detect`'s run rebuilder, which judges the runs,
and its facts to the run the rebuilder put it in; each judged run is counted in the overview and offered to the
bound on drawn runs.

Feed it the spans `detect` reads (``tracefile.SpanRecord``, in file order) and the verdicts are `detect`'s own: the
same rebuilder, fed the same spans, so the page's figures are those of `looptrace detect --json` over the same file.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from looptrace.instrumentation.detector import DetectorConfig
from looptrace.instrumentation.offline import RunRebuilder

from .facts import AGENT, SpanFact, fact_of
from .overview import Overview
from .runs import OpenRun, RunRecord, record_of
from .selection import DEFAULT_MAX_RUNS, DrawnRuns

MAX_OPEN_RUNS = 10_000  # as the rebuilder's own bound: a run whose root never comes is forgotten, oldest first


@dataclass(slots=True)
class Report:
    """What the page shows: the overview of every run since ``since_ns``, and the runs drawn in full."""

    overview: Overview
    runs: list[RunRecord]  # drawn in full, latest first
    max_runs: int
    left_out: int  # runs counted in the overview but not drawn (beyond max_runs)
    since_ns: int | None = None
    before_since: int = 0  # runs judged but left out because they started before since_ns
    notes: list[str] = field(default_factory=list)  # what the reader of the page should know about the input

    @property
    def run_count(self) -> int:
        return self.overview.total.runs


class RunCollector:
    """``add`` each span, then ``finish`` for the report."""

    def __init__(self, *, since_ns: int | None = None, max_runs: int = DEFAULT_MAX_RUNS,
                 config: DetectorConfig | None = None) -> None:
        self._rebuilder = RunRebuilder(config)
        self._open: OrderedDict[str, OpenRun] = OrderedDict()
        self._since = since_ns
        self.overview = Overview()
        self.drawn = DrawnRuns(max_runs)
        self.before_since = 0

    def add(self, span: Any) -> None:
        rebuilder = self._rebuilder
        verdict = rebuilder.add(span)
        if rebuilder.last_dropped is not None:  # a model call's second span: its own run is gone
            self._open.pop(rebuilder.last_dropped, None)
        read, key = rebuilder.last_span, rebuilder.last_key
        fact = fact_of(read)
        run = self._open.get(key)
        if run is None:
            run = self._open[key] = OpenRun()
            if len(self._open) > MAX_OPEN_RUNS:
                self._open.popitem(last=False)
        run.add(read, fact)
        if verdict is not None:
            self._judged(verdict, key, read, fact)

    def finish(self) -> Report:
        """Judge the runs still open (their roots never came) and return the report."""
        for verdict in self._rebuilder.finish():
            self._judged(verdict, verdict.trace_id, None, None)
        self._open.clear()
        return Report(overview=self.overview, runs=self.drawn.runs(), max_runs=self.drawn.limit,
                      left_out=self.drawn.left_out, since_ns=self._since, before_since=self.before_since)

    def _judged(self, verdict: Any, key: str, read: Any, fact: SpanFact | None) -> None:
        closing = fact if fact is not None and fact.kind == AGENT else None
        anchor = anchor_of(key)
        if closing is not None and read.parent_span_id is not None and key in self._rebuilder.open_runs():
            # a run inside another run's tool, judged on its own: the outer run goes on without its spans
            run = self._open[key].split_off(closing.span_id, closing.start_ns, closing.end_ns)
            anchor = f"{anchor}-{anchor_of(closing.span_id)[4:]}"
        else:
            run = self._open.pop(key) if key in self._open else OpenRun()
        record = record_of(verdict, run, anchor, closing)
        if self._since is not None and record.start_ns and record.start_ns < self._since:
            self.before_since += 1
            return
        self.overview.add(record)
        self.drawn.offer(record)



def anchor_of(key: str) -> str:
    """The page's id for a run: ``run-`` and its trace id (or session or conversation key); a run nested in another's
    tool adds its own span's id (``selection`` numbers any id two drawn runs would still share)."""
    return "run-" + re.sub(r"[^A-Za-z0-9_-]+", "-", key)[:80]
