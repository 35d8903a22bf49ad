"""The spill file: spans a backend could not take, kept until ``push()`` delivers them, exactly once.

One OTLP/JSON ``TracesData`` per line, like the trace file (``otlp_file.read_spans`` reads it), plus one key that says
which backend the batch was meant for::

    {"looptrace": {"backend": "langfuse", "batch": "<id>"}, "resourceSpans": [...]}

Exactly once, whatever the moment a push is interrupted: a delivered batch's id is appended (and fsynced) to a ledger
beside the file (``<file>.sent``) before anything else happens, and only then is the line dropped from the file by an
atomic rewrite. A batch is always either pending or in the ledger. Pushes exclude each other with an advisory lock;
writers (a run spilling, a push compacting) share another, held only for the write.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans as encode_spans_json
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from .exporters import network_exporter
from .otlp_file import decode_attributes, decode_span_kind, decode_status_code
from .settings import DEFAULT_SPILL_FILE, ConfigurationError, Settings

try:  # advisory file locks keep concurrent runs and pushes from interleaving; Windows has none, threads still lock
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we test
    fcntl = None  # type: ignore[assignment]

__all__ = ["DEFAULT_SPILL_FILE", "PushReport", "SpillFile", "default_spill_file", "push"]


def default_spill_file() -> Path:
    return Settings.from_env().spill_file


@dataclass(frozen=True)
class PendingBatch:
    """One undelivered batch: a line of the spill file."""

    backend: str
    batch: str
    data: Mapping[str, Any]  # the OTLP/JSON TracesData of the line

    @property
    def span_count(self) -> int:
        return sum(len(ss.get("spans") or ()) for rs in self.data.get("resourceSpans") or ()
                   for ss in rs.get("scopeSpans") or ())

    def readable_spans(self) -> list[ReadableSpan]:
        return readable_spans(self.data)


class SpillFile:
    """The spill file at ``path`` (default ``LOOPTRACE_SPILL_FILE`` or ``.looptrace/spill.jsonl``)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_spill_file()
        self.ledger = self.path.with_name(self.path.name + ".sent")
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._push_lock_path = self.path.with_name(self.path.name + ".push-lock")
        self._thread_lock = threading.RLock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._lock_path, "a") as handle:
                if fcntl is not None:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    if fcntl is not None:
                        fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def pushing(self) -> Iterator[None]:
        """Held for a whole push: a second push at the same time is refused rather than sending the same batches."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._push_lock_path, "a") as handle:
            if fcntl is not None:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise PushInProgress(f"another push is sending {self.path}; try again when it is done") from None
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def append(self, backend: str, spans: Sequence[ReadableSpan]) -> str:
        """Add one batch for ``backend``; returns its batch id."""
        batch = uuid.uuid4().hex
        document = {"looptrace": {"backend": backend, "batch": batch}, **encode_spans_json(spans).to_dict()}
        line = json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n"
        with self._locked(), open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
        return batch

    def mark_delivered(self, batch: str) -> None:
        with self._locked(), open(self.ledger, "a", encoding="utf-8") as handle:
            handle.write(batch + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def delivered(self) -> set[str]:
        try:
            return set(self.ledger.read_text(encoding="utf-8").split())
        except FileNotFoundError:
            return set()

    def pending(self, backends: Iterable[str] | None = None) -> list[PendingBatch]:
        """The batches not yet delivered, in file order (for ``backends`` only, when given)."""
        wanted = None if backends is None else set(backends)
        if not self.path.exists():  # the common case; and reading must not create files
            return []
        with self._locked():
            delivered = self.delivered()
            lines = self._lines()
        batches = []
        for raw in lines:
            parsed = _parse_spill_line(raw)
            if parsed is None or parsed.batch in delivered or (wanted is not None and parsed.backend not in wanted):
                continue
            batches.append(parsed)
        return batches

    def pending_spans(self, backend: str | None = None) -> int:
        return sum(b.span_count for b in self.pending(None if backend is None else [backend]))

    def compact(self) -> None:
        """Drop delivered batches from the file (atomically), then empty the ledger; remove both when nothing is
        left. Lines that cannot be parsed are kept: they are someone's data, and `looptrace traces` reports them."""
        if not self.ledger.exists():
            return
        with self._locked():
            delivered = self.delivered()
            if not delivered:
                return
            kept = [raw for raw in self._lines()
                    if (parsed := _parse_spill_line(raw)) is None or parsed.batch not in delivered]
            if kept:
                temporary = self.path.with_name(self.path.name + ".tmp")
                with open(temporary, "w", encoding="utf-8") as handle:
                    handle.writelines(kept)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, self.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            # Every id in the ledger named a line that is now gone: the ledger has nothing left to protect.
            self.ledger.unlink()

    def _lines(self) -> list[str]:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                return [line if line.endswith("\n") else line + "\n" for line in handle if line.strip()]
        except FileNotFoundError:
            return []


def _parse_spill_line(raw: str) -> PendingBatch | None:
    try:
        document = json.loads(raw)
        tag = document.pop("looptrace")
        return PendingBatch(backend=str(tag["backend"]), batch=str(tag["batch"]), data=document)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class PushInProgress(RuntimeError):
    """Another push holds the spill file."""


# --- OTLP/JSON back to spans, for push ----------------------------------------------------------------------------

_KIND_BY_OTLP = {1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER,
                 5: SpanKind.CONSUMER}
_STATUS_BY_OTLP = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_PARENT_IS_REMOTE = 0x200  # OTLP span flags: bit 8 says "is_remote is known", bit 9 is its value


