"""Runs rebuilt from their spans, in any order, and judged by the detector: what `looptrace detect`, `looptrace watch`
and the live span processor share (``trace_detect`` and ``trace_detect_live`` are the ways in).

Any agent whose tool calls are `execute_tool` spans with `gen_ai.tool.*` attributes can be checked, whatever
framework produced them. A run is rebuilt from its spans: model-call spans (`gen_ai.operation.name` chat and its kin)
mark where a turn begins, each tool span belongs to the turn whose model call started last before it, and the root
gives the way the run ended. Results are compared by `looptrace.tool.result_digest` when present (ours, recorded even
without content capture), else by the digest of `gen_ai.tool.call.result`.

A trace is judged when its root span arrives (roots end last, so in a trace file they come after their children);
traces whose root never arrives are judged at the end of the input. An agent run inside another's tool (a sub-agent,
a hand-off) is a run of its own: when its `invoke_agent` span arrives, the spans under it (its turns, model calls
and tools, all ended by then) are judged as one run, and the outer run goes on without them. Memory holds the
compact calls of the traces still open (and their span tree), not the spans.

Runs without a root (a session's, or a conversation's rebuilt from its history: see readers.py) are judged at the
end of the input, or when `close` is called (`looptrace watch` does when the run goes idle). One model call described
by two spans (the SDK's own messageless span and an instrumentation's, with one `gen_ai.response.id`) counts once: in
one trace the second is skipped; alone in its trace, the messageless span is held until its twin comes (then
dropped) or until it is closed or the input ends (then judged as a run of its own). When the instrumentation's span
is the parent of the SDK's (it wraps the SDK method) and joins its conversation, the trace it leaves behind holds only
that child: it is dropped too.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..detector import (
    CYCLE,
    FAILING_TOOL,
    IGNORED_ERROR,
    REPEATED_CALL,
    REPEATED_TEXT,
    Anomaly,
    DetectorConfig,
    LoopCost,
    LoopDetector,
    SessionDetectors,
    ToolCall,
    TurnUsage,
    UnresolvedToolError,
    result_digest,
)
from ..detector.turns import answers, feed_turn
from ..recording import semconv as sc
from ..recording.prices import DEFAULT_PRICES, Price
from ..tracefile.read import SpanRecord
from .readers import FOREIGN_EXACT_KEYS, FOREIGN_KEY_PREFIXES, KeySelection, ProducerReader
from .span_usage import USAGE_KEYS, model_call_usage

MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
# The only span attributes detection reads: a reader can skip decoding everything else.
_OWN_KEYS = frozenset({
    sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_TOOL_NAME, sc.GEN_AI_TOOL_CALL_ID, sc.GEN_AI_TOOL_CALL_ARGUMENTS,
    sc.GEN_AI_TOOL_CALL_RESULT, sc.TOOL_ARGUMENTS_DIGEST, sc.TOOL_RESULT_DIGEST, sc.TOOL_IS_ERROR, sc.ERROR_TYPE,
    sc.TOOL_OUTCOME,
    sc.STOP_REASON, sc.GEN_AI_RESPONSE_FINISH_REASONS, sc.GEN_AI_OUTPUT_MESSAGES, sc.RUN_STATUS,
    sc.GEN_AI_CONVERSATION_ID, sc.GEN_AI_RESPONSE_ID,
})
# ... and what the readers of other producers' spans need (readers.py), indexed attributes by prefix.
DETECTION_KEYS = KeySelection(_OWN_KEYS | USAGE_KEYS | FOREIGN_EXACT_KEYS, FOREIGN_KEY_PREFIXES)
_STOP_LIKE = frozenset({"stop", "end_turn"})
REJECTED = "rejected"  # the `looptrace.tool.outcome` of a call a person or an approver rejected


# Plain classes with slots rather than dataclasses: defining a dataclass costs about a millisecond at import, which
# `looptrace detect` pays on every invocation (the detector's records say the same).


class _Call:
    """A tool call of an open run; it is also what the detector is fed (it reads a `ToolCall`'s fields by name)."""

    __slots__ = ("arguments", "call_id", "is_error", "result", "result_digest", "span_id", "start_ns", "tool", "turn")

    def __init__(self, start_ns: int, tool: str, arguments: object, call_id: str | None, is_error: bool,
                 result_digest: str | None, result: Any, span_id: str) -> None:
        self.start_ns = start_ns
        self.tool = tool
        self.arguments = arguments
        self.call_id = call_id
        self.is_error = is_error
        self.result_digest = result_digest
        self.result = result  # the recorded result (content capture on): error texts, and the batch an error came in
        self.turn = 0  # set when the run is judged
        self.span_id = span_id  # which run it belongs to, when runs nest, is read from the span tree


class _OpenRun:
    """What the detector needs of one trace, gathered span by span in whatever order they come."""

    __slots__ = ("calls", "first_model_name", "last_model", "model_ends", "model_outputs", "model_spans",
                 "model_usage", "parents", "response_starts", "root_name", "root_status", "root_text", "session_id")

    def __init__(self, session_id: str | None = None) -> None:
        self.model_spans: list[tuple[int, str, str | None]] = []  # start, span id, parent id
        self.first_model_name = ""  # the first model call's span name: the run's name when no root ever comes
        # gen_ai.response.id -> (start, end) of its first span (made when seen): a second span of one call overlaps it
        self.response_starts: dict[str, tuple[int, int]] | None = None
        self.model_outputs: dict[int, Any] = {}  # start -> raw output messages, parsed only if needed
        self.model_usage: dict[int, TurnUsage] = {}  # start -> what the call used (tokens, USD): its loop's cost
        self.session_id = session_id  # gen_ai.conversation.id: runs of one conversation share the detector's memory
        self.calls: list[_Call] = []
        self.last_model: tuple[int, str | None, str | None] = (-1, None, None)  # start, stop reason, output text
        self.root_name = ""
        self.root_text: str | None = None  # the root's gen_ai.output.messages, unparsed
        self.root_status: str | None = None
        self.parents: dict[str, str | None] = {}  # span id -> parent span id, to tell nested runs apart
        self.model_ends: dict[str, tuple[int, str | None, Any]] = {}  # span id -> last_model's kind


_TOOL_STOPS = frozenset({"tool_use", "tool_calls"})  # Anthropic's stop reason; the GenAI finish reason


@dataclass(frozen=True, slots=True)
class Verdict:
    trace_id: str
    name: str  # the root span's name
    turns: int
    tool_calls: int
    status: str | None  # looptrace.run.status when the trace is ours
    anomalies: list[Anomaly]
    rules_not_run: dict[str, str] = field(default_factory=dict)  # rule -> what the producer did not record
    # The tool errors standing when the run ended, rebuilt from its tool spans as the live run's ledger kept them.
    unresolved_errors: list[UnresolvedToolError] = field(default_factory=list)
    # What the run's loops cost (each turn counted once), and its session's so far; None without a loop or usage.
    loop_cost: LoopCost | None = None
    session_loop_cost: LoopCost | None = None
    # `loop_cost` split by the anomaly type that found each turn first: the loop_cost_usd scores (not in to_dict).
    loop_cost_by_type: dict[str, LoopCost] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "name": self.name, "turns": self.turns, "tool_calls": self.tool_calls,
                "status": self.status, "anomalies": [a.to_dict() for a in self.anomalies],
                "rules_not_run": self.rules_not_run,
                "unresolved_errors": [e.to_dict() for e in self.unresolved_errors],
                "loop_cost": None if self.loop_cost is None else self.loop_cost.to_dict(),
                "session_loop_cost": None if self.session_loop_cost is None else self.session_loop_cost.to_dict()}


