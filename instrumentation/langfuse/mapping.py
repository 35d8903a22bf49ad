"""Langfuse's mapping: what Langfuse needs to see on looptrace's spans beyond the GenAI conventions and looptrace.*.

Spans reach Langfuse through its OTLP endpoint, and Langfuse's ingestion turns span attributes into its data model.
The functions here return plain attribute dicts; ``backend_attributes`` composes them (with OpenInference's kinds)
for each run, the one place spans take vendor attributes from. They know nothing about OpenTelemetry, so they cost
nothing when Langfuse is not in use and are trivially testable. The scores are ``scores``', the public API
client (the scan, the scores, the project behind a trace link) ``api``'s.

How Langfuse reads them (server: packages/shared/src/server/otel/OtelIngestionProcessor.ts and ObservationTypeMapper.ts
in langfuse/langfuse; SDK: langfuse 5.x, langfuse/_client/attributes.py and propagation.py):

* Observation type (ObservationTypeMapper.ts): ``langfuse.observation.type`` first, then ``openinference.span.kind``
  (AGENT, CHAIN, LLM -> generation, TOOL), then ``gen_ai.operation.name`` (invoke_agent, chat, execute_tool). Every
  span of ours carries ``openinference.span.kind`` for Phoenix anyway, so no Langfuse-only type attribute is sent: a
  turn shows as a CHAIN, the rest as agent, generation and tool.
* Trace attributes (name, user, session, tags, metadata) are read *per observation* by the v4 ingestion
  (``processToEvent``): every span of a run carries them, as the SDK's ``propagate_attributes`` does. Keys:
  ``langfuse.trace.name``, ``user.id``, ``langfuse.trace.tags`` (string array), ``langfuse.trace.metadata.<key>``;
  the session is read from ``session.id`` *or* ``gen_ai.conversation.id`` (``extractSessionId``), so only the
  conventions' attribute is sent. The SDK drops a propagated value over 200 characters; here it is cut and marked.
* Environment and release (``extractEnvironment``): ``langfuse.environment``, then ``deployment.environment.name``,
  then ``deployment.environment``, each from the span or else the resource; ``langfuse.release`` likewise. They go on
  the resource, once per export batch, from ``LANGFUSE_TRACING_ENVIRONMENT`` and ``LANGFUSE_RELEASE`` as the SDK
  reads them (``resource_attributes``); scores carry the same environment.
* Trace root: a span without a parent, or one with ``langfuse.internal.as_root`` (older servers). A run that joins
  someone else's trace marks its agent span so and also sends ``langfuse.trace.input``/``output``, which newer
  servers apply as trace updates whatever the span's place.
* Usage: ``langfuse.observation.usage_details`` (a JSON object) wins over ``gen_ai.usage.*``. How the server reads
  ``gen_ai.usage.*`` has changed between versions (older ones take ``input_tokens`` as is and add the cache counts
  beside it, counting cache tokens twice for Anthropic); the explicit object is read the same way by all of them.
  Langfuse sums every usage type whose name contains "input" into the input total, so ``input`` is Anthropic's own
  ``input_tokens`` (cache excluded) and the cache reads and writes are their own types: ``input_cache_read``,
  ``input_cache_creation_5m`` and ``input_cache_creation_1h``, the keys its Anthropic price tables
  (worker/src/constants/default-model-prices.json) price at 0.1x, 1.25x and 2x the input rate. Only generations
  get usage: the root carries the run totals under ``looptrace.usage.*``, which Langfuse does not read as usage.
* Cost: ``langfuse.observation.cost_details`` (JSON, ``{"total": usd}``) is taken as given instead of inferred.
* Input and output (``extractInputAndOutput``): ``input.value``/``output.value`` (OpenInference) come before
  ``gen_ai.input.messages``/``gen_ai.output.messages`` and, for tools, ``gen_ai.tool.call.arguments``/``result``,
  and one present without the other leaves the other empty. So only the agent span has ``input.value`` and
  ``output.value``; a generation's input gets ``gen_ai.system_instructions`` put in front of its messages.
  Structured (kvlist) attribute values are not decoded (``convertValueToPlainJavascript``): content stays JSON text.
* Level: ``langfuse.observation.level`` (DEBUG, DEFAULT, WARNING, ERROR) and ``langfuse.observation.status_message``
  override what Langfuse derives from the span status (ERROR for an error status).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..logs import log
from ..recording import semconv as sc
from ..recording.labels import MAX_LABEL_CHARS, RunLabels, checked, run_labels

if TYPE_CHECKING:
    from ..settings import LangfuseSettings

TRACE_NAME = sc.LANGFUSE_TRACE_NAME
USER_ID = sc.LANGFUSE_USER_ID
SESSION_ID = sc.LANGFUSE_SESSION_ID  # not sent: Langfuse reads gen_ai.conversation.id as the session
TRACE_INPUT = sc.LANGFUSE_TRACE_INPUT
TRACE_OUTPUT = sc.LANGFUSE_TRACE_OUTPUT
AS_ROOT = sc.LANGFUSE_AS_ROOT
IS_APP_ROOT = sc.LANGFUSE_IS_APP_ROOT
DEFAULT_ENVIRONMENT = "default"  # what Langfuse files observations and scores under when none is set
ENVIRONMENT = sc.LANGFUSE_ENVIRONMENT
RELEASE = sc.LANGFUSE_RELEASE
TRACE_TAGS = sc.LANGFUSE_TRACE_TAGS
TRACE_METADATA_PREFIX = sc.LANGFUSE_TRACE_METADATA_PREFIX
OBSERVATION_TYPE = sc.LANGFUSE_OBSERVATION_TYPE
OBSERVATION_LEVEL = sc.LANGFUSE_OBSERVATION_LEVEL
OBSERVATION_STATUS_MESSAGE = sc.LANGFUSE_OBSERVATION_STATUS_MESSAGE
OBSERVATION_USAGE_DETAILS = sc.LANGFUSE_OBSERVATION_USAGE_DETAILS
OBSERVATION_COST_DETAILS = sc.LANGFUSE_OBSERVATION_COST_DETAILS

# looptrace's span kinds -> Langfuse observation types. A turn only groups its calls: a plain span.
OBSERVATION_TYPES = {"agent": "agent", "turn": "span", "chat": "generation", "tool": "tool"}
LEVELS = ("DEBUG", "DEFAULT", "WARNING", "ERROR")
MAX_PROPAGATED_CHARS = MAX_LABEL_CHARS  # the Langfuse SDK drops longer trace-level values: labels are cut to this
MAX_STATUS_MESSAGE_CHARS = 1024
_ENVIRONMENT = re.compile(r"^(?!langfuse)[a-z0-9_-]{1,40}$")  # what the scores API and the SDK accept

ANOMALY_SCORE = sc.LANGFUSE_ANOMALY_SCORE


def trace_attributes(trace_name: str, *, session_id: str | None = None, user_id: str | None = None,
                     tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Langfuse's trace attributes, for *every* span of a run (the trace is named after the agent), from labels not
    yet checked (``labels.run_labels`` checks them: a value over 200 characters is cut and marked, an empty value or
    a metadata key that is not alphanumeric raises ValueError)."""
    return run_attributes(trace_name, run_labels(session_id=session_id, user_id=user_id, tags=tags,
                                                 metadata=metadata))


