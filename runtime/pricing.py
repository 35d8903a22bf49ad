"""USD per million tokens, per model, cache reads and writes included (the table lives in
`looptrace.instrumentation.recording.prices`, which the readers of stored spans price by too).

Figures are Anthropic's published list prices (platform.claude.com pricing page, checked 2026-11). A model id matches
the longest key that it starts with, so dated ids ("claude-sonnet-4-5-20250929") and aliases share one row. Pass your
own table to `Agent(prices=...)` for negotiated rates or models released after this file. Claude Haiku 5.5 is left out
on purpose: its price depends on each request's prompt length (two tiers around 100k tokens), which a flat row would
misstate; give it a row of your own for the tier you use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from looptrace.instrumentation.interface import DEFAULT_PRICES, Price, price_for, usd_for_tokens
from looptrace.runtime.result import Usage

__all__ = ["DEFAULT_PRICES", "Price", "Pricing", "cost_usd", "price_for"]


def cost_usd(usage: Usage, price: Price, *, cache_write_1h_tokens: int = 0) -> float:
    """The cost of one response. ``cache_write_1h_tokens`` is the part of the cache writes made with a 1-hour TTL."""
    return usd_for_tokens(price, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                          cache_read_tokens=usage.cache_read_input_tokens,
                          cache_write_tokens=usage.cache_creation_input_tokens,
                          cache_write_1h_tokens=cache_write_1h_tokens)


class Pricing:
    """One model's row of a price table, and the pricing of its responses."""

    __slots__ = ("model", "price")

    def __init__(self, model: str, prices: Mapping[str, Price] | None = None) -> None:
        self.model = model
        self.price = price_for(model, DEFAULT_PRICES if prices is None else prices)

    @property
    def output_usd_per_token(self) -> float | None:
        return self.price.output / 1_000_000 if self.price is not None else None

    def cost_of(self, response: Mapping[str, Any], usage: Usage | None = None) -> float | None:
        """What ``response`` cost (its usage parsed again when not given); None when the model has no price."""
        if self.price is None:
            return None
        return cost_usd(usage or Usage.from_response(response), self.price,
                        cache_write_1h_tokens=Usage.one_hour_cache_writes(response))

    def check(self, *, max_cost_usd: float | None, max_loop_cost_usd: float | None, detector_on: bool) -> None:
        """A cost limit needs a price (and a loop's, the detector): ValueError saying what to pass otherwise."""
        wanted = f"pass prices={{{self.model!r}: Price(input=..., output=..., ...)}}"
        if max_cost_usd is not None and self.price is None:
            raise ValueError(f"max_cost_usd needs a price for {self.model!r}, and the price table has none: {wanted}")
        if max_loop_cost_usd is not None and (self.price is None or not detector_on):
            raise ValueError(f"max_loop_cost_usd needs the loop detector on and a price for {self.model!r}"
                             + ("" if self.price is not None else f": the price table has none; {wanted}"))