class RunRebuilder:
    """Feed spans (as `SpanRecord`-like objects) in any order; get a Verdict per trace as its root arrives."""

    def __init__(self, config: DetectorConfig | None = None, max_open_traces: int = 10_000,
                 prices: Mapping[str, Price] = DEFAULT_PRICES) -> None:
        self.config = config
        self.prices = prices  # what another producer's model calls are priced by (ours carry their own cost)
        self.max_open_traces = max_open_traces
        self._open: OrderedDict[str, _OpenRun] = OrderedDict()
        self._sessions = SessionDetectors(config)  # runs of one conversation, judged in the order their roots came
        self._reader = ProducerReader(max_open_traces)  # other producers' spans, in our vocabulary
        # Lone messageless model calls waiting for their twin (by trace), and the runs of calls seen (by response id).
        self._held: OrderedDict[str, SpanRecord] = OrderedDict()
        self._held_by_response: dict[str, str] = {}
        self._twins: OrderedDict[str, str] = OrderedDict()
        self.last_key = ""  # the run the span added last belongs to (a trace id, or a session or conversation key)
        self.last_dropped: str | None = None  # the held twin that span made redundant: that key has no run now
        # The span added last, as read (in looptrace's vocabulary, whoever produced it).
        self.last_span: SpanRecord | None = None

    def add(self, span: SpanRecord) -> Verdict | None:
        own_trace, was_root = span.trace_id, span.parent_span_id is None
        span = self.last_span = self._reader.translate(span)
        self.last_key = span.trace_id
        self.last_dropped = None
        if was_root and span.trace_id != own_trace:
            self._drop_inner_twin(own_trace, span.span_id)
        response_id = span.attributes.get(sc.GEN_AI_RESPONSE_ID)
        if response_id and self._reader.bare_call:
            twin = self._twins.get(str(response_id)) or self._held_by_response.get(str(response_id))
            if twin is not None:
                self.last_key = twin  # its twin was counted already (or, messageless too, is held already)
                return None
            self._held[span.trace_id] = span
            self._held_by_response[str(response_id)] = span.trace_id
            if len(self._held) > self.max_open_traces:
                self._unhold(next(iter(self._held)))  # a messageless call alone: nothing the detector could find
            return None
        if response_id and span.attributes.get(sc.GEN_AI_OPERATION_NAME) in MODEL_OPERATIONS:
            self._count_once(str(response_id), span.trace_id)
        return self._add(span)

    def _count_once(self, response_id: str, key: str) -> None:
        """Remember which run this model call is in; drop its messageless twin if it came first."""
        self._twins[response_id] = key
        self._twins.move_to_end(response_id)
        if len(self._twins) > self.max_open_traces:
            self._twins.popitem(last=False)
        held = self._held_by_response.get(response_id)
        if held is not None:
            self._unhold(held)
            self.last_dropped = held

    def _drop_inner_twin(self, trace_id: str, root_span_id: str) -> None:
        """A root model call that joined its conversation leaves its own trace behind; what that trace holds already
        is the call's children (they end first): the SDK's messageless span of the same call, when an instrumentation
        wraps the SDK method (OpenInference, OpenTelemetry's GenAI instrumentation). That is no run of its own."""
        run = self._open.get(trace_id)
        if run is None or run.calls or any(parent != root_span_id for _, _, parent in run.model_spans):
            return
        del self._open[trace_id]
        self._reader.forget(trace_id)
        self.last_dropped = trace_id

    def _unhold(self, trace_id: str) -> SpanRecord:
        span = self._held.pop(trace_id)
        self._held_by_response.pop(str(span.attributes.get(sc.GEN_AI_RESPONSE_ID)), None)
        return span

    def _add(self, span: SpanRecord) -> Verdict | None:
        attributes = span.attributes
        run = self._open.get(span.trace_id)
        if run is None:
            run = self._open[span.trace_id] = _OpenRun()
            if len(self._open) > self.max_open_traces:  # a root that never comes must not hold memory forever
                self._open.popitem(last=False)
        operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
        run.parents[span.span_id] = span.parent_span_id
        if run.session_id is None and isinstance(attributes.get(sc.GEN_AI_CONVERSATION_ID), str):
            run.session_id = attributes[sc.GEN_AI_CONVERSATION_ID]
        if operation == sc.OPERATION_EXECUTE_TOOL or (operation is None and sc.GEN_AI_TOOL_NAME in attributes):
            run.calls.append(_call_of(span))
        elif operation in MODEL_OPERATIONS:
            start = span.start_ns
            response_id = attributes.get(sc.GEN_AI_RESPONSE_ID)
            seen = run.response_starts
            second = False
            end = getattr(span, "end_ns", 0) or start
            first = seen.get(response_id) if response_id and seen is not None else None
            if first is not None and start <= first[1] and end >= first[0]:
                # A second span of one call (the SDK's and another's): the same id and the same time. The same id
                # at another time is another call (a scripted or replayed model repeats its ids).
                start, second = first[0], True
            else:
                if response_id:
                    run.response_starts = seen if seen is not None else {}
                    run.response_starts[response_id] = (start, end)
                run.model_spans.append((start, span.span_id, span.parent_span_id))
                run.first_model_name = run.first_model_name or span.name
            if sc.GEN_AI_OUTPUT_MESSAGES in attributes:
                run.model_outputs[start] = attributes[sc.GEN_AI_OUTPUT_MESSAGES]
            if start not in run.model_usage:  # of two spans of one call, the first that recorded usage
                usage = model_call_usage(attributes, span.start_ns, end, self.prices)
                if usage is not None:
                    run.model_usage[start] = usage
            stop_reason = _stop_reason(attributes)
            ending = (start, stop_reason, attributes.get(sc.GEN_AI_OUTPUT_MESSAGES))
            run.model_ends[span.span_id] = ending
            if start > run.last_model[0] or (start == run.last_model[0] and (not second or stop_reason is not None)):
                # Output text kept raw: only the last one is ever parsed. Of two spans of one call, the one that
                # recorded something wins.
                run.last_model = ending
        if span.parent_span_id is not None and operation == sc.OPERATION_INVOKE_AGENT:
            nested = _split_off(run, span.span_id, span.start_ns, getattr(span, "end_ns", 0) or span.start_ns)
            if nested is not None:  # a run inside another run's tool: judged alone, the outer run stays open
                own_session = attributes.get(sc.GEN_AI_CONVERSATION_ID)
                nested.session_id = own_session if isinstance(own_session, str) else None
                if run.session_id is not None and run.session_id == nested.session_id:
                    run.session_id = None  # it came from the nested run's spans; the outer run's own will say
                nested.root_name = span.name
                nested.root_text = attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
                nested.root_status = attributes.get(sc.RUN_STATUS)
                return self._judge_run(span.trace_id, nested, {})
        if span.parent_span_id is None or operation == sc.OPERATION_INVOKE_AGENT:
            run.root_name = span.name
            run.root_text = attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
            run.root_status = attributes.get(sc.RUN_STATUS)
            return self._judge(span.trace_id)
        return None

    def finish(self) -> list[Verdict]:
        """Judge every trace still open (their roots never came: a crashed process, a partial file)."""
        released = [self._release(trace_id) for trace_id in list(self._held)]
        verdicts = released + [self._judge(trace_id) for trace_id in list(self._open)]
        return [v for v in verdicts if v is not None]

    def _release(self, trace_id: str) -> Verdict | None:
        """A held messageless call whose twin never came: a run of its own after all."""
        return self._add(self._unhold(trace_id))

    def open_runs(self) -> list[str]:
        """The keys (trace ids, or session or conversation keys) of the runs still open, oldest first."""
        return list(self._open)

    def check(self, trace_id: str) -> list[Anomaly]:
        """The anomalies of an open run so far, without closing it (no end-of-run rules): for live watching."""
        run = self._open.get(trace_id)
        if run is None:
            return []
        calls = run.calls + [_call_of(s) for s in self._reader.message_calls(trace_id)]
        detector = self._replay(run, calls)
        not_run = self._reader.limits(trace_id)
        return [a for a in detector.anomalies if a.type not in not_run]

    def close(self, trace_id: str) -> Verdict | None:
        """Judge an open run now (its root never came: the sender went quiet, or the run was evicted)."""
        if trace_id in self._held:
            return self._release(trace_id)
        return self._judge(trace_id) if trace_id in self._open else None

    def _replay(self, run: _OpenRun, calls: list[_Call]) -> LoopDetector:
        detector = LoopDetector(self.config)
        model_starts = _model_call_starts(run.model_spans)
        stops = _stops_by_turn(model_starts, run.model_ends)
        usage = _usage_by_turn(model_starts, run.model_usage)
        for turn, turn_calls in _assign_turns(model_starts, calls):
            if turn in usage:
                detector.record_usage(turn, usage[turn])
            # (a check for `watch`, not the hot path: without the results, as before)
            feed_turn(detector, turn, [ToolCall(turn=turn, tool=c.tool, arguments=c.arguments, call_id=c.call_id,
                                                is_error=c.is_error, result_digest=c.result_digest)
                                       for c in turn_calls], None, stops.get(turn))
        return detector

    def _judge(self, trace_id: str) -> Verdict | None:
        run = self._open.pop(trace_id)
        run.calls.extend(_call_of(s) for s in self._reader.message_calls(trace_id))
        not_run = self._reader.limits(trace_id)
        self._reader.forget(trace_id)
        return self._judge_run(trace_id, run, not_run)

    def _judge_run(self, trace_id: str, run: _OpenRun, not_run: dict[str, str]) -> Verdict | None:
        if not run.calls and not run.model_spans:
            return None  # no agent here: an application span around a run that was already judged, or unrelated
        detector = self._sessions.detector_for(run.session_id) if run.session_id else LoopDetector(self.config)
        model_starts = _model_call_starts(run.model_spans)
        turns = _assign_turns(model_starts, run.calls)
        stops = _stops_by_turn(model_starts, run.model_ends)
        # What the model said: its answers (a run may answer, be nudged and go on), and beside its tool calls, where
        # it can report a failure (read only when some call failed) or repeat itself.
        said = _texts_by_turn(model_starts, run.model_outputs)
        _, stop_reason, model_output = run.last_model
        final_text = _output_text(run.root_text if run.root_text is not None else model_output)
        last_turn = turns[-1][0] if turns else max(len(model_starts), 1)
        usage = _usage_by_turn(model_starts, run.model_usage)
        for turn, calls in turns:
            if turn in usage:
                detector.record_usage(turn, usage[turn])
            for call in calls:
                call.turn = turn
            text = final_text if turn == last_turn and answers(stops.get(turn), bool(calls)) else said.get(turn)
            # the same turn model as the live loop: an answer ends the run, it is no turn of its own
            feed_turn(detector, turn, calls, text, stops.get(turn))
        for turn in range(last_turn + 1, len(model_starts) + 1):  # the answer, after the last turn with calls
            if turn in usage:
                detector.record_usage(turn, usage[turn])
        detector.end_run(stop_reason, final_text, max(last_turn, len(model_starts)))
        if final_text is None:  # stored without content: whether the answer admitted a failure cannot be known
            not_run.setdefault(IGNORED_ERROR, "the final answer's text was not recorded (content capture off?)")
            if not said:
                not_run.setdefault(REPEATED_TEXT, "the model's text was not recorded (content capture off?)")
        if stop_reason is None and run.model_spans:
            not_run.setdefault(IGNORED_ERROR, "the way the run ended (stop or finish reason) was not recorded")
        if not run.calls and (len(model_starts) > 1 or (stop_reason or "").lower() in _TOOL_STOPS):
            # Model calls that asked for tools, and not one call recorded (the anthropic SDK's own spans): the
            # loops cannot be seen, which is not the same as there being none.
            for rule in (REPEATED_CALL, CYCLE, FAILING_TOOL):
                not_run.setdefault(rule, "no tool calls were recorded (no tool spans, no tool-use parts in messages)")
        anomalies = [a for a in detector.anomalies if a.type not in not_run]
        return Verdict(trace_id=trace_id, name=run.root_name or run.first_model_name,
                       turns=max(len(model_starts), len(turns)), tool_calls=len(run.calls), status=run.root_status,
                       anomalies=anomalies, rules_not_run=not_run, unresolved_errors=detector.unresolved_errors(),
                       loop_cost=detector.loop_cost if anomalies else None,
                       session_loop_cost=detector.session_loop_cost if anomalies and run.session_id else None,
                       loop_cost_by_type=detector.loop_cost_by_type if anomalies else {})


