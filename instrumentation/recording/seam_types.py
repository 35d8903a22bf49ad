"""The plain types the loop and its telemetry both speak, apart from the protocols so that either side can use them.

``interface`` re-exports every name here: the runtime imports them from there. Pure standard library.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["ACTIONS", "Action", "CostOf", "ModelLike", "Usage", "first_chunk_receiver", "report_first_chunk"]

Action = Literal["warn", "nudge", "ask", "stop"]
"""What the policy did about an anomaly: alert only, alert and send one corrective message, pause the run for a
person to say go on or stop, or end the run."""
ACTIONS: tuple[Action, ...] = ("warn", "nudge", "ask", "stop")


@dataclass(slots=True)
class Usage:
    """Token counts the Anthropic way: ``input_tokens`` excludes the cache, which is counted apart."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @classmethod
    def from_response(cls, response: Mapping[str, Any]) -> Usage:
        """The usage of a Messages API response. A backend that sends "12" or 12.0 still gets counted, and one that
        sends garbage (null, a negative number, text, no usage at all) counts as zero rather than ending the run."""
        raw = response.get("usage")
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            input_tokens=_token_count(raw.get("input_tokens")),
            output_tokens=_token_count(raw.get("output_tokens")),
            cache_read_input_tokens=_token_count(raw.get("cache_read_input_tokens")),
            cache_creation_input_tokens=_token_count(raw.get("cache_creation_input_tokens")),
        )

    @staticmethod
    def one_hour_cache_writes(response: Mapping[str, Any]) -> int:
        """The cache writes of ``response`` kept for an hour (priced higher): Anthropic splits them by lifetime in
        ``usage.cache_creation``; without that split every write is a 5-minute one."""
        raw = response.get("usage")
        creation = raw.get("cache_creation") if isinstance(raw, Mapping) else None
        if not isinstance(creation, Mapping):
            return 0
        return min(_token_count(creation.get("ephemeral_1h_input_tokens")),
                   _token_count(raw.get("cache_creation_input_tokens")))  # type: ignore[union-attr]

    @property
    def total_tokens(self) -> int:
        """Everything the budget counts: input, output, cache reads and cache writes."""
        return self.input_tokens + self.output_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    @property
    def all_input_tokens(self) -> int:
        """Input with the cache added back: the GenAI conventions' Anthropic rule for ``gen_ai.usage.input_tokens``."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def add(self, other: Usage) -> None:
        """Count ``other`` in as well."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_input_tokens += other.cache_read_input_tokens
        self.cache_creation_input_tokens += other.cache_creation_input_tokens


def _token_count(value: Any) -> int:
    if type(value) is int:  # what the API sends: read four times per model call
        return value if value > 0 else 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float):
        return max(int(value), 0) if value == value and abs(value) != float("inf") else 0
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 18:
        return int(value.strip())
    return 0


CostOf = Callable[[Mapping[str, Any], Usage], "float | None"]
"""The USD cost of a Messages API response whose usage was already parsed (``Usage.from_response``), or None when its
model has no price (the agent's price table decides)."""


class ModelLike(Protocol):
    """The model seam as telemetry sees it (``runtime.models.Model`` is the loop's own, identical, description)."""

    stream: bool

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]: ...

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]: ...

    def server(self) -> tuple[str | None, int | None]: ...


# A streaming model reports its first chunk through this: the instrumented wrapper sets a receiver while the call
# runs, so a model implementation needs no telemetry of its own (and one called outside a run costs a lookup).
first_chunk_receiver: contextvars.ContextVar[Callable[[float], None] | None] = contextvars.ContextVar(
    "looptrace_first_chunk", default=None)


def report_first_chunk(seconds: float) -> None:
    """A streaming model call got its first chunk ``seconds`` after it was sent (the chat span's time to first
    chunk). Free when nothing listens."""
    receiver = first_chunk_receiver.get()
    if receiver is not None:
        receiver(seconds)
