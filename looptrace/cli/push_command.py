"""`looptrace traces push [--to langfuse|otlp]`: send the spans a backend could not take earlier (the spill file),
never twice. It loads the exporters when it runs."""

from __future__ import annotations

import argparse

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
    try:
        report = push(settings.spill_file, to=[args.to] if args.to else None,
                      resend_interrupted=args.resend_interrupted, settings=settings)
    except (PushInProgress, ConfigurationError) as exc:
        raise UsageError(str(exc)) from None
    print(report.summary())
    return EXIT_OK if report.ok else 1
