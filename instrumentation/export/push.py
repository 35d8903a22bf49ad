"""``looptrace traces push``: send what a backend could not take earlier, from the trace file, never twice.

The undelivered list (``tracefile/undelivered.py``) names the spans by id and the trace file that holds them. A push
reads that trace file and the files it was rotated into (oldest first), rebuilds each listed span as an SDK
``ReadableSpan`` and sends it with the SDK's own exporter for the backend (``exporters.network_exporter``), in
batches. Before a batch goes out its spans are marked ``sending`` (fsynced), and ``delivered`` once the backend took
it, so a second push sends nothing again. Scores kept because Langfuse was down are posted after the spans.

Where "never twice" needs the backend's help, and what push does about it:

* A batch whose request may have arrived although no answer did (the export timed out, in a run or in a push, or a
  push was killed while sending) is *uncertain*. Langfuse makes one observation per span id (its OTel ingestion sets
  the observation id to the span id and merges events with the same id), so a second copy changes nothing there: push
  resends uncertain spans to Langfuse. An OTLP backend may store a span twice, so push holds them back and says so,
  unless ``resend_interrupted`` (``--resend-interrupted``) asks for them. An answer that arrives after push stopped
  waiting (while it still runs) marks the batch delivered.
* Scores carry ids derived from what they say (``langfuse.scores.stable_score_id``): posting one again updates it.

Nothing is dropped silently, and each span push cannot send is said for what it is: no longer in any trace file
(rotated away, deleted: lost, reported once and listed no more), on a line of the trace file that cannot be rebuilt
as spans (lost, the same), in a trace file that cannot be read now, or possibly on a line longer than the line limit
(left listed: a later push may read them). Lines of the list itself that cannot be read are skipped and said.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from ..settings import MAX_LINE_BYTES_VARIABLE, ConfigurationError, LangfuseSettings, Settings
from ..tracefile.read import (
    BadLine,
    ResourceTable,
    TraceFileError,
    decode_attributes,
    decode_span_kind,
    decode_status_code,
    describe_unreadable,
    read_lines,
    trace_files,
)
from ..tracefile.undelivered import Pending, PushInProgress, UndeliveredList, span_key
from .failures import TIMEOUT
from .mapped import MappedSpanExporter, StoredRuns, backend_mappings, mappings_for

__all__ = ["PushInProgress", "PushReport", "push", "spans_as_sent"]

BATCH_SPANS = 512  # spans per request, the BatchSpanProcessor's default batch
# Backends that keep one record per span id, so that a second copy of an uncertain batch is harmless.
RESENDS_SAFELY = frozenset({"langfuse"})


@dataclass
class PushReport:
    """What a push did, per backend, in spans (and scores), and why whatever was not sent was not."""

    path: Path
    sent: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)  # tried (or not tried after a failure) and still pending
    uncertain: Counter = field(default_factory=Counter)  # sent, no answer in time: they may be there
    skipped: Counter = field(default_factory=Counter)  # pending for a backend not targeted or not configured
    held: Counter = field(default_factory=Counter)  # uncertain, not resent without resend_interrupted
    missing: Counter = field(default_factory=Counter)  # listed, but in no trace file any more: lost
    unbuilt: Counter = field(default_factory=Counter)  # on a line that cannot be rebuilt as spans: lost
    unread: Counter = field(default_factory=Counter)  # their trace file (or line) cannot be read now: still listed
    scores_sent: Counter = field(default_factory=Counter)
    scores_failed: Counter = field(default_factory=Counter)
    scores_skipped: Counter = field(default_factory=Counter)
    list_lines_skipped: list[BadLine] = field(default_factory=list)  # lines of the list itself it could not read
    notes: list[str] = field(default_factory=list)  # why spans were unread, unbuilt or missing, one phrase each

    @property
    def ok(self) -> bool:
        """Nothing failed, nothing was held back or left uncertain, nothing was lost or unreadable."""
        return not (self.failed or self.uncertain or self.held or self.missing or self.unbuilt or self.unread
                    or self.scores_failed or self.list_lines_skipped)

    def summary(self) -> str:
        if not any((self.sent, self.failed, self.uncertain, self.skipped, self.held, self.missing, self.unbuilt,
                    self.unread, self.scores_sent, self.scores_failed, self.scores_skipped, self.list_lines_skipped)):
            return f"nothing to push: {self.path} lists nothing undelivered"
        parts = [f"sent {_count(n, 'span')} to {b}" for b, n in sorted(self.sent.items())]
        parts += [f"sent {_count(n, 'score')} to {b}" for b, n in sorted(self.scores_sent.items())]
        parts += [f"{_count(n, 'span')} for {b} still pending (it failed; see the warning)"
                  for b, n in sorted(self.failed.items())]
        parts += [f"{_count(n, 'span')} for {b} sent with no answer in time: they may have arrived, so "
                  + ("the next push sends them again (Langfuse keeps one copy per span id)" if b in RESENDS_SAFELY
                     else "they are held back from now on (send them anyway with --resend-interrupted)")
                  for b, n in sorted(self.uncertain.items())]
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
        parts += [f"{_count(n, 'span')} for {b} lost: the trace file holds them on a line that cannot be rebuilt as "
                  f"spans" for b, n in sorted(self.unbuilt.items())]
        parts += [f"{_count(n, 'span')} for {b} left pending: not read this time"
                  for b, n in sorted(self.unread.items())]
        if self.list_lines_skipped:
            first = self.list_lines_skipped[0]
            parts.append(f"{_count(len(self.list_lines_skipped), 'line')} of {self.path} could not be read and "
                         f"{'was' if len(self.list_lines_skipped) == 1 else 'were'} left out of it (first: line "
                         f"{first.line}: {first.reason})")
        return "; ".join(parts) + "".join(f"\n  {note}" for note in self.notes)


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
    limits the push to those backends. A backend that fails is not tried again in the same push. With nothing listed
    (no list file), a push creates nothing: no folder, no lock file, no connection.
    """
    settings = settings or Settings()
    listing = UndeliveredList(undelivered_path if undelivered_path is not None else settings.undelivered_file,
                              max_line_bytes=settings.max_line_bytes)
    available = set(exporters) if exporters is not None else set(settings.configured_backends())
    targets = set(to) if to else available
    missing = targets - available
    if missing:
        raise ConfigurationError(f"cannot push to {', '.join(sorted(missing))}: it is not configured "
                                 "(langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY, otlp needs "
                                 "OTEL_EXPORTER_OTLP_ENDPOINT)")
    report = PushReport(listing.path)
    if not listing.path.exists():
        return report
    outcomes = _Outcomes(listing)
    own = exporters is None
    if exporters is None:
        from .exporters import network_exporter

        exporters = {name: network_exporter(name, settings, undelivered=outcomes) for name in available}
    if post_score is None and settings.langfuse is not None:
        post_score = _score_poster(settings.langfuse)
    # Each span leaves as it first would have: its input whole again, and its backend's attributes (mapped.py).
    runs = StoredRuns()
    sending = {name: MappedSpanExporter(exporter, mappings_for(backend_mappings(name, settings)), runs)
               for name, exporter in exporters.items()}
    try:
        with listing.pushing():
            pending = listing.pending()
            report.list_lines_skipped = list(listing.bad_lines)
            _push_spans(pending, listing, _Sender(listing, sending, outcomes if own else None, report), targets,
                        resend_interrupted, settings.max_line_bytes, report, runs)
            _push_scores(pending, listing, targets, post_score, report)
            listing.compact()
    finally:
        if own:
            for exporter in exporters.values():
                exporter.shutdown()
    return report


