"""No test touches the checkout's ``.looptrace/``: what a user's own runs left there is theirs.

Runs whose telemetry nobody configured (an ``Agent`` built without ``telemetry=False`` or a provider, a CLI process)
write to the default trace file, ``.looptrace/traces.jsonl`` under the working directory, and list what a backend
missed in ``.looptrace/undelivered.jsonl``. ``isolate`` points both variables at a scratch directory of the test
process (processes the tests start inherit it); ``snapshot`` and ``changes`` let the conftest fail a test, and the
session, that changed the checkout's directory all the same (a test that clears the variables and keeps the
checkout as its working directory, say).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
GUARDED = CHECKOUT / ".looptrace"
VARIABLES = ("LOOPTRACE_TRACE_FILE", "LOOPTRACE_UNDELIVERED_FILE")

Snapshot = dict[str, tuple[int, int]]


def isolate() -> Path:
    """Point the trace file and the undelivered list at a scratch directory removed when the process ends, whatever
    the environment said (a user's own LOOPTRACE_TRACE_FILE must not collect test runs either)."""
    scratch = Path(tempfile.mkdtemp(prefix="looptrace-tests-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    os.environ["LOOPTRACE_TRACE_FILE"] = str(scratch / "traces.jsonl")
    os.environ["LOOPTRACE_UNDELIVERED_FILE"] = str(scratch / "undelivered.jsonl")
    os.environ.pop("LOOPTRACE_SPILL_FILE", None)  # the old name of the undelivered list's variable
    return scratch


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
