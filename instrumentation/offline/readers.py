"""Other producers' GenAI spans, read into the one vocabulary the run rebuilder knows.

`trace_detect.RunRebuilder` rebuilds a run from spans that speak the OpenTelemetry GenAI conventions the way looptrace
writes them: model calls (`gen_ai.operation.name` chat), `execute_tool` spans with `gen_ai.tool.*`, a root whose
`gen_ai.output.messages` holds the final answer. `ProducerReader.translate` turns every producer's span into that
vocabulary, span by span, as they come:

- GenAI conventions (looptrace, OpenTelemetry's GenAI utilities, pydantic-ai, OpenLLMetry >= 0.56): passed through.
  When a trace has no tool spans, its tool calls are read from the messages: the model's `tool_call` parts in
  `gen_ai.output.messages`, their results in a later call's `gen_ai.input.messages` (`tool_call_response` parts).
- OpenLLMetry (traceloop) up to 0.53: indexed attributes `gen_ai.prompt.N.*` and `gen_ai.completion.N.*`; tool calls
  under `gen_ai.completion.N.tool_calls.M.*`, results in a later prompt (Anthropic `tool_result` blocks, with
  `is_error`, or OpenAI-style `tool` messages).
- OpenInference (Arize/Phoenix): `openinference.span.kind` LLM / TOOL / AGENT / CHAIN spans, `llm.input_messages.*`,
  `llm.output_messages.*`, `tool.name`, `input.value` / `output.value`.

Tool calls read from messages are emitted as synthetic `execute_tool` spans when the run is judged or checked, placed
just after the model call that asked for them, so they count in the turn the model asked for them.

What a producer did not record is never made up. `limits(trace_id)` says which detector rules cannot run on a trace,
and why (arguments not recorded, no error flag on tool results, no final answer text); the rebuilder drops those
rules' findings and reports the reasons beside its verdict.

Runs are keyed by trace. A model call that is alone in its trace (no parent: an SDK call outside any agent span) but
carries a session id (`session.id`, `gen_ai.conversation.id`, OpenLLMetry's association property) joins its session's
run instead. One with neither a parent nor a session id joins the conversation its input history continues
(`conversations.ConversationIndex`: successive calls whose histories extend one another are one run). Such runs have
no root and are judged at the end of the input (or, under `looptrace watch`, when idle). A conversation's tool calls
are read from its messages: each call's output, and the assistant messages of the history (which also hold the calls
whose own spans were lost; those are placed just before the call whose history showed them, so their turn is only
approximate).

Some processes describe one model call twice: the anthropic SDK's own span (`anthropic.messages.create`: the
request, the response id and usage, no messages) beside an instrumentation's. `bare_call` tells such a messageless
call apart so that the rebuilder can count it once, matched by `gen_ai.response.id`.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

from ..detector import CYCLE, FAILING_TOOL, IGNORED_ERROR, REPEATED_CALL
from ..recording import semconv as sc
from ..tracefile.read import BAD_ATTRIBUTE_KEY, NotTraceData, SpanRecord
from .conversations import ConversationIndex

# OpenInference's attribute names (openinference-semantic-conventions), listed so the reader needs no extra package.
OI_SPAN_KIND = "openinference.span.kind"
OI_INPUT_VALUE = "input.value"
OI_OUTPUT_VALUE = "output.value"
OI_TOOL_NAME = "tool.name"
OI_TOOL_PARAMETERS = "tool.parameters"
OI_TOOL_CALL_ID = "tool_call.id"
OI_SESSION_ID = "session.id"
OI_FINISH_REASON = "llm.finish_reason"
OI_INPUT_MESSAGES = "llm.input_messages."
OI_OUTPUT_MESSAGES = "llm.output_messages."
OI_MODEL_NAME = "llm.model_name"
OI_PROMPT_TOKENS = "llm.token_count.prompt"  # every input token, the cache's included
OI_COMPLETION_TOKENS = "llm.token_count.completion"
OI_CACHE_READ_TOKENS = "llm.token_count.prompt_details.cache_read"
OI_CACHE_WRITE_TOKENS = "llm.token_count.prompt_details.cache_write"
# OpenInference's token counts and model in the GenAI conventions' names, which the loop cost is read from.
_OI_USAGE = {OI_MODEL_NAME: sc.GEN_AI_REQUEST_MODEL, OI_PROMPT_TOKENS: sc.GEN_AI_USAGE_INPUT_TOKENS,
             OI_COMPLETION_TOKENS: sc.GEN_AI_USAGE_OUTPUT_TOKENS,
             OI_CACHE_READ_TOKENS: sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
             OI_CACHE_WRITE_TOKENS: sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS}
# OpenLLMetry's (opentelemetry-semantic-conventions-ai, before the GenAI message attributes).
OLL_PROMPT = sc.OPENLLMETRY_PROMPT_PREFIX
OLL_COMPLETION = sc.OPENLLMETRY_COMPLETION_PREFIX
OLL_SESSION_ID = "traceloop.association.properties.session_id"

SESSION_PREFIX = "session:"
# OpenInference's session.id is also the attribute Langfuse reads a session from.
SESSION_KEYS = (sc.GEN_AI_CONVERSATION_ID, OI_SESSION_ID, OLL_SESSION_ID)
# Every attribute any reader looks at, for readers of files that decode only what detection needs.
FOREIGN_EXACT_KEYS = frozenset({
    sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_AGENT_NAME, sc.GEN_AI_RESPONSE_ID, OI_SPAN_KIND, OI_INPUT_VALUE,
    OI_OUTPUT_VALUE, OI_TOOL_NAME, OI_TOOL_PARAMETERS, OI_TOOL_CALL_ID, OI_FINISH_REASON, *SESSION_KEYS, *_OI_USAGE,
})
FOREIGN_KEY_PREFIXES = (OLL_PROMPT, OLL_COMPLETION, OI_INPUT_MESSAGES, OI_OUTPUT_MESSAGES)

MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_INDEXED = re.compile(r"^(\d+)\.(.+)$")
_MAX_OPEN_TRACES = 10_000


class KeySelection(frozenset):
    """The attribute keys detection decodes: an exact set plus the prefixes of indexed attributes.

    ``verdicts[key]`` is ``key in selection``, remembered: a file repeats the same few dozen keys on every span, and
    one dict look-up is cheaper than testing the prefixes each time.
    """

    prefixes: tuple[str, ...] = ()
    verdicts: dict[str, bool]

    def __new__(cls, keys: frozenset[str], prefixes: tuple[str, ...]) -> KeySelection:
        selection = super().__new__(cls, keys)
        selection.prefixes = prefixes
        selection.verdicts = _Verdicts(selection)
        return selection

    def __contains__(self, key: object) -> bool:
        return frozenset.__contains__(self, key) or (isinstance(key, str) and key.startswith(self.prefixes))


class _Verdicts(dict):
    """Whether a selection holds a key, worked out once per key (at most ``_MAX_VERDICTS`` kept: a hostile file could
    make keys without end)."""

    def __init__(self, selection: KeySelection) -> None:
        super().__init__()
        self.selection = selection

    def __missing__(self, key: str) -> bool:
        if type(key) is not str:  # every reader of trace files refuses the line, in the same words
            raise NotTraceData(BAD_ATTRIBUTE_KEY)
        verdict = key in self.selection
        if len(self) < _MAX_VERDICTS:
            self[key] = verdict
        return verdict


_MAX_VERDICTS = 100_000


# Plain classes with slots rather than dataclasses, for start-up time (run_rebuilder.py says why).


class _Requested:
    """A tool call a model call's messages asked for."""

    __slots__ = ("after_ns", "arguments", "call_id", "exact", "tool")

    def __init__(self, after_ns: int, tool: str, arguments: object, call_id: str, *, exact: bool = True) -> None:
        self.after_ns = after_ns  # the requesting model call's start: the call belongs to its turn
        self.tool = tool
        self.arguments = arguments
        self.call_id = call_id
        self.exact = exact  # False when read from a later call's history: the requesting call's start is not known