def readable_spans(data: Mapping[str, Any]) -> list[ReadableSpan]:
    """The spans of one OTLP/JSON ``TracesData`` document, rebuilt as SDK spans an exporter can send again.

    What the OTLP encoder reads from a span survives the round trip (ids, parent, names, kind, times, attributes,
    events, links, status, resource, scope); bytes attributes come back as their base64 text.
    """
    spans = []
    for resource_spans in data.get("resourceSpans") or ():
        resource = Resource(decode_attributes((resource_spans.get("resource") or {}).get("attributes")),
                            schema_url=resource_spans.get("schemaUrl") or None)
        for scope_spans in resource_spans.get("scopeSpans") or ():
            scope = scope_spans.get("scope") or {}
            instrumentation = InstrumentationScope(scope.get("name", ""), scope.get("version") or None,
                                                   scope_spans.get("schemaUrl") or None,
                                                   decode_attributes(scope.get("attributes")) or None)
            for span in scope_spans.get("spans") or ():
                spans.append(_readable_span(span, resource, instrumentation))
    return spans


def _readable_span(span: Mapping[str, Any], resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id = int(span["traceId"], 16)
    flags = int(span.get("flags") or 0)
    parent_id = span.get("parentSpanId")
    parent = SpanContext(trace_id, int(parent_id, 16), is_remote=bool(flags & _PARENT_IS_REMOTE),
                         trace_flags=TraceFlags(TraceFlags.SAMPLED)) if parent_id else None
    status = span.get("status") or {}
    code = decode_status_code(status.get("code", 0))
    kind = decode_span_kind(span.get("kind", 1))
    return ReadableSpan(
        name=span.get("name", ""),
        context=SpanContext(trace_id, int(span["spanId"], 16), is_remote=False,
                            trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=_trace_state(span)),
        parent=parent,
        resource=resource,
        attributes=_attributes(span.get("attributes")),
        events=[Event(e.get("name", ""), _attributes(e.get("attributes")), int(e.get("timeUnixNano") or 0))
                for e in span.get("events") or ()],
        links=[Link(SpanContext(int(link["traceId"], 16), int(link["spanId"], 16), is_remote=True,
                                trace_state=_trace_state(link)), _attributes(link.get("attributes")))
               for link in span.get("links") or ()],
        kind=_KIND_BY_OTLP.get(kind, SpanKind.INTERNAL),
        status=Status(_STATUS_BY_OTLP.get(code, StatusCode.UNSET), status.get("message") or None),
        start_time=int(span.get("startTimeUnixNano") or 0),
        end_time=int(span.get("endTimeUnixNano") or 0),
        instrumentation_scope=scope,
    )


def _attributes(items: Any) -> dict[str, Any]:
    # The SDK wants sequences as tuples, so that attributes stay immutable.
    return {k: tuple(v) if isinstance(v, list) else v for k, v in decode_attributes(items).items()}


def _trace_state(item: Mapping[str, Any]) -> TraceState | None:
    header = item.get("traceState")
    return TraceState.from_header([header]) if header else None


# --- push ---------------------------------------------------------------------------------------------------------


@dataclass
class PushReport:
    """What a push did, per backend, in spans."""

    path: Path
    sent: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)  # tried and still pending
    skipped: Counter = field(default_factory=Counter)  # pending for a backend not targeted or not configured

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        if not (self.sent or self.failed or self.skipped):
            return f"nothing to push: {self.path} holds no pending spans"
        parts = [f"sent {n} spans to {b}" for b, n in sorted(self.sent.items())]
        parts += [f"{n} spans for {b} still pending (it failed; see the warning)"
                  for b, n in sorted(self.failed.items())]
        parts += [f"{n} spans for {b} left pending (not configured or not chosen with --to)"
                  for b, n in sorted(self.skipped.items())]
        return "; ".join(parts)


def push(spill_path: str | os.PathLike[str] | None = None, exporters: Mapping[str, SpanExporter] | None = None, *,
         to: Iterable[str] | None = None, settings: Settings | None = None) -> PushReport:
    """Send what the spill file holds, exactly once, and keep what still fails.

    ``exporters`` maps backend names to exporters (tests pass their own); by default every backend the environment
    configures (``configured_backends()``) gets a guarded exporter. ``to`` limits the push to those backends. A
    backend that fails is not tried again in the same push; its batches stay pending.
    """
    spill = SpillFile(spill_path)
    own = exporters is None
    if exporters is None:
        settings = settings or Settings.from_env()
        exporters = {name: network_exporter(name, settings) for name in settings.configured_backends()}
    targets = set(to) if to else set(exporters)
    missing = targets - set(exporters)
    if missing:
        raise ConfigurationError(f"cannot push to {', '.join(sorted(missing))}: it is not configured "
                                 "(langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY, otlp needs "
                                 "OTEL_EXPORTER_OTLP_ENDPOINT)")
    report = PushReport(spill.path)
    try:
        with spill.pushing():
            for batch in spill.pending():
                if batch.backend not in targets:
                    report.skipped[batch.backend] += batch.span_count
                elif batch.backend in report.failed:
                    report.failed[batch.backend] += batch.span_count
                elif _send(exporters[batch.backend], batch):
                    spill.mark_delivered(batch.batch)
                    report.sent[batch.backend] += batch.span_count
                else:
                    report.failed[batch.backend] += batch.span_count
            spill.compact()
    finally:
        if own:
            for exporter in exporters.values():
                exporter.shutdown()
    return report


def _send(exporter: SpanExporter, batch: PendingBatch) -> bool:
    try:
        return exporter.export(batch.readable_spans()) == SpanExportResult.SUCCESS
    except Exception:  # noqa: BLE001 - an unguarded exporter from a caller: the batch stays pending
        return False