def _push_spans(pending: Mapping[str, Pending], listing: UndeliveredList, sender: _Sender, targets: set[str],
                resend: bool, max_line_bytes: int, report: PushReport, runs: StoredRuns) -> None:
    wanted: dict[str, dict[str, list[str]]] = defaultdict(dict)  # trace file -> span key -> backends
    for backend, waiting in pending.items():
        if backend not in targets:
            report.skipped[backend] += waiting.span_count
            continue
        for trace_file, keys in waiting.spans.items():
            for key in keys:
                if key in waiting.uncertain and not (resend or backend in RESENDS_SAFELY):
                    report.held[backend] += 1
                else:
                    wanted[trace_file].setdefault(key, []).append(backend)
    for trace_file, backends_of in wanted.items():
        runs.read(trace_file, {key[:32] for key in backends_of}, max_line_bytes)
        scan = _TraceFileScan(trace_file, backends_of, max_line_bytes)
        for key, span in scan.spans():
            for backend in backends_of.pop(key, []):  # popped: a span written twice is sent once
                sender.add(backend, key, span)
        sender.flush_all()
        _settle_unsent(listing, scan, backends_of, report)


def _settle_unsent(listing: UndeliveredList, scan: _TraceFileScan, left: Mapping[str, list[str]],
                   report: PushReport) -> None:
    """The listed spans of one trace file that were not found or not rebuilt: said for what they are. Those that can
    never be sent are reported once and listed no more; those a later push may read stay listed."""
    given_up: dict[str, list[str]] = defaultdict(list)
    counts: Counter[str] = Counter()
    for key, backends in left.items():
        kind = "unread" if scan.unreadable or (scan.too_long and key not in scan.unbuilt) else \
            "unbuilt" if key in scan.unbuilt else "missing"
        for backend in backends:
            getattr(report, kind)[backend] += 1
            counts[kind] += 1
            if kind != "unread":
                given_up[backend].append(key)
    for backend, keys in given_up.items():
        listing.record(backend, "delivered", keys)  # nothing left to send: reported now, listed no more (one append)
    report.notes.extend(scan.notes(counts))


