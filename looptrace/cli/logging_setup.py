"""The CLI's one logging set-up, used by every command that logs.

The CLI owns its process, so it may configure structlog: warnings and above rendered on stderr, keeping stdout for
results; colours only for a person at a terminal and never with NO_COLOR. The library's records (the stdlib logger
``looptrace``) are routed through that rendering and shown once, not a second time by a root handler.
`looptrace watch` is a service and switches to one JSON object per line when it starts serving (the watch package's
service logging set-up).
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from looptrace.cli.environment import no_color_requested
from looptrace.instrumentation import install_cli_rendering


def configure_logging() -> None:
    """Render warnings and errors on stderr through structlog, looptrace's own records included."""
    import structlog

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=use_color(sys.stderr)),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        # Looked up at each use, not bound once: whoever swaps sys.stderr later (a test harness) is still followed.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
    )
    install_cli_rendering()


def use_color(stream: TextIO) -> bool:
    """Colour only for a person at a terminal, and never when NO_COLOR is set to anything (no-color.org)."""
    return not no_color_requested() and stream.isatty()
