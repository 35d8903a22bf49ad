"""One point in time that every part of a flush or a shutdown works against.

A flush has parts (the span processors, the metric readers, the Langfuse scores) and the CLI's way out has two calls
(a flush as the run ends, then the shutdown): each part asking for "5 s" of its own is how an exit took 10 s behind a
backend that never answers. A ``Deadline`` is made once and handed down; each part gets what is left of it.
"""

from __future__ import annotations

import time

__all__ = ["Deadline"]

_clock = time.monotonic  # the clock of every deadline (and of the guards' own); tests may replace it


class Deadline:
    """``at`` is a ``time.monotonic()`` value; past it nothing may wait any more."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at

    @classmethod
    def after_ms(cls, timeout_ms: float) -> Deadline:
        return cls(_clock() + max(timeout_ms, 0) / 1000)

    def remaining_s(self) -> float:
        return max(self.at - _clock(), 0.0)

    def remaining_ms(self) -> int:
        return int(self.remaining_s() * 1000)

    @property
    def passed(self) -> bool:
        return _clock() >= self.at

    def sooner(self, timeout_ms: float) -> Deadline:
        """This deadline, or one ``timeout_ms`` from now if that comes first."""
        other = Deadline.after_ms(timeout_ms)
        return other if other.at < self.at else self

    def __repr__(self) -> str:
        return f"Deadline(in {self.remaining_s():.3f} s)"
