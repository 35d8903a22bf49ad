"""What Langfuse needs to see on looptrace's spans, and the score that marks a run with an anomaly.

Spans reach Langfuse through its OTLP endpoint (``export.langfuse_span_exporter``), and Langfuse's ingestion turns
span attributes into its data model. The functions here return plain attribute dicts for ``spans.py`` to merge; they
know nothing about OpenTelemetry, so they cost nothing when Langfuse is not in use and are trivially testable.

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

import hashlib
import json
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import requests

from . import semconv as sc
from .failures import Failure, failure_from_exception, failure_from_status
from .logs import log
from .per_provider import PerProvider
from .settings import LangfuseSettings, safe_url

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
MAX_PROPAGATED_CHARS = 200  # the Langfuse SDK drops longer trace-level values; we cut them to this and mark the cut
MAX_STATUS_MESSAGE_CHARS = 1024
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_]+$")
_ENVIRONMENT = re.compile(r"^(?!langfuse)[a-z0-9_-]{1,40}$")  # what the scores API and the SDK accept

ANOMALY_SCORE = sc.LANGFUSE_ANOMALY_SCORE


def trace_attributes(trace_name: str, *, session_id: str | None = None, user_id: str | None = None,
                     tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Langfuse's trace attributes, for *every* span of a run (the trace is named after the agent).

    The session is not among them: spans.py sends it as ``gen_ai.conversation.id``, which Langfuse reads as the
    session. A value over 200 characters is cut to 200 and ends in "…": visible, never an exception in a run. An
    empty value or a metadata key that is not alphanumeric raises ValueError, so a caller hears about it at once.
    """
    attributes: dict[str, Any] = {TRACE_NAME: _checked("trace name", trace_name)}
    if session_id is not None:
        _checked("session_id", session_id)
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


def session_id_of(session_id: str) -> str:
    """The session id as it goes on spans: checked and capped like the trace attributes."""
    return _checked("session_id", session_id)


