"""`looptrace traces push [--to langfuse|otlp]`: send the spans a backend could not take earlier (the spill file),
never twice. It loads the exporters when it runs."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from .common import UsageError
from .environment import read_settings
from .exit_codes import EXIT_OK


def push_command(args: argparse.Namespace) -> int:
    """Push the spill file's pending batches; print what was sent and what is still pending."""
    from looptrace.instrumentation.settings import ConfigurationError
    from looptrace.instrumentation.tracefile.spill import PushInProgress, push

    from .logging_setup import configure_logging

    configure_logging()  # the exporters' warnings, rendered as the rest of the CLI renders them
    settings = read_settings(spill_file=args.file)
    _require_a_regular_file(settings.spill_file)
    try:
        report = push(settings.spill_file, to=[args.to] if args.to else None,
                      resend_interrupted=args.resend_interrupted, settings=settings)
    except (PushInProgress, ConfigurationError) as exc:
        raise UsageError(str(exc)) from None
    print(report.summary())
    return EXIT_OK if report.ok else 1


def _require_a_regular_file(path: Path) -> None:
    """A spill file is read to its end and rewritten in place: a device or a pipe can be neither (/dev/zero never
    ends; /dev/null must not be replaced). One that does not exist yet simply holds nothing to push."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot read spill file {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"spill file {path} is a directory")
    if not stat.S_ISREG(mode):
        raise UsageError(f"spill file {path} is not a regular file (a device or a pipe); give the spill file, "
                         "e.g. .looptrace/spill.jsonl")
