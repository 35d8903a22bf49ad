"""What Langfuse needs to see on looptrace's spans, and the score that marks a run with an anomaly.

Spans reach Langfuse through its OTLP endpoint (``export.langfuse_span_exporter``), and Langfuse's ingestion turns
span attributes into its data model. The functions here return plain attribute dicts for ``spans.py`` to merge; they
know nothing about OpenTelemetry, so they cost nothing when Langfuse is not in use and are trivially testable.

How Langfuse reads them (server: packages/shared/src/server/otel/OtelIngestionProcessor.ts and ObservationTypeMapper.ts
in langfuse/langfuse; SDK: langfuse 5.x, langfuse/_client/attributes.py and propagation.py):

* Observation type: ``langfuse.observation.type`` wins over everything else. Without it Langfuse guesses from
  ``gen_ai.operation.name`` (chat -> generation, invoke_agent -> agent, execute_tool -> tool) and, failing that, calls
  any span with ``gen_ai.request.model`` a generation. We set it explicitly on every span.
* Trace attributes (name, user, session, tags, metadata) are read *per observation* in Langfuse v4: every span of a run
  must carry them, which is what the v5 SDK's ``propagate_attributes`` does. Keys: ``langfuse.trace.name``,
  ``user.id``, ``session.id``, ``langfuse.trace.tags`` (string array), ``langfuse.trace.metadata.<key>``. Langfuse
  drops a propagated value longer than 200 characters; metadata keys are alphanumeric (underscores are accepted).
* Usage: ``langfuse.observation.usage_details`` (a JSON object) wins over ``gen_ai.usage.*``. How the server reads
  ``gen_ai.usage.*`` has changed between versions (older ones take ``input_tokens`` as is and add the cache counts
  beside it, counting cache tokens twice for Anthropic); the explicit object is read the same way by all of them.
  Langfuse sums every usage type whose name contains "input" into the input total, so ``input`` is Anthropic's own
  ``input_tokens`` (cache excluded) and the cache reads and writes are their own types, ``input_cache_read`` and
  ``input_cache_creation``, the names its Anthropic price tables use. Only generations get usage: the root carries
  the run totals under ``looptrace.usage.*``, which Langfuse does not read as usage.
* Cost: ``langfuse.observation.cost_details`` (JSON, ``{"total": usd}``) is taken as given instead of inferred.
* Input and output: Langfuse maps ``gen_ai.input.messages`` / ``gen_ai.output.messages`` and, for tools,
  ``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result``; a tool observation is named after ``gen_ai.tool.name``.
  spans.py already writes all of these, so nothing here repeats them (it would double the size of every span).
* Level: ``langfuse.observation.level`` (DEBUG, DEFAULT, WARNING, ERROR) and ``langfuse.observation.status_message``
  override what Langfuse derives from the span status (ERROR for an error status).
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import requests

from . import semconv as sc
from .failures import Failure, failure_from_exception, failure_from_status
from .logs import log
from .settings import LangfuseSettings, safe_url

TRACE_NAME = sc.LANGFUSE_TRACE_NAME
USER_ID = sc.LANGFUSE_USER_ID
SESSION_ID = sc.LANGFUSE_SESSION_ID
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
MAX_PROPAGATED_CHARS = 200  # Langfuse drops longer trace-level values
MAX_STATUS_MESSAGE_CHARS = 1024
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_]+$")

ANOMALY_SCORE = sc.LANGFUSE_ANOMALY_SCORE


def trace_attributes(trace_name: str, *, session_id: str | None = None, user_id: str | None = None,
                     tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Langfuse's trace attributes, for *every* span of a run (the trace is named after the agent).

    Raises ValueError for a value Langfuse would silently drop (over 200 characters, a metadata key that is not
    alphanumeric), so the caller hears about it when the run starts rather than never.
    """
    attributes: dict[str, Any] = {TRACE_NAME: _checked("trace name", trace_name)}
    if session_id is not None:
        attributes[SESSION_ID] = _checked("session_id", session_id)
    if user_id is not None:
        attributes[USER_ID] = _checked("user_id", user_id)
    tags = tuple(dict.fromkeys(_checked("tag", tag) for tag in tags))  # unique, order kept
    if tags:
        attributes[TRACE_TAGS] = tags
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not _METADATA_KEY.match(key):
            raise ValueError(f"metadata key {key!r}: Langfuse accepts letters, digits and underscores only")
        # Strings go as they are; anything else as JSON, so 3 and "3" stay distinguishable in Langfuse.
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        attributes[TRACE_METADATA_PREFIX + key] = _checked(f"metadata[{key!r}]", text)
    return attributes