def _usage_by_turn(starts: list[int], usage: dict[int, TurnUsage]) -> dict[int, TurnUsage]:
    """Each model call's usage by its turn number (the n-th model call is turn n)."""
    return {turn: usage[start] for turn, start in enumerate(starts, start=1) if start in usage}


def _texts_by_turn(starts: list[int], outputs: Mapping[int, object]) -> dict[int, str]:
    texts = {}
    for turn, start in enumerate(starts, start=1):
        text = _output_text(outputs.get(start))
        if text:
            texts[turn] = text
    return texts


def _stops_by_turn(starts: list[int], ends: Mapping[str, tuple[int, str | None, object]]) -> dict[int, str | None]:
    """Each turn's stop reason, from the model call that started it."""
    by_start: dict[int, str | None] = {}
    for start, stop, _ in ends.values():  # of two spans of one call, the one that recorded a stop reason
        if stop is not None or start not in by_start:
            by_start[start] = stop
    return {turn: by_start.get(start) for turn, start in enumerate(starts, start=1)}


def _model_call_starts(model_spans: list[tuple[int, str, str | None]]) -> list[int]:
    """One start per model call. A model span nested in another (an SDK's own span inside an agent framework's, or
    inside ours) is the same call seen twice, not a turn of its own."""
    ids = {span_id for _, span_id, _ in model_spans}
    return sorted(start for start, _, parent in model_spans if parent not in ids)