class _TraceState:
    """What the reader remembers of one trace between its spans."""

    __slots__ = ("arguments_missing", "has_tool_spans", "latest_input", "requested", "tool_span_ids")

    def __init__(self) -> None:
        self.has_tool_spans = False
        self.tool_span_ids: set[str] = set()  # call ids of real tool spans: never doubled from messages
        self.requested: dict[str, _Requested] = {}
        self.latest_input: tuple[int, Any, str] = (-1, None, "")  # start, raw input of the newest model call, format
        self.arguments_missing = False


class ProducerReader:
    """Turns any producer's spans into `SpanRecord`s in looptrace's vocabulary; remembers per trace what the messages
    said."""

    def __init__(self, max_open_traces: int = _MAX_OPEN_TRACES) -> None:
        self.max_open_traces = max_open_traces
        self._traces: OrderedDict[str, _TraceState] = OrderedDict()
        self._conversations = ConversationIndex(max_open_traces)
        self.bare_call = False  # whether the span translated last was a lone model call that recorded no messages

    # -- span by span -------------------------------------------------------------------------------------------

    def translate(self, span: SpanRecord) -> SpanRecord:
        attributes = span.attributes
        kind = attributes.get(OI_SPAN_KIND)
        # A span that follows the GenAI conventions is read as such even when it also names an OpenInference kind:
        # looptrace's own spans do (for Phoenix), and their gen_ai.* attributes are the complete record.
        neutral: SpanRecord
        if kind is not None and not attributes.get(sc.GEN_AI_OPERATION_NAME) and sc.TURN_INDEX not in attributes:
            neutral = _from_openinference(span, str(kind).upper())
        elif sc.GEN_AI_OPERATION_NAME not in attributes and any(
                key.startswith((OLL_PROMPT, OLL_COMPLETION)) for key in attributes):  # OpenLLMetry named no operation
            neutral = _from_openllmetry(span)
        elif type(span) is SpanRecord and span.parent_span_id is not None:
            # A decoded record (watch's, a file's) has every field the rebuilder reads, and only a root is ever moved
            # to a session or conversation: a child is read as it is, not copied.
            neutral = span
        else:
            neutral = _from_gen_ai(span)
        model_call = neutral.attributes.get(sc.GEN_AI_OPERATION_NAME) in MODEL_OPERATIONS
        raw, form = None, ""  # the input messages: read here only for a lone call, else in _remember if needed
        self.bare_call = False
        if not _join_session(neutral, span) and model_call and span.parent_span_id is None:
            raw, form = _raw_input(span)
            if raw is not None:
                self._join_conversation(neutral, raw, form)
            else:
                self.bare_call = _records_no_messages(neutral)
        self._remember(neutral, span, raw, form)
        return neutral

    def _join_conversation(self, neutral: SpanRecord, raw: Any, form: str) -> None:
        """A lone model call with a history joins the conversation that history continues."""
        history = _canonical_history(raw, form)
        if not history:
            return  # a history that cannot be read (capped JSON) is not guessed at: the call stays a run of its own
        neutral.trace_id = self._conversations.place(neutral.trace_id, history)
        neutral.parent_span_id = "conversation"  # not a root: the run stays open for the conversation's next call

    def _remember(self, neutral: SpanRecord, original: SpanRecord, raw: Any, form: str) -> None:
        state = self._traces.get(neutral.trace_id)
        if state is None:
            state = self._traces[neutral.trace_id] = _TraceState()
            if len(self._traces) > self.max_open_traces:
                self._traces.popitem(last=False)
        a = neutral.attributes
        operation = a.get(sc.GEN_AI_OPERATION_NAME)
        if operation == sc.OPERATION_EXECUTE_TOOL:
            state.has_tool_spans = True
            if a.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS) is None and a.get(sc.TOOL_ARGUMENTS_DIGEST) is None:
                state.arguments_missing = True
            if a.get(sc.GEN_AI_TOOL_CALL_ID):
                state.tool_span_ids.add(str(a[sc.GEN_AI_TOOL_CALL_ID]))
        elif operation in MODEL_OPERATIONS and not state.has_tool_spans:
            # Messages are read only while the trace has shown no tool span: a trace with tool spans has it all there.
            if raw is None:
                raw, form = _raw_input(original)
            for requested in _requested_calls(original, neutral.start_ns):
                known = state.requested.get(requested.call_id)
                if known is None or not known.exact:  # the requesting call's own output places it exactly
                    state.requested[requested.call_id] = requested
            if raw is not None and neutral.parent_span_id == "conversation":
                # The history's assistant messages: the calls of earlier model calls, their spans seen or not.
                for requested in _history_calls(raw, form, neutral.start_ns - 1):
                    state.requested.setdefault(requested.call_id, requested)
            if raw is not None and neutral.start_ns >= state.latest_input[0]:
                state.latest_input = (neutral.start_ns, raw, form)

    # -- per trace, when judged or checked ----------------------------------------------------------------------

    def message_calls(self, trace_id: str) -> list[SpanRecord]:
        """The tool calls read from messages, as execute_tool spans (none when the trace has real tool spans)."""
        state = self._traces.get(trace_id)
        if state is None or state.has_tool_spans or not state.requested:
            return []
        _, raw, form = state.latest_input
        responses = _responses(raw, form) if raw is not None else {}
        spans = []
        for requested in state.requested.values():
            if requested.call_id in state.tool_span_ids:
                continue
            attributes: dict[str, Any] = {
                sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: requested.tool,
                sc.GEN_AI_TOOL_CALL_ID: requested.call_id, sc.GEN_AI_TOOL_CALL_ARGUMENTS: requested.arguments,
            }
            response = responses.get(requested.call_id)
            if response is not None:
                text, is_error = response
                attributes[sc.GEN_AI_TOOL_CALL_RESULT] = text
                if is_error:
                    attributes[sc.TOOL_IS_ERROR] = True
            spans.append(SpanRecord(trace_id=trace_id, span_id=f"message:{requested.call_id}",
                                     parent_span_id="message", name=f"execute_tool {requested.tool}",
                                     start_ns=requested.after_ns + 1, attributes=attributes))
        return spans

    def limits(self, trace_id: str) -> dict[str, str]:
        """The rules that cannot run on this trace, and why."""
        state = self._traces.get(trace_id)
        if state is None:
            return {}
        not_run: dict[str, str] = {}
        if state.arguments_missing:
            reason = "tool arguments were not recorded (content capture off?): calls cannot be compared"
            not_run.update({REPEATED_CALL: reason, CYCLE: reason, FAILING_TOOL: reason})
        if not state.has_tool_spans and state.requested:
            _, raw, form = state.latest_input
            if not _errors_flagged(raw, form):
                reason = "tool results were read from messages that carry no error flag"
                not_run.setdefault(IGNORED_ERROR, reason)
                not_run.setdefault(FAILING_TOOL, reason)
        return not_run

    def forget(self, trace_id: str) -> None:
        self._traces.pop(trace_id, None)
        self._conversations.forget(trace_id)


