"""USD per million tokens, per model, cache reads and writes included: the table both the runtime (a run's cost,
its budgets) and the readers of stored spans (`looptrace detect`, `watch`: what another producer's loop cost) price
model calls by. Standard library only.

Figures are Anthropic's published list prices (platform.claude.com pricing page, checked 2026-11). A model id matches
the longest key that it starts with, so dated ids ("claude-sonnet-4-5-20250929") and aliases share one row. Pass your
own table to `Agent(prices=...)` for negotiated rates or models released after this file. Claude Haiku 5.5 is left out
on purpose: its price depends on each request's prompt length (two tiers around 100k tokens), which a flat row would
misstate; give it a row of your own for the tier you use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write_5m: float
    cache_write_1h: float

    @classmethod
    def standard(cls, input: float, output: float) -> Price:
        """Anthropic's usual cache multipliers: reads 0.1x, 5-minute writes 1.25x, 1-hour writes 2x the input price."""
        return cls(input, output, round(input * 0.1, 6), round(input * 1.25, 6), round(input * 2, 6))


DEFAULT_PRICES: dict[str, Price] = {
    "claude-fable-5-1": Price(10, 50, 0.25, 12.5, 20),
    "claude-mythos-5-1": Price(10, 50, 0.25, 12.5, 20),
    "claude-fable-5": Price.standard(10, 50),
    "claude-mythos-5": Price.standard(10, 50),
    "claude-opus-5-5": Price(4, 20, 0.20, 5, 8),
    "claude-sonnet-5-5": Price(2, 10, 0.10, 2.5, 4),  # cache reads cut to 0.05x on 2026-10-07
    "claude-sonnet-5": Price.standard(2, 10),
    "claude-opus-4-5": Price.standard(5, 25),
    "claude-opus-4-6": Price.standard(5, 25),
    "claude-opus-4-7": Price.standard(5, 25),
    "claude-opus-4-8": Price.standard(5, 25),
    "claude-opus-5": Price.standard(5, 25),
    "claude-opus-4-1": Price.standard(15, 75),
    "claude-opus-4-0": Price.standard(15, 75),
    "claude-opus-4-20250514": Price.standard(15, 75),
    "claude-3-opus": Price.standard(15, 75),
    "claude-sonnet-4": Price.standard(3, 15),  # 4, 4.5 and 4.6 share a price
    "claude-3-7-sonnet": Price.standard(3, 15),
    "claude-3-5-sonnet": Price.standard(3, 15),
    "claude-haiku-4-5": Price.standard(1, 5),
    "claude-3-5-haiku": Price(0.80, 4, 0.08, 1, 1.6),
    "claude-3-haiku": Price(0.25, 1.25, 0.03, 0.30, 0.50),
}


def price_for(model: str, prices: Mapping[str, Price] = DEFAULT_PRICES) -> Price | None:
    """The row whose key is the longest prefix of ``model``, or None when the model is not in the table."""
    best = None
    for key in prices:
        if model.startswith(key) and (best is None or len(key) > len(best)):
            best = key
    return prices[best] if best is not None else None


def usd_for_tokens(price: Price, *, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
                   cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0) -> float:
    """The cost of one model call by its token counts; ``input_tokens`` without the cache (Anthropic's way), and
    ``cache_write_1h_tokens`` the part of the cache writes made with a 1-hour TTL."""
    write_5m = cache_write_tokens - cache_write_1h_tokens
    return (
        input_tokens * price.input
        + output_tokens * price.output
        + cache_read_tokens * price.cache_read
        + write_5m * price.cache_write_5m
        + cache_write_1h_tokens * price.cache_write_1h
    ) / 1_000_000
