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
    {"backend": "langfuse", "score_posted": "<score id>"}

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
from typing import Any

from .write import FILE_MODE, append_line, make_private_directory, open_private_append

try:
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we test
    fcntl = None  # type: ignore[assignment]

__all__ = ["Pending", "PushInProgress", "UndeliveredList", "span_key"]


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

    def __init__(self, path: str | os.PathLike[str], *, trace_file: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(os.path.abspath(path))  # resolved now: a later change of directory must not move the list
        self.trace_file = None if trace_file is None else os.path.abspath(trace_file)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._push_lock_path = self.path.with_name(self.path.name + ".push-lock")
        self._thread_lock = threading.RLock()
        self._batches: dict[str, tuple[str, list[str]]] = {}  # batch id -> (backend, keys), this process's only

    # --- what the guarded exporters and the score sender write ---------------------------------------------------

    def append(self, backend: str, spans: Sequence[Any], *, uncertain: bool = False) -> str:
        """Note that ``backend`` did not take ``spans`` (held in the trace file); returns an id for the batch."""
        if self.trace_file is None:
            raise ValueError("no trace file holds these spans")
        keys = [span_key(span.context.trace_id, span.context.span_id) for span in spans]
        self._write({"backend": backend, "file": self.trace_file, "undelivered": keys,
                     "uncertain": uncertain})
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
        """``state`` is ``sending``, ``delivered`` or ``not_sent``; ``score_posted`` takes score ids."""
        keys = list(keys)
        if keys:
            self._write({"backend": backend, state: keys})

    def _write(self, entry: Mapping[str, Any]) -> None:
        line = (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        with self._locked():
            fd = open_private_append(self.path)
            try:
                append_line(fd, line)  # after a torn last line (a crash mid-append), on a line of its own
                os.fsync(fd)
            finally:
                os.close(fd)

    # --- what push reads -----------------------------------------------------------------------------------------

    def pending(self) -> dict[str, Pending]:
        """Per backend, what is still undelivered. Lines that cannot be read (torn by a crash) are skipped."""
        with self._locked():
            return _replay(self._entries())

    def pending_spans(self, backend: str | None = None) -> int:
        return sum(p.span_count for name, p in self.pending().items() if backend in (None, name))

    def _entries(self) -> Iterator[dict[str, Any]]:
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            return
        with handle:
            for raw in handle:
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue  # a line torn by a crash mid-append: its batch was never noted (the warning said so)
                if isinstance(entry, dict) and isinstance(entry.get("backend"), str):
                    yield entry

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
                        if chosen:
                            lines.append({"backend": backend, "file": trace_file, "undelivered": chosen,
                                          "uncertain": uncertain})
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
                    os.write(fd, (json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n").encode())
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


def _replay(entries: Iterable[dict[str, Any]]) -> dict[str, Pending]:
    """The state the lines add up to: each span's last line decides it."""
    state: dict[tuple[str, str], str] = {}  # (backend, key) -> undelivered | uncertain | delivered
    where: dict[tuple[str, str], str] = {}  # (backend, key) -> trace file
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in entries:
        backend = entry["backend"]
        if isinstance(entry.get("undelivered"), list) and isinstance(entry.get("file"), str):
            mark = "uncertain" if entry.get("uncertain") else "undelivered"
            for key in entry["undelivered"]:
                state[(backend, str(key))] = mark
                where[(backend, str(key))] = entry["file"]
            continue
        for name, mark in (("sending", "uncertain"), ("delivered", "delivered"), ("not_sent", "undelivered")):
            for key in entry.get(name) or ():
                if (backend, str(key)) in where:
                    state[(backend, str(key))] = mark
        if isinstance(entry.get("score"), dict) and isinstance(entry["score"].get("id"), str):
            scores.setdefault(backend, {})[entry["score"]["id"]] = entry["score"]
        for score_id in entry.get("score_posted") or ():
            scores.get(backend, {}).pop(str(score_id), None)
    pending: dict[str, Pending] = {}
    for (backend, key), mark in state.items():  # insertion order: the order the spans failed in
        if mark == "delivered":
            continue
        waiting = pending.setdefault(backend, Pending())
        waiting.spans.setdefault(where[(backend, key)], []).append(key)
        if mark == "uncertain":
            waiting.uncertain.add(key)
    for backend, bodies in scores.items():
        if bodies:
            pending.setdefault(backend, Pending()).scores.update(bodies)
    return pending
