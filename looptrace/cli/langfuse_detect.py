"""`looptrace detect --langfuse`: the loop anomalies in the traces a Langfuse project already holds.

Reads a window of traces (and their observations) through Langfuse's public API with the project's keys
(``LANGFUSE_*``), rebuilds the runs with the same readers as `detect` and `watch`, and prints what `detect` prints.
With ``--score`` each finding becomes a ``loop_anomaly`` score on its trace (the live path's body and id, so a second
scan adds none); with ``--cursor FILE`` an interrupted scan resumes where it stopped. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from looptrace.cli.common import UsageError, plural
from looptrace.cli.exit_codes import EXIT_OK

_RELATIVE = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
PROGRESS_EVERY_S = 1.0


def add_langfuse_arguments(detect: argparse.ArgumentParser) -> None:
    group = detect.add_argument_group(
        "Langfuse", "read the traces of the Langfuse project of LANGFUSE_PUBLIC_KEY / LANGFUSE_SECRET_KEY "
                    "(LANGFUSE_BASE_URL) instead of a file")
    group.add_argument("--langfuse", action="store_true", help="scan the Langfuse project's traces")
    group.add_argument("--since", type=moment, metavar="WHEN",
                       help="traces started at or after WHEN: ISO 8601 (2026-11-24T00:00Z) or an age (24h, 7d)")
    group.add_argument("--until", type=moment, metavar="WHEN", help="traces started before WHEN (default: now)")
    group.add_argument("--session-id", help="only this session's traces")
    group.add_argument("--user-id", help="only this user's traces")
    group.add_argument("--tag", action="append", default=[], help="only traces with this tag (repeatable: all of)")
    group.add_argument("--environment", action="append", default=[],
                       help="only traces of this environment (repeatable: any of)")
    group.add_argument("--score", action="store_true",
                       help="post a loop_anomaly score per finding to its trace (idempotent)")
    group.add_argument("--cursor", metavar="FILE",
                       help="remember what was scanned in FILE; the same command resumes an interrupted scan")
    group.add_argument("--rootless", action="store_true",
                       help="also find traces whose root never reached Langfuse (a killed run): a heavier read")


def moment(text: str) -> datetime:
    """An ISO 8601 time (naive means UTC) or an age before now: 90s, 30m, 24h, 7d, 2w."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return datetime.now(UTC) - timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an ISO 8601 time nor an age like 24h or 7d") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def langfuse_detect_command(args: argparse.Namespace, print_verdict: Any) -> int:
    """Scan, print each verdict as `detect` does (``print_verdict``), say the count on stderr; exit 1 on findings."""
    from looptrace.cli.environment import read_settings
    from looptrace.instrumentation.langfuse import CursorError, LangfuseAPI, LangfuseAPIError, ScanQuery, scan_traces

    if args.file is not None:
        raise UsageError("give a trace file or --langfuse, not both")
    settings = read_settings()
    if settings.langfuse is None:
        raise UsageError("--langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY (and LANGFUSE_BASE_URL for "
                         "a self-hosted Langfuse)")
    query = ScanQuery(since=args.since, until=args.until, session_id=args.session_id, user_id=args.user_id,
                      tags=tuple(args.tag), environments=tuple(args.environment), rootless=args.rootless)
    progress = _Progress()
    found = 0
    try:
        for verdict in scan_traces(LangfuseAPI.from_settings(settings.langfuse), query, score=args.score,
                                   cursor=args.cursor, on_progress=progress):
            found += len(verdict.anomalies)
            if verdict.anomalies or args.all:
                progress.clear()
                print_verdict(verdict, args)
    except (LangfuseAPIError, CursorError) as exc:
        progress.clear()
        raise UsageError(str(exc)) from None
    progress.clear()
    if not args.json:
        scored = f"; {plural(progress.scores, 'score')} posted" if args.score else ""
        print(f"{plural(found, 'anomaly')} found in {plural(progress.judged, 'trace')} of "
              f"{settings.langfuse.base_url}{scored}", file=sys.stderr)
    return 1 if found else EXIT_OK


def _waiting_line(seconds: float, reason: str) -> str:
    """A retry's pause, said as what happened: Langfuse asks to wait only when it answers 429 or 5xx (with or
    without Retry-After); a connection that fails or times out is ours to retry."""
    if reason.startswith("cannot connect"):
        return f"cannot connect to Langfuse; retrying in {seconds:.0f} s"
    if reason.startswith("no answer"):
        return f"no answer from Langfuse in time; retrying in {seconds:.0f} s"
    return f"Langfuse asked to wait {seconds:.0f} s ({reason})"


class _Progress:
    """A progress line on stderr for a person watching (redrawn in place), at most once a second."""

    def __init__(self) -> None:
        self.interactive = sys.stderr.isatty()
        self.judged = 0
        self.scores = 0
        self._shown = 0.0
        self._drawn = False

    def __call__(self, report: Any) -> None:
        self.judged, self.scores = report.judged, report.scores_posted
        if report.phase == "waiting":  # always said: a pause nobody is told of looks like a hang
            self._say(_waiting_line(report.wait_s, report.reason))
            return
        now = time.monotonic()
        if not self.interactive or report.phase == "done" or now - self._shown < PROGRESS_EVERY_S:
            return
        self._shown = now
        total = f" of {report.total:,}" if report.total is not None else ""
        self._say(f"{report.phase} traces: {report.judged:,}{total} judged, {report.listed:,} listed, "
                  f"{plural(report.anomalies, 'anomaly')}")

    def _say(self, line: str) -> None:
        if self.interactive:
            sys.stderr.write("\r" + line[:100].ljust(100))
            sys.stderr.flush()
            self._drawn = True
        else:
            print(f"looptrace: {line}", file=sys.stderr)

    def clear(self) -> None:
        if self._drawn:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()
            self._drawn = False
