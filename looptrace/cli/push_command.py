"""`looptrace traces push [--to langfuse|otlp]`: send the spans and scores a backend could not take earlier, never
twice (``instrumentation/export/push.py``). It loads the exporters when it runs."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from looptrace.cli.common import UsageError
from looptrace.cli.environment import read_settings
from looptrace.cli.exit_codes import EXIT_OK


def push_command(args: argparse.Namespace) -> int:
    """Push what the undelivered list names; print what was sent and what is still pending."""
    from looptrace.cli.logging_setup import configure_logging
    from looptrace.instrumentation import ConfigurationError
    from looptrace.instrumentation.export import push_undelivered
    from looptrace.instrumentation.tracefile import PushInProgress, TraceFileError

    configure_logging()  # the exporters' warnings, rendered as the rest of the CLI renders them
    settings = read_settings(undelivered_file=args.file)
    _require_a_regular_file(settings.undelivered_file)
    try:
        report = push_undelivered(settings.undelivered_file, to=[args.to] if args.to else None,
                                  resend_interrupted=args.resend_interrupted, settings=settings)
    except (PushInProgress, ConfigurationError, TraceFileError) as exc:
        raise UsageError(str(exc)) from None
    print(report.summary())
    return EXIT_OK if report.ok else 1


def _require_a_regular_file(path: Path) -> None:
    """The undelivered list is read to its end and rewritten in place: a device or a pipe can be neither (/dev/zero
    never ends; /dev/null must not be replaced). One that does not exist yet simply lists nothing to push."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot read the undelivered list {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"undelivered list {path} is a directory")
    if not stat.S_ISREG(mode):
        raise UsageError(f"undelivered list {path} is not a regular file (a device or a pipe); give the list, "
                         "e.g. .looptrace/undelivered.jsonl")