def run_attributes(trace_name: str, labels: RunLabels) -> dict[str, Any]:
    """Langfuse's trace attributes of a run whose labels are checked, for every span of it.

    The session is not among them: spans carry it as ``gen_ai.conversation.id``, which Langfuse reads as the session.
    """
    attributes: dict[str, Any] = {TRACE_NAME: checked("trace name", trace_name)}
    if labels.user_id is not None:
        attributes[USER_ID] = labels.user_id
    if labels.tags:
        attributes[TRACE_TAGS] = labels.tags
    for key, text in labels.metadata:
        attributes[TRACE_METADATA_PREFIX + key] = text
    return attributes


def run_end_attributes(*, joins_outer_trace: bool, output: str | None, unresolved_tool_errors: int) -> dict[str, Any]:
    """What the agent span adds for Langfuse as the run ends: the count of tool errors left unresolved as trace
    metadata (its traces table filters on it, 0 included) and, for a run that joined an outer trace, the trace's
    output set explicitly (its input was, see ``root_attributes``)."""
    attributes: dict[str, Any] = {sc.LANGFUSE_UNRESOLVED_TOOL_ERRORS: str(unresolved_tool_errors)}
    if joins_outer_trace and output is not None:
        attributes[TRACE_OUTPUT] = output
    return attributes


def root_attributes(*, joins_outer_trace: bool, trace_input: str | None) -> dict[str, Any]:
    """What makes a run's agent span the root of its trace in Langfuse when it has a parent there (a traceparent, an
    application's span): the root markers of both ingestion paths (the Langfuse SDK sets the same two on a span whose
    parent it never exported), and the trace's input set explicitly (its output at the end)."""
    if not joins_outer_trace:
        return {}
    attributes: dict[str, Any] = {AS_ROOT: True, IS_APP_ROOT: True}
    if trace_input:
        attributes[TRACE_INPUT] = trace_input
    return attributes


def resource_attributes(settings: LangfuseSettings | None) -> dict[str, str]:
    """``langfuse.environment`` and ``langfuse.release`` from LANGFUSE_TRACING_ENVIRONMENT and LANGFUSE_RELEASE (read
    into the settings as the Langfuse SDK reads them), for the tracer provider's resource: Langfuse reads both from
    the resource as well as from a span, so they are sent once per batch instead of on every span."""
    attributes = {}
    environment = _valid_environment(settings.environment or "") if settings is not None else None
    if environment:
        attributes[ENVIRONMENT] = environment
    if settings is not None and settings.release:
        attributes[RELEASE] = settings.release
    return attributes