def _assign_turns(starts: list[int], calls: list[_Call]) -> list[tuple[int, list[_Call]]]:
    """Tool calls grouped by turn: the turn of a call is the number of model calls that started before it."""
    by_turn: dict[int, list[_Call]] = {}
    position = 0
    for call in sorted(calls, key=lambda c: c.start_ns):
        while position < len(starts) and starts[position] <= call.start_ns:
            position += 1
        by_turn.setdefault(max(position, 1), []).append(call)
    if not starts:
        return sorted(by_turn.items())
    # Turns without tool calls still count: they break streaks the way they did in the live run.
    return [(turn, by_turn.get(turn, [])) for turn in range(1, max([len(starts), *by_turn]) + 1)]


def _call_of(span: SpanRecord) -> _Call:
    a = span.attributes
    # Without content capture only the digest of the arguments is stored: equal digests, equal calls.
    raw_arguments = a.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS, a.get(sc.TOOL_ARGUMENTS_DIGEST))
    digest = a.get(sc.TOOL_RESULT_DIGEST)
    if digest is None and sc.GEN_AI_TOOL_CALL_RESULT in a:
        digest = result_digest(str(a[sc.GEN_AI_TOOL_CALL_RESULT]))
    # A person's (or an approver's) rejection is a decision, not a failure the model could leave unresolved: the live
    # loop feeds it to its detector as an answer (docs/approvals.md), and so does this reading of its span.
    is_error = (bool(a.get(sc.TOOL_IS_ERROR)) or span.status_code == 2 or sc.ERROR_TYPE in a) \
        and a.get(sc.TOOL_OUTCOME) != REJECTED
    return _Call(start_ns=span.start_ns, tool=str(a.get(sc.GEN_AI_TOOL_NAME) or span.name), arguments=raw_arguments,
                 call_id=a.get(sc.GEN_AI_TOOL_CALL_ID), is_error=is_error, result_digest=digest,
                 result=a.get(sc.GEN_AI_TOOL_CALL_RESULT), span_id=str(getattr(span, "span_id", "") or ""))


