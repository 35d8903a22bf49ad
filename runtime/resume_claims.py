"""Each paused run resumes once, held per run: one claim file per state id, created atomically, in a directory of the
user's own.

A state file can be reached by many names (a symlink, a hard link, a copy, its JSON handed to ``Agent.resume``), so
nothing beside the file can say that the run it holds was resumed. What every copy shares is the state's id. The first
resume creates ``<claims directory>/<state id>`` with ``O_CREAT | O_EXCL``: of any number of processes resuming one
paused run, by whatever name, one creates it and the others find it there. The directory is
``$XDG_STATE_HOME/looptrace/resumed`` (``~/.local/state/looptrace/resumed`` by default; the variable is read with the
settings, ``Settings.state_home``), created 0700 and refused when another user could write to it. A claim is fsynced
before the resumed run does anything: a power cut cannot bring back a run whose approved call went out. A resume that
fails before its run begins takes its claim back.

The claim holds when and by which process the run was resumed (and the path it was resumed from), nothing from the
conversation. Its scope is the directory: the user's processes on this machine, or wherever that directory is shared.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600
# A state id names a file: letters, digits, '-' and '_' only (looptrace writes 32 hex digits).
STATE_ID = re.compile(r"[A-Za-z0-9_-]{8,128}")


class ClaimError(Exception):
    """The claim could not be taken or read; the message says why (the caller turns it into a StateError)."""


class AlreadyClaimed(ClaimError):
    """The run was resumed already: the claim exists."""


def claims_directory(state_home: Path | None) -> Path:
    """Where claims live: ``looptrace/resumed`` under the state home (``Settings.state_home``: XDG_STATE_HOME), or
    under ``~/.local/state`` without one."""
    return (state_home or Path.home() / ".local" / "state") / "looptrace" / "resumed"


def check_state_id(state_id: str) -> None:
    """Raise ValueError unless ``state_id`` can name a claim file."""
    if not STATE_ID.fullmatch(state_id):
        raise ValueError("state_id must be 8 to 128 letters, digits, '-' or '_'")


def claimed(state_id: str, directory: Path) -> str | None:
    """When and how the run was resumed, in words, if it was; None if it was not."""
    check_state_id(state_id)
    claim = directory / state_id
    try:
        with open(claim, "rb") as handle:
            return _describe(handle.read(4096), claim)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ClaimError(f"cannot read {claim}: {exc.strerror or exc}") from None


def claim(state_id: str, directory: Path, source: Path | None = None) -> Path:
    """Claim the run ``state_id`` in ``directory``: AlreadyClaimed if any process did before. Returns the claim
    file. ``source`` is the file it was resumed from, if any, for whoever reads the claim."""
    check_state_id(state_id)
    folder = directory
    _private_directory(folder)
    path = folder / state_id
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags, FILE_MODE)
    except FileExistsError:
        raise AlreadyClaimed(claimed(state_id, folder) or f"see {path}") from None
    except OSError as exc:
        raise ClaimError(f"cannot create {path}: {exc.strerror or exc}") from None
    record = {"state_id": state_id, "resumed_at": time.time(), "pid": os.getpid(),
              "from": None if source is None else os.path.abspath(source)}
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        _sync_directory(folder)
    except OSError as exc:  # a full disk: the claim is not trustworthy, so it is not kept
        path.unlink(missing_ok=True)
        raise ClaimError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def release(path: Path) -> bool:
    """Remove a claim this process took (its resume never began). False when it could not be removed."""
    try:
        path.unlink()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _private_directory(folder: Path) -> None:
    """Create ``folder`` and its missing parents 0700; refuse one another user could write into (a claim planted
    there would block a resume, a claim removed would allow a second)."""
    missing = []
    for parent in [folder, *folder.parents]:
        if os.path.lexists(parent):
            break
        missing.append(parent)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIRECTORY_MODE)
        except FileExistsError:
            pass  # made meanwhile by another process: checked below like any other
        except OSError as exc:
            raise ClaimError(f"cannot create {directory}: {exc.strerror or exc}") from None
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise ClaimError(f"cannot use {folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ClaimError(f"{folder} is not a directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ClaimError(f"{folder} belongs to another user")
    if info.st_mode & 0o022:
        raise ClaimError(f"{folder} can be written by other users (mode {stat.S_IMODE(info.st_mode):04o}); "
                         f"make it 0700")


def _sync_directory(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # not on this platform (Windows): the file's own fsync is what there is
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _describe(raw: bytes, path: Path) -> str:
    try:
        record: Any = json.loads(raw)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record["resumed_at"])))
        where = f" from {record['from']}" if record.get("from") else ""
        return f"at {when} by process {int(record['pid'])}{where}; claim {path}"
    except (ValueError, KeyError, TypeError, OverflowError):
        return f"claim {path}"
