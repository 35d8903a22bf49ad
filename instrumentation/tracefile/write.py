"""Writing the local trace file: each span appended as one OTLP/JSON line the moment it ends.

The file is local, so batching buys little and costs a lot when the process dies: with a write per ended span a
kill -9 loses only the spans still open. Each line is written with one ``write`` on a descriptor opened in append
mode, so concurrent processes interleave whole lines, and the first line a writer appends starts on a fresh line: if
the file ends in the middle of a line (a writer killed mid-write, a full disk), a newline is written first, so the
torn line costs only itself.

Rotation. Past ``Rotation.max_bytes`` the file is renamed ``<file>.1`` (``.1`` to ``.2`` and so on first, the oldest
beyond ``Rotation.backups`` replaced), and the next line starts a new file. Several processes may append to the same
file, so writers share an advisory lock beside it (``<file>.lock``): each line is written under the shared lock, to the
file the path names at that moment (a writer whose file was rotated away reopens first), and a rotation takes the lock
exclusively. No line is torn or lost across a rotation, and none lands in a file already deleted. A writer learns
that its file was rotated away from the file's own size (one ``fstat`` per line: a file is rotated only when full),
and looks at the path itself once a second, for a file deleted or moved by hand. Size is the only trigger: age adds
no bound that size does not give, and a quiet process would have to wake up to honour it.

Trace files hold prompts and tool results: they are created readable by their owner only (0600), in a directory
created 0700. A trace file is a convenience that must never take an agent down: a failed write costs a warning
(once) and the span, and every span lost that way is counted and reported when the writer shuts down.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..logs import log
from ..settings import DEFAULT_TRACE_FILE_BACKUPS, DEFAULT_TRACE_FILE_MAX_BYTES
from .encodable import with_attributes
from .encode import encode_line, encode_traces_data, resource_key
from .history import HistoryCompactor

try:  # advisory locks keep a rotation from racing other processes' writes; without them (Windows) threads still lock
    import fcntl

    LOCK_SH, LOCK_EX, LOCK_UN = fcntl.LOCK_SH, fcntl.LOCK_EX, fcntl.LOCK_UN
except ImportError:  # pragma: no cover - not on the platforms we test
    fcntl = None  # type: ignore[assignment]
    LOCK_SH, LOCK_EX, LOCK_UN = 1, 2, 8

FILE_MODE = 0o600
PATH_CHECK_INTERVAL_S = 1.0  # how often a writer looks whether the path still names its file
DIRECTORY_MODE = 0o700


def open_private_append(path: Path) -> int:
    """A descriptor appending to ``path`` (readable too, to look for a torn last line), created 0600 (parents 0700)."""
    make_private_directory(path.parent)
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)


def make_private_directory(directory: Path) -> None:
    """Create ``directory`` (and missing parents) 0700; an existing one is left as its owner set it."""
    if not directory.is_dir():
        directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)


def start_on_fresh_line(fd: int) -> None:
    """If what ``fd`` points at ends inside a line (a torn write), end that line so the next one stands alone."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


def append_line(fd: int, line: bytes, fresh: bool = True) -> None:
    """Append one whole line; a short write (a full disk) is completed or raises, never left for the next line.

    ``fresh=False`` skips looking for a torn last line (two system calls), for a writer that already did when it
    opened the file and wrote only whole lines since.
    """
    if fresh:
        start_on_fresh_line(fd)
    written = os.write(fd, line)
    while written < len(line):  # rare: a signal or a nearly full disk; the rest goes on the same line
        written += os.write(fd, line[written:])


@dataclass(frozen=True)
class Rotation:
    """When the trace file rotates (``max_bytes``; 0 never) and how many older files are kept (``backups``)."""

    max_bytes: int = DEFAULT_TRACE_FILE_MAX_BYTES
    backups: int = DEFAULT_TRACE_FILE_BACKUPS


def rotated_name(path: Path, number: int) -> Path:
    return path.with_name(f"{path.name}.{number}")


