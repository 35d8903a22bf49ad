"""The undelivered list: which spans (by id) and which scores a backend has not taken, for ``looptrace traces push``.

The trace file is the one durable copy of a span: it is written as each span ends, beside every backend. So when a
backend cannot take a batch, nothing more than its spans' ids needs keeping, with the trace file that holds them.
``push`` (``instrumentation/export/push.py``) reads those spans back from the trace file and its rotated files and sends
them. A Langfuse score is small and held nowhere else, so a score that could not be posted is kept here whole.

One JSON object per line, appended and fsynced (it happens only when a backend fails, so the cost is rare)::

    {"backend": "langfuse", "file": "/abs/traces.jsonl", "undelivered": ["<trace><span>", ...], "uncertain": false}
    {"backend": "langfuse", "sending": [...]}      a push is about to send these
    {"backend": "langfuse", "delivered": [...]}    the backend took them: never sent again
    {"backend": "langfuse", "not_sent": [...]}     the backend refused them: still undelivered, and certainly so
    {"backend": "langfuse", "score": {...}}        a score body that could not be posted
    {"backend": "langfuse", "score_posted": ["<score id>", ...]}

Each line stays short whatever the number of spans: a list of keys is split over lines of at most ``KEYS_PER_LINE``
keys, so that no line looptrace writes is longer than ``MIN_LINE_BYTES``, the least the list is read with. The list
is read as the trace file is, a line at a time in bounded memory (``Settings.max_line_bytes``, at least
``MIN_LINE_BYTES``): a line that cannot be read (torn by a crash, over the limit, not JSON, nested beyond reason, not
an entry) is skipped and counted in ``bad_lines``, for push to say so, and it is left out when the list is rewritten.

A span's last line decides its state. ``uncertain`` marks a batch whose request may have reached the backend (no
answer within the timeout), and a span marked ``sending`` with no later line is uncertain too (a push interrupted
mid-request): see ``push`` for what is done with them. After a push the file is rewritten, atomically, with only what
is still undelivered; writers append under the same advisory lock (``<file>.lock``) and open the file for each append,
so no line is written to a file the rewrite replaced. Nothing here holds content or credentials: ids, backend names,
the trace file's path, and score bodies (a trace id, a name, a value, a comment).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

from ..settings import DEFAULT_MAX_LINE_BYTES
from .read import BadLine, read_lines
from .write import FILE_MODE, append_line, make_private_directory, open_private_append

try:
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we test
    fcntl = None  # type: ignore[assignment]

__all__ = ["Pending", "PushInProgress", "UndeliveredList", "span_key"]

KEYS_PER_LINE = 16_384  # keys of one line: about 0.8 MiB, with the trace file's path
MIN_LINE_BYTES = 4 << 20  # the least the list is read with, whatever LOOPTRACE_MAX_LINE_BYTES says: above any line


def span_key(trace_id: int, span_id: int) -> str:
    """A span's key in the list: its trace id and span id in hex, 48 characters."""
    return f"{trace_id:032x}{span_id:016x}"


class PushInProgress(RuntimeError):
    """Another push holds the undelivered list."""


@dataclass
class Pending:
    """What one backend has not taken: spans by trace file (in the order they failed), and scores."""

    spans: dict[str, list[str]] = field(default_factory=dict)  # trace file -> span keys
    uncertain: set[str] = field(default_factory=set)  # span keys that may have reached the backend already
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)  # score id -> body

    @property
    def span_count(self) -> int:
        return sum(len(keys) for keys in self.spans.values())