def _split_off(run: _OpenRun, root_id: str, start_ns: int, end_ns: int) -> _OpenRun | None:
    """The part of ``run`` under the span ``root_id`` (a nested agent run, from ``start_ns`` to ``end_ns``), taken
    out of ``run``; None when nothing of ``run`` lies outside it (it is the run itself, the common case).

    Spans reach the rebuilder as they end, children before parents, so every span under ``root_id`` is known: its
    ancestry leads to ``root_id`` through spans already seen. A reader may leave out spans detection has no use for
    (`looptrace detect` skips looptrace's turn spans): then the model and tool calls whose ancestry stops at the same
    unseen span (one turn) are under ``root_id`` when they all started within its time.
    """
    under: dict[str, bool] = {root_id: True}
    anchors: dict[str, str] = {}  # span id -> the unseen ancestor its ancestry stops at

    def climb(span_id: str) -> bool | str:
        path = []
        current: str | None = span_id
        while current is not None and current not in under and current in run.parents:
            path.append(current)
            current = run.parents[current]
        if current is None or current in under:
            found = current is not None and under[current]
            for visited in path:
                under[visited] = found
            return found
        for visited in path:
            anchors[visited] = current
        return current

    starts = {span_id: start for start, span_id, _ in run.model_spans}
    for call in run.calls:
        if call.span_id:
            starts[call.span_id] = call.start_ns
    groups: dict[str, bool] = {}
    for span_id, start in starts.items():
        place = climb(span_id)
        if isinstance(place, str):
            groups[place] = groups.get(place, True) and start_ns <= start <= end_ns

    def is_under(span_id: str) -> bool:
        if span_id in under:
            return under[span_id]
        anchor = anchors.get(span_id)
        return anchor is not None and groups.get(anchor, False)

    inner_models = [m for m in run.model_spans if is_under(m[1])]
    inner_calls = [c for c in run.calls if c.span_id and is_under(c.span_id)]
    if len(inner_models) == len(run.model_spans) and len(inner_calls) == len(run.calls):
        return None
    if not inner_models and not inner_calls:
        return None  # nothing of it was seen (its spans went elsewhere): the outer run is left as it is
    nested = _OpenRun(session_id=run.session_id)
    nested.model_spans = inner_models
    nested.calls = inner_calls
    run.model_spans = [m for m in run.model_spans if not is_under(m[1])]
    run.calls = [c for c in run.calls if not (c.span_id and is_under(c.span_id))]
    for part in (nested, run):
        begun = {start for start, _, _ in part.model_spans}
        part.model_outputs = {start: text for start, text in run.model_outputs.items() if start in begun}
        ends = [run.model_ends[span_id] for _, span_id, _ in part.model_spans if span_id in run.model_ends]
        part.last_model = max(ends, key=lambda end: end[0]) if ends else (-1, None, None)
    nested.parents = {}
    run.parents = {span_id: parent for span_id, parent in run.parents.items() if not is_under(span_id)}
    run.model_ends = {span_id: end for span_id, end in run.model_ends.items() if not is_under(span_id)}
    return nested


def _stop_reason(attributes: dict[str, Any]) -> str | None:
    raw = attributes.get(sc.STOP_REASON)
    if raw:
        return raw
    reasons = attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
    if isinstance(reasons, (list, tuple)) and reasons:
        return str(reasons[-1])
    return None


def _output_text(raw: object) -> str | None:
    """The text parts of a gen_ai.output.messages value, if a span carried one (content capture on)."""
    if not isinstance(raw, str):
        return None
    try:
        messages = json.loads(raw)
    except ValueError:
        return raw  # capped (truncated) JSON: its text still tells whether the answer admits a failure
    texts = [part.get("content", "") for message in messages if isinstance(message, dict)
             for part in message.get("parts", ()) if isinstance(part, dict) and part.get("type") == "text"]
    return "\n".join(str(t) for t in texts)