class _TraceFileScan:
    """One trace file (and its rotated files) read for the listed spans it holds, and what got in the way."""

    def __init__(self, trace_file: str, keys: Mapping[str, list[str]], max_line_bytes: int) -> None:
        self.trace_file = trace_file
        self.keys = keys
        self.max_line_bytes = max_line_bytes
        self.unreadable: str | None = None  # why the file could not be read at all
        self.too_long = 0  # lines over the limit, read past: a listed span may be on one
        self.damaged: list[BadLine] = []  # lines that are not JSON or not trace data
        self.unbuilt: dict[str, str] = {}  # key -> why the line holding it cannot be rebuilt

    def spans(self) -> Iterator[tuple[str, ReadableSpan]]:
        """(key, ReadableSpan) of every span of the file whose key is listed."""
        resources = ResourceTable()  # a line may name its resource by id: the line that holds it came before
        try:
            for number, data in read_lines(self.trace_file, self._bad_line, max_line_bytes=self.max_line_bytes,
                                           regular_only=True):
                try:
                    found = list(_spans_in(data, self.keys, resources))
                except Exception as exc:  # noqa: BLE001 - a line push cannot rebuild costs its spans, said as such
                    named = _keys_on(data, self.keys)
                    if named:
                        self.unbuilt.update((key, f"line {number}: {describe_unreadable(exc)}") for key in named)
                    else:
                        self.damaged.append(BadLine(number, describe_unreadable(exc)))
                    continue
                yield from found
        except TraceFileError as exc:
            if any(os.path.lexists(name) for name in trace_files(self.trace_file)):
                self.unreadable = str(exc)  # there, but not readable now (permissions, a FIFO): nothing given up
            # else gone, rotated files and all: every listed span of it is missing

    def _bad_line(self, bad: BadLine) -> None:
        if bad.reason.startswith("longer than"):
            self.too_long += 1
        else:
            self.damaged.append(bad)

    def notes(self, counts: Mapping[str, int]) -> list[str]:
        """Why this file's spans were not sent, where the summary's words alone do not say it."""
        where = self.trace_file
        if counts.get("unread") and self.unreadable:
            return [f"{where}: {self.unreadable}; its spans stay listed"]
        notes = []
        if counts.get("unread"):
            notes.append(f"{where}: {_count(self.too_long, 'line')} longer than the line limit "
                         f"({self.max_line_bytes:,} bytes) could not be read and may hold them: raise "
                         f"{MAX_LINE_BYTES_VARIABLE} and push again")
        if counts.get("unbuilt"):
            notes.append(f"{where}: {next(iter(self.unbuilt.values()))}")
        if counts.get("missing") and self.damaged:
            first = self.damaged[0]
            notes.append(f"{where}: or on one of its {_count(len(self.damaged), 'damaged line')} (first: line "
                         f"{first.line}: {first.reason})")
        return notes