def lock_name(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def rotated_numbers(path: Path) -> list[int]:
    """The numbers of the rotated files of ``path`` that exist (``path.1``, ``path.2``, ...), one listing of its
    folder, in no particular order."""
    try:
        entries = os.listdir(path.parent)
    except OSError:
        return []
    prefix = path.name + "."
    return [int(entry[len(prefix):]) for entry in entries
            if entry.startswith(prefix) and entry[len(prefix):].isdigit() and entry[len(prefix):].isascii()]


def rotate(path: Path, backups: int, max_bytes: int = 0) -> None:
    """Shift the rotated files ``path.1`` .. ``path.<backups-1>`` that exist up by one (``path.<backups>`` is
    replaced) and rename ``path`` to ``path.1``; with no backups, the file is removed. What goes is noted
    (``note_rotated_away``). The caller holds the exclusive lock, so the work is bounded by the files there are (one
    folder listing), not by ``backups``: a setting of a million costs no more than one of eight."""
    if backups <= 0:
        note_rotated_away(path, path, backups, max_bytes)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    note_rotated_away(path, rotated_name(path, backups), backups, max_bytes)
    for number in sorted((n for n in rotated_numbers(path) if 0 < n < backups), reverse=True):
        with contextlib.suppress(FileNotFoundError):
            os.replace(rotated_name(path, number), rotated_name(path, number + 1))
    os.replace(path, rotated_name(path, 1))


def rotated_note_name(path: Path) -> Path:
    return path.with_name(path.name + ".rotated")


def note_rotated_away(path: Path, going: Path, backups: int, max_bytes: int) -> None:
    """Before rotation deletes ``going`` (the oldest file): note, beside the trace file, that the runs written up to
    its last write are gone (``read.rotated_away`` reads it; `looptrace traces list` says so), with the limits that
    made it go. Best effort: a note that cannot be written costs the note, never a span."""
    try:
        written = os.stat(going).st_mtime
    except OSError:
        return  # nothing is deleted
    note = rotated_note_name(path)
    try:
        with contextlib.suppress(OSError, ValueError):
            written = max(written, float(json.loads(note.read_text(encoding="utf-8"))["before"]))
        temporary = note.with_name(note.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"before": written, "backups": backups, "max_bytes": max_bytes}, handle)
        os.replace(temporary, note)
    except OSError:
        pass


class TraceFileWriter:
    """Appends lines to one trace file, rotating it by size; thread-safe, and safe beside other processes writing
    the same file (see the module's note on rotation). The file is opened on first use and kept open."""

    def __init__(self, path: str | os.PathLike[str], rotation: Rotation | None = None) -> None:
        # Resolved now, as logging's FileHandler does: the file is opened (and reopened after a rotation) later, and a
        # process that changes its working directory meanwhile must not start a second trace file there.
        self.path = Path(os.path.abspath(path))
        self.rotation = rotation or Rotation()
        self.lost_spans = 0
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._identity: tuple[int, int] = (0, 0)  # (inode, device) of the file self._fd appends to
        self._checked_at = 0.0  # time.monotonic() when the path was last looked at
        self._lock = threading.Lock()
        self._warned = False
        self._closed = False
        self._failed = False
        # The resources (by key) this writer wrote whole into the file it appends to: its later lines there carry
        # their service name and key alone (encode.py). Forgotten whenever it opens a file, or a write fails.
        self._defined: set[str] = set()
        self._resource: tuple[str, ReadableSpan] | None = None  # of the line being written: (key, its span)

    def write(self, line: bytes, spans: int = 1, *, resource: tuple[str, ReadableSpan] | None = None) -> bool:
        """Append ``line`` (``spans`` spans). ``resource``: (key, span) of a line that leaves its resource out,
        to write the span with it whole instead if the file does not hold it yet."""
        with self._lock:
            if self._closed:
                self.lost_spans += spans
                return False
            self._resource = resource
            try:
                if self.rotation.max_bytes <= 0:
                    self._write_unrotated(line)
                else:
                    self._write_rotating(line)
            except OSError as error:
                self.lost_spans += spans
                self._failed = True
                self._defined.clear()
                self._warn_once(error)
                return False
            finally:
                self._resource = None
        return True

    def _write_unrotated(self, line: bytes) -> None:
        opened = self._fd is None
        if opened:
            self._fd = open_private_append(self.path)
        self._append(self._fd, line, opened)  # type: ignore[arg-type]

    def _write_rotating(self, line: bytes) -> None:
        # The size is checked before the line is written, so a file passes the limit by at most the lines that
        # writers checked beside this one, however busy they are; a full file is rotated, and the line written, under
        # the exclusive lock. The locks are taken in place (no context manager): this runs for every span.
        self._flock(LOCK_SH)
        try:
            fd, opened = self._current_file()
            # The size of the file this writer appends to, other writers' lines included. A file rotated away by
            # another writer was full when it was, so a writer still appending to it finds it full here and takes
            # the exclusive path, which reopens the path's new file.
            full = self.rotation.max_bytes <= os.fstat(fd).st_size
            if not full:
                self._append(fd, line, opened)
        finally:
            self._flock(LOCK_UN)
        if full:
            self._flock(LOCK_EX)
            try:
                self._rotate_if_full()
                self._checked_at = 0.0  # look at the path again: it names a new file
                fd, opened = self._current_file()
                self._append(fd, line, opened)
            finally:
                self._flock(LOCK_UN)

    def _flock(self, mode: int) -> None:
        """Take (or with LOCK_UN, release) the lock all writers of this file share; threads only where there is no
        advisory locking (the writer's own lock is held throughout)."""
        if fcntl is None:
            return
        if self._lock_fd is None:
            self._lock_fd = open_private_append(lock_name(self.path))
        fcntl.flock(self._lock_fd, mode)

    def _append(self, fd: int, line: bytes, opened: bool) -> None:
        # A torn line is looked for when the file is opened (a crashed run before this one) and after a failed write
        # of ours; a process killed mid-write while this one appends costs its line and ours.
        if opened:
            self._defined.clear()
        resource = self._resource
        if resource is not None and resource[0] not in self._defined:  # rare: a new file, or the resource is new
            line = encode_line(resource[1])
        append_line(fd, line, fresh=opened or self._failed)
        self._failed = False
        if resource is not None:
            self._defined.add(resource[0])

    def _current_file(self) -> tuple[int, bool]:
        """The descriptor of the file the path names (reopened when it names another file than ours), and whether it
        was just opened. The path itself is looked at once a second and after a rotation, not on every line: a file
        another writer rotated away is found full first (see ``_write_rotating``), and the second is for a file
        deleted or moved by hand, whose next lines then go to a new file at the path."""
        now = time.monotonic()
        if self._fd is not None and now - self._checked_at >= PATH_CHECK_INTERVAL_S:
            self._checked_at = now
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if current is None or (current.st_ino, current.st_dev) != self._identity:
                os.close(self._fd)  # what it holds is complete; the path names another file now
                self._fd = None
        if self._fd is None:
            self._fd = open_private_append(self.path)
            opened = os.fstat(self._fd)
            self._identity = (opened.st_ino, opened.st_dev)
            self._checked_at = now
            return self._fd, True
        return self._fd, False

    def _rotate_if_full(self) -> None:
        """Rotate unless another writer just did (the file the path names is small again)."""
        try:
            if os.stat(self.path).st_size < self.rotation.max_bytes:
                return
        except FileNotFoundError:
            return
        rotate(self.path, self.rotation.backups, self.rotation.max_bytes)

    def write_span(self, span: ReadableSpan) -> bool:
        """Append one finished span as its own line, its resource whole on this writer's first line in the file
        and referred to after. A span that cannot be encoded is a bug of ours: it costs that span, counted and
        reported, never the agent."""
        try:
            key = resource_key(span.resource)
            line = encode_line(span, resource_known=key in self._defined)  # checked again under the lock
        except Exception as error:  # noqa: BLE001 - see above
            self.lost(1, error)
            return False
        return self.write(line, resource=(key, span))

    def lost(self, spans: int, error: BaseException) -> None:
        with self._lock:
            self.lost_spans += spans
            self._warn_once(error)

    def _warn_once(self, error: BaseException) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning("trace_file_unwritable", path=str(self.path), error=f"{type(error).__name__}: {error}",
                    hint="the agent keeps running; spans that cannot be written are counted and reported at exit. "
                         "Set LOOPTRACE_TRACE_FILE or --trace-file to a writable path")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._fd, self._lock_fd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._lock_fd = None
        if self.lost_spans:
            log.warning("trace_file_spans_lost", path=str(self.path), spans=self.lost_spans,
                        hint="these spans are not in the trace file; the warning above says why")


