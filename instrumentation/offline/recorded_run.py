"""A stored looptrace run rebuilt from its spans, for replay: the task, the system prompt, the tool definitions, every
model response in order and every tool result by its tool_use id.

What is read, and where (instrumentation/recording/spans.py writes it):

- the run (``invoke_agent``): agent, model, the task (``gen_ai.input.messages``), system instructions, tool
  definitions, how the run ended (``looptrace.run.status``, turns, total tokens, cost), the session;
- each turn (``turn``, ``looptrace.turn.index``): the anomalies reported in it (its evaluation events), in order;
- each turn's model call (``chat``): the response as ``gen_ai.output.messages`` with its id, model, raw stop_reason
  (``looptrace.anthropic.stop_reason``) and usage; a call that failed has an error status instead;
- each tool call (``execute_tool``): its id, result (``gen_ai.tool.call.result``) and ``looptrace.tool.is_error``.

With content on events only (capture mode EVENT_ONLY), the chat span's content event holds what its attributes would,
and a tool call's result is read from the next call's input messages. A run recorded without content holds digests
only: it cannot be replayed (``ContentNotRecorded``). A run whose spans miss something else (a line lost from the
file, a response cut at the attribute size cap) names the span and what it misses (``IncompleteRecording``).

Standard library only, like the other readers: replay's reading costs no OpenTelemetry import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..detector import result_digest
from ..recording import semconv as sc
from ..tracefile.read import SpanRecord
from .anthropic_messages import anthropic_message, text_of_parts, tool_definition
from .recorded_facts import as_count

ERROR_STATUS = 2
CUT_MARK = "…[truncated "  # content.cap's marker: a value cut at the attribute size cap
ANOMALY_EVENTS = frozenset({sc.ANOMALY_EVENT, sc.LEGACY_ANOMALY_EVENT})
# Outcomes whose result is not what the tool would say again: the run was cut short there.
_NOT_A_RESULT = frozenset({"interrupted"})


class NotReplayable(Exception):
    """A stored run that cannot be replayed; the message says why, and what can be done instead."""


class ContentNotRecorded(NotReplayable):
    """The run was recorded without content: its spans hold digests, not the model's responses or the tools' results."""

    def __init__(self, trace_id: str, agent: str) -> None:
        self.trace_id = trace_id
        self.agent = agent
        super().__init__(
            f"run {trace_id} (agent {agent!r}) was recorded without content (LOOPTRACE_CAPTURE_CONTENT=false or "
            f"NO_CONTENT): its spans hold digests of the calls, not the model's responses, so it cannot be replayed. "
            f"`looptrace detect` still judges it from the digests; record with content on to replay a run.")


class IncompleteRecording(NotReplayable):
    """A span of the run lacks what replay needs; ``span_id`` and ``span_name`` say which, ``missing`` what."""

    def __init__(self, span_id: str, span_name: str, missing: str) -> None:
        self.span_id = span_id
        self.span_name = span_name
        self.missing = missing
        super().__init__(f"span {span_id} ({span_name}): {missing}")


@dataclass(frozen=True, slots=True)
class RecordedModelError:
    """A model call of the recording that failed (the API raised): the replay fails the same call."""

    turn: int
    error: str  # the chat span's status message, "ExceptionType: message"


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One tool_use of the recording and what its tool returned."""

    turn: int
    call_id: str
    tool: str
    arguments: Any  # as the model sent them, secrets redacted (as every span holds them)
    result: str | None  # the tool_result text; None when it was not recorded (the run stopped before, or capture)
    is_error: bool
    span_id: str | None  # its execute_tool span, when there is one
    cut: bool = False  # the recorded text is not the whole result the run saw (cut at the attribute size cap)


