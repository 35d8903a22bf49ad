"""The spill file: spans a backend could not take, kept until ``push()`` delivers them, never sent twice.

One OTLP/JSON ``TracesData`` per line, like the trace file (``read.read_spans`` reads it), plus one key that says
which backend the batch was meant for::

    {"looptrace": {"backend": "langfuse", "batch": "<id>"}, "resourceSpans": [...]}

What a push guarantees, whatever the moment it is interrupted (Ctrl-C, kill -9, a power cut):

* Never twice. Before a batch is sent, ``sending <id>`` is appended to a ledger beside the file (``<file>.sent``) and
  fsynced; once the backend has accepted it, ``<id>``. Only then is the line dropped from the file, by an atomic
  rewrite. A batch whose send was interrupted (marked sending, never delivered) may or may not have reached the
  backend: later pushes hold it back and report it, and only ``push(resend_interrupted=True)`` (``looptrace traces
  push --resend-interrupted``) sends it again, for a backend that tolerates a second copy.
* Never lost. A batch is always pending, held, delivered, or quarantined. A line that cannot be read back (torn by a
  crash, not JSON, not trace data, or spans the wire encoder refuses) is moved to ``<file>.quarantine``, kept there
  and reported, and no longer stands in the way of the batches after it. Spans a killed process still had queued
  for export are in its journal (``journal.py``); a push first moves them in here as batches.
* Bounded memory. Pushing and compacting read one line at a time, at most ``max_line_bytes`` of it; a longer line
  is read past (or copied into the quarantine) in 1 MiB chunks.

Pushes exclude each other with an advisory lock; writers (a run spilling, a push compacting) share another, held
only for the write. Every file here is created 0600 (its directory 0700): spans hold prompts and tool results.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from ..encodable import encodable_spans
from ..exporters import network_exporter
from ..settings import DEFAULT_MAX_LINE_BYTES, DEFAULT_SPILL_FILE, ConfigurationError, Settings
from .encode import encode_traces_data
from .read import decode_attributes, decode_span_kind, decode_status_code
from .write import FILE_MODE, append_line, make_private_directory, open_private_append

try:  # advisory file locks keep concurrent runs and pushes from interleaving; Windows has none, threads still lock
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we test
    fcntl = None  # type: ignore[assignment]

__all__ = ["DEFAULT_SPILL_FILE", "PushReport", "SpillFile", "push"]

_SENDING = "sending "
_NOT_SENT = "unsent "


@dataclass(frozen=True)
class PendingBatch:
    """One undelivered batch: a line of the spill file."""

    backend: str
    batch: str
    data: Mapping[str, Any]  # the OTLP/JSON TracesData of the line
    interrupted: bool = False  # a push began sending it and never learned whether it arrived
    spans: tuple[ReadableSpan, ...] = field(default=(), compare=False, repr=False)

    @property
    def span_count(self) -> int:
        return len(self.spans)

    def readable_spans(self) -> list[ReadableSpan]:
        return list(self.spans)


@dataclass(frozen=True)
class BadSpillLine:
    line: int
    reason: str


class SpillFile:
    """The spill file at ``path`` (``Settings.spill_file``). A line longer than ``max_line_bytes``
    (``Settings.max_line_bytes``) cannot be read back: it is reported, and a push sets it aside."""

    def __init__(self, path: str | os.PathLike[str], *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.path = Path(path)
        self.max_line_bytes = max_line_bytes
        self.ledger = self.path.with_name(self.path.name + ".sent")
        self.quarantine = self.path.with_name(self.path.name + ".quarantine")
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._push_lock_path = self.path.with_name(self.path.name + ".push-lock")
        self._thread_lock = threading.RLock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock, self._flocked(self._lock_path, blocking=True):
            yield

    @contextlib.contextmanager
    def _flocked(self, path: Path, blocking: bool) -> Iterator[None]:
        fd = open_private_append(path)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    @contextlib.contextmanager
    def pushing(self) -> Iterator[None]:
        """Held for a whole push: a second push at the same time is refused rather than sending the same batches."""
        try:
            with self._flocked(self._push_lock_path, blocking=False):
                yield
        except BlockingIOError:
            raise PushInProgress(f"another push is sending {self.path}; try again when it is done") from None

    def append(self, backend: str, spans: Sequence[ReadableSpan]) -> str:
        """Add one batch for ``backend``; returns its batch id."""
        batch = uuid.uuid4().hex
        tag = '"looptrace":' + json.dumps({"backend": backend, "batch": batch}, separators=(",", ":"))
        line = (encode_traces_data(spans, extra=tag) + "\n").encode("utf-8")
        with self._locked():
            fd = open_private_append(self.path)
            try:
                append_line(fd, line)  # after a torn last line, on a fresh line of its own
            finally:
                os.close(fd)
        return batch

    def append_encoded(self, backend: str, batch: str, line: str) -> None:
        """Add one batch already encoded as a spill line (``batch`` must be its id), fsynced: a journal's spans are
        deleted from the journal once this returns."""
        data = (line + "\n").encode("utf-8")
        with self._locked():
            fd = open_private_append(self.path)
            try:
                append_line(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)

    def recover_journals(self) -> Counter:
        """Move what abandoned journals (``journal.py``: processes gone before their queued spans were exported)
        still hold into this file as batches; returns spans moved, per backend."""
        from .journal import recover

        def known_spans() -> set[str]:
            return {format(span.context.span_id, "016x") for batch in self.iter_pending() for span in batch.spans}

        def known_batches() -> set[str]:
            return {batch.batch for batch in self.iter_pending()} | self.delivered()

        return recover(self.path, self.max_line_bytes, known_spans, known_batches, self.append_encoded)

    def mark_sending(self, batch: str) -> None:
        self._record(_SENDING + batch)

    def mark_delivered(self, batch: str) -> None:
        self._record(batch)

    def mark_not_delivered(self, batch: str) -> None:
        """The backend refused or could not be reached: the send is over and the batch can be tried again."""
        self._record(_NOT_SENT + batch)

    def _record(self, entry: str) -> None:
        with self._locked():
            fd = open_private_append(self.ledger)
            try:
                append_line(fd, (entry + "\n").encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)

    def _ledger(self) -> tuple[set[str], set[str]]:
        """(delivered ids, ids whose last send began and never ended)."""
        delivered: set[str] = set()
        in_flight: dict[str, bool] = {}
        try:
            with open(self.ledger, encoding="ascii", errors="replace") as handle:
                for entry in handle:
                    entry = entry.strip()
                    if entry.startswith(_SENDING):
                        in_flight[entry[len(_SENDING):]] = True
                    elif entry.startswith(_NOT_SENT):
                        in_flight[entry[len(_NOT_SENT):]] = False
                    elif entry:
                        delivered.add(entry)
        except FileNotFoundError:
            pass
        return delivered, {batch for batch, flying in in_flight.items() if flying} - delivered

    def delivered(self) -> set[str]:
        return self._ledger()[0]

    def pending(self, backends: Iterable[str] | None = None,
                on_bad_line: Callable[[BadSpillLine], None] | None = None) -> list[PendingBatch]:
        """The batches not yet delivered, in file order (for ``backends`` only, when given); interrupted ones are
        included, marked. Lines that cannot be read back go to ``on_bad_line``."""
        return list(self.iter_pending(backends, on_bad_line))

    def iter_pending(self, backends: Iterable[str] | None = None,
                     on_bad_line: Callable[[BadSpillLine], None] | None = None) -> Iterator[PendingBatch]:
        wanted = None if backends is None else set(backends)
        if not self.path.exists():  # the common case; and reading must not create files
            return
        with self._locked():
            delivered, interrupted = self._ledger()
            # A snapshot: lines appended later wait for the next push; a rewrite by a compaction replaces the file,
            # and this handle keeps reading the one it opened.
            try:
                handle = open(self.path, "rb")  # noqa: SIM115 - read after the lock is released, closed below
            except FileNotFoundError:
                return
            size = os.fstat(handle.fileno()).st_size
        with handle:
            for number, raw in _bounded_lines(handle, size, self.max_line_bytes):
                parsed = _parse_spill_line(raw, self.max_line_bytes)
                if isinstance(parsed, str):
                    if on_bad_line is not None:
                        on_bad_line(BadSpillLine(number, parsed))
                    continue
                if parsed.batch in delivered or (wanted is not None and parsed.backend not in wanted):
                    continue
                if parsed.batch in interrupted:
                    parsed = PendingBatch(parsed.backend, parsed.batch, parsed.data, True, parsed.spans)
                yield parsed

    def pending_spans(self, backend: str | None = None) -> int:
        return sum(b.span_count for b in self.pending(None if backend is None else [backend]))

    def compact(self, quarantine: bool = False) -> int:
        """Drop delivered batches from the file (atomically) and forget them in the ledger; remove both when nothing
        is left. With ``quarantine``, lines that cannot be read back move to ``<file>.quarantine`` (otherwise they
        stay). Returns the number of lines quarantined."""
        if not self.path.exists() and not self.ledger.exists():
            return 0
        with self._locked():
            delivered, interrupted = self._ledger()
            if not delivered and not quarantine:
                return 0
            moved, kept_ids = self._rewrite(delivered, quarantine)
            still_interrupted = sorted(interrupted & kept_ids)
            if still_interrupted:  # the only entries left worth remembering
                self._replace(self.ledger, [(_SENDING + batch + "\n").encode("ascii") for batch in still_interrupted])
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.ledger.unlink()
        return moved

    def _rewrite(self, delivered: set[str], quarantine: bool) -> tuple[int, set[str]]:
        """Stream the file into its replacement (and its bad lines into the quarantine), line by line: memory holds
        one line of at most ``max_line_bytes``, and a longer line is copied in chunks, never held whole."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            return 0, set()
        kept = _LazyFile(lambda: _open_replacement(self.path))
        bad = _LazyFile(lambda: open_private_append(self.quarantine))
        moved = 0
        kept_ids: set[str] = set()
        try:
            with handle:
                readline = handle.readline
                while True:
                    raw = readline(self.max_line_bytes + 1)
                    if not raw:
                        break
                    if len(raw) > self.max_line_bytes and not raw.endswith(b"\n"):
                        _copy_rest_of_line(readline, raw, bad if quarantine else kept)
                        moved += quarantine
                        continue
                    if not raw.strip():
                        continue
                    line = raw if raw.endswith(b"\n") else raw + b"\n"
                    parsed = _parse_spill_line(raw, self.max_line_bytes)
                    if isinstance(parsed, str):
                        (bad if quarantine else kept).write(line)
                        moved += quarantine
                    elif parsed.batch not in delivered:
                        kept.write(line)
                        kept_ids.add(parsed.batch)
            bad.sync()  # kept safely before it leaves the spill file
            if kept.opened:
                kept.sync()
                kept.close()
                os.replace(_replacement_of(self.path), self.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            kept.close()
            bad.close()
            with contextlib.suppress(FileNotFoundError):
                _replacement_of(self.path).unlink()  # only left behind when the rewrite failed
        return moved, kept_ids

    def _replace(self, path: Path, lines: list[bytes]) -> None:
        temporary = path.with_name(path.name + ".tmp")
        make_private_directory(path.parent)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
        try:
            for line in lines:
                os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)


