"""looptrace's warnings: records of the standard ``logging`` logger ``looptrace``, so an application routes or
silences them as it does any library's (``logging.getLogger("looptrace").setLevel(logging.ERROR)``).

Each record's message is the event name (``export_failed``) followed by its fields as ``key=value``; the fields are
also on the record as ``record.looptrace`` (a dict) for structured handlers. With no logging configured at all, Python
prints WARNING and above to standard error (its "last resort" handler), never to standard output, where a program's
results go. The CLI renders these records with structlog (``install_cli_rendering``); a long-running service
(``looptrace watch``) renders them as JSON lines instead (``configure_service_logging``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOGGER_NAME = "looptrace"
logger = logging.getLogger(LOGGER_NAME)


def _format(event: str, fields: dict[str, Any]) -> str:
    return " ".join([event, *(f"{key}={value!r}" for key, value in fields.items())])


class _Log:
    """``log.warning("event", key=value)``: one record of the ``looptrace`` logger, fields kept on the record."""

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if logger.isEnabledFor(level):
            logger.log(level, "%s", _format(event, fields), extra={"looptrace": {"event": event, **fields}},
                       stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields)


log = _Log()


class _StructlogHandler(logging.Handler):
    """Hands looptrace's records to structlog, for the CLI's rendering (colours at a terminal, unless NO_COLOR)."""

    def emit(self, record: logging.LogRecord) -> None:
        import structlog

        if not structlog.is_configured():  # the CLI's configuration was reset (an in-process caller): plain stderr
            sys.stderr.write(self.format(record) + "\n")
            return
        fields = dict(getattr(record, "looptrace", None) or {"event": record.getMessage()})
        event = fields.pop("event")
        try:
            getattr(structlog.get_logger(LOGGER_NAME), record.levelname.lower())(event, **fields)
        except Exception:  # noqa: BLE001 - a log line must never take a command down
            self.handleError(record)


def install_cli_rendering() -> None:
    """Route the ``looptrace`` logger's records through structlog (the CLI owns its process, so it may)."""
    if not any(isinstance(handler, _StructlogHandler) for handler in logger.handlers):
        logger.addHandler(_StructlogHandler())
    logger.propagate = False  # rendered once, by structlog, not again by a root handler


_failures_said: set[tuple[str, str]] = set()
telemetry_failures = 0  # spans (or parts of them) that could not be recorded, since the process started


def telemetry_failed(where: str, exc: BaseException) -> None:
    """Telemetry that failed to record ``where`` (a span, an attribute): counted, and said once per place and cause,
    never raised into the run it describes."""
    global telemetry_failures
    telemetry_failures += 1
    said = (where, type(exc).__qualname__)
    if said not in _failures_said:
        _failures_said.add(said)
        log.warning("telemetry_failed", where=where, error=type(exc).__qualname__,
                    hint="the run goes on; this part of its trace is missing")


def configure_service_logging() -> None:
    """One JSON object per line on stderr, INFO and up: what log collectors read from a long-running service.

    Process-wide (structlog's configuration and the ``looptrace`` logger's level), so only an entry point that owns
    its process calls it: the CLI's ``watch`` command does, before it serves.
    """
    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    # looptrace's records (the stdlib logger "looptrace") rendered by the structlog chain above.
    install_cli_rendering()
    logger.setLevel(logging.INFO)


_ignored_said: set[str] = set()


def settings_ignored(problems: tuple[str, ...]) -> None:
    """Each setting the environment got wrong and that is ignored (``Settings.ignored``), said once per process as
    one warning naming it, whichever entry point read it first."""
    for problem in problems:
        if problem not in _ignored_said:
            _ignored_said.add(problem)
            log.warning("setting_ignored", problem=problem)