@dataclass(frozen=True, slots=True)
class RecordedAnomaly:
    """An anomaly the live run reported, as its turn span's evaluation event holds it."""

    turn: int
    type: str
    tool: str | None
    count: int
    action: str | None  # warn | nudge | stop
    message: str
    streak: str = ""  # the same for every report of one streak (``Anomaly.streak``)

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "type": self.type, "tool": self.tool, "count": self.count, "action": self.action,
                "message": self.message}


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """Everything a replay needs of one stored run, in the Messages API's own shapes."""

    trace_id: str
    agent: str
    model: str
    task: str | list[dict[str, Any]]  # the user's request, or the message history the run continued
    system: str | None
    tool_definitions: list[dict[str, Any]]  # Messages API client tools: name, description, input_schema
    responses: list[dict[str, Any] | RecordedModelError]  # one per turn, in order
    calls: list[RecordedCall]  # every tool_use, in the order the model asked for them
    anomalies: list[RecordedAnomaly]  # in the order they were reported
    status: str | None  # looptrace.run.status; None when the run's root span was never written
    turns: int
    total_tokens: int | None = None
    cost_usd: float | None = None
    max_tokens: int | None = None
    session_id: str | None = None
    notes: tuple[str, ...] = field(default=())  # what a replay cannot reproduce exactly, in words

    def require_results(self) -> None:
        """Raise ``IncompleteRecording`` for the first tool call that ran but whose result was not recorded: without
        it the recorded results cannot stand in for the tools (the user's own tools still can)."""
        for call in self.calls:
            if call.result is None and call.span_id is not None and not self._cut_short(call):
                raise IncompleteRecording(
                    call.span_id, sc.tool_span_name(call.tool),
                    "holds no result (gen_ai.tool.call.result was not recorded: content went to events only, or "
                    "was off for tools); replay it with --tools FILE to run your tools instead")

    def _cut_short(self, call: RecordedCall) -> bool:
        return call.turn == self.turns and self.status in ("interrupted", "timeout", "error")


