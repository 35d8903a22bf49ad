"""A stand-in for Langfuse's public REST API, holding traces the way Langfuse stores what it ingests over OTLP.

``FakeLangfuse`` is a ThreadingHTTPServer on 127.0.0.1, port 0, that answers:

* ``GET /api/public/v2/observations``: cursor pages (newest first, ``meta.cursor`` absent on the last page), field
  groups (``fields``; core and basic without it), the filters traceId, userId, sessionId, type, environment (any of),
  isRootObservation, fromStartTime (inclusive), toStartTime (exclusive) and ``filter`` with tags (arrayOptions); a
  ``limit`` over 1000 is a 400. Metadata flattened (``attributes.<key>``) and each value JSON-decoded again, values
  over 200 characters cut unless ``io`` or ``expandMetadata`` asks for the full ones. ``v2=False`` answers 404, as a
  Langfuse v3 server does.
* ``GET /api/public/traces`` and ``GET /api/public/observations``: numbered pages with ``meta.page``, ``limit``,
  ``totalItems`` and ``totalPages``; ``limit`` at most 100. Metadata and input/output as Langfuse v3 returns them
  (top-level metadata keys, ``attributes`` an object of texts; input and output JSON-decoded). ``v1=False`` answers
  404, as Langfuse v4 in events-only mode does.
* ``POST /api/public/scores``: stores the score under its id (a known id is updated), ``{"id": ...}`` back.

Every request needs HTTP Basic auth with the fake's keys (401 with Langfuse's message otherwise; ``forbidden=True``
answers 403). ``fail(path, status, ...)`` makes the next matching requests fail: a 429 with ``Retry-After``, a 503,
or a 200 whose body is not a page (``body=`` raw text). Each request is appended to ``log`` as
``("GET", path, params)``; a test may append its own events (a sleep) to the same list to check their order.

Spans come in with ``ingest(traces_data)`` (an OTLP/JSON ``TracesData`` object, a line of a trace file) or
``ingest_file(path)``, and are stored the way Langfuse's OTel ingestion stores them (langfuse/langfuse,
packages/shared/src/server/otel/OtelIngestionProcessor.ts ``processToEvent``, ObservationTypeMapper.ts, and
ingestion/extractToolsBackend.ts ``normalizeToolsForObservation``), for the producers the tests use: the name
(``gen_ai.tool.name``, ``logfire.msg``), the type, times floored to the millisecond, the level from the status, the
input and output taken from the first attribute pair Langfuse looks at and removed from the attributes with every
other input/output attribute, the remaining attributes JSON-encoded when not strings, tool definitions moved into
the input, trace name, user, session, tags and environment. ``add_observation(...)`` stores an observation as
Langfuse's own SDKs or its ingestion API would (no span attributes).
"""

from __future__ import annotations

import base64
import json
import math
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

V2_PATH = "/api/public/v2/observations"
TRACES_PATH = "/api/public/traces"
OBSERVATIONS_PATH = "/api/public/observations"
SCORES_PATH = "/api/public/scores"
INVALID_CREDENTIALS = "Invalid credentials. Confirm that you've configured the correct host."
V2_UNAVAILABLE = ("The observations v2 API is only available in a Langfuse v4 write mode. Learn more at: "
                  "https://langfuse.com/docs/v4")
V1_UNAVAILABLE = ("This endpoint is not available on deployments running in Langfuse v4 events_only mode. Learn more "
                  "about Langfuse v4 at: https://langfuse.com/docs/v4")
METADATA_PREVIEW_CHARS = 200

# --- what ingestion does with a span --------------------------------------------------------------------------------

