"""No test touches the checkout's ``.looptrace/``: what a user's own runs left there is theirs.

Runs whose telemetry nobody configured (an ``Agent`` built without ``telemetry=False`` or a provider, a CLI process)
write to the default trace file, ``.looptrace/traces.jsonl`` under the working directory, list what a backend missed
in ``.looptrace/undelivered.jsonl`` and keep paused runs in ``.looptrace/paused/``. The conftest runs every test in a
directory of its own (its ``tmp_path``) with none of the variables that name those files elsewhere (``isolate``), so
the defaults land there, and processes the tests start inherit both. ``snapshot`` and ``changes`` let it fail a test,
and the session, that changed the checkout's directory all the same.
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
GUARDED = CHECKOUT / ".looptrace"
# What would send a run's files elsewhere than the test's directory: a user's own shell may export them.
VARIABLES = ("LOOPTRACE_TRACE_FILE", "LOOPTRACE_UNDELIVERED_FILE", "LOOPTRACE_SPILL_FILE")


def isolate() -> None:
    """Forget the variables that name the trace file and the undelivered list: a user's own LOOPTRACE_TRACE_FILE must
    not collect test runs, and a test that means to set one does."""
    for name in VARIABLES:
        os.environ.pop(name, None)


Snapshot = dict[str, tuple[int, int]]


def snapshot(directory: Path = GUARDED) -> Snapshot:
    """Every file under ``directory`` with its size and modification time; empty when there is no directory."""
    found: Snapshot = {}
    if not directory.is_dir():
        return found
    for path in directory.rglob("*"):
        try:
            status = path.stat()
        except OSError:  # gone between the listing and the look
            continue
        found[str(path.relative_to(directory))] = (status.st_size, status.st_mtime_ns)
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What happened between two snapshots, one phrase per file: created, changed or removed."""
    said = [f"{name} created" for name in sorted(after.keys() - before.keys())]
    said += [f"{name} changed" for name in sorted(before.keys() & after.keys()) if before[name] != after[name]]
    said += [f"{name} removed" for name in sorted(before.keys() - after.keys())]
    return said