def run_environment(settings: LangfuseSettings | None, resource: Mapping[str, Any] | None) -> str | None:
    """The environment Langfuse files a run's observations under, as ``extractEnvironment`` picks it: the one the
    Langfuse variables set, else the resource's ``deployment.environment.name`` or ``deployment.environment``
    (OTEL_RESOURCE_ATTRIBUTES). None means Langfuse's "default"."""
    chosen = resource_attributes(settings).get(ENVIRONMENT)
    if chosen:
        return chosen
    for key in _ENVIRONMENT_KEYS:
        value = _valid_environment(str((resource or {}).get(key, "")))
        if value:
            return value
    return None


def environment_inputs(settings: LangfuseSettings, resource: Mapping[str, Any]) -> tuple[str | None, ...]:
    """What ``run_environment`` decides from, without deciding (or warning): two equal tuples give the same
    environment. A resource value that repeats the settings' own environment (configure()'s resource carries it) is
    the settings' value, not a second input."""
    return (settings.environment, *(None if resource.get(key) == settings.environment else str(resource.get(key, ""))
                                     for key in _ENVIRONMENT_KEYS))


_ENVIRONMENT_KEYS = (ENVIRONMENT, "deployment.environment.name", "deployment.environment")


def _valid_environment(value: str) -> str | None:
    value = value.strip()
    if not value:
        return None
    if not _ENVIRONMENT.match(value):
        log.warning("langfuse_environment_ignored", value=value[:60],
                    hint="lower-case letters, digits, - and _, at most 40, not starting with 'langfuse'")
        return None
    return value


def observation_attributes(kind: str) -> dict[str, str]:
    """The Langfuse observation type of one of our spans: kind is ``agent``, ``turn``, ``chat`` or ``tool``."""
    try:
        return {OBSERVATION_TYPE: OBSERVATION_TYPES[kind]}
    except KeyError:
        raise ValueError(f"unknown span kind {kind!r}; expected one of {', '.join(OBSERVATION_TYPES)}") from None


def generation_attributes(*, input_tokens: int, output_tokens: int, cache_read_input_tokens: int = 0,
                          cache_creation_input_tokens: int = 0, cache_creation_1h_input_tokens: int = 0,
                          cost_usd: float | None = None) -> dict[str, str]:
    """Usage (and cost) of one model call, for its chat span, in Anthropic's own terms.

    ``input_tokens`` is Anthropic's ``usage.input_tokens``: the uncached input, *not* the GenAI conventions' total
    that spans.py writes to ``gen_ai.usage.input_tokens``. ``cache_creation_input_tokens`` is all cache writes, of
    which ``cache_creation_1h_input_tokens`` had the 1-hour lifetime (Anthropic's ``usage.cache_creation``); the rest
    are 5-minute writes. Each kind goes under the key Langfuse prices it by; cache kinds appear only when non-zero.
    """
    usage = {"input": input_tokens, "output": output_tokens}
    if cache_read_input_tokens:
        usage["input_cache_read"] = cache_read_input_tokens
    one_hour = min(max(cache_creation_1h_input_tokens, 0), cache_creation_input_tokens)
    if cache_creation_input_tokens - one_hour:
        usage["input_cache_creation_5m"] = cache_creation_input_tokens - one_hour
    if one_hour:
        usage["input_cache_creation_1h"] = one_hour
    # Written out rather than by json: names of our own and integers (a token count is an int), and JSONEncoder.encode
    # sets up its machinery on every call, which costs more than these objects; this runs for every model call.
    attributes = {OBSERVATION_USAGE_DETAILS: "{" + ",".join(f'"{kind}":{int(count)}' for kind, count in usage.items())
                  + "}"}
    if cost_usd is not None:
        attributes[OBSERVATION_COST_DETAILS] = (f'{{"total":{float(cost_usd)!r}}}' if math.isfinite(cost_usd)
                                                else _compact_json({"total": cost_usd}))
    return attributes


# json.dumps(value, separators=(",", ":")) with the encoder made once.
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def anomaly_attributes(message: str, *, level: str = "WARNING") -> dict[str, str]:
    """Marks the offending observation: level WARNING and the anomaly as its status message.

    The level replaces the ERROR Langfuse derives from an error status, so for a span that failed as well pass
    ``level="ERROR"``.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    return {OBSERVATION_LEVEL: level, OBSERVATION_STATUS_MESSAGE: message[:MAX_STATUS_MESSAGE_CHARS]}


def warning_attributes(status_message: str) -> dict[str, str]:
    """Level WARNING with ``status_message`` as it is (the caller has cut it, marking the cut): a turn or a call that
    is part of an anomaly and did not fail (a failed one keeps the ERROR its status gives it)."""
    return {OBSERVATION_LEVEL: "WARNING", OBSERVATION_STATUS_MESSAGE: status_message}
