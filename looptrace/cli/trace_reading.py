"""Reading a stored trace file for the trace commands: line by line, in memory bounded by the longest line, with bad
lines reported and progress shown.

A file that is not a trace file (a log, a JSON document) is a usage error said in one line, not a stream of
"skipped" messages and a success: a CI gate pointed at the wrong file must not go green. In a real trace file, the
first few malformed lines are named and the rest counted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from looptrace.cli.common import UsageError, plural
from looptrace.cli.environment import read_settings
from looptrace.instrumentation.tracefile import (
    BadLine,
    SpanRecord,
    TraceFileError,
    decode_attributes,
    describe_unreadable,
    raw_spans,
    read_lines,
    span_record,
    total_size,
    trace_files,
)

BAD_LINES_SHOWN = 5
# A file this big takes a second or more to read: a person at a terminal gets a progress bar (tqdm's, imported only
# then: it costs 60-130 ms to import, more than `detect` takes on a small file).
PROGRESS_MIN_BYTES = 50_000_000
# What a missing trace file most likely means on a fresh clone, and what to do about it.
NO_FILE_HINT = ("no run has written one there yet: `looptrace demo` writes one offline; a file elsewhere is named by "
                "LOOPTRACE_TRACE_FILE")
# What a line that is JSON but not trace data raises while its spans are read: it is reported, never a traceback.
NOT_TRACE_DATA = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)


class LineReporter:
    """Names the first malformed lines, counts the rest, and shows progress on a big file at a terminal.

    Until the first span is read, messages wait: a file with no span at all is reported as one usage error instead.
    """

    def __init__(self, path: Path, max_line_bytes: int) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes  # longer lines are reported and skipped
        self.bad = 0
        self.first_reason = ""
        self.spans_seen = False
        self._waiting: list[str] = []
        self.size = 0
        self.interactive = sys.stderr.isatty()
        self._bar: Any = None  # the tqdm progress bar, made at the first progress report of a big file

    def __enter__(self) -> LineReporter:
        if os.path.isdir(self.path):
            raise UsageError(f"{self.path} is a directory, not a trace file")
        try:
            self.size = os.path.getsize(self.path)
        except FileNotFoundError as exc:
            if len(trace_files(self.path)) == 1:  # nothing rotated either
                raise UsageError(f"cannot read trace file {self.path}: {exc.strerror or exc} ({NO_FILE_HINT})") \
                    from None
        except OSError as exc:
            raise UsageError(f"cannot read trace file {self.path}: {exc.strerror or exc}") from None
        self.size = total_size(self.path)  # with the files it was rotated into, read first
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if isinstance(exc, TraceFileError):
            raise UsageError(str(exc)) from None

    def __call__(self, bad: BadLine) -> None:
        self.bad += 1
        if self.bad == 1:
            self.first_reason = f"line {bad.line}: {bad.reason}"
        if self.bad > BAD_LINES_SHOWN:
            return
        message = f"looptrace: {self.path}:{bad.line}: skipped: {bad.reason}"
        if self.spans_seen:
            self.clear_progress()
            print(message, file=sys.stderr)
        else:
            self._waiting.append(message)

    def saw_span(self) -> None:
        if not self.spans_seen:
            self.spans_seen = True
            for message in self._waiting:
                print(message, file=sys.stderr)
            self._waiting.clear()

    def finish(self, *, spans_required: bool, runs: int | None = None) -> None:
        """After the read: the count of lines not named, or the usage error for a file without any span, or (given
        ``runs``, the runs the command found) for a file of which no run could be read because lines were skipped:
        a few stray spans read around them are no verdict on the file (a CI gate must not pass what it never read)."""
        if not self.spans_seen and spans_required:
            what = f"{plural(self.bad, 'line')} read, none of them trace data; first: " \
                   f"{self.first_reason}" if self.bad else "it is empty"
            raise UsageError(f"{self.path} holds no OTLP/JSON spans ({what}); is it a trace file?")
        if runs == 0 and self.bad:
            raise UsageError(f"no run could be read from {self.path}: {plural(self.bad, 'line')} skipped, and the "
                             f"spans read around them make no run (first: {self.first_reason})")
        self.saw_span()
        if self.bad > BAD_LINES_SHOWN:
            print(f"looptrace: {self.path}: {plural(self.bad - BAD_LINES_SHOWN, 'more malformed line')} skipped "
                  f"({self.bad:,} in all)", file=sys.stderr)

    @property
    def shows_progress(self) -> bool:
        """Only a person watching a big file wants a progress bar."""
        return self.interactive and self.size >= PROGRESS_MIN_BYTES

    def clear_progress(self) -> None:
        """Take the bar off the line before something else is written there; the next update draws it again."""
        if self._bar is not None:
            self._bar.clear()

    def progress(self, done: int) -> None:
        if not self.shows_progress:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.size, desc=f"reading {self.path.name}", unit="B", unit_scale=True,
                             unit_divisor=1024, file=sys.stderr, leave=False, dynamic_ncols=True)
        self._bar.update(done - self._bar.n)


def spans_of(path: Path, report: LineReporter, keys: frozenset[str] | None,
             parse: Any = None) -> Iterator[SpanRecord]:
    """Every span of the file, each line decoded once; a line that is JSON but not trace data is reported."""

    def records(data: Any) -> list[SpanRecord]:
        decoded_resource: dict[str, Any] = {}
        last_resource: Any = None
        spans = []
        for span, resource, scope in raw_spans(data):
            if keys is None and resource is not last_resource:
                decoded_resource, last_resource = decode_attributes(resource), resource
            spans.append(span_record(span, decoded_resource, scope, keys))
        return spans

    return spans_by_line(path, report, parse, records)


def spans_by_line(path: Path, report: LineReporter, parse: Any, spans_in: Any) -> Iterator[Any]:
    """The spans ``spans_in`` makes of each parsed line, in file order; a line it refuses (it raises: JSON, but not
    trace data) is reported and skipped whole, so one bad span never leaves half a line read."""
    for number, data in read_lines(path, report, report.progress, parse, max_line_bytes=report.max_line_bytes):
        try:
            spans = spans_in(data)
        except NOT_TRACE_DATA as exc:
            report(BadLine(number, not_trace_data(exc)))
            continue
        if spans:
            report.saw_span()
            yield from spans


def bad_line_reason(exc: BaseException, raw: bytes) -> str:
    """Why a line failed to parse: ``describe_unreadable``'s words, which every reader uses for the same line."""
    return describe_unreadable(exc, raw)