def _bounded_lines(handle: Any, size: int | None, limit: int) -> Iterator[tuple[int, bytes]]:
    """Numbered non-blank lines up to ``size`` bytes; a line over ``limit`` bytes is read past in chunks and yielded
    as a marker, never held."""
    read = 0
    number = 0
    while size is None or read < size:
        raw = handle.readline(limit + 1)
        if not raw:
            return
        number += 1
        read += len(raw)
        if len(raw) > limit and not raw.endswith(b"\n"):
            chunk = raw
            while chunk and not chunk.endswith(b"\n"):
                chunk = handle.readline(_CHUNK_BYTES)
                read += len(chunk)
            raw = b"\0too long"
        if raw.strip():
            yield number, raw


_CHUNK_BYTES = 1 << 20  # how much of an over-long line is read (and copied) at a time


class _LazyFile:
    """A descriptor opened on the first write: a compaction creates a replacement or a quarantine file only when
    something goes there."""

    def __init__(self, opener: Callable[[], int]) -> None:
        self._opener = opener
        self._fd: int | None = None
        self.opened = False

    def write(self, data: bytes, fresh: bool = True) -> None:
        if self._fd is None:
            self._fd = self._opener()
            self.opened = True
        append_line(self._fd, data, fresh=fresh)

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _replacement_of(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def _open_replacement(path: Path) -> int:
    make_private_directory(path.parent)
    return os.open(_replacement_of(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
                   | getattr(os, "O_CLOEXEC", 0), FILE_MODE)


def _copy_rest_of_line(readline: Callable[[int], bytes], start: bytes, target: _LazyFile) -> None:
    """Copy an over-long line, whose first ``start`` bytes are read, to ``target`` chunk by chunk (a line cut short
    by the end of the file is ended with a newline there)."""
    target.write(start)
    chunk = start
    while not chunk.endswith(b"\n"):
        chunk = readline(_CHUNK_BYTES)
        if not chunk:
            target.write(b"\n", fresh=False)
            return
        target.write(chunk, fresh=False)


def _parse_spill_line(raw: bytes, limit: int) -> PendingBatch | str:
    """The batch on a line, or why it cannot be read back (a string); ``limit`` is the longest line read."""
    if raw == b"\0too long":
        return f"longer than {limit:,} bytes"
    try:
        document = json.loads(raw)
    except RecursionError:
        return "nested too deeply to read"
    except ValueError as exc:
        torn = " (torn: never finished)" if not raw.endswith(b"\n") else ""
        return f"not JSON{torn}: {exc}"
    try:
        tag = document.pop("looptrace")
        backend, batch = tag["backend"], tag["batch"]
        if not isinstance(backend, str) or not isinstance(batch, str):
            raise TypeError("backend and batch must be strings")
        # Repaired as every batch sent is (a key that is not text, a lone surrogate), then checked as it will go out.
        spans = tuple(encodable_spans(readable_spans(document)))
        _check_sendable(spans)
    except RecursionError:
        return "nested too deeply to read"
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with a line, it costs that line only
        return f"not a spilled batch ({type(exc).__name__}: {exc})"
    return PendingBatch(backend=backend, batch=batch, data=document, spans=spans)


def _check_sendable(spans: Sequence[ReadableSpan]) -> None:
    """Raise when the spans cannot be encoded for the wire: a batch the exporter would fail on every time must be
    set aside like an unreadable line, not retried forever in front of the batches behind it."""
    for span in spans:
        if not isinstance(span.name, str):
            raise TypeError(f"a span name is a {type(span.name).__name__}, not a string")
        description = span.status.description
        if description is not None and not isinstance(description, str):
            raise TypeError("a status message is not a string")
    if _encode_for_the_wire is not None:
        _encode_for_the_wire(spans)  # what the OTLP exporters (HTTP and gRPC, so Langfuse too) send


try:  # the OTLP exporters' own encoder: a batch it refuses is refused by every backend looptrace pushes to
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as _encode_for_the_wire
except ImportError:  # pragma: no cover - an installation without the OTLP exporters pushes nowhere anyway
    _encode_for_the_wire = None  # type: ignore[assignment]


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
    resource_spans_list = data.get("resourceSpans") or []
    if not isinstance(resource_spans_list, list):
        raise ValueError("resourceSpans is not a list")
    for resource_spans in resource_spans_list:
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
    """What a push did, per backend, in spans; and the lines it had to set aside."""

    path: Path
    sent: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)  # tried and still pending
    skipped: Counter = field(default_factory=Counter)  # pending for a backend not targeted or not configured
    held: Counter = field(default_factory=Counter)  # interrupted sends, not repeated without resend_interrupted
    recovered: Counter = field(default_factory=Counter)  # moved in from journals of processes that died mid-run
    quarantined: list[BadSpillLine] = field(default_factory=list)
    quarantine: Path | None = None

    @property
    def ok(self) -> bool:
        """Nothing failed, nothing was held back, nothing had to be set aside."""
        return not (self.failed or self.held or self.quarantined)

    def summary(self) -> str:
        if not (self.sent or self.failed or self.skipped or self.held or self.quarantined):
            return f"nothing to push: {self.path} holds no pending spans"
        parts = [f"recovered {_spans(n)} for {b} that a process ended (killed?) before exporting"
                 for b, n in sorted(self.recovered.items())]
        parts += [f"sent {_spans(n)} to {b}" for b, n in sorted(self.sent.items())]
        parts += [f"{_spans(n)} for {b} still pending (it failed; see the warning)"
                  for b, n in sorted(self.failed.items())]
        parts += [f"{_spans(n)} for {b} left pending (not configured or not chosen with --to)"
                  for b, n in sorted(self.skipped.items())]
        parts += [f"{_spans(n)} for {b} held back: an earlier push was interrupted while sending them, so they may "
                  f"already be there (send them anyway with --resend-interrupted)"
                  for b, n in sorted(self.held.items())]
        if self.quarantined:
            lines = ", ".join(str(bad.line) for bad in self.quarantined[:5]) + (", ..." if len(self.quarantined) > 5
                                                                                else "")
            parts.append(f"{len(self.quarantined)} unreadable line{'s' if len(self.quarantined) != 1 else ''} "
                         f"(line {lines}: {self.quarantined[0].reason}) moved to {self.quarantine}, kept there")
        return "; ".join(parts)


def _spans(n: int) -> str:
    return f"{n} span{'s' if n != 1 else ''}"


def push(spill_path: str | os.PathLike[str] | None = None, exporters: Mapping[str, SpanExporter] | None = None, *,
         to: Iterable[str] | None = None, resend_interrupted: bool = False,
         settings: Settings | None = None) -> PushReport:
    """Send what the spill file holds, never twice, and keep what still fails (see the module's guarantees).

    ``settings`` say where the spill file is (unless ``spill_path`` is given), how long a line may be, and which
    backends to push to; the CLI passes the environment's (``Settings.from_env()``), and without them the defaults
    apply (``Settings()``: no backend configured). ``exporters`` maps backend names to exporters (tests pass their
    own); by default every backend the settings configure (``configured_backends()``) gets a guarded exporter. ``to``
    limits the push to those backends. A backend that fails is not tried again in the same push; its batches stay
    pending. Lines that cannot be read back are moved to the quarantine file and reported; the batches after them are
    delivered.
    """
    settings = settings or Settings()
    spill = SpillFile(spill_path if spill_path is not None else settings.spill_file,
                      max_line_bytes=settings.max_line_bytes)
    own = exporters is None
    if exporters is None:
        exporters = {name: network_exporter(name, settings) for name in settings.configured_backends()}
    targets = set(to) if to else set(exporters)
    missing = targets - set(exporters)
    if missing:
        raise ConfigurationError(f"cannot push to {', '.join(sorted(missing))}: it is not configured "
                                 "(langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY, otlp needs "
                                 "OTEL_EXPORTER_OTLP_ENDPOINT)")
    report = PushReport(spill.path, quarantine=spill.quarantine)
    try:
        with spill.pushing():
            report.recovered.update(spill.recover_journals())
            for batch in spill.iter_pending(on_bad_line=report.quarantined.append):
                if batch.backend not in targets:
                    report.skipped[batch.backend] += batch.span_count
                elif batch.backend in report.failed:
                    report.failed[batch.backend] += batch.span_count
                elif batch.interrupted and not resend_interrupted:
                    report.held[batch.backend] += batch.span_count
                else:
                    spill.mark_sending(batch.batch)
                    if _send(exporters[batch.backend], batch):
                        spill.mark_delivered(batch.batch)
                        report.sent[batch.backend] += batch.span_count
                    else:  # the backend said no (or could not be reached): it has not got it; try again next time
                        spill.mark_not_delivered(batch.batch)
                        report.failed[batch.backend] += batch.span_count
            spill.compact(quarantine=True)
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