# Every attribute the input/output extraction may use is removed from the stored attributes, whichever it used.
_IO_KEYS = frozenset({
    "langfuse.trace.input", "langfuse.trace.output", "langfuse.observation.input", "langfuse.observation.output",
    "ai.prompt.messages", "ai.prompt", "ai.toolCall.args", "ai.response.text", "ai.result.text", "ai.toolCall.result",
    "ai.response.object", "ai.result.object", "ai.response.toolCalls", "ai.result.toolCalls",
    "gcp.vertex.agent.llm_request", "gcp.vertex.agent.llm_response", "gcp.vertex.agent.tool_call_args",
    "gcp.vertex.agent.tool_response", "prompt", "all_messages_events", "events", "lk.input_text",
    "lk.user_transcript", "lk.chat_ctx", "lk.user_input", "lk.function_tool.output", "lk.response.text",
    "mlflow.spanInputs", "mlflow.spanOutputs", "traceloop.entity.input", "traceloop.entity.output", "input.value",
    "output.value", "final_result", "pydantic_ai.all_messages", "gen_ai.system_instructions", "input", "output",
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
    "genkit:input", "genkit:output",
})
_IO_PREFIXES = ("gen_ai.prompt", "gen_ai.completion", "llm.input_messages", "llm.output_messages",
                "langfuse.trace.metadata", "langfuse.observation.metadata", "ai.telemetry.metadata")
_LANGFUSE_TYPES = {"span": "SPAN", "generation": "GENERATION", "event": "EVENT", "agent": "AGENT", "tool": "TOOL",
                   "chain": "CHAIN", "retriever": "RETRIEVER", "embedding": "EMBEDDING", "guardrail": "GUARDRAIL",
                   "evaluator": "EVALUATOR"}
_OPENINFERENCE_TYPES = {"CHAIN": "CHAIN", "RETRIEVER": "RETRIEVER", "LLM": "GENERATION", "EMBEDDING": "EMBEDDING",
                        "AGENT": "AGENT", "TOOL": "TOOL", "GUARDRAIL": "GUARDRAIL", "EVALUATOR": "EVALUATOR"}
_GENAI_TYPES = {"chat": "GENERATION", "completion": "GENERATION", "text_completion": "GENERATION",
                "generate_content": "GENERATION", "generate": "GENERATION", "embeddings": "EMBEDDING",
                "invoke_agent": "AGENT", "create_agent": "AGENT", "execute_tool": "TOOL"}
_MODEL_KEYS = ("langfuse.observation.model.name", "gen_ai.request.model", "gen_ai.response.model", "llm.model_name",
               "model")
CONTENT_EVENT = "gen_ai.client.inference.operation.details"


def js_json(value: Any) -> str:
    """JSON.stringify: compact."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _truthy(value: Any) -> bool:
    """JavaScript truthiness: "", 0, false, null and undefined are false; [] and {} are true."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return bool(value)
    return True


