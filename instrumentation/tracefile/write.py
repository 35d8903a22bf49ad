"""Writing the local trace file: each span appended as one OTLP/JSON line the moment it ends.

The file is local, so batching buys little and costs a lot when the process dies: with a write per ended span a
kill -9 loses only the spans still open. Each line is written with one ``write`` on a descriptor opened in append
mode, so concurrent processes interleave whole lines, and the first line a writer appends starts on a fresh line: if
the file ends in the middle of a line (a writer killed mid-write, a full disk), a newline is written first, so the
torn line costs only itself.

Trace files hold prompts and tool results: they are created readable by their owner only (0600), in a directory
created 0700. A trace file is a convenience that must never take an agent down: a failed write costs a warning
(once) and the span, and every span lost that way is counted and reported when the writer shuts down.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..logs import log
from .encode import encode_line, encode_traces_data

FILE_MODE = 0o600
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


class TraceFileWriter:
    """Appends lines to one trace file; thread-safe; opens the file on first use and keeps it open."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lost_spans = 0
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._warned = False
        self._closed = False
        self._failed = False

    def write(self, line: bytes, spans: int = 1) -> bool:
        with self._lock:
            if self._closed:
                self.lost_spans += spans
                return False
            try:
                fd = self._fd
                opened = fd is None
                if fd is None:
                    fd = self._fd = open_private_append(self.path)
                # A torn line is looked for when the file is opened (a crashed run before this one) and after a
                # failed write of ours; a process killed mid-write while this one appends costs its line and ours.
                append_line(fd, line, fresh=opened or self._failed)
                self._failed = False
            except OSError as error:
                self.lost_spans += spans
                self._failed = True
                self._warn_once(error)
                return False
        return True

    def write_span(self, span: ReadableSpan) -> bool:
        """Append one finished span as its own line. A span that cannot be
        encoded is a bug of ours: it costs that span, counted and reported, never the agent."""
        try:
            line = encode_line(span)
        except Exception as error:  # noqa: BLE001 - see above
            self.lost(1, error)
            return False
        return self.write(line)

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
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        if self.lost_spans:
            log.warning("trace_file_spans_lost", path=str(self.path), spans=self.lost_spans,
                        hint="these spans are not in the trace file; the warning above says why")


class _OnTheTraceFile:
    """What the processor and the exporter share: one writer, its path, and the spans it could not write."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.writer = TraceFileWriter(path)

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
    """

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self.writer.write_span(span)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every span was written when it ended


class OTLPJsonFileExporter(_OnTheTraceFile, SpanExporter):
    """The same file as a ``SpanExporter`` (for a pipeline of the application's choosing): one line per batch."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = (encode_traces_data(spans) + "\n").encode("utf-8")
        except Exception as error:  # noqa: BLE001
            self.writer.lost(len(spans), error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self.writer.write(line, len(spans)) else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every export is written before it returns