def _keys_on(data: Any, keys: Mapping[str, list[str]]) -> list[str]:
    """The listed keys of the spans a line names, found as leniently as its shape allows."""
    found = []
    groups = data.get("resourceSpans") if isinstance(data, dict) else None
    for resource_spans in groups if isinstance(groups, list) else ():
        scopes = resource_spans.get("scopeSpans") if isinstance(resource_spans, dict) else None
        for scope_spans in scopes if isinstance(scopes, list) else ():
            spans = scope_spans.get("spans") if isinstance(scope_spans, dict) else None
            for span in spans if isinstance(spans, list) else ():
                if isinstance(span, dict) and isinstance(span.get("traceId"), str) \
                        and isinstance(span.get("spanId"), str):
                    key = f"{span['traceId']}{span['spanId']}".lower()
                    if key in keys:
                        found.append(key)
    return found


class _Outcomes:
    """What push's own guarded exporters say of a batch they could not deliver (``delivery.UndeliveredSink``):
    whether its request may have arrived (a timeout), and, if an answer comes after all, that it was delivered."""

    def __init__(self, listing: UndeliveredList) -> None:
        self.listing = listing
        self.last_uncertain: bool | None = None
        self._batches: dict[str, tuple[str, list[str]]] = {}
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.listing.path

    def append(self, backend: str, spans: Sequence[ReadableSpan], *, uncertain: bool = False) -> str:
        batch = uuid.uuid4().hex
        with self._lock:
            self.last_uncertain = uncertain
            self._batches[batch] = (backend, [span_key(s.context.trace_id, s.context.span_id) for s in spans])
        return batch

    def mark_delivered(self, batch: str) -> None:
        with self._lock:
            backend, keys = self._batches.pop(batch, ("", []))
        if keys:
            self.listing.record(backend, "delivered", keys)


_SENT, _NOT_SENT, _UNCERTAIN = "sent", "not sent", "uncertain"


class _Sender:
    """Batches per backend; marks each batch sending, then delivered, not sent, or (no answer in time) leaves it
    marked sending, which the list reads as uncertain."""

    def __init__(self, listing: UndeliveredList, exporters: Mapping[str, SpanExporter], outcomes: _Outcomes | None,
                 report: PushReport) -> None:
        self.listing = listing
        self.exporters = exporters
        self.outcomes = outcomes
        self.report = report
        self.stopped: set[str] = set()  # backends that failed in this push: not tried again
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
        if backend in self.stopped:
            self.report.failed[backend] += len(batch)
            return
        keys = [key for key, _ in batch]
        self.listing.record(backend, "sending", keys)
        outcome = self._export(backend, [span for _, span in batch])
        if outcome == _SENT:
            self.listing.record(backend, "delivered", keys)
            self.report.sent[backend] += len(batch)
            return
        self.stopped.add(backend)
        if outcome == _UNCERTAIN:  # the "sending" line stays the last word: uncertain, held back from an OTLP backend
            self.report.uncertain[backend] += len(batch)
        else:
            self.listing.record(backend, "not_sent", keys)
            self.report.failed[backend] += len(batch)

    def _export(self, backend: str, spans: list[ReadableSpan]) -> str:
        """Whether the backend took the batch, refused it, or may have it (no answer in time, or an exporter that
        raised while the request may have been on the wire)."""
        exporter = self.exporters[backend]
        if self.outcomes is not None:
            self.outcomes.last_uncertain = None
        try:
            result = exporter.export(spans)
        except Exception:  # noqa: BLE001 - a caller's unguarded exporter: whether the request went out is unknown
            return _UNCERTAIN
        if result == SpanExportResult.SUCCESS:
            return _SENT
        if self.outcomes is not None and self.outcomes.last_uncertain is not None:
            return _UNCERTAIN if self.outcomes.last_uncertain else _NOT_SENT
        failure = getattr(exporter, "last_failure", None)  # a guarded exporter of the caller's
        return _UNCERTAIN if getattr(failure, "cause", None) == TIMEOUT else _NOT_SENT


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

def _push_scores(pending: Mapping[str, Pending], listing: UndeliveredList, targets: set[str],
                 post_score: Callable[[Mapping[str, Any]], bool] | None, report: PushReport) -> None:
    for backend, waiting in pending.items():  # as read before the spans were sent: their records touch no score
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
