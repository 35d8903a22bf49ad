"""Langfuse's mapping: what Langfuse needs to see on looptrace's spans beyond the GenAI conventions and looptrace.*.

Spans reach Langfuse through its OTLP endpoint, and Langfuse's ingestion turns span attributes into its data model.
looptrace's spans carry the conventions once (the trace file keeps them so); ``span_attributes`` is what Langfuse's
exporter adds to each span it sends (``export.mapped``, beside OpenInference's kinds and input and output, which
Langfuse reads too), and what ``traces push`` adds when it sends from the trace file. It is read from the span and
from its run's root (``offline.run_facts.RunFacts``). The functions here return plain attribute dicts and know
nothing about OpenTelemetry's SDK, so they cost nothing when Langfuse is not in use and are trivially testable. The
scores are ``scores``', the public API client (the scan, the scores, the project behind a trace link) ``api``'s.

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
  looptrace's spans carry the user, tags and metadata on the run's root only (``user.id``, ``looptrace.run.tags``,
  ``looptrace.run.metadata.<key>``): this mapping puts Langfuse's form of them on every span.
* Tools a generation was offered (``normalizeToolsForObservation`` in ingestion/extractToolsBackend.ts): read from
  the observation's own ``gen_ai.tool.definitions``, moved into its input beside the messages. looptrace records the
  definitions (and the system instructions) once, on the run's root; this mapping puts both on every generation.
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
  and one present without the other leaves the other empty. OpenInference's mapping (``export.openinference``) sets
  both on every span with content, each exactly what Langfuse would make of the gen_ai.* attributes (a generation's
  input gets ``gen_ai.system_instructions`` put in front of its messages).
  Structured (kvlist) attribute values are not decoded (``convertValueToPlainJavascript``): content stays JSON text.
* Level: ``langfuse.observation.level`` (DEBUG, DEFAULT, WARNING, ERROR) and ``langfuse.observation.status_message``
  override what Langfuse derives from the span status (ERROR for an error status). A turn or a call that is part of
  an anomaly (its ``gen_ai.evaluation.result`` event) and did not fail shows as WARNING, the anomaly its message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..logs import log
from ..offline.run_facts import RunFacts, answer_text, span_kind, task_text
from ..recording import semconv as sc
from ..recording.content import cap
from ..recording.labels import MAX_LABEL_CHARS, RunLabels, checked, run_labels

if TYPE_CHECKING:
    from ..settings import LangfuseSettings

# Langfuse's OpenTelemetry attributes: what its OTLP ingestion maps onto traces and observations.
TRACE_NAME = "langfuse.trace.name"
USER_ID = sc.USER_ID  # the conventions' user.id, which Langfuse reads as the trace's user
SESSION_ID = "session.id"  # not sent: Langfuse reads gen_ai.conversation.id as the session
TRACE_INPUT = "langfuse.trace.input"
TRACE_OUTPUT = "langfuse.trace.output"
AS_ROOT = "langfuse.internal.as_root"  # read by the trace-create path
IS_APP_ROOT = "langfuse.internal.is_app_root"  # read by the v4 events path (parent_span_id = '' OR this)
DEFAULT_ENVIRONMENT = "default"  # what Langfuse files observations and scores under when none is set
ENVIRONMENT = "langfuse.environment"
RELEASE = "langfuse.release"
TRACE_TAGS = "langfuse.trace.tags"
TRACE_METADATA_PREFIX = "langfuse.trace.metadata."
# The count of tool errors a run left unresolved, as trace metadata: what Langfuse's traces table can filter on.
UNRESOLVED_TOOL_ERRORS = TRACE_METADATA_PREFIX + "unresolved_tool_errors"
OBSERVATION_TYPE = "langfuse.observation.type"
OBSERVATION_LEVEL = "langfuse.observation.level"
OBSERVATION_STATUS_MESSAGE = "langfuse.observation.status_message"
OBSERVATION_USAGE_DETAILS = "langfuse.observation.usage_details"
OBSERVATION_COST_DETAILS = "langfuse.observation.cost_details"
# The scores looptrace adds to a trace: a loop anomaly's categorical score (named as the anomaly's evaluation event),
# what a run's loops cost per anomaly type (numeric, for alerts to sum), and whether a run looped at all (boolean,
# on every run: its average over a window is the share of runs that looped).
ANOMALY_SCORE = sc.ANOMALY_EVALUATION_NAME
LOOP_COST_SCORE = "loop_cost_usd"
LOOPED_SCORE = "looped"

# looptrace's span kinds -> Langfuse observation types. A turn only groups its calls: a plain span.
OBSERVATION_TYPES = {"agent": "agent", "turn": "span", "chat": "generation", "tool": "tool"}
LEVELS = ("DEBUG", "DEFAULT", "WARNING", "ERROR")
MAX_PROPAGATED_CHARS = MAX_LABEL_CHARS  # the Langfuse SDK drops longer trace-level values: labels are cut to this
MAX_STATUS_MESSAGE_CHARS = 1024
_ENVIRONMENT = re.compile(r"^(?!langfuse)[a-z0-9_-]{1,40}$")  # what the scores API and the SDK accept



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
    attributes: dict[str, Any] = {UNRESOLVED_TOOL_ERRORS: str(unresolved_tool_errors)}
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


# --- a span as Langfuse's exporter sends it ------------------------------------------------------------------------


def span_attributes(span: Any, run: RunFacts | None) -> dict[str, Any]:
    """What Langfuse's exporter adds to one of looptrace's finished spans (``span``: name, attributes, events,
    status, as an SDK ``ReadableSpan`` has them), given its run's facts (None when its root was not seen)."""
    a = span.attributes
    kind = span_kind(a)
    if kind is None:
        return {}
    agent = run.agent if run is not None and run.agent else str(a.get(sc.GEN_AI_AGENT_NAME) or "")
    attributes = run_attributes(agent, _labels(run)) if agent else {}
    if kind == "agent":
        joins = run is not None and run.joins_outer_trace
        attributes.update(root_attributes(joins_outer_trace=joins, trace_input=task_text(a)))
        if sc.RUN_UNRESOLVED_TOOL_ERRORS in a:  # the run ended (a root at its start has none of the end's facts)
            attributes.update(run_end_attributes(joins_outer_trace=joins, output=answer_text(a),
                                                 unresolved_tool_errors=int(a[sc.RUN_UNRESOLVED_TOOL_ERRORS])))
    elif kind == "chat":
        attributes.update(_generation(a, run))
    elif kind in ("turn", "tool"):
        attributes.update(_flagged(span))
    return attributes


