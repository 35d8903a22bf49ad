"""looptrace's log lines: structlog as the application configured it, or standard error when nobody did.

structlog's unconfigured default prints to standard output, which is where a program's own results go (`looptrace run
--json`, a script piping an agent's answer): a library's warning must never land there.
"""

from __future__ import annotations

import sys
from typing import Any

import structlog

_FALLBACK_PROCESSORS = [
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso"),
    structlog.dev.ConsoleRenderer(colors=False),
]


class _Log:
    """``log.warning("event", key=value)``, resolved at each call so configuring structlog later still takes effect."""

    def __getattr__(self, level: str):
        def emit(event: str, **fields: Any) -> None:
            if structlog.is_configured():
                logger = structlog.get_logger("looptrace")
            else:
                logger = structlog.wrap_logger(structlog.PrintLogger(sys.stderr), processors=_FALLBACK_PROCESSORS)
            getattr(logger, level)(event, **fields)

        return emit


log = _Log()
