"""Token counts the Anthropic way, and what a call costs: the plain types the loop and its telemetry both speak.

``interface`` re-exports them for the runtime. Pure standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CostOf", "Usage"]


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


def _token_count(value: object) -> int:
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