def _plain(value: dict[str, Any]) -> Any:
    """convertValueToPlainJavascript: an OTLP/JSON AnyValue as a plain value (a kvlist stays its JSON)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "doubleValue" in value:
        number = value["doubleValue"]
        if isinstance(number, str):
            parsed = float(number)
            return parsed if math.isfinite(parsed) else number
        return number
    if "boolValue" in value:
        return value["boolValue"]
    if "arrayValue" in value:
        return [_plain(item) for item in (value["arrayValue"] or {}).get("values") or ()]
    if "intValue" in value:
        return int(value["intValue"])
    return js_json(value)


def _attributes(items: Any) -> dict[str, Any]:
    return {item["key"]: _plain(item.get("value") or {}) for item in items or ()}


def _nested(attributes: dict[str, Any], prefix: str) -> Any:
    """convertKeyPathToNestedObject: ``prefix.0.content`` -> ``[{"content": ...}]``."""
    keys = [key[len(prefix) + 1:] for key in attributes if key.startswith(prefix + ".")]
    use_list = any(key.split(".", 1)[0].isdigit() for key in keys)
    result: Any = [] if use_list else {}
    for key in keys:
        parts = key.split(".")
        value = attributes[f"{prefix}.{key}"]
        if use_list:
            index = int(parts[0])
            while len(result) <= index:
                result.append(None)
            if result[index] is None:
                result[index] = {}
            _set_path(result[index], parts[1:], value)
        else:
            _set_path(result, parts, value)
    return result


def _set_path(target: Any, path: list[str], value: Any) -> None:
    for position, key in enumerate(path[:-1]):
        following_is_index = path[position + 1].isdigit()
        if isinstance(target, list):
            index = int(key)
            while len(target) <= index:
                target.append(None)
            if target[index] is None:
                target[index] = [] if following_is_index else {}
            target = target[index]
        else:
            if key not in target:
                target[key] = [] if following_is_index else {}
            target = target[key]
    last = path[-1]
    if isinstance(target, list):
        index = int(last)
        while len(target) <= index:
            target.append(None)
        target[index] = value
    else:
        target[last] = value


def _with_system_instructions(messages: Any, instructions: Any) -> Any:
    """prependSystemInstructions: a system message in front, unless the messages have one."""
    try:
        parsed = json.loads(messages) if isinstance(messages, str) else messages
    except ValueError:
        return messages
    if not isinstance(parsed, list) or any(isinstance(m, dict) and m.get("role") == "system" for m in parsed):
        return messages
    try:
        given = json.loads(instructions) if isinstance(instructions, str) else instructions
    except ValueError:
        given = instructions
    if isinstance(given, list):
        content = "\n".join(str(p["content"]) if isinstance(p, dict) and p.get("content") else str(p) for p in given)
    else:
        content = str(given)
    merged = [{"role": "system", "content": content}, *parsed]
    return js_json(merged) if isinstance(messages, str) else merged


def _genai_io(attributes: dict[str, Any]) -> tuple[Any, Any] | None:
    given_input, given_output = attributes.get("gen_ai.input.messages"), attributes.get("gen_ai.output.messages")
    if _truthy(given_input) and attributes.get("gen_ai.system_instructions"):
        given_input = _with_system_instructions(given_input, attributes["gen_ai.system_instructions"])
    if _truthy(given_input) or _truthy(given_output):
        return given_input, given_output
    given_input, given_output = attributes.get("gen_ai.tool.call.arguments"), attributes.get("gen_ai.tool.call.result")
    if _truthy(given_input) or _truthy(given_output):
        return given_input, given_output
    return None


def _input_output(attributes: dict[str, Any], events: list[dict[str, Any]], scope: str) -> tuple[Any, Any]:
    """extractInputAndOutput, for the attribute families of the producers under test, in Langfuse's order."""
    if attributes.get("langfuse.observation.input") is not None or \
            attributes.get("langfuse.observation.output") is not None:
        return attributes.get("langfuse.observation.input"), attributes.get("langfuse.observation.output")
    for event in events:
        if event.get("name") == CONTENT_EVENT:
            found = _genai_io(_attributes(event.get("attributes")))
            if found:
                return found
    for input_key, output_key in (("traceloop.entity.input", "traceloop.entity.output"), ("input.value", "output.value"),
                                  ("input", "output")):
        if _truthy(attributes.get(input_key)) or _truthy(attributes.get(output_key)):
            return attributes.get(input_key), attributes.get(output_key)
    if scope == "pydantic-ai":
        given_input, given_output = attributes.get("pydantic_ai.all_messages"), attributes.get("final_result")
        if _truthy(given_input) and attributes.get("gen_ai.system_instructions"):
            given_input = _with_system_instructions(given_input, attributes["gen_ai.system_instructions"])
        if _truthy(given_input) or _truthy(given_output):
            return given_input, given_output
    if _truthy(attributes.get("tool_arguments")) or _truthy(attributes.get("tool_response")):
        return attributes.get("tool_arguments"), attributes.get("tool_response")
    for input_prefix, output_prefix in (("gen_ai.prompt", "gen_ai.completion"),
                                        ("llm.input_messages", "llm.output_messages")):
        if any(key.startswith((input_prefix, output_prefix)) for key in attributes):
            return _nested(attributes, input_prefix), _nested(attributes, output_prefix)
    return _genai_io(attributes) or (None, None)


def _tool_definitions(attributes: dict[str, str]) -> tuple[list[Any], dict[str, str]]:
    """The tool definitions ingestion moves out of the attributes, and the attributes without them."""
    tools: list[Any] = []
    cleaned = dict(attributes)

    def definitions(text: Any) -> list[Any] | None:
        try:
            value = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            return None
        if isinstance(value, list) and value and all(isinstance(t, dict) and t.get("name") for t in value):
            return value
        return None

    found = definitions(attributes.get("gen_ai.tool.definitions"))
    if found:
        tools += found
        del cleaned["gen_ai.tool.definitions"]
    try:
        parameters = json.loads(attributes.get("model_request_parameters", ""))
    except ValueError:
        parameters = None
    if isinstance(parameters, dict):
        found = definitions(parameters.get("function_tools"))
        if found:
            tools += found
            rest = {k: v for k, v in parameters.items() if k != "function_tools"}
            if rest:
                cleaned["model_request_parameters"] = js_json(rest)
            else:
                del cleaned["model_request_parameters"]
    for key in sorted((k for k in attributes if k.startswith("llm.tools.") and k.endswith(".tool.json_schema")),
                      key=lambda k: int(k.split(".")[2]) if k.split(".")[2].isdigit() else 0):
        found = definitions(f"[{attributes[key]}]")
        if found:
            tools += found
            del cleaned[key]
    return tools, cleaned


