"""USD per million tokens, per model, cache reads and writes included (the table lives in
`looptrace.instrumentation.recording.prices`, which the readers of stored spans price by too).

Figures are Anthropic's published list prices (platform.claude.com pricing page, checked 2026-11). A model id matches
the longest key that it starts with, so dated ids ("claude-sonnet-4-5-20250929") and aliases share one row. Pass your
own table to `Agent(prices=...)` for negotiated rates or models released after this file. Claude Haiku 5.5 is left out
on purpose: its price depends on each request's prompt length (two tiers around 100k tokens), which a flat row would
misstate; give it a row of your own for the tier you use.
"""

from __future__ import annotations

from looptrace.instrumentation.interface import DEFAULT_PRICES, Price, price_for, usd_for_tokens
from looptrace.runtime.result import Usage

__all__ = ["DEFAULT_PRICES", "Price", "cost_usd", "price_for"]


def cost_usd(usage: Usage, price: Price, *, cache_write_1h_tokens: int = 0) -> float:
    """The cost of one response. ``cache_write_1h_tokens`` is the part of the cache writes made with a 1-hour TTL."""
    return usd_for_tokens(price, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                          cache_read_tokens=usage.cache_read_input_tokens,
                          cache_write_tokens=usage.cache_creation_input_tokens,
                          cache_write_1h_tokens=cache_write_1h_tokens)
