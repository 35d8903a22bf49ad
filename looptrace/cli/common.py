"""What every command shares, at no start-up cost (standard library only): the parser class, the usage error, the
handling of a closed stdout and of a terminal that cannot show every character, and the words for counts."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from looptrace.cli.exit_codes import EXIT_USAGE


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line, as every other usage error is: the full usage is one --help away."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def silence_stdout() -> None:
    """The reader of stdout is gone (`looptrace demo | head -3`): nothing more can be shown, and Python's own flush at
    exit must not complain about it either. The command itself was not cut short."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor (a test harness)
        pass


def tolerate_any_terminal() -> None:
    """Characters the terminal cannot show (✓ on cp1252, say) become '?' instead of a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):  # a stream that cannot be reconfigured (already closed, a test's)
                pass


def is_terminal(stream: Any) -> bool:
    """Whether a stream is a terminal (a closed or replaced stream, a test's, is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def plural(count: int, noun: str) -> str:
    """``1 turn``, ``2 turns``, ``3 anomalies``: a count with its noun, thousands separated."""
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {plural_of(noun)}"


def plural_of(noun: str) -> str:
    """``turns``, ``anomalies``: the plural of one of the CLI's nouns."""
    return noun[:-1] + "ies" if noun.endswith("y") and noun[-2:-1] not in "aeiou" else noun + "s"


# How the model dealt with a tool error it left standing (`UnresolvedToolError.reported`), as the CLI says it.
REPORTED_HOW = {"answer": "reported in the answer", "model": "reported by the model before it answered",
                "handed on": "handed on by a later call"}


def unresolved_lines(errors: Sequence[Any], *, total: int | None = None, most: int = 5) -> list[str]:
    """What became of the tool errors a run left standing, one line per fate: those the model reported (``1 tool
    error, reported in the answer: reserve_equipment(EQ-001) at turn 2: ...``), then those nothing addressed (``...
    left unresolved: ...``), each with the most recent ``most``. ``total`` when more stood than are given: the ones
    not given are counted as left unresolved (their fate was not recorded)."""
    lines = []
    for how, said in REPORTED_HOW.items():
        reported = [e for e in errors if getattr(e, "reported", None) == how]
        if reported:
            shown = [e.describe() for e in reported[-most:]]
            more = f"({len(reported) - len(shown)} earlier not shown) " if len(reported) > len(shown) else ""
            lines.append(f"{plural(len(reported), 'tool error')}, {said}: {more}{'; '.join(shown)}")
    left = [e for e in errors if getattr(e, "reported", None) not in REPORTED_HOW]
    count = len(left) + max((total or 0) - len(errors), 0)
    if count:
        shown = [e.describe() for e in left[-most:]]
        more = f"({count - len(shown)} earlier not shown) " if count > len(shown) else ""
        lines.append(f"{plural(count, 'tool error')} left unresolved: {more}{'; '.join(shown)}".rstrip(": "))
    return lines


def left_unresolved(errors: Sequence[Any]) -> int:
    """How many of a run's standing tool errors nothing addressed (the others the model reported)."""
    return sum(1 for e in errors if getattr(e, "reported", None) not in REPORTED_HOW)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def since_time(text: str) -> int:
    """An argparse type: a moment as Unix nanoseconds, from an ISO time (``2026-12-01T09:30``, local time unless it
    names its zone) or a time ago (``90s``, ``15m``, ``2h``, ``1d``, ``1w``, or several: ``2h30m``)."""
    import re
    import time
    from datetime import datetime

    ago = re.fullmatch(r"(?:\d+[smhdw])+", text.strip())
    if ago:
        seconds = sum(int(n) * _UNITS[unit] for n, unit in re.findall(r"(\d+)([smhdw])", text))
        return time.time_ns() - seconds * 10**9
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("expected an ISO time (2026-12-01T09:30) or a time ago (90s, 15m, 2h, "
                                         "1d, 2h30m)") from None
    return int(moment.timestamp() * 1e9)  # a naive time is local, as `traces list` shows times


def positive_count(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError("expected a whole number of at least 1")
    return number
