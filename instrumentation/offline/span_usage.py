"""What a stored model call used and cost, from its span: the GenAI conventions' `gen_ai.usage.*` token counts (other
producers' in those names too: readers.py translates OpenInference's), priced by looptrace's own figure when the
span is ours (`looptrace.chat.cost_usd`), else by the price table. Turned into the `TurnUsage` the detector's cost
ledger takes, so `looptrace detect` and `watch` give another producer's loop the same figures as a live run's.

`gen_ai.usage.input_tokens` is read the conventions' way for Anthropic: every input token, cache reads and writes
included; the cache's part is priced at its own rate. A model the table does not know keeps its tokens and says why
it has no USD.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..detector import TurnUsage
from ..recording import semconv as sc
from ..recording.prices import DEFAULT_PRICES, Price, price_for, usd_for_tokens

# The attributes read here, for readers that decode only what detection needs.
USAGE_KEYS = frozenset({
    sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_RESPONSE_MODEL, sc.CHAT_COST_USD,
})


def model_call_usage(attributes: Mapping[str, Any], start_ns: int, end_ns: int,
                     prices: Mapping[str, Price] = DEFAULT_PRICES) -> TurnUsage | None:
    """The usage one model-call span recorded; None when it recorded no token counts at all."""
    input_tokens = _count(attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS))
    output_tokens = _count(attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS))
    if input_tokens is None and output_tokens is None:
        return None
    all_input, output = input_tokens or 0, output_tokens or 0
    cache_read = _count(attributes.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)) or 0
    cache_write = _count(attributes.get(sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS)) or 0
    usd, unpriced = _priced(attributes, prices, uncached=max(all_input - cache_read - cache_write, 0),
                            output=output, cache_read=cache_read, cache_write=cache_write)
    return TurnUsage(input_tokens=all_input, output_tokens=output, usd=usd, unpriced=unpriced,
                     started=start_ns / 1e9 if start_ns else None, ended=end_ns / 1e9 if end_ns else None)


def _priced(attributes: Mapping[str, Any], prices: Mapping[str, Price], *, uncached: int, output: int,
            cache_read: int, cache_write: int) -> tuple[float | None, str | None]:
    own = attributes.get(sc.CHAT_COST_USD)
    if isinstance(own, (int, float)) and not isinstance(own, bool):
        return float(own), None  # the run priced it itself, with its own table
    model = attributes.get(sc.GEN_AI_RESPONSE_MODEL) or attributes.get(sc.GEN_AI_REQUEST_MODEL)
    if not isinstance(model, str) or not model:
        return None, "the model call recorded no model name"
    price = price_for(model, prices) or price_for(model.rsplit("/", 1)[-1], prices)  # "anthropic/claude-..." too
    if price is None:
        return None, f"no price for model {model!r} in the price table"
    return usd_for_tokens(price, input_tokens=uncached, output_tokens=output, cache_read_tokens=cache_read,
                          cache_write_tokens=cache_write), None


def _count(value: object) -> int | None:
    """A token count as a producer wrote it (an int, or its text in OTLP/JSON); None when there is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str):
        try:
            return max(int(value.strip()), 0)
        except ValueError:
            return None
    return None
