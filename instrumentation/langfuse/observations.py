"""Langfuse observations turned back into the spans they were ingested from, for the run rebuilder.

`looptrace detect` rebuilds runs from spans (``tracefile.read.SpanRecord``); Langfuse keeps what it ingested as
observations. This module undoes, as far as what is stored allows, what Langfuse's OpenTelemetry ingestion did to
each span (langfuse/langfuse, packages/shared/src/server/otel/OtelIngestionProcessor.ts, ``processToEvent``):

- Attributes: kept in the observation's metadata under ``attributes``, each non-string value JSON-encoded. Langfuse
  v3 (and the v1 API) returns that as ``metadata.attributes = {key: text}``; the v4 events store flattens it to
  ``metadata["attributes.<key>"]`` and the v2 API JSON-decodes each value again (``parseMetadataCHRecordToDomain``).
  Both shapes are read, and each value gets back the type the rebuilder reads it as (``looptrace.tool.is_error`` a
  bool, finish reasons a list, identifiers text); any other value is decoded as the v2 API decodes it.
- Input and output: the attribute that became the observation's ``input``/``output`` is *removed* from the
  attributes (``extractInputAndOutput``): ``input.value``/``output.value`` (OpenInference, and looptrace's agent
  span), ``gen_ai.input.messages``/``gen_ai.output.messages``, ``gen_ai.tool.call.arguments``/``result``,
  OpenLLMetry's ``gen_ai.prompt.N.*``/``gen_ai.completion.N.*`` (rebuilt into nested lists), pydantic-ai's
  ``pydantic_ai.all_messages``/``final_result``. Which one it was is read back from what the observation still
  says (its operation, its OpenInference kind, its scope, the shape of the value), and the attribute is put back.
  Tool definitions moved into the input (``{"messages": [...], "tools": [...]}``) are taken out again.
- Names: Langfuse names a tool span after ``gen_ai.tool.name`` and a pydantic-ai span after ``logfire.msg``
  (``extractName``); where the operation is known, the conventions' span name is restored.
- Status: only the level survives (ERROR for an error status, unless ``langfuse.observation.level`` said otherwise):
  an ERROR level becomes an error status again.
- Time: Langfuse floors span times to the millisecond, and a scripted or fast agent fits whole turns in one. Within
  a millisecond the order is rebuilt from the tree: a parent before its children, looptrace's turns by their index,
  siblings by end time (a call that ended first started first), model calls before tool calls.

Observations that were not ingested from OpenTelemetry (Langfuse's own SDKs and its ingestion API) have no span
attributes; for those the observation's own fields are read: a TOOL observation is a tool call (name, input as the
arguments, output as the result, an ERROR level as a failure), a GENERATION a model call, an AGENT the run.

What Langfuse does not keep is not made up: span events (a recorded exception), the span's raw status once a level
overrides it, OpenInference's ``llm.*_messages.*`` when ``input.value`` was there too (the response text is read back
from the raw response in ``output.value``), the model's messages on looptrace's agent span (its ``output.value`` is
the same final answer), and sub-millisecond time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from ..offline.readers import (
    FOREIGN_EXACT_KEYS,
    OI_INPUT_MESSAGES,
    OI_INPUT_VALUE,
    OI_OUTPUT_MESSAGES,
    OI_OUTPUT_VALUE,
    OI_SPAN_KIND,
    OLL_COMPLETION,
    OLL_PROMPT,
)
from ..recording import semconv as sc
from ..tracefile.read import SpanRecord

NS_PER_MS = 1_000_000
ERROR_STATUS = 2
LANGFUSE_SDK_SCOPE = "langfuse-sdk"  # Langfuse's own SDKs: their observations keep no span attributes
PYDANTIC_AI_SCOPE = "pydantic-ai"
PYDANTIC_AI_MESSAGES = "pydantic_ai.all_messages"
PYDANTIC_AI_RESULT = "final_result"
LOGFIRE_MESSAGE = "logfire.msg"
_ATTRIBUTES = "attributes"
_FLAT_ATTRIBUTES = "attributes."
_SCOPE = "scope"

# The type each attribute the rebuilder reads must have again (Langfuse stored every value as text).
_BOOLEAN_KEYS = frozenset({sc.TOOL_IS_ERROR, sc.GEN_AI_REQUEST_STREAM, sc.JUDGE})
_LIST_KEYS = frozenset({sc.GEN_AI_RESPONSE_FINISH_REASONS, sc.GEN_AI_REQUEST_STOP_SEQUENCES})
_INTEGER_KEYS = frozenset({sc.TURN_INDEX, sc.RUN_TURNS, sc.RUN_ANOMALY_COUNT, sc.RUN_USAGE_TOTAL_TOKENS,
                           sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_OUTPUT_TOKENS})
_TEXT_KEYS = frozenset({
    sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_TOOL_NAME, sc.GEN_AI_TOOL_CALL_ID, sc.GEN_AI_TOOL_CALL_ARGUMENTS,
    sc.GEN_AI_TOOL_CALL_RESULT, sc.TOOL_ARGUMENTS_DIGEST, sc.TOOL_RESULT_DIGEST, sc.ERROR_TYPE, sc.STOP_REASON,
    sc.GEN_AI_OUTPUT_MESSAGES, sc.RUN_STATUS, sc.GEN_AI_CONVERSATION_ID, sc.GEN_AI_AGENT_NAME, sc.GEN_AI_REQUEST_MODEL,
    *FOREIGN_EXACT_KEYS,
})
# Where a span's time ties with a sibling's, a model call came before the tool calls it asked for.
_TYPE_RANK = {"AGENT": 0, "CHAIN": 1, "SPAN": 1, "GENERATION": 2, "TOOL": 3}
_MODEL_OPERATIONS = frozenset({sc.OPERATION_CHAT, "text_completion", "generate_content"})


@dataclass(frozen=True, slots=True)
class StoredAttributes:
    """What an observation's metadata says about the span it came from."""

    attributes: dict[str, Any]
    scope: str | None
    from_opentelemetry: bool  # ingested from an OpenTelemetry span (not Langfuse's SDK or its ingestion API)