def _checked(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_PROPAGATED_CHARS:
        raise ValueError(f"{what} is {len(value)} characters; Langfuse drops trace attributes over "
                         f"{MAX_PROPAGATED_CHARS}")
    return value


def observation_attributes(kind: str) -> dict[str, str]:
    """The Langfuse observation type of one of our spans: kind is ``agent``, ``turn``, ``chat`` or ``tool``."""
    try:
        return {OBSERVATION_TYPE: OBSERVATION_TYPES[kind]}
    except KeyError:
        raise ValueError(f"unknown span kind {kind!r}; expected one of {', '.join(OBSERVATION_TYPES)}") from None


def generation_attributes(*, input_tokens: int, output_tokens: int, cache_read_input_tokens: int = 0,
                          cache_creation_input_tokens: int = 0, cost_usd: float | None = None) -> dict[str, str]:
    """Usage (and cost) of one model call, for its chat span, in Anthropic's own terms.

    ``input_tokens`` is Anthropic's ``usage.input_tokens``: the uncached input, *not* the GenAI conventions' total
    that spans.py writes to ``gen_ai.usage.input_tokens``. Cache types appear only when non-zero.
    """
    usage = {"input": input_tokens, "output": output_tokens}
    if cache_read_input_tokens:
        usage["input_cache_read"] = cache_read_input_tokens
    if cache_creation_input_tokens:
        usage["input_cache_creation"] = cache_creation_input_tokens
    attributes = {OBSERVATION_USAGE_DETAILS: json.dumps(usage, separators=(",", ":"))}
    if cost_usd is not None:
        attributes[OBSERVATION_COST_DETAILS] = json.dumps({"total": cost_usd}, separators=(",", ":"))
    return attributes


def anomaly_attributes(message: str, *, level: str = "WARNING") -> dict[str, str]:
    """Marks the offending observation: level WARNING and the anomaly as its status message.

    The level replaces the ERROR Langfuse derives from an error status, so for a span that failed as well pass
    ``level="ERROR"``.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    return {OBSERVATION_LEVEL: level, OBSERVATION_STATUS_MESSAGE: message[:MAX_STATUS_MESSAGE_CHARS]}


# --- scores -------------------------------------------------------------------------------------------------------

SCORES_PATH = "/api/public/scores"
_STOP = object()


class LangfuseScores:
    """Sends scores to Langfuse's public REST API (``POST /api/public/scores``), off the caller's thread.

    Plain HTTP rather than the langfuse SDK: the SDK's client brings its own tracer provider, span processor and
    background threads, and looptrace already owns those. One score is one JSON object, the form every Langfuse
    version accepts. Each score gets an id derived from what it says, so sending it again (a retry, a second run of
    the same code on the same trace) updates it instead of adding a duplicate.

    ``send`` never blocks and never raises; failures end as one warning per cause. ``flush(timeout_s)`` waits, at most
    that long, for the queue to drain; ``close(timeout_s)`` flushes and stops the worker.
    """

    def __init__(self, base_url: str, public_key: str, secret_key: str, *, timeout_s: float = 5.0) -> None:
        self._settings = LangfuseSettings(public_key=public_key, secret_key=secret_key, base_url=base_url.rstrip("/"),
                                          timeout_s=timeout_s)
        self.url = self._settings.base_url + SCORES_PATH
        self.timeout_s = timeout_s
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._closed = False
        self.sent = 0

    @classmethod
    def from_settings(cls, settings: LangfuseSettings, *, timeout_s: float | None = None) -> LangfuseScores:
        return cls(settings.base_url, settings.public_key, settings.secret_key,
                   timeout_s=timeout_s if timeout_s is not None else min(settings.timeout_s, 5.0))

    @classmethod
    def from_env(cls) -> LangfuseScores | None:
        """None when the Langfuse keys are not set."""
        settings = LangfuseSettings.from_env()
        return None if settings is None else cls.from_settings(settings)

    def send(self, trace_id: str, *, name: str, value: float | str, comment: str | None = None,
             data_type: str | None = None, observation_id: str | None = None, score_id: str | None = None,
             metadata: Mapping[str, Any] | None = None) -> str:
        """Queue one score on a trace (or on one observation of it); returns the score id.

        ``data_type`` is NUMERIC, BOOLEAN or CATEGORICAL (then ``value`` is a string); Langfuse assumes NUMERIC.
        """
        score_id = score_id or _score_id(trace_id, name, value, observation_id)
        body: dict[str, Any] = {"id": score_id, "traceId": trace_id, "name": name, "value": value,
                                # Fixed now, so that a retry is "the same score again", which Langfuse upserts.
                                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for key, item in (("observationId", observation_id), ("comment", comment), ("dataType", data_type),
                          ("metadata", dict(metadata) if metadata else None)):
            if item is not None:
                body[key] = item
        with self._lock:
            if self._closed:
                return score_id
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="looptrace-langfuse-scores", daemon=True)
                self._thread.start()
        self._queue.put(body)
        return score_id

    def anomaly(self, trace_id: str, anomaly_type: str, message: str, *, span_id: str | None = None) -> str:
        """The score that marks a run with a loop anomaly: categorical ``loop_anomaly`` = the anomaly type, on the
        trace (so the traces table can filter on it and an alert can count it), one per type and trace, with the
        detector's message as the comment and the id of the span that reported it (the run's root) in the metadata."""
        return self.send(trace_id, name=ANOMALY_SCORE, value=anomaly_type, data_type="CATEGORICAL",
                         comment=message[:MAX_STATUS_MESSAGE_CHARS],
                         metadata={"span_id": span_id} if span_id else None)

    def alert_callback(self, anomaly: Any, context: Any) -> None:
        """``Alerts(callback=scores.alert_callback)``: the anomaly score for every anomaly the detector reports."""
        self.anomaly(context.trace_id, anomaly.type, anomaly.message, span_id=context.span_id)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued score was sent or failed, at most ``timeout_s``. True when the queue drained."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout_s: float = 5.0) -> bool:
        drained = self.flush(timeout_s)
        with self._lock:
            self._closed = True
            if self._thread is not None:
                self._queue.put(_STOP)
        return drained

    def _work(self) -> None:
        session = requests.Session()
        headers = {"Authorization": self._settings.authorization(), "Content-Type": "application/json"}
        while True:
            body = self._queue.get()
            try:
                if body is _STOP:
                    return
                self._post(session, headers, body)
            finally:
                self._queue.task_done()

    def _post(self, session: requests.Session, headers: Mapping[str, str], body: Mapping[str, Any]) -> None:
        try:
            response = session.post(self.url, json=body, headers=headers, timeout=self.timeout_s)
        except Exception as error:  # noqa: BLE001 - classified, reported once, never raised
            self._warn(failure_from_exception(error))
            return
        if response.status_code >= 300:
            self._warn(failure_from_status(response.status_code))
        else:
            self.sent += 1
            self._warned.clear()

    def _warn(self, failure: Failure) -> None:
        if failure.cause in self._warned:
            return
        self._warned.add(failure.cause)
        log.warning("langfuse_score_failed", backend="langfuse", cause=failure.cause, detail=failure.detail,
                    endpoint=safe_url(self.url),
                    hint="the run's spans are not affected; check LANGFUSE_BASE_URL and the keys")


def _score_id(trace_id: str, name: str, value: Any, observation_id: str | None) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"looptrace:{trace_id}:{observation_id or ''}:{name}:{value}"))