def _checked(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return capped(value)


def capped(value: str) -> str:
    """At most MAX_PROPAGATED_CHARS characters; a longer value is cut and ends in "…", so the cut shows."""
    return value if len(value) <= MAX_PROPAGATED_CHARS else value[: MAX_PROPAGATED_CHARS - 1] + "…"


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
    for key in (ENVIRONMENT, "deployment.environment.name", "deployment.environment"):
        value = _valid_environment(str((resource or {}).get(key, "")))
        if value:
            return value
    return None


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
    attributes = {OBSERVATION_USAGE_DETAILS: _compact_json(usage)}
    if cost_usd is not None:
        attributes[OBSERVATION_COST_DETAILS] = _compact_json({"total": cost_usd})
    return attributes


# json.dumps(value, separators=(",", ":")) with the encoder made once: this runs for every model call.
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


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

    def __init__(self, base_url: str, public_key: str, secret_key: str, *, timeout_s: float = 5.0,
                 environment: str | None = None) -> None:
        # Scores go to the environment of the run's observations, or environment-filtered views would miss them.
        self.environment = environment
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
        # Where a score Langfuse could not take goes (the undelivered list's keep_score), for `looptrace traces push`.
        self.keep_undelivered: Callable[[Mapping[str, Any]], None] | None = None

    @classmethod
    def from_settings(cls, settings: LangfuseSettings, *, resource: Any, timeout_s: float | None = None
                      ) -> LangfuseScores:
        """Scores for the project of ``settings``, filed in the environment of the runs' observations: ``resource``
        is the tracer provider's resource, or the resource attributes (``Settings.resource_attributes``)."""
        attributes: Mapping[str, Any] = getattr(resource, "attributes", resource)
        return cls(settings.base_url, settings.public_key, settings.secret_key,
                   timeout_s=timeout_s if timeout_s is not None else min(settings.timeout_s, 5.0),
                   environment=run_environment(settings, attributes))

    def send(self, trace_id: str, *, name: str, value: float | str, comment: str | None = None,
             data_type: str | None = None, observation_id: str | None = None, score_id: str | None = None,
             metadata: Mapping[str, Any] | None = None) -> str:
        """Queue one score on a trace (or on one observation of it); returns the score id.

        ``data_type`` is NUMERIC, BOOLEAN or CATEGORICAL (then ``value`` is a string); Langfuse assumes NUMERIC.
        Only fields of the API's CreateScoreRequest are sent; the deterministic id alone makes a retry an update.
        """
        body: dict[str, Any] = {"id": score_id or stable_score_id(trace_id, name, value, observation_id),
                                "traceId": trace_id, "name": name, "value": value}
        for key, item in (("observationId", observation_id), ("comment", comment), ("dataType", data_type),
                          ("metadata", dict(metadata) if metadata else None), ("environment", self.environment)):
            if item is not None:
                body[key] = item
        return self._enqueue(body)

    def anomaly(self, trace_id: str, anomaly_type: str, message: str, *, span_id: str | None = None) -> str:
        """The score that marks a run with a loop anomaly (``anomaly_score_body``), queued."""
        return self._enqueue(anomaly_score_body(trace_id, anomaly_type, message, span_id=span_id,
                                                environment=self.environment))

    def _enqueue(self, body: dict[str, Any]) -> str:
        with self._lock:
            if self._closed:
                return body["id"]
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="looptrace-langfuse-scores", daemon=True)
                self._thread.start()
        self._queue.put(body)
        return body["id"]

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
        if not drained:  # what the deadline left unsent is kept, not dropped (the worker may still post one)
            while True:
                try:
                    body = self._queue.get_nowait()
                except queue.Empty:
                    break
                if body is not _STOP:
                    self._keep(body)
                self._queue.task_done()
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
            self._keep(body)
            return
        if response.status_code >= 300:
            self._warn(failure_from_status(response.status_code))
            if response.status_code not in (400, 422):  # a body Langfuse refuses would be refused again
                self._keep(body)
        else:
            self.sent += 1
            self._warned.clear()

    def _keep(self, body: Mapping[str, Any]) -> None:
        keep = self.keep_undelivered
        if keep is not None:
            try:
                keep(body)
            except Exception:  # noqa: BLE001 - an unwritable list costs the score, as it did before it existed
                pass

    def _warn(self, failure: Failure) -> None:
        if failure.cause in self._warned:
            return
        self._warned.add(failure.cause)
        log.warning("langfuse_score_failed", backend="langfuse", cause=failure.cause, detail=failure.detail,
                    endpoint=safe_url(self.url),
                    hint="the run's spans are not affected; " + (
                        "scores Langfuse could not take are kept for `looptrace traces push` (a malformed one, "
                        "HTTP 400 or 422, is not); " if self.keep_undelivered is not None else "")
                    + "check LANGFUSE_BASE_URL and the keys")


def stable_score_id(trace_id: str, name: str, value: Any, observation_id: str | None = None) -> str:
    """A score's id, the same whoever posts it (a live run, watch, a scan): a second post updates, never adds."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"looptrace:{trace_id}:{observation_id or ''}:{name}:{value}"))


def anomaly_score_body(trace_id: str, anomaly_type: str, message: str, *, span_id: str | None = None,
                       environment: str | None = None) -> dict[str, Any]:
    """The score that marks a run with a loop anomaly, as the scores API takes it: categorical ``loop_anomaly`` = the
    anomaly type, on the trace (so the traces table can filter on it and an alert can count it), one per type and
    trace, with the detector's message as the comment and the id of the span that reported it (the run's root) in
    the metadata; filed in ``environment`` unless that is Langfuse's default one."""
    body: dict[str, Any] = {"id": stable_score_id(trace_id, ANOMALY_SCORE, anomaly_type), "traceId": trace_id,
                            "name": ANOMALY_SCORE, "value": anomaly_type, "dataType": "CATEGORICAL",
                            "comment": message[:MAX_STATUS_MESSAGE_CHARS]}
    if span_id:
        body["metadata"] = {"span_id": span_id}
    if environment and environment != DEFAULT_ENVIRONMENT:
        body["environment"] = environment
    return body


# --- a link to the trace in Langfuse's UI ---------------------------------------------------------------------------

PROJECTS_PATH = "/api/public/projects"  # "Get Project associated with API key": {"data": [{"id", "name"}]}
PROJECT_LOOKUP_TIMEOUT_S = 2.0


