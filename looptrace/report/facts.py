"""What the report keeps of one span: the few facts a timeline draws (what it was, when, whether it failed, what it
used) and the content it recorded, if any, in looptrace's vocabulary whoever produced it.

Spans arrive already read into that vocabulary (the run rebuilder's ``last_span``: OpenInference's and OpenLLMetry's
spans translated, the GenAI conventions' passed through). Content is kept as recorded, cut at a size a page can hold;
nothing is kept of a span the report does not draw (an application's own spans).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looptrace.instrumentation.offline import MODEL_OPERATIONS, model_call_usage
from looptrace.instrumentation.recording import semconv as sc

AGENT, MODEL, TOOL = "agent", "model", "tool"
ERROR_STATUS = 2
# Content longer than this is cut when read (the page shows less: content.CONTENT_CHARS); the length is kept.
KEPT_CHARS = 16_000

# The attributes the report reads beyond those detection reads (which it reads too): how a run ended and what it
# cost as its root recorded it, how a tool call ended and who approved it, the system prompt.
REPORT_KEYS = frozenset({
    sc.RUN_STATUS, sc.RUN_TURNS, sc.RUN_ERROR, sc.RUN_USAGE_TOTAL_TOKENS, sc.RUN_COST_USD, sc.GEN_AI_AGENT_NAME,
    sc.GEN_AI_SYSTEM_INSTRUCTIONS, sc.TOOL_OUTCOME, sc.TOOL_APPROVAL, sc.TOOL_APPROVAL_BY, sc.TOOL_APPROVAL_REASON,
    sc.TOOL_APPROVAL_WAIT_S, sc.JUDGE, sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_RESPONSE_MODEL,
})


@dataclass(slots=True)
class Kept:
    """A recorded content value, cut at ``KEPT_CHARS``; ``length`` is the whole value's."""

    text: str
    length: int


@dataclass(slots=True)
class SpanFact:
    """One drawn span: an agent run's root, a model call or a tool call."""

    kind: str  # AGENT | MODEL | TOOL
    span_id: str
    parent: str | None
    name: str
    start_ns: int
    end_ns: int
    error: bool = False
    error_type: str | None = None
    tool: str | None = None
    call_id: str | None = None
    outcome: str | None = None  # looptrace.tool.outcome: ok, error, timeout, rejected, awaiting_approval...
    approval: str | None = None  # pending | approved | rejected
    approval_by: str | None = None
    approval_wait_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    usd: float | None = None
    stop_reason: str | None = None
    model: str | None = None
    response_id: str | None = None
    judge: bool = False
    status: str | None = None  # the run's status, on its root
    run_error: str | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None
    agent_name: str | None = None
    # Content, only where the span holds it (capture on): arguments, result, model output, input, system prompt,
    # a rejection's reason.
    arguments: Kept | None = None
    result: Kept | None = None
    output: Kept | None = None
    input: Kept | None = None
    system: Kept | None = None
    approval_reason: Kept | None = None

    @property
    def tokens(self) -> int | None:
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)


def fact_of(span: Any) -> SpanFact | None:
    """The facts of a span the report draws (None for any other span)."""
    a = span.attributes
    operation = a.get(sc.GEN_AI_OPERATION_NAME)
    if operation in MODEL_OPERATIONS:
        return _model_fact(span, a)
    if operation == sc.OPERATION_EXECUTE_TOOL or (operation is None and sc.GEN_AI_TOOL_NAME in a):
        return _tool_fact(span, a)
    if operation == sc.OPERATION_INVOKE_AGENT or span.parent_span_id is None:
        return _agent_fact(span, a)
    return None


def _base(kind: str, span: Any, a: dict[str, Any]) -> SpanFact:
    error_type = a.get(sc.ERROR_TYPE)
    return SpanFact(kind=kind, span_id=str(span.span_id), parent=span.parent_span_id, name=str(span.name),
                    start_ns=span.start_ns, end_ns=max(getattr(span, "end_ns", 0) or span.start_ns, span.start_ns),
                    error=getattr(span, "status_code", 0) == ERROR_STATUS or error_type is not None,
                    error_type=None if error_type is None else str(error_type))