def rebuild_run(spans: Iterable[SpanRecord], *, root_span_id: str | None = None) -> RecordedRun:
    """The run among ``spans`` (one trace's) rebuilt for replay; ``root_span_id`` picks one of several runs in a trace
    (default: the one that ended last). Raises ``ContentNotRecorded`` or ``IncompleteRecording``, or
    ``NotReplayable`` when the spans hold no looptrace run."""
    spans = list(spans)
    children: dict[str | None, list[SpanRecord]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    root = _root(spans, root_span_id)
    notes: list[str] = []
    if root is None:
        turn_parents = {s.parent_span_id for s in spans if sc.TURN_INDEX in s.attributes}
        if len(turn_parents) != 1:
            raise NotReplayable("no looptrace run here: replay rebuilds looptrace's own runs (an invoke_agent span "
                                "with turn spans); `looptrace detect` judges other agents' traces")
        root_id, root_attributes = next(iter(turn_parents)), {}
        notes.append("the run's root span was never written (the process ended mid-run): its task is read from the "
                     "first model call")
    else:
        root_id, root_attributes = root.span_id, root.attributes
    turns = sorted((s for s in children.get(root_id, ()) if sc.TURN_INDEX in s.attributes),
                   key=lambda s: as_count(s.attributes.get(sc.TURN_INDEX)))
    if not turns:
        raise NotReplayable("no looptrace run here: the run has no turn spans (replay rebuilds looptrace's own runs; "
                            "`looptrace detect` judges other agents' traces)")
    trace_id = turns[0].trace_id
    agent = str(root_attributes.get(sc.GEN_AI_AGENT_NAME) or turns[0].attributes.get(sc.GEN_AI_AGENT_NAME) or "agent")
    chats = [_chat_of(turn, children.get(turn.span_id, ())) for turn in turns]
    if not any(_output_of(chat) is not None for chat in chats if not _failed(chat)):
        raise ContentNotRecorded(trace_id, agent)
    responses = [_response(chat, index) for index, chat in enumerate(chats, start=1)]
    later_results = _results_in_inputs(chats)
    calls = [call for index, (turn, response) in enumerate(zip(turns, responses, strict=True), start=1)
             for call in _calls(index, response, children.get(turn.span_id, ()), later_results)]
    cut = [call.span_id for call in calls if call.cut]
    if cut:
        notes.append(f"{len(cut)} tool result(s) were cut at the attribute size cap when recorded (span "
                     f"{cut[0]}{' and others' if len(cut) > 1 else ''}): the replay sends the cut text")
    first_chat = chats[0]
    run_content = _run_content(root_attributes, first_chat)
    model = str(root_attributes.get(sc.GEN_AI_REQUEST_MODEL) or first_chat.attributes.get(sc.GEN_AI_REQUEST_MODEL)
                or "")
    session = root_attributes.get(sc.GEN_AI_CONVERSATION_ID) or turns[0].attributes.get(sc.GEN_AI_CONVERSATION_ID)
    if session:
        notes.append(f"the run belongs to session {session!r}: the live detector remembered the session's earlier "
                     f"runs, the replay starts with none")
    if any(s.attributes.get(sc.JUDGE) for turn in turns for s in children.get(turn.span_id, ())):
        notes.append("the live run asked a judge to confirm ignored errors; the replay has no judge")
    return RecordedRun(
        trace_id=trace_id,
        agent=agent,
        model=model,
        task=_task(root, root_attributes, first_chat),
        system=text_of_parts(_parsed(run_content.get(sc.GEN_AI_SYSTEM_INSTRUCTIONS), first_chat,
                                     sc.GEN_AI_SYSTEM_INSTRUCTIONS)),
        tool_definitions=[d for d in (tool_definition(item) for item in _parsed(
            run_content.get(sc.GEN_AI_TOOL_DEFINITIONS), first_chat, sc.GEN_AI_TOOL_DEFINITIONS) or ()) if d],
        responses=responses,
        calls=calls,
        anomalies=reported_anomalies(turns),
        status=root_attributes.get(sc.RUN_STATUS),
        turns=as_count(root_attributes.get(sc.RUN_TURNS)) or len(turns),
        total_tokens=_optional_int(root_attributes.get(sc.RUN_USAGE_TOTAL_TOKENS)),
        cost_usd=_optional_float(root_attributes.get(sc.RUN_COST_USD)),
        max_tokens=_optional_int(first_chat.attributes.get(sc.GEN_AI_REQUEST_MAX_TOKENS)),
        session_id=str(session) if session else None,
        notes=tuple(notes),
    )


def runs_in(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """The spans of each trace, by trace id, in the order the traces first appear."""
    by_trace: dict[str, list[SpanRecord]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    return by_trace


# --- the pieces ---------------------------------------------------------------------------------------------------


def _root(spans: list[SpanRecord], wanted: str | None) -> SpanRecord | None:
    roots = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT]
    if wanted is not None:
        roots = [s for s in roots if s.span_id == wanted]
        if not roots:
            raise NotReplayable(f"no run with root span {wanted} in this trace")
    return max(roots, key=lambda s: getattr(s, "end_ns", 0) or s.start_ns) if roots else None


def _chat_of(turn: SpanRecord, children: Iterable[SpanRecord]) -> SpanRecord:
    chats = [s for s in children if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_CHAT
             and not s.attributes.get(sc.JUDGE)]
    if not chats:
        index = as_count(turn.attributes.get(sc.TURN_INDEX))
        raise IncompleteRecording(turn.span_id, turn.name, f"turn {index} has no chat span: its model call was not "
                                                           f"recorded (a span lost from the file?)")
    return min(chats, key=lambda s: s.start_ns)


def _failed(span: SpanRecord) -> bool:
    return getattr(span, "status_code", 0) == ERROR_STATUS and _output_of(span) is None


def _content(span: SpanRecord, key: str) -> object:
    """A content attribute of a chat span: on the span, or on its content event (capture mode EVENT_ONLY)."""
    if key in span.attributes:
        return span.attributes[key]
    for name, _, attributes in getattr(span, "events", ()) or ():
        if name == sc.CONTENT_EVENT and key in attributes:
            return attributes[key]
    return None


def _output_of(span: SpanRecord) -> object:
    return _content(span, sc.GEN_AI_OUTPUT_MESSAGES)


def _parsed(raw: object, span: SpanRecord, key: str) -> Any:
    """A JSON content attribute's value; a value cut at the size cap (or not JSON) names the span."""
    if raw is None or not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        why = ("was cut at the attribute size cap when recorded (raise LOOPTRACE_MAX_ATTRIBUTE_CHARS and record "
               "again)" if CUT_MARK in raw[-80:] else "is not JSON")
        raise IncompleteRecording(span.span_id, span.name, f"{key} {why}") from None


def _response(chat: SpanRecord, turn: int) -> dict[str, Any] | RecordedModelError:
    """The Messages API response a chat span recorded (or the failure it recorded)."""
    if _failed(chat):
        return RecordedModelError(turn, getattr(chat, "status_message", "") or "the model call failed")
    raw = _output_of(chat)
    if raw is None:
        raise IncompleteRecording(chat.span_id, chat.name, "holds no gen_ai.output.messages (the response was not "
                                                           "recorded)")
    messages = _parsed(raw, chat, sc.GEN_AI_OUTPUT_MESSAGES)
    try:
        content = anthropic_message(messages[0])["content"] if isinstance(messages, list) and messages else None
    except ValueError as exc:
        raise IncompleteRecording(chat.span_id, chat.name, f"gen_ai.output.messages: {exc}") from None
    if content is None:
        raise IncompleteRecording(chat.span_id, chat.name, "gen_ai.output.messages holds no message")
    a = chat.attributes
    stop_reason = a.get(sc.STOP_REASON)
    if stop_reason is None:
        raise IncompleteRecording(chat.span_id, chat.name, f"holds no {sc.STOP_REASON} (the response's stop_reason)")
    return {"id": a.get(sc.GEN_AI_RESPONSE_ID) or None, "type": "message", "role": "assistant",
            "model": a.get(sc.GEN_AI_RESPONSE_MODEL) or a.get(sc.GEN_AI_REQUEST_MODEL) or "", "content": content,
            "stop_reason": stop_reason or None, "stop_sequence": None, "usage": _usage(a)}


def _usage(a: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's usage object again: the conventions' input tokens count the cache reads and writes too, so they are
    taken apart, and the 1-hour cache writes (priced apart) are the chat span's own count. Files written before that
    count was recorded hold it in Langfuse's usage object, read for them."""
    cache_read = as_count(a.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS))
    cache_creation = as_count(a.get(sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS))
    legacy = _legacy_usage(a)
    if legacy is not None and sc.CHAT_CACHE_WRITES_1H not in a:
        return legacy
    usage: dict[str, Any] = {
        "input_tokens": max(as_count(a.get(sc.GEN_AI_USAGE_INPUT_TOKENS)) - cache_read - cache_creation, 0),
        "output_tokens": as_count(a.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)),
        "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": cache_creation}
    one_hour = min(as_count(a.get(sc.CHAT_CACHE_WRITES_1H)), cache_creation)
    if one_hour:
        usage["cache_creation"] = {"ephemeral_1h_input_tokens": one_hour,
                                   "ephemeral_5m_input_tokens": cache_creation - one_hour}
    return usage


def _legacy_usage(a: Mapping[str, Any]) -> dict[str, Any] | None:
    """The usage an older file's generation holds in Langfuse's terms (the 1-hour cache writes apart), or None."""
    details = a.get(sc.LEGACY_LANGFUSE_USAGE_DETAILS)
    try:
        parsed = json.loads(details) if isinstance(details, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return None
    one_hour = as_count(parsed.get("input_cache_creation_1h"))
    usage: dict[str, Any] = {
        "input_tokens": as_count(parsed.get("input")), "output_tokens": as_count(parsed.get("output")),
        "cache_read_input_tokens": as_count(parsed.get("input_cache_read")),
        "cache_creation_input_tokens": as_count(parsed.get("input_cache_creation_5m")) + one_hour}
    if one_hour:
        usage["cache_creation"] = {"ephemeral_1h_input_tokens": one_hour,
                                   "ephemeral_5m_input_tokens": usage["cache_creation_input_tokens"] - one_hour}
    return usage


def _results_in_inputs(chats: list[SpanRecord]) -> dict[str, tuple[Any, bool]]:
    """Tool results as later model calls were sent them (tool_call_response parts), by tool_use id: where a tool span
    holds no result (content on events only), the next call's input messages still do."""
    found: dict[str, tuple[Any, bool]] = {}
    for chat in chats[1:]:
        raw = _content(chat, sc.GEN_AI_INPUT_MESSAGES)
        try:
            messages = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            continue  # cut at the cap: the tool spans are the first source anyway
        for message in messages if isinstance(messages, list) else ():
            for part in message.get("parts", ()) if isinstance(message, dict) else ():
                if isinstance(part, dict) and part.get("type") == "tool_call_response" and part.get("id"):
                    found.setdefault(str(part["id"]), (part.get("response"), bool(part.get("is_error"))))
    return found


def _calls(turn: int, response: dict[str, Any] | RecordedModelError, children: Iterable[SpanRecord],
           later_results: Mapping[str, tuple[Any, bool]]) -> list[RecordedCall]:
    if isinstance(response, RecordedModelError):
        return []
    tool_spans = {str(s.attributes.get(sc.GEN_AI_TOOL_CALL_ID)): s for s in children
                  if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_EXECUTE_TOOL}
    calls = []
    for block in response["content"]:
        if block.get("type") != "tool_use":
            continue
        call_id = str(block.get("id") or "")
        span = tool_spans.get(call_id)
        a = span.attributes if span is not None else {}
        result, is_error = a.get(sc.GEN_AI_TOOL_CALL_RESULT), bool(a.get(sc.TOOL_IS_ERROR))
        if result is None and call_id in later_results:
            content, is_error = later_results[call_id]
            result = content if isinstance(content, str) or content is None else json.dumps(content)
        if a.get(sc.TOOL_OUTCOME) in _NOT_A_RESULT:
            result = None
        recorded_digest = a.get(sc.TOOL_RESULT_DIGEST)
        cut = result is not None and recorded_digest is not None and result_digest(result) != recorded_digest
        calls.append(RecordedCall(turn=turn, call_id=call_id, tool=str(block.get("name") or ""),
                                  arguments=block.get("input"), result=None if result is None else str(result),
                                  is_error=is_error, span_id=span.span_id if span is not None else None, cut=cut))
    return calls


def _run_content(root_attributes: Mapping[str, Any], first_chat: SpanRecord) -> dict[str, Any]:
    """System instructions and tool definitions: on the root with content on spans, on every chat (span or event)."""
    return {key: root_attributes.get(key) if key in root_attributes else _content(first_chat, key)
            for key in (sc.GEN_AI_SYSTEM_INSTRUCTIONS, sc.GEN_AI_TOOL_DEFINITIONS)}


def _task(root: SpanRecord | None, root_attributes: Mapping[str, Any],
          first_chat: SpanRecord) -> str | list[dict[str, Any]]:
    """The run's task: the root's input messages, else the first model call's (the history it was sent is the task,
    unless older messages were left out to fit the size cap). One user text is the task as a string, as it was."""
    raw, span = root_attributes.get(sc.GEN_AI_INPUT_MESSAGES), root
    if raw is not None and span is not None and as_count(root_attributes.get(sc.INPUT_MESSAGES_OMITTED)):
        raise IncompleteRecording(span.span_id, span.name, "the task's older messages were left out of "
                                                           "gen_ai.input.messages to fit the size cap")
    if raw is None or span is None:
        raw, span = _content(first_chat, sc.GEN_AI_INPUT_MESSAGES), first_chat
        if as_count(first_chat.attributes.get(sc.INPUT_MESSAGES_OMITTED)):
            raise IncompleteRecording(first_chat.span_id, first_chat.name, "the task's older messages were left out "
                                                                           "of gen_ai.input.messages to fit the size "
                                                                           "cap, and the run's root holds none")
    if raw is None:
        raise IncompleteRecording(span.span_id, span.name, "holds no gen_ai.input.messages (the task)")
    parsed = _parsed(raw, span, sc.GEN_AI_INPUT_MESSAGES)
    try:
        messages = [anthropic_message(m) for m in parsed] if isinstance(parsed, list) else None
    except ValueError as exc:
        raise IncompleteRecording(span.span_id, span.name, f"gen_ai.input.messages: {exc}") from None
    if not messages:
        raise IncompleteRecording(span.span_id, span.name, "gen_ai.input.messages holds no message")
    only = messages[0]["content"]
    if len(messages) == 1 and messages[0]["role"] == "user" and len(only) == 1 and only[0]["type"] == "text":
        return str(only[0]["text"])
    return messages


def reported_anomalies(spans: Iterable[SpanRecord]) -> list[RecordedAnomaly]:
    """The anomalies a live run reported, from its turn spans' evaluation events, in turn order. Readable with
    content capture off too: what the live detector said needs no content."""
    turns = sorted((s for s in spans if sc.TURN_INDEX in s.attributes),
                   key=lambda s: as_count(s.attributes[sc.TURN_INDEX]))
    found = []
    for turn in turns:
        index = as_count(turn.attributes.get(sc.TURN_INDEX))
        for name, _, a in getattr(turn, "events", ()) or ():
            if name in ANOMALY_EVENTS and a.get(sc.ANOMALY_TYPE):
                found.append(RecordedAnomaly(turn=index, type=str(a[sc.ANOMALY_TYPE]), tool=a.get(sc.ANOMALY_TOOL),
                                             count=as_count(a.get(sc.ANOMALY_COUNT)), action=a.get(sc.ANOMALY_ACTION),
                                             message=str(a.get(sc.ANOMALY_MESSAGE) or ""),
                                             streak=str(a.get(sc.ANOMALY_STREAK) or "")))
    return found


def _optional_int(value: object) -> int | None:
    return None if value is None else as_count(value)


def _optional_float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