def stored_attributes(metadata: object) -> StoredAttributes:
    """The span attributes and instrumentation scope in an observation's metadata, in either stored shape."""
    if isinstance(metadata, str):
        metadata = _json_or(metadata, None)
    if not isinstance(metadata, Mapping):
        return StoredAttributes({}, None, False)
    raw: dict[str, Any] = {}
    nested = metadata.get(_ATTRIBUTES)
    if isinstance(nested, str):
        nested = _json_or(nested, None)
    if isinstance(nested, Mapping):
        raw.update(nested)
    raw.update({key[len(_FLAT_ATTRIBUTES):]: value for key, value in metadata.items()
                if isinstance(key, str) and key.startswith(_FLAT_ATTRIBUTES)})
    scope_value = metadata.get(_SCOPE)
    scope = scope_value.get("name") if isinstance(scope_value, Mapping) else metadata.get("scope.name")
    otel = scope is not None or "resourceAttributes" in metadata or any(
        isinstance(key, str) and key.startswith("resourceAttributes.") for key in metadata)
    scope_name = str(scope) if scope is not None else None
    if scope_name is not None and scope_name.startswith(LANGFUSE_SDK_SCOPE):
        otel = False  # the SDK's spans are stored without their attributes: the observation's fields are the record
    return StoredAttributes({key: attribute_value(key, value) for key, value in raw.items()}, scope_name,
                            otel and bool(raw))


def attribute_value(key: str, value: Any) -> object:
    """An attribute as the span had it, from the text (or re-decoded JSON) Langfuse stored."""
    if key in _BOOLEAN_KEYS:
        if isinstance(value, str):
            return value.strip().lower() == "true"
        return bool(value)
    if key in _LIST_KEYS:
        decoded = _json_or(value, value) if isinstance(value, str) else value
        return list(decoded) if isinstance(decoded, (list, tuple)) else [decoded]
    if key in _INTEGER_KEYS:
        try:
            return int(value)
        except (TypeError, ValueError):
            return value
    if key in _TEXT_KEYS:
        return value if isinstance(value, str) else as_text(value)
    if isinstance(value, Mapping):  # a JSON text the v2 API decoded: an attribute is never a map
        return as_text(value)
    if isinstance(value, str):  # the v1 API's text: decoded as the v2 API decodes it, so both read the same
        decoded = _json_or(value, value, strict=True)
        return decoded if isinstance(decoded, (bool, int, float, list)) else value
    return value


# --- one observation ------------------------------------------------------------------------------------------------