def _model_fact(span: Any, a: dict[str, Any]) -> SpanFact:
    fact = _base(MODEL, span, a)
    usage = model_call_usage(a, span.start_ns, fact.end_ns)
    if usage is not None:
        fact.input_tokens, fact.output_tokens, fact.usd = usage.input_tokens, usage.output_tokens, usage.usd
    stop = a.get(sc.STOP_REASON)
    if stop is None:
        reasons = a.get(sc.GEN_AI_RESPONSE_FINISH_REASONS)
        stop = reasons[-1] if isinstance(reasons, (list, tuple)) and reasons else None
    fact.stop_reason = None if stop is None else str(stop)
    model = a.get(sc.GEN_AI_RESPONSE_MODEL) or a.get(sc.GEN_AI_REQUEST_MODEL)
    fact.model = None if model is None else str(model)
    response_id = a.get(sc.GEN_AI_RESPONSE_ID)
    fact.response_id = None if response_id is None else str(response_id)
    fact.judge = bool(a.get(sc.JUDGE))
    fact.output = kept(a.get(sc.GEN_AI_OUTPUT_MESSAGES))
    fact.input = kept(a.get(sc.GEN_AI_INPUT_MESSAGES))
    fact.system = kept(a.get(sc.GEN_AI_SYSTEM_INSTRUCTIONS))
    return fact


def _tool_fact(span: Any, a: dict[str, Any]) -> SpanFact:
    fact = _base(TOOL, span, a)
    fact.error = fact.error or bool(a.get(sc.TOOL_IS_ERROR))
    fact.tool = str(a.get(sc.GEN_AI_TOOL_NAME) or span.name)
    call_id = a.get(sc.GEN_AI_TOOL_CALL_ID)
    fact.call_id = None if call_id is None else str(call_id)
    outcome = a.get(sc.TOOL_OUTCOME)
    fact.outcome = None if outcome is None else str(outcome)
    approval = a.get(sc.TOOL_APPROVAL)
    if approval is not None:
        fact.approval = str(approval)
        by = a.get(sc.TOOL_APPROVAL_BY)
        fact.approval_by = None if by is None else str(by)
        fact.approval_wait_s = _number(a.get(sc.TOOL_APPROVAL_WAIT_S))
        fact.approval_reason = kept(a.get(sc.TOOL_APPROVAL_REASON))
    fact.arguments = kept(a.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS))
    fact.result = kept(a.get(sc.GEN_AI_TOOL_CALL_RESULT))
    return fact


def _agent_fact(span: Any, a: dict[str, Any]) -> SpanFact:
    fact = _base(AGENT, span, a)
    status = a.get(sc.RUN_STATUS)
    fact.status = None if status is None else str(status)
    run_error = a.get(sc.RUN_ERROR)
    fact.run_error = None if run_error is None else str(run_error)[:KEPT_CHARS]
    tokens = _number(a.get(sc.RUN_USAGE_TOTAL_TOKENS))
    fact.total_tokens = None if tokens is None else int(tokens)
    fact.cost_usd = _number(a.get(sc.RUN_COST_USD))
    name = a.get(sc.GEN_AI_AGENT_NAME)
    fact.agent_name = None if name is None else str(name)
    fact.output = kept(a.get(sc.GEN_AI_OUTPUT_MESSAGES))
    fact.input = kept(a.get(sc.GEN_AI_INPUT_MESSAGES))
    fact.system = kept(a.get(sc.GEN_AI_SYSTEM_INSTRUCTIONS))
    return fact


def kept(value: Any) -> Kept | None:
    """A content attribute as kept: None when the span does not hold it."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return Kept(text[:KEPT_CHARS], len(text))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def read_keys() -> Any:
    """The attributes a reader of stored spans decodes for the report: detection's (``offline.DETECTION_KEYS``, with
    its prefixes of indexed attributes) and ``REPORT_KEYS``."""
    from looptrace.instrumentation.offline import DETECTION_KEYS, KeySelection

    return KeySelection(frozenset(DETECTION_KEYS) | REPORT_KEYS, DETECTION_KEYS.prefixes)