class UndeliveredList:
    """The list at ``path`` (``Settings.undelivered_file``); thread-safe, and shared safely by processes.
    ``trace_file`` is the file that holds the spans an exporter notes here (needed by ``append`` only)."""

    def __init__(self, path: str | os.PathLike[str], *, trace_file: str | os.PathLike[str] | None = None,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.path = Path(os.path.abspath(path))  # resolved now: a later change of directory must not move the list
        self.trace_file = None if trace_file is None else os.path.abspath(trace_file)
        self.max_line_bytes = max(max_line_bytes, MIN_LINE_BYTES)
        self.bad_lines: list[BadLine] = []  # the lines the last read could not use
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._push_lock_path = self.path.with_name(self.path.name + ".push-lock")
        self._thread_lock = threading.RLock()
        self._batches: dict[str, tuple[str, list[str]]] = {}  # batch id -> (backend, keys), this process's only

    # --- what the guarded exporters and the score sender write ---------------------------------------------------

    def append(self, backend: str, spans: Sequence[ReadableSpan], *, uncertain: bool = False) -> str:
        """Note that ``backend`` did not take ``spans`` (held in the trace file); returns an id for the batch."""
        if self.trace_file is None:
            raise ValueError("no trace file holds these spans")
        keys = [span_key(span.context.trace_id, span.context.span_id) for span in spans]
        self._write(*({"backend": backend, "file": self.trace_file, "undelivered": chunk, "uncertain": uncertain}
                      for chunk in _chunks(keys)))
        batch = uuid.uuid4().hex
        with self._thread_lock:
            self._batches[batch] = (backend, keys)
        return batch

    def mark_delivered(self, batch: str) -> None:
        """The batch got through after all (an answer that came after the wait gave up): never push it."""
        with self._thread_lock:
            backend, keys = self._batches.pop(batch, ("", []))
        if keys:
            self.record(backend, "delivered", keys)

    def keep_score(self, body: Mapping[str, Any], backend: str = "langfuse") -> None:
        """Keep a score that could not be posted, for the next push."""
        self._write({"backend": backend, "score": dict(body)})

    def record(self, backend: str, state: str, keys: Iterable[str]) -> None:
        """``state`` is ``sending``, ``delivered`` or ``not_sent``; ``score_posted`` takes score ids. However many
        keys, one append and one fsync."""
        self._write(*({"backend": backend, state: chunk} for chunk in _chunks(list(keys))))

    def _write(self, *entries: Mapping[str, Any]) -> None:
        if not entries:
            return
        data = b"".join((json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
                        for entry in entries)
        with self._locked():
            fd = open_private_append(self.path)
            try:
                append_line(fd, data)  # after a torn last line (a crash mid-append), on a line of its own
                os.fsync(fd)
            finally:
                os.close(fd)

    # --- what push reads -----------------------------------------------------------------------------------------

    def pending(self) -> dict[str, Pending]:
        """Per backend, what is still undelivered. Lines that cannot be read are skipped (``bad_lines`` says which).
        A list that does not exist lists nothing, and no lock file is made for it."""
        if not self.path.exists():
            self.bad_lines = []
            return {}
        with self._locked():
            return _replay(self._entries())

    def pending_spans(self, backend: str | None = None) -> int:
        return sum(p.span_count for name, p in self.pending().items() if backend in (None, name))

    def _entries(self) -> Iterator[dict[str, Any]]:
        """The entries of the list, read as the trace file is (bounded lines, a FIFO refused without blocking). What
        cannot be read (a line torn by a crash mid-append, whose batch was never noted and the warning said so; a line
        over the limit, nested too deeply, not an entry) is skipped and kept in ``bad_lines``."""
        self.bad_lines = []
        if not self.path.exists():
            return
        for number, entry in read_lines(self.path, self.bad_lines.append, max_line_bytes=self.max_line_bytes,
                                        rotated=False, regular_only=True):
            if isinstance(entry, dict) and isinstance(entry.get("backend"), str):
                yield entry
            else:
                self.bad_lines.append(BadLine(number, "not an entry of the undelivered list"))

    def compact(self) -> None:
        """Rewrite the list with only what is still undelivered (atomically); remove it when nothing is."""
        with self._locked():
            if not self.path.exists():
                return
            pending = _replay(self._entries())
            lines: list[dict[str, Any]] = []
            for backend, waiting in sorted(pending.items()):
                for trace_file, keys in waiting.spans.items():
                    for uncertain in (False, True):
                        chosen = [k for k in keys if (k in waiting.uncertain) == uncertain]
                        lines.extend({"backend": backend, "file": trace_file, "undelivered": chunk,
                                      "uncertain": uncertain} for chunk in _chunks(chosen))
                lines.extend({"backend": backend, "score": body} for body in waiting.scores.values())
            if not lines:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                return
            temporary = self.path.with_name(self.path.name + ".tmp")
            make_private_directory(self.path.parent)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
            try:
                for entry in lines:
                    append_line(fd, (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode(),
                                fresh=False)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)

    # --- locks ---------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock, _flocked(self._lock_path, blocking=True):
            yield

    @contextlib.contextmanager
    def pushing(self) -> Iterator[None]:
        """Held for a whole push: a second push at the same time is refused rather than sending the same spans."""
        try:
            with _flocked(self._push_lock_path, blocking=False):
                yield
        except BlockingIOError:
            raise PushInProgress(f"another push is sending what {self.path} lists; try again when it is done") \
                from None


@contextlib.contextmanager
def _flocked(path: Path, blocking: bool) -> Iterator[None]:
    fd = open_private_append(path)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _chunks(keys: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(keys), KEYS_PER_LINE):
        yield keys[start:start + KEYS_PER_LINE]


def _texts(value: object) -> list[str]:
    """A list of keys as a list entry holds it; anything else (a hand-edited or damaged entry) holds none."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _replay(entries: Iterable[dict[str, Any]]) -> dict[str, Pending]:
    """The state the lines add up to: each span's last line decides it. Linear in the keys the lines hold, with no
    work per key beyond a dict update (a long outage lists millions)."""
    state: dict[str, dict[str, str]] = {}  # backend -> key -> undelivered | uncertain | delivered
    where: dict[str, dict[str, str]] = {}  # backend -> key -> trace file
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in entries:
        backend = entry["backend"]
        marks, files = state.setdefault(backend, {}), where.setdefault(backend, {})
        if isinstance(entry.get("undelivered"), list) and isinstance(entry.get("file"), str):
            keys = _texts(entry["undelivered"])
            marks.update(dict.fromkeys(keys, "uncertain" if entry.get("uncertain") else "undelivered"))
            files.update(dict.fromkeys(keys, entry["file"]))
            continue
        for name, mark in (("sending", "uncertain"), ("delivered", "delivered"), ("not_sent", "undelivered")):
            marks.update((key, mark) for key in _texts(entry.get(name)) if key in files)
        if isinstance(entry.get("score"), dict) and isinstance(entry["score"].get("id"), str):
            scores.setdefault(backend, {})[entry["score"]["id"]] = entry["score"]
        for score_id in _texts(entry.get("score_posted")):
            scores.get(backend, {}).pop(score_id, None)
    pending: dict[str, Pending] = {}
    for backend, marks in state.items():
        files = where[backend]
        for key, mark in marks.items():  # insertion order: the order the spans failed in
            if mark == "delivered":
                continue
            waiting = pending.get(backend) or pending.setdefault(backend, Pending())
            waiting.spans.setdefault(files[key], []).append(key)
            if mark == "uncertain":
                waiting.uncertain.add(key)
    for backend, bodies in scores.items():
        if bodies:
            pending.setdefault(backend, Pending()).scores.update(bodies)
    return pending