def observation_span(observation: Mapping[str, Any], *, session_id: str | None = None) -> SpanRecord:
    """One observation as a span in the rebuilder's vocabulary, start and end at millisecond precision (``ordered``
    spreads ties). ``session_id`` is the trace's Langfuse session, for observations that carry no attributes."""
    stored = stored_attributes(observation.get("metadata"))
    if stored.from_opentelemetry:
        attributes = dict(stored.attributes)
        attributes.update(_restored_io(attributes, stored.scope, observation.get("input"), observation.get("output")))
    else:
        attributes = _native_attributes(observation, session_id)
    start = epoch_ms(observation.get("startTime")) or 0
    end = epoch_ms(observation.get("endTime"))
    parent = observation.get("parentObservationId")
    return SpanRecord(
        trace_id=str(observation.get("traceId") or "").lower(),
        span_id=str(observation.get("id") or "").lower(),
        parent_span_id=str(parent).lower() if parent else None,
        name=_span_name(str(observation.get("name") or ""), attributes),
        start_ns=start * NS_PER_MS,
        attributes=attributes,
        status_code=ERROR_STATUS if observation.get("level") == "ERROR" else 0,
        end_ns=(end if end is not None else start) * NS_PER_MS,
    )


def _restored_io(a: dict[str, Any], scope: str | None, raw_input: object, raw_output: object) -> dict[str, Any]:
    """The attributes Langfuse turned into the observation's input and output, under their own names again."""
    operation = a.get(sc.GEN_AI_OPERATION_NAME)
    kind = a.get(OI_SPAN_KIND)
    given_input, unwrapped = _without_tools(_decoded(raw_input))
    input_text = as_text(given_input) if unwrapped else as_text(raw_input)
    output = _decoded(raw_output)
    output_text = as_text(raw_output)
    restored: dict[str, Any] = {}

    def put(key: str, text: str | None) -> None:
        if text is not None:
            restored[key] = text

    if scope == PYDANTIC_AI_SCOPE and operation == sc.OPERATION_INVOKE_AGENT:
        put(PYDANTIC_AI_MESSAGES, input_text)
        put(PYDANTIC_AI_RESULT, output_text)
    elif operation == sc.OPERATION_EXECUTE_TOOL or (operation is None and kind is None and sc.GEN_AI_TOOL_NAME in a):
        put(sc.GEN_AI_TOOL_CALL_ARGUMENTS, input_text)
        put(sc.GEN_AI_TOOL_CALL_RESULT, output_text)
    elif operation is not None:
        put(sc.GEN_AI_INPUT_MESSAGES if _is_messages(given_input) else OI_INPUT_VALUE, input_text)
        if _is_messages(output):
            put(sc.GEN_AI_OUTPUT_MESSAGES, output_text)
        elif output_text is not None:
            restored[OI_OUTPUT_VALUE] = output_text
            if operation == sc.OPERATION_INVOKE_AGENT:
                # looptrace's agent span: Langfuse kept output.value and dropped the same answer as messages
                restored[sc.GEN_AI_OUTPUT_MESSAGES] = _answer(output_text)
    elif kind is not None:
        restored.update(_indexed_or(OI_INPUT_VALUE, OI_INPUT_MESSAGES, given_input, input_text))
        restored.update(_indexed_or(OI_OUTPUT_VALUE, OI_OUTPUT_MESSAGES, output, output_text))
        if str(kind).upper() == "LLM" and OI_OUTPUT_VALUE in restored:
            text = _response_text(output)
            if text is not None:  # llm.output_messages were dropped in favour of output.value: its text, again
                restored[f"{OI_OUTPUT_MESSAGES}0.message.role"] = "assistant"
                restored[f"{OI_OUTPUT_MESSAGES}0.message.content"] = text
    else:
        restored.update(_indexed_or(OI_INPUT_VALUE, OLL_PROMPT, given_input, input_text))
        restored.update(_indexed_or(OI_OUTPUT_VALUE, OLL_COMPLETION, output, output_text))
    return restored


def _indexed_or(plain_key: str, prefix: str, value: object, text: str | None) -> dict[str, Any]:
    """Attributes Langfuse rebuilt into nested lists (``prefix.N.key`` -> ``[{key: ...}]``), flattened again; any
    other value under ``plain_key``."""
    if isinstance(value, list) and value and all(item is None or isinstance(item, Mapping) for item in value):
        flat: dict[str, Any] = {}
        _flatten(prefix.rstrip("."), value, flat)
        return flat
    return {plain_key: text} if text is not None else {}


