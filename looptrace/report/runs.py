"""One judged run as the report holds it (``RunRecord``), and the spans of a run still open (``OpenRun``), split when
a run nested in another's tool is judged before its outer run.

A run's facts are the drawn spans the run rebuilder put in it (its key: a trace id, or a session's or conversation's
key). Its verdict is `looptrace detect`'s, so every figure the report shows of it is the one `detect --json` gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looptrace.instrumentation.detector import LoopCost

from .facts import AGENT, MODEL, TOOL, SpanFact

NOT_RECORDED = "not recorded"  # the status of a run whose spans do not say how it ended (another producer's)
AGENT_PREFIX = "invoke_agent "


class OpenRun:
    """The drawn spans of a run not judged yet, with its time window and its parent links."""

    __slots__ = ("earliest_model", "end_ns", "facts", "parents", "start_ns")

    def __init__(self) -> None:
        self.facts: list[SpanFact] = []
        self.parents: dict[str, str | None] = {}  # span id -> parent, for every span of the run (drawn or not)
        self.start_ns = 0
        self.end_ns = 0
        self.earliest_model: SpanFact | None = None  # the one model call whose input (the task) is kept

    def add(self, span: Any, fact: SpanFact | None) -> None:
        self.parents[str(span.span_id)] = span.parent_span_id
        start, end = span.start_ns, max(getattr(span, "end_ns", 0) or 0, span.start_ns)
        if start and (not self.start_ns or start < self.start_ns):
            self.start_ns = start
        self.end_ns = max(self.end_ns, end)
        if fact is None:
            return
        if fact.kind == MODEL:
            self._keep_one_input(fact)
        self.facts.append(fact)

    def _keep_one_input(self, fact: SpanFact) -> None:
        """Every model call's input holds the whole conversation so far: only the first call's is kept (the task
        and the system prompt); the rest of the conversation is in the calls' outputs and the tools' results."""
        first = self.earliest_model
        if first is None or fact.start_ns < first.start_ns:
            if first is not None:
                first.input = first.system = None
            self.earliest_model = fact
        else:
            fact.input = fact.system = None

    def split_off(self, root_id: str, start_ns: int, end_ns: int) -> OpenRun:
        """The part of this run under the span ``root_id`` (a run nested in a tool of this one), taken out of it.

        Under it: the spans whose ancestry reaches it, and those whose ancestry stops at a span the file reader
        skipped (looptrace's turn spans) when they lie within its time, as the run rebuilder tells them apart.
        """
        nested = OpenRun()
        kept: list[SpanFact] = []
        for fact in self.facts:
            place = self._ancestry(fact.span_id, root_id)
            inside = place is True or (place is None and start_ns <= fact.start_ns <= end_ns)
            (nested.facts if inside else kept).append(fact)
        self.facts = kept
        nested.start_ns, nested.end_ns = start_ns, end_ns
        return nested

    def _ancestry(self, span_id: str, root_id: str) -> bool | None:
        """True when ``span_id`` is ``root_id`` or under it, False when its ancestry ends elsewhere in the run, None
        when it stops at a span this run never saw."""
        current: str | None = span_id
        for _ in range(len(self.parents) + 1):
            if current == root_id:
                return True
            if current is None:
                return False
            if current not in self.parents:
                return None
            current = self.parents[current]
        return False  # a loop in the parent links: a file that lies


@dataclass(slots=True)
class RunRecord:
    """A judged run: its verdict and what the overview and its own view need. ``facts`` is None when the run is
    counted but not drawn in full (beyond the bound on drawn runs)."""

    anchor: str  # the page's id for it
    verdict: Any  # offline.Verdict
    agent: str
    status: str
    start_ns: int
    end_ns: int
    tokens: int | None
    usd: float | None
    tools: frozenset[str]
    facts: list[SpanFact] | None = None

    @property
    def trace_id(self) -> str:
        return str(self.verdict.trace_id)

    @property
    def looped(self) -> bool:
        return bool(self.verdict.anomalies)

    @property
    def loop_cost(self) -> LoopCost | None:
        cost: LoopCost | None = self.verdict.loop_cost
        return cost

    @property
    def root(self) -> SpanFact | None:
        """The run's own span (`invoke_agent`, or another producer's root), when it was recorded and drawn."""
        roots = [f for f in self.facts or () if f.kind == AGENT]
        return min(roots, key=lambda f: f.start_ns) if roots else None


def record_of(verdict: Any, run: OpenRun, anchor: str, root: SpanFact | None) -> RunRecord:
    """The record of a judged run from its verdict and its spans (``root``: the span that closed it, if one did)."""
    roots = [f for f in run.facts if f.kind == AGENT]
    own = root if root is not None else (min(roots, key=lambda f: f.start_ns) if roots else None)
    start, end = (own.start_ns, own.end_ns) if own is not None else (run.start_ns, run.end_ns)
    tokens, usd = _totals(own, run.facts)
    status = verdict.status or (own.status if own is not None else None) or NOT_RECORDED
    tools = frozenset(f.tool for f in run.facts if f.kind == TOOL and f.tool)
    return RunRecord(anchor=anchor, verdict=verdict, agent=agent_of(verdict.name), status=str(status),
                     start_ns=start, end_ns=max(end, start), tokens=tokens, usd=usd, tools=tools, facts=run.facts)


def agent_of(name: str) -> str:
    """The agent's name as `detect` names its run (the root span's name), without the operation before it."""
    name = str(name or "")
    return name[len(AGENT_PREFIX):] if name.startswith(AGENT_PREFIX) else (name or "?")


def model_calls(facts: list[SpanFact]) -> list[SpanFact]:
    """One fact per model call, in order: a model span inside another (an SDK's own span under a framework's) or a
    second span of the same response at the same time is the same call, as the run rebuilder counts them."""
    models = [f for f in facts if f.kind == MODEL]
    ids = {f.span_id for f in models}
    calls: list[SpanFact] = []
    seen: dict[str, SpanFact] = {}
    for fact in sorted((f for f in models if f.parent not in ids), key=lambda f: f.start_ns):
        twin = seen.get(fact.response_id) if fact.response_id else None
        if twin is not None and fact.start_ns <= twin.end_ns and fact.end_ns >= twin.start_ns:
            continue
        if fact.response_id:
            seen[fact.response_id] = fact
        calls.append(fact)
    return calls


def _totals(root: SpanFact | None, facts: list[SpanFact]) -> tuple[int | None, float | None]:
    """The run's tokens and USD: as its root recorded them (looptrace's), else the sum of its model calls."""
    if root is not None and root.total_tokens is not None:
        return root.total_tokens, root.cost_usd
    calls = model_calls(facts)
    used = [c for c in calls if c.tokens is not None]
    if not used:
        return None, None
    priced = all(c.usd is not None for c in used)
    return sum(c.tokens or 0 for c in used), (sum(c.usd or 0.0 for c in used) if priced else None)
