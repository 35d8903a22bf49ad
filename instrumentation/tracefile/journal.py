"""The span journal: what a network backend has not yet taken, on disk from the moment a span ends.

The network exporters sit behind a BatchSpanProcessor, whose queue lives in memory: a process killed (``kill -9``,
the OOM killer, a power cut of the container) loses the spans waiting in it, up to ``OTEL_BSP_SCHEDULE_DELAY`` of
them, although the trace file already holds them. The spill file only gets what an export attempt failed on.

So each network pipeline keeps a journal beside the spill file, one per process and backend
(``<spill>.journal-<backend>-<pid>-<id>``):

* As a span is queued (on the thread that ended it), its trace-file line is appended (``encode.encode_line``):
  one ``write``, no fsync (the page cache outlives the process).
* When the export thread has settled a batch (delivered, or saved in the spill file), it appends the batch's span
  ids. Once every span written is settled and the file has grown past ``ROTATE_BYTES``, it is emptied.
* A clean shutdown deletes it. A journal left behind by a process that is gone (its lock is free) holds the spans
  that process never settled: ``recover()``, run by every push, moves them into the spill file as ordinary batches,
  where the spill file's guarantees take over (never twice, never lost, bad lines quarantined).

The journal costs the agent's hot path one ``write`` per span per network backend (and the span's encoding, which
the export would otherwise do on its thread), and nothing on the network side changes: the queue, the batches and
the spill file work as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..logs import log
from .encode import encode_line
from .write import append_line, open_private_append

try:
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we test
    fcntl = None  # type: ignore[assignment]

__all__ = ["ROTATE_BYTES", "SpanJournal", "journals_of", "recover"]

ROTATE_BYTES = 8 << 20  # a fully settled journal larger than this is emptied, so a long-lived process's stays small
RECOVERED_BATCH_SPANS = 512  # spans per batch moved into the spill file (the BatchSpanProcessor's default batch)
_SETTLED = '{"looptrace":{"settled":['
_SETTLED_BYTES = _SETTLED.encode("ascii")


def journal_prefix(spill_path: Path) -> str:
    return spill_path.name + ".journal-"


class SpanJournal:
    """One process's journal of the spans queued for ``backend``; thread-safe; the file is made on the first span."""

    def __init__(self, spill_path: str | os.PathLike[str], backend: str) -> None:
        spill_path = Path(spill_path)
        self.backend = backend
        self.path = spill_path.with_name(f"{journal_prefix(spill_path)}{backend}-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._written = 0  # spans recorded since the file was last emptied
        self._settled = 0
        self._size = 0
        self._closed = False
        self._broken = False
        self.made_directory = False  # removed again at a clean shutdown: nothing is left behind when all went well

    def record(self, span: Any) -> None:
        """Append a span about to be queued for export. Never raises: a journal that cannot be written costs one
        warning and the protection it gave, never the span's export."""
        if self._closed or self._broken:
            return
        try:
            line = _journal_line(span)
        except Exception:  # noqa: BLE001 - a span that cannot be encoded is refused by the export, which says so
            return
        with self._lock:
            if self._closed or self._broken:
                return
            try:
                fd = self._fd if self._fd is not None else self._open()
                append_line(fd, line, fresh=False)
            except OSError as error:
                self._fail(error)
                return
            self._written += 1
            self._size += len(line)

    def settle(self, spans: Sequence[Any]) -> None:
        """The export thread is done with these spans (delivered, or saved in the spill file)."""
        if not spans or self._broken:
            return
        ids = ",".join(f'"{span.context.span_id:016x}"' for span in spans)
        line = (_SETTLED + ids + "]}}\n").encode("ascii")
        with self._lock:
            if self._fd is None or self._broken:
                return
            try:
                append_line(self._fd, line, fresh=False)
                self._settled += len(spans)
                self._size += len(line)
                if self._settled >= self._written and self._size > ROTATE_BYTES:
                    os.ftruncate(self._fd, 0)  # all settled: nothing in it is needed any more
                    self._written = self._settled = self._size = 0
            except OSError as error:
                self._fail(error)

    def close(self) -> None:
        """At shutdown, after the last export: delete the journal when everything in it was settled; otherwise
        leave it (unlocked) for the next push to recover."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            fd, self._fd = self._fd, None
            if fd is None:
                return
            if self._settled >= self._written and not self._broken:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(fd)  # releases the lock that says the writer is alive

    def _open(self) -> int:
        self.made_directory = not self.path.parent.is_dir()
        fd = open_private_append(self.path)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held for the process's life: "still writing"
        self._fd = fd
        return fd

    def _fail(self, error: OSError) -> None:
        self._broken = True
        log.warning("span_journal_unwritable", backend=self.backend, path=str(self.path),
                    error=f"{type(error).__name__}: {error}",
                    hint="spans queued for export are lost if the process is killed before they are sent; set "
                         "LOOPTRACE_SPILL_FILE to a writable path")


# The last span's line: each network backend's journal writes the same line for the same span, one after the other on
# the thread that ended it. One tuple, replaced whole, so a thread never sees one span beside another's line.
_last_line: tuple[Any, bytes] = (None, b"")


def _journal_line(span: Any) -> bytes:
    global _last_line
    last = _last_line
    if last[0] is span:
        return last[1]
    line = encode_line(span)
    _last_line = (span, line)
    return line


def journals_of(spill_path: Path) -> list[Path]:
    """The journals beside a spill file, oldest name first."""
    try:
        return sorted(spill_path.parent.glob(journal_prefix(spill_path) + "*"))
    except OSError:
        return []


@contextlib.contextmanager
def _abandoned(path: Path) -> Iterator[int | None]:
    """A descriptor of the journal at ``path`` locked by us, or None while its writer is alive (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield None
        return
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield None
                return
        yield fd
    finally:
        os.close(fd)


def recover(spill_path: Path, max_line_bytes: int, known_spans: Callable[[], set[str]],
            known_batches: Callable[[], set[str]], append: Callable[[str, str, str], None]) -> Counter:
    """Move the unsettled spans of every abandoned journal into the spill file; returns spans moved, per backend.

    ``known_spans()`` gives the span ids pending in the spill file (a batch spilled just before its settle record
    was written must not be added twice); ``known_batches()`` the batch ids the spill file or its ledger already
    holds (a recovery interrupted after its first batches must not add them again); ``append(backend, batch,
    line)`` adds one line. The journal is deleted once its spans are in the spill file.
    """
    moved: Counter = Counter()
    prefix = journal_prefix(spill_path)
    spans_known: set[str] | None = None
    for path in journals_of(spill_path):
        backend = path.name[len(prefix):].split("-", 1)[0]
        with _abandoned(path) as fd:
            if fd is None:
                continue
            if spans_known is None:
                spans_known = known_spans()
            pending = _unsettled(fd, max_line_bytes, spans_known)
            if pending:
                batches = known_batches()
                token = path.name[len(prefix):]
                for number, start in enumerate(range(0, len(pending), RECOVERED_BATCH_SPANS)):
                    chunk = pending[start:start + RECOVERED_BATCH_SPANS]
                    batch = f"journal-{token}-{number}"
                    if batch not in batches:
                        append(backend, batch, _spill_line(backend, batch, [rs for _, rs in chunk]))
                    moved[backend] += len(chunk)
            with contextlib.suppress(OSError):
                path.unlink()
    return moved


def _unsettled(fd: int, limit: int, known: set[str]) -> list[tuple[str, Any]]:
    """(span id, its resourceSpans entry) of every journaled span not settled and not already in the spill file."""
    spans: list[tuple[str, Any]] = []
    settled: set[str] = set()
    with open(os.dup(fd), "rb") as handle:
        while True:
            raw = handle.readline(limit + 1)
            if not raw:
                break
            if len(raw) > limit and not raw.endswith(b"\n"):
                chunk = raw
                while chunk and not chunk.endswith(b"\n"):
                    chunk = handle.readline(1 << 20)
                continue  # a span line longer than the spill file may hold could never be pushed either
            try:
                document = json.loads(raw)
                if raw.startswith(_SETTLED_BYTES):
                    settled.update(str(span_id) for span_id in document["looptrace"]["settled"])
                    continue
                queued = document["resourceSpans"]  # the span's trace-file line
                for resource_spans in queued:
                    for scope_spans in resource_spans.get("scopeSpans") or ():
                        for span in scope_spans.get("spans") or ():
                            spans.append((str(span["spanId"]).lower(), resource_spans))
            except Exception:  # noqa: BLE001 - a torn last line (the process died mid-write) costs that line only
                continue
    return [(span_id, entry) for span_id, entry in spans if span_id not in settled and span_id not in known]


def _spill_line(backend: str, batch: str, resource_spans: list[Any]) -> str:
    tag = json.dumps({"backend": backend, "batch": batch}, separators=(",", ":"))
    return '{"looptrace":' + tag + ',"resourceSpans":' + json.dumps(resource_spans, separators=(",", ":")) + "}"