def _flatten(path: str, value: object, into: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(f"{path}.{key}", item, into)
    elif isinstance(value, list) and any(isinstance(item, Mapping) for item in value):
        for index, item in enumerate(value):
            if item is not None:  # a gap Langfuse filled in a sparse list
                _flatten(f"{path}.{index}", item, into)
    elif value is not None:
        into[path] = value


def _native_attributes(observation: Mapping[str, Any], session_id: str | None) -> dict[str, Any]:
    """An observation without span attributes (Langfuse's SDKs, its ingestion API), read from its own fields."""
    kind = observation.get("type")
    attributes: dict[str, Any] = {}
    if kind == "TOOL":
        attributes[sc.GEN_AI_OPERATION_NAME] = sc.OPERATION_EXECUTE_TOOL
        attributes[sc.GEN_AI_TOOL_NAME] = str(observation.get("name") or "tool")
        for key, field in ((sc.GEN_AI_TOOL_CALL_ARGUMENTS, "input"), (sc.GEN_AI_TOOL_CALL_RESULT, "output")):
            text = as_text(observation.get(field))
            if text is not None:
                attributes[key] = text
    elif kind in ("GENERATION", "AGENT"):
        attributes[sc.GEN_AI_OPERATION_NAME] = sc.OPERATION_CHAT if kind == "GENERATION" else sc.OPERATION_INVOKE_AGENT
        text = _response_text(_decoded(observation.get("output")))
        if text is not None:
            attributes[sc.GEN_AI_OUTPUT_MESSAGES] = _answer(text)
        if kind == "GENERATION":
            attributes.update(_native_usage(observation))
    if session_id and attributes:
        attributes[sc.GEN_AI_CONVERSATION_ID] = session_id
    return attributes


def _native_usage(observation: Mapping[str, Any]) -> dict[str, Any]:
    """A generation's model and token counts (``usageDetails``: input, output, cache reads and writes) in the GenAI
    conventions' names, what its loop's cost is read from. Langfuse's own ``input`` excludes the cache, as
    Anthropic's does; the conventions' input count includes it."""
    attributes: dict[str, Any] = {}
    model = observation.get("model")
    if isinstance(model, str) and model:
        attributes[sc.GEN_AI_REQUEST_MODEL] = model
    details = observation.get("usageDetails")
    if not isinstance(details, Mapping) or not details:
        return attributes
    counts = {key: value for key, value in details.items()
              if isinstance(value, int) and not isinstance(value, bool) and value >= 0}
    # Langfuse's own names (what looptrace sends), or Anthropic's (what its integrations pass through)
    cache_read = counts.get("input_cache_read", counts.get("cache_read_input_tokens", 0))
    cache_write = (sum(v for k, v in counts.items() if k.startswith("input_cache_creation"))
                   or counts.get("cache_creation_input_tokens", 0))
    if "input" in counts or "output" in counts:
        attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = counts.get("input", 0) + cache_read + cache_write
        attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = counts.get("output", 0)
        attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = cache_read
        attributes[sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] = cache_write
    return attributes


def _span_name(name: str, a: Mapping[str, Any]) -> str:
    """The span's own name where Langfuse replaced it with the tool's name or pydantic-ai's log message."""
    operation = a.get(sc.GEN_AI_OPERATION_NAME)
    tool = a.get(sc.GEN_AI_TOOL_NAME)
    if operation == sc.OPERATION_EXECUTE_TOOL and tool and name == tool:
        return sc.tool_span_name(str(tool))
    if a.get(LOGFIRE_MESSAGE) and name == a[LOGFIRE_MESSAGE]:
        if operation == sc.OPERATION_INVOKE_AGENT and a.get(sc.GEN_AI_AGENT_NAME):
            return sc.agent_span_name(str(a[sc.GEN_AI_AGENT_NAME]))
        if operation in _MODEL_OPERATIONS and a.get(sc.GEN_AI_REQUEST_MODEL):
            return f"{operation} {a[sc.GEN_AI_REQUEST_MODEL]}"
    return name


# --- one trace ------------------------------------------------------------------------------------------------------


def ordered(spans: Iterable[SpanRecord], types: Mapping[str, str] | None = None) -> list[SpanRecord]:
    """A trace's spans in the order a trace file holds them (each span after its children, so a root comes last),
    with start times spread within each millisecond so that they keep the order they ran in.

    ``types`` gives each span id's Langfuse observation type, for the tie between a model call and a tool call.
    """
    spans = list(spans)
    by_id = {span.span_id: span for span in spans}
    children: dict[str, list[SpanRecord]] = {}
    roots: list[SpanRecord] = []
    for span in spans:
        if span.parent_span_id in by_id and span.parent_span_id != span.span_id:
            children.setdefault(span.parent_span_id, []).append(span)
        else:
            roots.append(span)

    def sort_key(span: SpanRecord) -> tuple[int, int, int, int, str]:
        turn = span.attributes.get(sc.TURN_INDEX)
        return (span.start_ns, turn if isinstance(turn, int) else 0, span.end_ns,
                _TYPE_RANK.get((types or {}).get(span.span_id, ""), 1), span.span_id)

    preorder: list[SpanRecord] = []
    postorder: list[SpanRecord] = []
    visited: set[str] = set()
    # Roots first; then whatever a cycle of parent links left unreached, so that no span is ever dropped.
    for root in [*sorted(roots, key=sort_key), *sorted(spans, key=sort_key)]:
        if root.span_id in visited:
            continue
        visited.add(root.span_id)
        stack: list[tuple[SpanRecord, bool]] = [(root, False)]
        while stack:
            span, expanded = stack.pop()
            if expanded:
                postorder.append(span)
                continue
            preorder.append(span)
            stack.append((span, True))
            for child in sorted(children.get(span.span_id, ()), key=sort_key, reverse=True):
                if child.span_id not in visited:
                    visited.add(child.span_id)
                    stack.append((child, False))
    seen_in_ms: dict[int, int] = {}
    for span in preorder:
        rank = seen_in_ms.get(span.start_ns, 0)
        seen_in_ms[span.start_ns] = rank + 1
        span.start_ns += min(rank, NS_PER_MS - 1)
    return postorder


def trace_spans(observations: Iterable[Mapping[str, Any]], *, session_id: str | None = None) -> list[SpanRecord]:
    """The spans of one trace's observations, ready to feed to ``RunRebuilder.add`` in this order."""
    spans: list[SpanRecord] = []
    types: dict[str, str] = {}
    for observation in observations:
        span = observation_span(observation, session_id=session_id)
        spans.append(span)
        types[span.span_id] = str(observation.get("type") or "")
    return ordered(spans, types)


# --- values ---------------------------------------------------------------------------------------------------------


def as_text(value: object) -> str | None:
    """A value as the text an attribute held: strings as they are, anything else as compact JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _decoded(value: object) -> object:
    """A stored input or output as a value: the v2 API returns the stored text, the v1 API the decoded JSON."""
    return _json_or(value, value) if isinstance(value, str) else value


def _json_or(text: str, default: object, *, strict: bool = False) -> object:
    """The JSON in a text, or ``default``; ``strict`` refuses NaN and Infinity, as JavaScript's JSON.parse does."""
    try:
        return json.loads(text, parse_constant=_refuse) if strict else json.loads(text)
    except (ValueError, RecursionError):
        return default


def _refuse(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not JSON")


def _without_tools(value: object) -> tuple[object, bool]:
    """The input before Langfuse merged tool definitions into it (``normalizeToolsForObservation``), and whether it
    had: a message list became ``{"messages", "tools"}``, a text ``{"prompt", "tools"}``, nothing ``{"tools"}``."""
    if isinstance(value, Mapping) and "tools" in value:
        keys = set(value) - {"tools"}
        if keys == {"messages"}:
            return value["messages"], True
        if keys == {"prompt"}:
            return value["prompt"], True
        if not keys:
            return None, True
    return value, False


def _is_messages(value: object) -> bool:
    """Whether a value is a GenAI conventions message list (each a role; parts, except the system message Langfuse
    puts in front from ``gen_ai.system_instructions``)."""
    return (isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m for m in value)
            and (not value or any("parts" in m for m in value)))


def _response_text(value: object) -> str | None:
    """The text of a model's answer as Langfuse kept it: plain text, a message, or a provider's raw response
    (Anthropic's content blocks, OpenAI's choices)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [t for t in (_response_text(item) for item in value) if t]
        return "\n".join(texts) if texts else None
    if not isinstance(value, Mapping):
        return None
    if isinstance(value.get("choices"), list):
        return _response_text([choice.get("message") for choice in value["choices"] if isinstance(choice, Mapping)])
    content = value.get("content", value.get("text"))
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [str(block.get("text")) for block in content
                 if isinstance(block, Mapping) and block.get("type") == "text" and block.get("text") is not None]
        return "\n".join(texts) if texts else None
    return None


def _answer(text: str) -> str:
    return as_text([{"role": "assistant", "parts": [{"type": "text", "content": text}]}]) or ""


def epoch_ms(value: object) -> int | None:
    """Milliseconds since the epoch of an ISO 8601 time (Langfuse's are in UTC, at millisecond precision)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