class _OnTheTraceFile:
    """What the processor and the exporter share: one writer, its path, and the spans it could not write."""

    def __init__(self, path: str | os.PathLike[str], rotation: Rotation | None = None) -> None:
        self.writer = TraceFileWriter(path, rotation)

    @property
    def path(self) -> Path:
        return self.writer.path

    @property
    def lost_spans(self) -> int:
        return self.writer.lost_spans

    def shutdown(self) -> None:
        self.writer.close()


class TraceFileProcessor(_OnTheTraceFile, SpanProcessor):
    """looptrace's default export: every span written to the trace file as it ends, on the thread that ended it.

    No queue, so nothing is ever dropped for want of room and nothing waits for a flush: what has ended is on disk.
    Each message of a run is written once (``history``): a model call's input continuing its run's earlier spans is
    written as the messages that follow them.
    """

    def __init__(self, path: str | os.PathLike[str], rotation: Rotation | None = None) -> None:
        super().__init__(path, rotation)
        self.history = HistoryCompactor()

    def on_start(self, span, parent_context=None) -> None:
        self.history.started(span)

    def on_end(self, span: ReadableSpan) -> None:
        written = self.history.written(span)
        self.writer.write_span(span if written is None else with_attributes(span, written))

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every span was written when it ended


class OTLPJsonFileExporter(_OnTheTraceFile, SpanExporter):
    """The same file as a ``SpanExporter`` (for a pipeline of the application's choosing): one line per batch, its
    resource whole. A model call's input continuing the previous call of its trace is written as what follows it
    (``history``; an exporter sees no span start, so a run's first call is written whole)."""

    def __init__(self, path: str | os.PathLike[str], rotation: Rotation | None = None) -> None:
        super().__init__(path, rotation)
        self.history = HistoryCompactor()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            spans = [span if (written := self.history.written(span)) is None else with_attributes(span, written)
                     for span in spans]
            line = (encode_traces_data(spans) + "\n").encode("utf-8")
        except Exception as error:  # noqa: BLE001
            self.writer.lost(len(spans), error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self.writer.write(line, len(spans)) else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every export is written before it returns