def _with_tools(given_input: Any, tools: list[Any]) -> tuple[Any, bool]:
    """appendToolsToInput: the input with the tool definitions merged in, and whether it could be."""
    def merge(value: Any) -> tuple[Any, bool]:
        if isinstance(value, list):
            return {"messages": value, "tools": tools}, True
        if isinstance(value, dict):
            if value.get("tools") is not None:
                if not isinstance(value["tools"], list):
                    return given_input, False
                return {**value, "tools": value["tools"] + tools}, True
            return {**value, "tools": tools}, True
        if value is None:
            return {"tools": tools}, True
        if isinstance(value, str):
            return {"prompt": value, "tools": tools}, True
        return given_input, False

    if isinstance(given_input, str):
        try:
            return merge(json.loads(given_input))
        except ValueError:
            return {"prompt": given_input, "tools": tools}, True
    return merge(given_input)


def _observation_type(attributes: dict[str, Any]) -> str:
    return (_LANGFUSE_TYPES.get(str(attributes.get("langfuse.observation.type", "")))
            or _OPENINFERENCE_TYPES.get(str(attributes.get("openinference.span.kind", "")))
            or _GENAI_TYPES.get(str(attributes.get("gen_ai.operation.name", "")))
            or ("GENERATION" if any(_truthy(attributes.get(key)) for key in _MODEL_KEYS) else "SPAN"))


