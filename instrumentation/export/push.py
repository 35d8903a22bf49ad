"""``looptrace traces push``: send what a backend could not take earlier, from the trace file, never twice.

The undelivered list (``tracefile/undelivered.py``) names the spans by id and the trace file that holds them. A push
reads that trace file and the files it was rotated into (oldest first), rebuilds each listed span as an SDK
``ReadableSpan`` and sends it with the SDK's own exporter for the backend (``exporters.network_exporter``), in
batches. Before a batch goes out its spans are marked ``sending`` (fsynced), and ``delivered`` once the backend took
it, so a second push sends nothing again. Scores kept because Langfuse was down are posted after the spans.

Where "never twice" needs the backend's help, and what push does about it:

* A batch whose request may have arrived although no answer did (the export timed out, or a push was killed while
  sending) is *uncertain*. Langfuse makes one observation per span id (its OTel ingestion sets the observation id to
  the span id and merges events with the same id), so a second copy changes nothing there: push resends uncertain
  spans to Langfuse. An OTLP backend may store a span twice, so push holds them back and says so, unless
  ``resend_interrupted`` (``--resend-interrupted``) asks for them.
* Scores carry ids derived from what they say (``langfuse.scores.stable_score_id``): posting one again updates it.

Nothing is dropped silently: spans no longer in any trace file (rotated away, deleted) are reported as lost, and
dropped from the list so that they are reported once.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from ..settings import ConfigurationError, LangfuseSettings, Settings
from ..tracefile.read import (
    ResourceTable,
    TraceFileError,
    decode_attributes,
    decode_span_kind,
    decode_status_code,
    read_lines,
)
from ..tracefile.undelivered import PushInProgress, UndeliveredList
from .mapped import MappedSpanExporter, StoredRuns, backend_mappings, mappings_for

__all__ = ["PushInProgress", "PushReport", "push", "spans_as_sent"]

BATCH_SPANS = 512  # spans per request, the BatchSpanProcessor's default batch
# Backends that keep one record per span id, so that a second copy of an uncertain batch is harmless.
RESENDS_SAFELY = frozenset({"langfuse"})


@dataclass
class PushReport:
    """What a push did, per backend, in spans (and scores)."""

    path: Path
    sent: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)  # tried and still pending
    skipped: Counter = field(default_factory=Counter)  # pending for a backend not targeted or not configured
    held: Counter = field(default_factory=Counter)  # uncertain, not resent without resend_interrupted
    missing: Counter = field(default_factory=Counter)  # listed, but in no trace file any more: lost
    scores_sent: Counter = field(default_factory=Counter)
    scores_failed: Counter = field(default_factory=Counter)
    scores_skipped: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        """Nothing failed, nothing was held back, nothing was missing."""
        return not (self.failed or self.held or self.missing or self.scores_failed)

    def summary(self) -> str:
        if not any((self.sent, self.failed, self.skipped, self.held, self.missing, self.scores_sent,
                    self.scores_failed, self.scores_skipped)):
            return f"nothing to push: {self.path} lists nothing undelivered"
        parts = [f"sent {_count(n, 'span')} to {b}" for b, n in sorted(self.sent.items())]
        parts += [f"sent {_count(n, 'score')} to {b}" for b, n in sorted(self.scores_sent.items())]
        parts += [f"{_count(n, 'span')} for {b} still pending (it failed; see the warning)"
                  for b, n in sorted(self.failed.items())]
        parts += [f"{_count(n, 'score')} for {b} still pending (it failed; see the warning)"
                  for b, n in sorted(self.scores_failed.items())]
        parts += [f"{_count(n, 'span')} for {b} left pending (not configured or not chosen with --to)"
                  for b, n in sorted(self.skipped.items())]
        parts += [f"{_count(n, 'score')} for {b} left pending (not configured or not chosen with --to)"
                  for b, n in sorted(self.scores_skipped.items())]
        parts += [f"{_count(n, 'span')} for {b} held back: a request carrying them got no answer, so they may "
                  f"already be there (send them anyway with --resend-interrupted)"
                  for b, n in sorted(self.held.items())]
        parts += [f"{_count(n, 'span')} for {b} lost: no trace file holds them any more (rotated away or deleted; "
                  f"raise LOOPTRACE_TRACE_FILE_BACKUPS)" for b, n in sorted(self.missing.items())]
        return "; ".join(parts)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def push(undelivered_path: str | os.PathLike[str] | None = None, exporters: Mapping[str, SpanExporter] | None = None, *,
         to: Iterable[str] | None = None, resend_interrupted: bool = False, settings: Settings | None = None,
         post_score: Callable[[Mapping[str, Any]], bool] | None = None) -> PushReport:
    """Send what the undelivered list names, never twice, and keep listing what still fails.

    ``settings`` say where the list is (unless ``undelivered_path`` is given), how long a line may be, and which
    backends to push to; without them the defaults apply (no backend configured). ``exporters`` maps backend names to
    span exporters (tests pass their own); by default every configured backend gets its guarded exporter. ``post_score``
    posts one Langfuse score body and says whether it was taken (by default, to the configured Langfuse). ``to``
    limits the push to those backends. A backend that fails is not tried again in the same push.
    """
    settings = settings or Settings()
    listing = UndeliveredList(undelivered_path if undelivered_path is not None else settings.undelivered_file)
    own = exporters is None
    if exporters is None:
        from .exporters import network_exporter

        exporters = {name: network_exporter(name, settings) for name in settings.configured_backends()}
    targets = set(to) if to else set(exporters)
    missing = targets - set(exporters)
    if missing:
        raise ConfigurationError(f"cannot push to {', '.join(sorted(missing))}: it is not configured "
                                 "(langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY, otlp needs "
                                 "OTEL_EXPORTER_OTLP_ENDPOINT)")
    if post_score is None and settings.langfuse is not None:
        post_score = _score_poster(settings.langfuse)
    report = PushReport(listing.path)
    # Each span leaves as it first would have: its input whole again, and its backend's attributes (mapped.py).
    runs = StoredRuns()
    sending = {name: MappedSpanExporter(exporter, mappings_for(backend_mappings(name, settings)), runs)
               for name, exporter in exporters.items()}
    try:
        with listing.pushing():
            _push_spans(listing, sending, targets, resend_interrupted, settings.max_line_bytes, report, runs)
            _push_scores(listing, targets, post_score, report)
            listing.compact()
    finally:
        if own:
            for exporter in exporters.values():
                exporter.shutdown()
    return report


def _push_spans(listing: UndeliveredList, exporters: Mapping[str, SpanExporter], targets: set[str],
                resend: bool, max_line_bytes: int, report: PushReport, runs: StoredRuns) -> None:
    wanted: dict[str, dict[str, list[str]]] = defaultdict(dict)  # trace file -> span key -> backends
    for backend, waiting in listing.pending().items():
        if backend not in targets:
            report.skipped[backend] += waiting.span_count
            continue
        for trace_file, keys in waiting.spans.items():
            for key in keys:
                if key in waiting.uncertain and not (resend or backend in RESENDS_SAFELY):
                    report.held[backend] += 1
                else:
                    wanted[trace_file].setdefault(key, []).append(backend)
    sender = _Sender(listing, exporters, report)
    for trace_file, backends_of in wanted.items():
        runs.read(trace_file, {key[:32] for key in backends_of}, max_line_bytes)
        for key, span in _listed_spans(trace_file, backends_of, max_line_bytes):
            for backend in backends_of.pop(key, []):  # popped: a span written twice is sent once
                sender.add(backend, key, span)
        sender.flush_all()
        for key, backends in backends_of.items():
            for backend in backends:
                report.missing[backend] += 1
                listing.record(backend, "delivered", [key])  # nothing left to send: reported now, listed no more


class _Sender:
    """Batches per backend; marks each batch sending, then delivered or not sent."""

    def __init__(self, listing: UndeliveredList, exporters: Mapping[str, SpanExporter], report: PushReport) -> None:
        self.listing = listing
        self.exporters = exporters
        self.report = report
        self.batches: dict[str, list[tuple[str, ReadableSpan]]] = defaultdict(list)

    def add(self, backend: str, key: str, span: ReadableSpan) -> None:
        batch = self.batches[backend]
        batch.append((key, span))
        if len(batch) >= BATCH_SPANS:
            self.flush(backend)

    def flush_all(self) -> None:
        for backend in list(self.batches):
            self.flush(backend)

    def flush(self, backend: str) -> None:
        batch = self.batches.pop(backend, [])
        if not batch:
            return
        if backend in self.report.failed:  # failed once in this push: not tried again
            self.report.failed[backend] += len(batch)
            return
        keys = [key for key, _ in batch]
        self.listing.record(backend, "sending", keys)
        try:
            sent = self.exporters[backend].export([span for _, span in batch]) == SpanExportResult.SUCCESS
        except Exception:  # noqa: BLE001 - an unguarded exporter from a caller: the batch stays pending
            sent = False
        if sent:
            self.listing.record(backend, "delivered", keys)
            self.report.sent[backend] += len(batch)
        else:  # the guarded exporter tells a refusal from a timeout only in its warning: an OTLP retry is held
            self.listing.record(backend, "not_sent", keys)
            self.report.failed[backend] += len(batch)


def _listed_spans(trace_file: str, keys: Mapping[str, list[str]], max_line_bytes: int):
    """(key, ReadableSpan) of every span of the trace file (and its rotated files) whose key is in ``keys``."""
    resources = ResourceTable()  # a line may name its resource by id: the line that holds it came before
    try:
        for _, data in read_lines(trace_file, max_line_bytes=max_line_bytes):
            if not isinstance(data, dict):
                continue
            try:
                found = list(_spans_in(data, keys, resources))
            except Exception:  # noqa: BLE001 - a line push cannot rebuild costs its spans, reported as missing
                continue
            yield from found
    except TraceFileError:
        if os.path.exists(trace_file):
            raise  # there but unreadable (permissions): nothing is given up on, the push stops and says why
        return  # gone, rotated files and all: every listed span of it is reported missing


def _spans_in(data: Mapping[str, Any], keys: Mapping[str, list[str]] | None, resources: ResourceTable):
    for resource_spans in data.get("resourceSpans") or ():
        attributes = resources.resolved(decode_attributes((resource_spans.get("resource") or {}).get("attributes")))
        scopes = resource_spans.get("scopeSpans") or ()
        chosen = [(scope_spans, span) for scope_spans in scopes for span in scope_spans.get("spans") or ()
                  if keys is None or f"{span.get('traceId', '')}{span.get('spanId', '')}".lower() in keys]
        if not chosen:
            continue
        resource = Resource(attributes, schema_url=resource_spans.get("schemaUrl") or None)
        for scope_spans, span in chosen:
            scope = scope_spans.get("scope") or {}
            instrumentation = InstrumentationScope(scope.get("name", ""), scope.get("version") or None,
                                                   scope_spans.get("schemaUrl") or None,
                                                   decode_attributes(scope.get("attributes")) or None)
            key = f"{span['traceId']}{span['spanId']}".lower()
            yield key, readable_span(span, resource, instrumentation)


def spans_as_sent(trace_file: str | os.PathLike[str], backend: str, settings: Settings | None = None
                  ) -> list[ReadableSpan]:
    """Every span of a trace file (its rotated files included) as ``backend``'s exporter sends it, which is what a
    push sends: each model call's input whole, and the backend's attributes added (``mapped``)."""
    settings = settings or Settings()
    path = os.fspath(trace_file)
    runs = StoredRuns()
    runs.read(path, None, settings.max_line_bytes)
    mappings = mappings_for(backend_mappings(backend, settings))
    resources = ResourceTable()
    found = []
    for _, data in read_lines(path, max_line_bytes=settings.max_line_bytes):
        if isinstance(data, dict):
            found += [runs.prepared(span, mappings) for _, span in _spans_in(data, None, resources)]
    return found


# --- OTLP/JSON back to an SDK span ---------------------------------------------------------------------------------

_KIND_BY_OTLP = {1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER,
                 5: SpanKind.CONSUMER}
_STATUS_BY_OTLP = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_PARENT_IS_REMOTE = 0x200  # OTLP span flags: bit 8 says "is_remote is known", bit 9 is its value


def readable_span(span: Mapping[str, Any], resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """One trace-file span as the SDK span an exporter sends: ids, parent, name, kind, times, attributes, events,
    links, status, resource and scope survive the round trip; bytes attributes come back as their base64 text."""
    trace_id = int(span["traceId"], 16)
    flags = int(span.get("flags") or 0)
    parent_id = span.get("parentSpanId")
    parent = SpanContext(trace_id, int(parent_id, 16), is_remote=bool(flags & _PARENT_IS_REMOTE),
                         trace_flags=TraceFlags(TraceFlags.SAMPLED)) if parent_id else None
    status = span.get("status") or {}
    return ReadableSpan(
        name=str(span.get("name", "")),
        context=SpanContext(trace_id, int(span["spanId"], 16), is_remote=False,
                            trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=_trace_state(span)),
        parent=parent,
        resource=resource,
        attributes=_attributes(span.get("attributes")),
        events=[Event(str(e.get("name", "")), _attributes(e.get("attributes")), int(e.get("timeUnixNano") or 0))
                for e in span.get("events") or ()],
        links=[Link(SpanContext(int(link["traceId"], 16), int(link["spanId"], 16), is_remote=True,
                                trace_state=_trace_state(link)), _attributes(link.get("attributes")))
               for link in span.get("links") or ()],
        kind=_KIND_BY_OTLP.get(decode_span_kind(span.get("kind", 1)), SpanKind.INTERNAL),
        status=Status(_STATUS_BY_OTLP.get(decode_status_code(status.get("code", 0)), StatusCode.UNSET),
                      str(status["message"]) if status.get("message") else None),
        start_time=int(span.get("startTimeUnixNano") or 0),
        end_time=int(span.get("endTimeUnixNano") or 0),
        instrumentation_scope=scope,
    )


def _attributes(items: Any) -> dict[str, Any]:
    # The SDK wants sequences as tuples, so that attributes stay immutable.
    return {str(k): tuple(v) if isinstance(v, list) else v for k, v in decode_attributes(items).items()}


def _trace_state(item: Mapping[str, Any]) -> TraceState | None:
    header = item.get("traceState")
    return TraceState.from_header([header]) if header else None


# --- scores --------------------------------------------------------------------------------------------------------

def _push_scores(listing: UndeliveredList, targets: set[str],
                 post_score: Callable[[Mapping[str, Any]], bool] | None, report: PushReport) -> None:
    for backend, waiting in listing.pending().items():
        if not waiting.scores:
            continue
        if backend not in targets or post_score is None:
            report.scores_skipped[backend] += len(waiting.scores)
            continue
        for score_id, body in waiting.scores.items():
            if backend in report.scores_failed:
                report.scores_failed[backend] += 1
            elif post_score(body):
                listing.record(backend, "score_posted", [score_id])
                report.scores_sent[backend] += 1
            else:
                report.scores_failed[backend] += 1


def _score_poster(settings: LangfuseSettings) -> Callable[[Mapping[str, Any]], bool]:
    """Post one score body to Langfuse's public API (the one Langfuse client); True when it was taken."""
    from ..langfuse.api import LangfuseAPI
    from ..langfuse.scores import post_score

    api = LangfuseAPI(settings.base_url, settings.public_key, settings.secret_key, timeout_s=settings.timeout_s)
    return lambda body: post_score(api, body) is None