def _labels(run: RunFacts | None) -> RunLabels:
    if run is None:
        return RunLabels()
    return RunLabels(user_id=run.user_id, tags=run.tags, metadata=run.metadata)


def _generation(a: Any, run: RunFacts | None) -> dict[str, Any]:
    """A model call's usage and cost in Langfuse's terms, and the prompt and tools it was sent (its run's)."""
    attributes: dict[str, Any] = {}
    if run is not None and sc.GEN_AI_INPUT_MESSAGES in a:  # content on spans: what the model got, as Langfuse shows it
        if run.system_instructions is not None:
            attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS] = run.system_instructions
        if run.tool_definitions is not None:
            attributes[sc.GEN_AI_TOOL_DEFINITIONS] = run.tool_definitions
    if sc.GEN_AI_USAGE_INPUT_TOKENS in a:  # the call answered (a failed one has no usage)
        cache_read = _count(a.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS))
        cache_creation = _count(a.get(sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS))
        cost = a.get(sc.CHAT_COST_USD)
        attributes.update(generation_attributes(
            # The conventions' input tokens count the cache too (the Anthropic rule); Langfuse's "input" does not.
            input_tokens=max(_count(a.get(sc.GEN_AI_USAGE_INPUT_TOKENS)) - cache_read - cache_creation, 0),
            output_tokens=_count(a.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)), cache_read_input_tokens=cache_read,
            cache_creation_input_tokens=cache_creation,
            cache_creation_1h_input_tokens=_count(a.get(sc.CHAT_CACHE_WRITES_1H)),
            cost_usd=float(cost) if isinstance(cost, (int, float)) else None))
    return attributes


def _flagged(span: Any) -> dict[str, str]:
    """Level WARNING, with the newest anomaly as the status message, for a turn or a call that is part of an anomaly
    and did not fail (a failed one keeps the ERROR its status gives it)."""
    if _is_error(span):
        return {}
    newest = None
    for event in span.events or ():
        if event.name in (sc.ANOMALY_EVENT, sc.LEGACY_ANOMALY_EVENT) and event.attributes.get(sc.ANOMALY_TYPE):
            newest = event.attributes
    if newest is None:
        return {}
    message = f"{newest.get(sc.ANOMALY_TYPE)}: {newest.get(sc.ANOMALY_MESSAGE, '')}"
    return warning_attributes(cap(message, MAX_STATUS_MESSAGE_CHARS))


def _is_error(span: Any) -> bool:
    status = getattr(span, "status", None)
    return getattr(getattr(status, "status_code", None), "name", "") == "ERROR"


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0