# --- one producer at a time -----------------------------------------------------------------------------------------

def _copy(span: SpanRecord, attributes: dict[str, Any]) -> SpanRecord:
    return SpanRecord(trace_id=span.trace_id, span_id=span.span_id, parent_span_id=span.parent_span_id,
                       name=span.name, start_ns=span.start_ns, attributes=attributes,
                       status_code=getattr(span, "status_code", 0), end_ns=getattr(span, "end_ns", 0))


def _from_gen_ai(span: SpanRecord) -> SpanRecord:
    # Already our vocabulary; the dict is shared, not copied: nothing downstream writes to it.
    return _copy(span, span.attributes)


def _answer(text: str) -> str:
    return json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}], ensure_ascii=False)


def _from_openinference(span: SpanRecord, kind: str) -> SpanRecord:
    a = span.attributes
    out: dict[str, Any] = {}
    if kind == "LLM":
        out[sc.GEN_AI_OPERATION_NAME] = sc.OPERATION_CHAT
        if a.get(OI_FINISH_REASON):
            out[sc.STOP_REASON] = str(a[OI_FINISH_REASON])
        else:
            stop = _json_field(a.get(OI_OUTPUT_VALUE), "stop_reason")
            if stop:
                out[sc.STOP_REASON] = stop
        text = _indexed_text(a, OI_OUTPUT_MESSAGES)
        if text is not None:
            out[sc.GEN_AI_OUTPUT_MESSAGES] = _answer(text)
        out.update((ours, a[theirs]) for theirs, ours in _OI_USAGE.items() if theirs in a)
    elif kind == "TOOL":
        out[sc.GEN_AI_OPERATION_NAME] = sc.OPERATION_EXECUTE_TOOL
        out[sc.GEN_AI_TOOL_NAME] = a.get(OI_TOOL_NAME) or span.name
        arguments = a.get(OI_TOOL_PARAMETERS, a.get(OI_INPUT_VALUE))
        if arguments is not None:
            out[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments
        if a.get(OI_TOOL_CALL_ID):
            out[sc.GEN_AI_TOOL_CALL_ID] = a[OI_TOOL_CALL_ID]
        if a.get(OI_OUTPUT_VALUE) is not None:
            out[sc.GEN_AI_TOOL_CALL_RESULT] = a[OI_OUTPUT_VALUE]
    elif kind == "AGENT" and a.get(OI_OUTPUT_VALUE) is not None:
        out[sc.GEN_AI_OUTPUT_MESSAGES] = _answer(str(a[OI_OUTPUT_VALUE]))
    for key in SESSION_KEYS:
        if key in a:
            out[key] = a[key]
    return _copy(span, out)


def _from_openllmetry(span: SpanRecord) -> SpanRecord:
    a = span.attributes
    out = {key: value for key, value in a.items() if not key.startswith((OLL_PROMPT, OLL_COMPLETION))}
    out.setdefault(sc.GEN_AI_OPERATION_NAME, sc.OPERATION_CHAT)
    completions = _indexed(a, OLL_COMPLETION)
    if completions:
        last = completions[max(completions)]
        if last.get("finish_reason"):
            out[sc.STOP_REASON] = str(last["finish_reason"])
        texts = [str(c["content"]) for _, c in sorted(completions.items()) if c.get("content") is not None]
        if texts:
            out[sc.GEN_AI_OUTPUT_MESSAGES] = _answer("\n".join(texts))
    return _copy(span, out)


def run_key(span: SpanRecord) -> str:
    """The run a span belongs to: its trace, or its session for a model call that is alone in its trace."""
    a = span.attributes
    if span.parent_span_id is not None:
        return span.trace_id
    kind = a.get(OI_SPAN_KIND)
    if kind is not None:
        is_model_call = str(kind).upper() == "LLM"
    else:
        is_model_call = (a.get(sc.GEN_AI_OPERATION_NAME) in MODEL_OPERATIONS
                         or any(key.startswith(OLL_COMPLETION) for key in a))
    session = next((a[key] for key in SESSION_KEYS if a.get(key)), None) if is_model_call else None
    return f"{SESSION_PREFIX}{session}" if session is not None else span.trace_id


def _join_session(neutral: SpanRecord, original: SpanRecord) -> bool:
    """A lone model call with a session id belongs to its session's run, not to a one-span trace of its own."""
    key = run_key(original)
    if key != original.trace_id:
        neutral.trace_id = key
        neutral.parent_span_id = "session"  # not a root: the run stays open for the session's next call
        return True
    return False


def _records_no_messages(neutral: SpanRecord) -> bool:
    """A model call that says which response it got but nothing of the conversation: the SDK's own span, say."""
    a = neutral.attributes
    return bool(a.get(sc.GEN_AI_RESPONSE_ID)) and sc.GEN_AI_OUTPUT_MESSAGES not in a


# --- conversations --------------------------------------------------------------------------------------------------

def _history_messages(raw: Any, form: str) -> list[Any]:
    """The input messages of a model call, one item per message, in the producer's own shape."""
    if form == "gen_ai":
        return _json_list(raw)
    prefix = OLL_PROMPT if form == "openllmetry" else OI_INPUT_MESSAGES
    return [message for _, message in sorted(_indexed(raw, prefix).items())]


def _canonical_history(raw: Any, form: str) -> list[str]:
    """Each input message as canonical text: equal messages give equal text, whatever the attributes' order."""
    return [json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
            for message in _history_messages(raw, form)]


def _history_calls(raw: Any, form: str, at_ns: int) -> list[_Requested]:
    """The tool calls in a history's assistant messages (placed at ``at_ns``: their own call's start is unknown)."""
    found: list[_Requested] = []
    for message in _history_messages(raw, form):
        if not isinstance(message, dict):
            continue
        if form == "gen_ai":
            for part in message.get("parts") or ():
                if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("id"):
                    found.append(_Requested(at_ns, str(part.get("name")), part.get("arguments"), str(part["id"]),
                                            exact=False))
            continue
        calls = _indexed(message, "tool_calls.") or _indexed(message, "message.tool_calls.")
        found += [_Requested(at_ns, name, arguments, call_id, exact=False)
                  for call_id, name, arguments in _tool_call_fields(calls)]
        content = message.get("content", message.get("message.content"))
        if not calls and isinstance(content, str) and '"tool_use"' in content:  # Anthropic blocks, as JSON text
            for block in _json_list(content):
                if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id"):
                    found.append(_Requested(at_ns, str(block.get("name")), block.get("input"), str(block["id"]),
                                            exact=False))
    return found


# --- messages -------------------------------------------------------------------------------------------------------

def _requested_calls(span: SpanRecord, start_ns: int) -> list[_Requested]:
    """The tool calls a model call asked for, in whatever form its producer wrote them."""
    a = span.attributes
    found: list[_Requested] = []
    raw = a.get(sc.GEN_AI_OUTPUT_MESSAGES)
    if isinstance(raw, str) and '"tool_call"' in raw:
        for message in _json_list(raw):
            for part in message.get("parts") or () if isinstance(message, dict) else ():
                if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("id"):
                    found.append(_Requested(start_ns, str(part.get("name")), part.get("arguments"), str(part["id"])))
    for prefix in (OLL_COMPLETION, OI_OUTPUT_MESSAGES):
        for message in _indexed(a, prefix).values():
            calls = _indexed(message, "tool_calls.") or _indexed(message, "message.tool_calls.")
            found += [_Requested(start_ns, name, arguments, call_id)
                      for call_id, name, arguments in _tool_call_fields(calls)]
    return found


def _tool_call_fields(calls: dict[int, dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(id, name, arguments) of each tool call an indexed message lists, OpenLLMetry's ``tool_calls.N.*`` or
    OpenInference's ``message.tool_calls.N.tool_call.*``; a call without an id or a name is left out."""
    found = []
    for call in calls.values():
        call_id = call.get("id", call.get("tool_call.id"))
        name = call.get("name", call.get("tool_call.function.name"))
        if call_id and name:
            found.append((str(call_id), str(name), call.get("arguments", call.get("tool_call.function.arguments"))))
    return found


def _raw_input(span: SpanRecord) -> tuple[Any, str]:
    a = span.attributes
    if a.get(sc.GEN_AI_INPUT_MESSAGES) is not None:
        return a[sc.GEN_AI_INPUT_MESSAGES], "gen_ai"
    prompts = {k: v for k, v in a.items() if k.startswith(OLL_PROMPT)}
    if prompts:
        return prompts, "openllmetry"
    inputs = {k: v for k, v in a.items() if k.startswith(OI_INPUT_MESSAGES)}
    if inputs:
        return inputs, "openinference_tool_role"
    return None, ""


def _responses(raw: Any, form: str) -> dict[str, tuple[str, bool]]:
    """Tool results by call id, each with whether the producer flagged it an error (False when it cannot say)."""
    found: dict[str, tuple[str, bool]] = {}
    if form == "gen_ai":
        for message in _json_list(raw):
            for part in message.get("parts") or () if isinstance(message, dict) else ():
                if isinstance(part, dict) and part.get("type") == "tool_call_response" and part.get("id"):
                    found[str(part["id"])] = (_text(part.get("response")), False)
        return found
    prefix = OLL_PROMPT if form == "openllmetry" else OI_INPUT_MESSAGES
    for message in _indexed(raw, prefix).values():
        role = message.get("role", message.get("message.role"))
        content = message.get("content", message.get("message.content"))
        call_id = message.get("tool_call_id", message.get("message.tool_call_id"))
        if role == "tool" and call_id:
            found[str(call_id)] = (_text(content), False)
        elif role == "user" and isinstance(content, str) and '"tool_result"' in content:
            for block in _json_list(content):
                if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id"):
                    found[str(block["tool_use_id"])] = (_text(block.get("content")), bool(block.get("is_error")))
    return found


def _errors_flagged(raw: object, form: str) -> bool:
    """Whether the producer's messages carry the tool-error flag at all (Anthropic tool_result blocks do)."""
    if form != "openllmetry" or not isinstance(raw, dict):
        return False
    return any(isinstance(v, str) and '"tool_result"' in v for v in raw.values())


def _indexed(attributes: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """`prefix.N.rest = v` attributes grouped as {N: {rest: v}}."""
    groups: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        match = _INDEXED.match(key[len(prefix):])
        if match:
            groups.setdefault(int(match.group(1)), {})[match.group(2)] = value
    return groups


def _indexed_text(attributes: dict[str, Any], prefix: str) -> str | None:
    """The text of OpenInference output messages: `message.content`, or the text `message.contents.K` parts."""
    texts = []
    for _, message in sorted(_indexed(attributes, prefix).items()):
        if message.get("message.content") is not None:
            texts.append(str(message["message.content"]))
        parts = _indexed(message, "message.contents.")
        texts.extend(str(p["message_content.text"]) for _, p in sorted(parts.items())
                     if p.get("message_content.type") == "text" and p.get("message_content.text") is not None)
    return "\n".join(texts) if texts else None


def _json_list(raw: object) -> list[Any]:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return []  # a capped (truncated) message list: what cannot be parsed is not guessed at
    return value if isinstance(value, list) else []


def _json_field(raw: object, name: str) -> str | None:
    if not isinstance(raw, str) or f'"{name}"' not in raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return str(value[name]) if isinstance(value, dict) and value.get(name) else None


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