class TraceLinks:
    """Links to traces in the Langfuse UI: ``{base_url}/project/{project id}/traces/{trace id}``.

    The project id is what the keys belong to, asked once of the public API (``GET /api/public/projects``) on a
    background thread as soon as this is made, and kept: in memory for the process and in the user's cache directory
    for the next one, keyed by a hash of the base URL and the public key (never the secret). ``url()`` waits for a
    lookup still on the wire at most ``wait_s``; a lookup that failed, or a server that does not answer, gives None:
    no link, never an error, never more than a short wait.
    """

    _known: dict[str, str] = {}  # cache key -> project id, for every TraceLinks of the process
    _lock = threading.Lock()

    def __init__(self, settings: LangfuseSettings, *, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.base_url = settings.base_url.rstrip("/")
        self._settings = settings
        self._key = hashlib.sha256(f"{self.base_url}\n{settings.public_key}".encode()).hexdigest()[:32]
        self._cache_file = _cache_file(cache_dir if cache_dir is not None else settings.cache_home, cache_dir is None)
        self.project_id: str | None = self._cached()
        self._thread: threading.Thread | None = None
        if self.project_id is None:
            self._thread = threading.Thread(target=self._look_up, name="looptrace-langfuse-project", daemon=True)
            self._thread.start()

    def url(self, trace_id: str, *, wait_s: float = PROJECT_LOOKUP_TIMEOUT_S) -> str | None:
        """The trace's URL in the Langfuse UI, or None when the project is unknown (or the trace id is all zeros)."""
        if not trace_id or set(trace_id) == {"0"}:
            return None
        if self._thread is not None:
            self._thread.join(wait_s)
        project = self.project_id
        return f"{self.base_url}/project/{project}/traces/{trace_id}" if project else None

    def _cached(self) -> str | None:
        with self._lock:
            if self._key in self._known:
                return self._known[self._key]
        try:
            stored = json.loads(self._cache_file.read_text(encoding="utf-8")) if self._cache_file else {}
        except (OSError, ValueError):
            return None
        project = stored.get(self._key) if isinstance(stored, dict) else None
        if isinstance(project, str) and project:
            with self._lock:
                self._known[self._key] = project
            return project
        return None

    def _look_up(self) -> None:
        try:
            response = requests.get(self.base_url + PROJECTS_PATH, timeout=PROJECT_LOOKUP_TIMEOUT_S,
                                    headers={"Authorization": self._settings.authorization()})
            projects = response.json().get("data") if response.status_code == 200 else None
            project = projects[0].get("id") if isinstance(projects, list) and projects else None
        except Exception as error:  # noqa: BLE001 - a link is a convenience: any failure just means no link
            log.debug("langfuse_project_lookup_failed", error=type(error).__name__, endpoint=safe_url(self.base_url))
            return
        if not isinstance(project, str) or not project:
            return
        self.project_id = project
        with self._lock:
            self._known[self._key] = project
        self._remember(project)

    def _remember(self, project: str) -> None:
        if self._cache_file is None:
            return
        try:
            stored = json.loads(self._cache_file.read_text(encoding="utf-8")) if self._cache_file.exists() else {}
            stored = stored if isinstance(stored, dict) else {}
            stored[self._key] = project
            self._cache_file.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._cache_file.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(stored), encoding="utf-8")
            os.replace(temporary, self._cache_file)
        except (OSError, ValueError):
            pass  # an unwritable cache costs one lookup per process, nothing more


def _cache_file(directory: str | os.PathLike[str] | None, cache_home: bool):
    """The cache file in ``directory`` itself, or under a cache home (XDG_CACHE_HOME's, or ~/.cache)."""
    from pathlib import Path

    if not cache_home and directory is not None:
        return Path(directory) / "langfuse-projects.json"
    root = Path(directory) if directory is not None else Path.home() / ".cache"
    return root / "looptrace" / "langfuse-projects.json"


# Which tracer provider sends to which Langfuse project: setup.configure() registers its provider, and a run's
# spans (spans.Tracing) look up the link for the provider they were made with.
_LINKS: PerProvider[TraceLinks] = PerProvider()


def register_trace_links(tracer_provider: Any, links: TraceLinks) -> None:
    _LINKS.attach(tracer_provider, links)


def trace_links_for(tracer_provider: Any) -> TraceLinks | None:
    return _LINKS.of(tracer_provider)