def not_trace_data(exc: BaseException) -> str:
    """Why a line (or a span) that is JSON was refused, in one phrase (``describe_unreadable``'s)."""
    return describe_unreadable(exc)


def trace_file_of(args: argparse.Namespace) -> tuple[Path, int]:
    """The file a trace command reads (its FILE or --file, else the settings': LOOPTRACE_TRACE_FILE or
    .looptrace/traces.jsonl) and the longest line it reads (LOOPTRACE_MAX_LINE_BYTES): the settings read once."""
    settings = read_settings()
    return getattr(args, "file", None) or settings.trace_file, settings.max_line_bytes


def trace_id_prefix(value: str | None) -> str | None:
    """A --trace-id as the readers match it (lower case), None when the flag was not given. An empty one is refused:
    taken as "no id", it would quietly pick the latest run."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError("--trace-id is empty: give a trace id or its first digits (`looptrace traces list` shows "
                         "them), or leave the flag out for the latest run")
    return value.strip().lower()


def is_root(span: dict[str, Any]) -> bool:
    """Whether a span (as stored, undecoded) is a run's root."""
    # Ours and other GenAI agents' roots are `invoke_agent {name}`, even when they join an outer trace.
    if not span.get("parentSpanId"):
        return True
    name = span.get("name")
    return type(name) is str and name.startswith("invoke_agent")