def _first(attributes: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if _truthy(attributes.get(key)):
            value = attributes[key]
            return value if isinstance(value, str) else js_json(value)
    return None


def iso_ms(nanoseconds: int) -> str:
    """Date.toISOString of a span time floored to the millisecond, as Langfuse stores it."""
    milliseconds = nanoseconds // 1_000_000
    moment = datetime.fromtimestamp(milliseconds // 1000, UTC).replace(microsecond=(milliseconds % 1000) * 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{milliseconds % 1000:03d}Z"


def stored_observation(span: dict[str, Any], resource: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
    """One OTLP/JSON span as Langfuse keeps it."""
    attributes = _attributes(span.get("attributes"))
    scope_name = str(scope.get("name") or "")
    events = span.get("events") or []
    given_input, given_output = _input_output(attributes, events, scope_name)
    kept = {key: value if isinstance(value, str) else js_json(value) for key, value in attributes.items()
            if key not in _IO_KEYS and not key.startswith(_IO_PREFIXES)}
    tools, without_tools = _tool_definitions(kept)
    if tools:
        merged, mapped = _with_tools(given_input, tools)
        if mapped:
            given_input, kept = merged, without_tools
    scope_record = {key: value for key, value in scope.items() if key in ("name", "version")}
    scope_record["attributes"] = _attributes(scope.get("attributes"))
    metadata: dict[str, Any] = {"resourceAttributes": resource, "scope": scope_record}
    if not scope_name.startswith("langfuse-sdk"):
        metadata = {"attributes": kept, **metadata}
    name = _first(attributes, "gen_ai.tool.name", "logfire.msg") or span.get("name", "")
    status = span.get("status") or {}
    code = status.get("code", 0)
    is_error = code in (2, "STATUS_CODE_ERROR")
    environment = "default"
    for key in ("langfuse.environment", "deployment.environment.name", "deployment.environment"):
        if _truthy(attributes.get(key)) or _truthy(resource.get(key)):
            environment = str(attributes.get(key) or resource.get(key))
            break
    tags = attributes.get("langfuse.trace.tags") or []
    if isinstance(tags, str):
        try:
            tags = json.loads(tags)
        except ValueError:
            tags = [tags]
    parent = span.get("parentSpanId") or None
    start = int(span.get("startTimeUnixNano") or 0)
    end = int(span.get("endTimeUnixNano") or start)
    return {
        "id": span["spanId"].lower(), "traceId": span["traceId"].lower(),
        "parentObservationId": parent.lower() if parent else None,
        "name": name, "type": _observation_type(attributes), "environment": environment,
        "startTime": iso_ms(start), "endTime": iso_ms(end),
        "level": attributes.get("langfuse.observation.level") or ("ERROR" if is_error else "DEFAULT"),
        "statusMessage": attributes.get("langfuse.observation.status_message") or status.get("message") or None,
        "version": attributes.get("langfuse.version") or resource.get("service.version"),
        "input": _stored_text(given_input), "output": _stored_text(given_output), "metadata": metadata,
        "userId": _first(attributes, "langfuse.user.id", "user.id"),
        "sessionId": _first(attributes, "langfuse.session.id", "session.id", "gen_ai.conversation.id"),
        "tags": list(tags) if isinstance(tags, list) else [str(tags)],
        "traceName": attributes.get("langfuse.trace.name"),
        "isRootObservation": parent is None or str(attributes.get("langfuse.internal.as_root")).lower() == "true",
        "model": _first(attributes, "gen_ai.response.model", "gen_ai.request.model", "llm.model_name"),
    }


def _stored_text(value: Any) -> str | None:
    """How the input and output columns hold a value: text as it is, anything else as its JSON."""
    if value is None:
        return None
    return value if isinstance(value, str) else js_json(value)


def _decoded(text: Any) -> Any:
    """parseJsonPrioritised: the JSON a text holds, or the text."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _flattened(value: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """flattenJsonToPathArrays: nested objects to ``a.b`` names, every leaf as text."""
    flat: dict[str, str] = {}
    for key, item in value.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(item, dict):
            flat.update(_flattened(item, path))
        else:
            flat[path] = item if isinstance(item, str) else js_json(item)
    return flat


# --- the server -----------------------------------------------------------------------------------------------------


@dataclass
class _Fault:
    path: str
    status: int
    headers: dict[str, str]
    body: str
    times: int
    skip: int
    match: dict[str, str]


class FakeLangfuse:
    """The stand-in server. ``with FakeLangfuse() as langfuse: ... langfuse.url``."""

    def __init__(self, *, public_key: str = "pk-lf-fake-public", secret_key: str = "sk-lf-fake-secret",
                 v2: bool = True, v1: bool = True, forbidden: bool = False) -> None:
        self.public_key, self.secret_key = public_key, secret_key
        self.v2, self.v1, self.forbidden = v2, v1, forbidden
        self.observations: list[dict[str, Any]] = []
        self.scores: dict[str, dict[str, Any]] = {}
        self.score_posts: list[dict[str, Any]] = []
        self.log: list[tuple[Any, ...]] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- data ------------------------------------------------------------------------------------------------------

    def ingest(self, traces_data: dict[str, Any], *, shift_s: float = 0) -> None:
        """Every span of an OTLP/JSON TracesData object, stored as Langfuse's OTel ingestion stores it; ``shift_s``
        moves the spans in time (a run from last week)."""
        shift_ns = int(shift_s * 1e9)
        with self._lock:
            for resource_spans in traces_data.get("resourceSpans") or ():
                resource = _attributes((resource_spans.get("resource") or {}).get("attributes"))
                for scope_spans in resource_spans.get("scopeSpans") or ():
                    scope = scope_spans.get("scope") or {}
                    for span in scope_spans.get("spans") or ():
                        if shift_ns:
                            span = {**span, "startTimeUnixNano": str(int(span["startTimeUnixNano"]) + shift_ns),
                                    "endTimeUnixNano": str(int(span["endTimeUnixNano"]) + shift_ns)}
                        self.observations.append(stored_observation(span, resource, scope))

    def ingest_file(self, path: str | Path, *, shift_s: float = 0) -> None:
        """A trace file's spans as Langfuse gets them from looptrace (``traces push``: Langfuse's mapping added)."""
        from looptrace.instrumentation.export.push import spans_as_sent
        from looptrace.instrumentation.tracefile.encode import encode_traces_data

        for span in spans_as_sent(path, "langfuse"):
            self.ingest(json.loads(encode_traces_data([span])), shift_s=shift_s)

    def add_observation(self, **observation: Any) -> None:
        """An observation made by Langfuse's own SDK or its ingestion API: no span attributes in its metadata."""
        record = {"parentObservationId": None, "type": "SPAN", "environment": "default", "level": "DEFAULT",
                  "statusMessage": None, "version": None, "input": None, "output": None, "metadata": {},
                  "userId": None, "sessionId": None, "tags": [], "traceName": None, "model": None, **observation}
        record.setdefault("endTime", record["startTime"])
        record["input"], record["output"] = _stored_text(record["input"]), _stored_text(record["output"])
        record.setdefault("isRootObservation", record["parentObservationId"] is None)
        with self._lock:
            self.observations.append(record)

    def trace_ids(self) -> set[str]:
        with self._lock:
            return {o["traceId"] for o in self.observations}

    # -- faults ----------------------------------------------------------------------------------------------------

    def fail(self, path: str, status: int, *, headers: dict[str, str] | None = None, body: str | None = None,
             times: int = 1, skip: int = 0, match: dict[str, str] | None = None) -> None:
        """The next ``times`` requests to ``path`` (after ``skip`` that succeed) get this answer instead; with
        ``match``, only requests with these query parameters count."""
        text = body if body is not None else js_json({"message": f"fault {status}"})
        with self._lock:
            self._faults.append(_Fault(path, status, dict(headers or {}), text, times, skip, dict(match or {})))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _fault_for(self, path: str, params: dict[str, list[str]]) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.path != path or fault.times <= 0:
                    continue
                if any(params.get(key) != [value] for key, value in fault.match.items()):
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                fault.times -= 1
                return fault
        return None

    # -- the HTTP side ---------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeLangfuse:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-langfuse", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeLangfuse:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(handler.path)
        params = parse_qs(parts.query, keep_blank_values=True)
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0)) if method == "POST" else b""
        with self._lock:
            self.log.append((method, parts.path, params))
        status, headers, text = self._answer(method, parts.path, params, body, handler.headers.get("Authorization"))
        payload = text.encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(payload)

    def _answer(self, method: str, path: str, params: dict[str, list[str]], body: bytes,
                authorization: str | None) -> tuple[int, dict[str, str], str]:
        expected = "Basic " + base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode()
        if authorization != expected:
            return 401, {}, js_json({"message": INVALID_CREDENTIALS})
        if self.forbidden:
            return 403, {}, js_json({"message": "Access denied - insufficient permissions for this endpoint"})
        fault = self._fault_for(path, params)
        if fault is not None:
            return fault.status, fault.headers, fault.body
        try:
            if method == "GET" and path == V2_PATH:
                return (200, {}, js_json(self._v2(params))) if self.v2 else (404, {}, js_json({"message": V2_UNAVAILABLE}))
            if method == "GET" and path == TRACES_PATH:
                return (200, {}, js_json(self._traces(params))) if self.v1 else (404, {}, js_json({"message": V1_UNAVAILABLE}))
            if method == "GET" and path == OBSERVATIONS_PATH:
                return (200, {}, js_json(self._v1_observations(params))) if self.v1 else (
                    404, {}, js_json({"message": V1_UNAVAILABLE}))
            if method == "POST" and path == SCORES_PATH:
                return 200, {}, js_json(self._score(json.loads(body or b"{}")))
        except _BadRequest as exc:
            return 400, {}, js_json({"message": str(exc)})
        return 404, {}, js_json({"message": "Not found"})

    # -- endpoints -------------------------------------------------------------------------------------------------

    def _v2(self, params: dict[str, list[str]]) -> dict[str, Any]:
        one = _first_values(params)
        if one.get("parseIoAsJson") == "true":
            raise _BadRequest("parseIoAsJson=true is no longer supported on the v2 observations endpoint.")
        limit = _limit(one, 1000)
        groups = [g.strip() for g in one.get("fields", "").split(",") if g.strip()] or ["core", "basic"]
        expand = {k.strip() for k in one.get("expandMetadata", "").split(",") if k.strip()}
        with self._lock:
            rows = [o for o in self.observations if _matches_v2(o, params, one)]
        rows.sort(key=_v2_order, reverse=True)
        if one.get("cursor"):
            try:
                position = json.loads(base64.b64decode(one["cursor"]))
                after = (position["lastStartTimeTo"], position["lastTraceId"], position["lastId"])
            except (ValueError, KeyError, TypeError):
                raise _BadRequest("Invalid cursor format") from None
            rows = [o for o in rows if _v2_order(o) < after]
        page, more = rows[:limit], len(rows) > limit
        meta: dict[str, Any] = {}
        if more and page:
            last = page[-1]
            meta["cursor"] = base64.b64encode(js_json({"lastStartTimeTo": last["startTime"],
                                                       "lastTraceId": last["traceId"],
                                                       "lastId": last["id"]}).encode()).decode()
        return {"data": [_v2_view(o, groups, full_metadata="io" in groups or bool(expand), expand=expand)
                         for o in page], "meta": meta}

    def _traces(self, params: dict[str, list[str]]) -> dict[str, Any]:
        one = _first_values(params)
        limit, page = _limit(one, 100), _page(one)
        with self._lock:
            by_trace: dict[str, list[dict[str, Any]]] = {}
            for o in self.observations:
                by_trace.setdefault(o["traceId"], []).append(o)
        traces = [_trace_view(observations) for observations in by_trace.values()]
        traces = [t for t in traces if _matches_trace(t, params, one)]
        descending = one.get("orderBy", "timestamp.desc").split(".")[-1].lower() != "asc"
        traces.sort(key=lambda t: (t["timestamp"], t["id"]), reverse=descending)
        return _numbered(traces, page, limit)

    def _v1_observations(self, params: dict[str, list[str]]) -> dict[str, Any]:
        one = _first_values(params)
        limit, page = _limit(one, 100), _page(one)
        with self._lock:
            rows = [o for o in self.observations if not one.get("traceId") or o["traceId"] == one["traceId"]]
        rows.sort(key=_v2_order, reverse=True)
        return _numbered([_v1_view(o) for o in rows], page, limit)

    def _score(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not body.get("name") or "value" not in body:
            raise _BadRequest("a score needs a name and a value")
        if not (body.get("traceId") or body.get("sessionId") or body.get("datasetRunId")):
            raise _BadRequest("a score needs a traceId, sessionId or datasetRunId")
        score_id = body.get("id") or str(uuid.uuid4())
        with self._lock:
            self.score_posts.append(dict(body))
            self.scores[score_id] = {**body, "id": score_id}
        return {"id": score_id}


class _BadRequest(Exception):
    pass


def _first_values(params: dict[str, list[str]]) -> dict[str, str]:
    return {key: values[0] for key, values in params.items() if values}


def _limit(one: dict[str, str], maximum: int) -> int:
    try:
        limit = int(one.get("limit", "50"))
    except ValueError:
        raise _BadRequest("limit must be a number") from None
    if not 1 <= limit <= maximum:
        raise _BadRequest(f"limit must be between 1 and {maximum}")
    return limit


def _page(one: dict[str, str]) -> int:
    try:
        page = int(one.get("page", "1"))
    except ValueError:
        raise _BadRequest("page must be a number") from None
    if page < 1:
        raise _BadRequest("page starts at 1")
    return page


def _numbered(items: list[dict[str, Any]], page: int, limit: int) -> dict[str, Any]:
    start = (page - 1) * limit
    return {"data": items[start:start + limit],
            "meta": {"page": page, "limit": limit, "totalItems": len(items),
                     "totalPages": math.ceil(len(items) / limit)}}


def _v2_order(observation: dict[str, Any]) -> tuple[str, str, str]:
    return observation["startTime"], observation["traceId"], observation["id"]


def _matches_v2(o: dict[str, Any], params: dict[str, list[str]], one: dict[str, str]) -> bool:
    for key in ("traceId", "userId", "sessionId", "type", "name", "level"):
        if key in one and o.get(key) != one[key]:
            return False
    if "isRootObservation" in one and o["isRootObservation"] != (one["isRootObservation"] == "true"):
        return False
    if params.get("environment") and o["environment"] not in params["environment"]:
        return False
    if one.get("fromStartTime") and _time(o["startTime"]) < _time(one["fromStartTime"]):
        return False
    if one.get("toStartTime") and _time(o["startTime"]) >= _time(one["toStartTime"]):
        return False
    return _advanced(o, one.get("filter"))


def _advanced(o: dict[str, Any], text: str | None) -> bool:
    if not text:
        return True
    try:
        conditions = json.loads(text)
    except ValueError:
        raise _BadRequest("filter is not JSON") from None
    for condition in conditions:
        if condition.get("type") != "arrayOptions" or condition.get("column") not in ("tags", "traceTags"):
            raise _BadRequest(f"the fake knows only tag filters, not {condition}")
        wanted, have = set(condition.get("value") or ()), set(o.get("tags") or ())
        operator = condition.get("operator")
        if (operator == "all of" and not wanted <= have) or (operator == "any of" and not wanted & have) or \
                (operator == "none of" and wanted & have):
            return False
    return True


def _matches_trace(t: dict[str, Any], params: dict[str, list[str]], one: dict[str, str]) -> bool:
    for key in ("userId", "sessionId", "name"):
        if key in one and t.get(key) != one[key]:
            return False
    if params.get("tags") and not set(params["tags"]) <= set(t["tags"]):
        return False
    if params.get("environment") and t["environment"] not in params["environment"]:
        return False
    if one.get("fromTimestamp") and _time(t["timestamp"]) < _time(one["fromTimestamp"]):
        return False
    return not (one.get("toTimestamp") and _time(t["timestamp"]) >= _time(one["toTimestamp"]))


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


_CORE = ("id", "traceId", "startTime", "endTime", "parentObservationId", "type")
_BASIC = ("name", "level", "statusMessage", "version", "environment", "userId", "sessionId", "isRootObservation")


def _v2_view(o: dict[str, Any], groups: Iterable[str], *, full_metadata: bool, expand: set[str]) -> dict[str, Any]:
    view: dict[str, Any] = {key: o.get(key) for key in _CORE}
    view.update(projectId="fake-project", modelId=None, inputPrice=None, outputPrice=None, totalPrice=None)
    groups = set(groups)
    if "basic" in groups:
        view.update({key: o.get(key) for key in _BASIC}, bookmarked=False, public=False)
    if "io" in groups:
        view.update(input=o.get("input"), output=o.get("output"))
    if "metadata" in groups:
        flat = _flattened(o.get("metadata") or {})
        view["metadata"] = {key: _decoded(value if full_metadata or key in expand or len(value) <= METADATA_PREVIEW_CHARS
                                          else value[:METADATA_PREVIEW_CHARS])
                            for key, value in flat.items()}
    if "model" in groups:
        view.update(providedModelName=o.get("model"), internalModelId=None, modelParameters={})
    if "trace_context" in groups:
        view.update(tags=o.get("tags") or [], traceName=o.get("traceName"), release=None)
    return view


def _v1_view(o: dict[str, Any]) -> dict[str, Any]:
    # Langfuse v3 kept metadata as a map of top-level keys to JSON texts and decodes each on the way out.
    metadata = {key: _decoded(value if isinstance(value, str) else js_json(value))
                for key, value in (o.get("metadata") or {}).items()}
    return {
        "id": o["id"], "traceId": o["traceId"], "type": o["type"], "name": o["name"], "startTime": o["startTime"],
        "endTime": o["endTime"], "completionStartTime": None, "model": o.get("model"), "modelParameters": {},
        "input": _decoded(o.get("input")), "output": _decoded(o.get("output")), "version": o.get("version"),
        "metadata": metadata, "level": o["level"], "statusMessage": o.get("statusMessage"),
        "parentObservationId": o.get("parentObservationId"), "environment": o["environment"], "usageDetails": {},
        "costDetails": {}, "promptId": None, "latency": None,
    }


def _trace_view(observations: list[dict[str, Any]]) -> dict[str, Any]:
    roots = [o for o in observations if o["isRootObservation"]] or observations
    root = min(roots, key=lambda o: o["startTime"])
    first = {key: next((o[key] for o in observations if o.get(key)), None) for key in ("userId", "sessionId")}
    return {"id": root["traceId"], "timestamp": root["startTime"], "name": root.get("traceName") or root["name"],
            "input": None, "output": None, "sessionId": first["sessionId"], "userId": first["userId"],
            "release": None, "version": root.get("version"), "metadata": {}, "public": False,
            "tags": sorted({tag for o in observations for tag in o.get("tags") or ()}),
            "environment": root["environment"], "htmlPath": f"/project/fake-project/traces/{root['traceId']}",
            "latency": None, "totalCost": None, "observations": [], "scores": []}
