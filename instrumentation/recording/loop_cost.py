"""A loop's cost as span attributes: on the anomaly event (the streak's cost when it was reported) and on the root
span (the run's and the session's loop cost, which `traces show` and `traces list` print). The figures themselves
come from the detector (`detector.LoopCost`)."""

from __future__ import annotations

from typing import Any

from ..detector import LoopCost
from . import semconv as sc

_RUN = (sc.RUN_LOOP_COST_USD, sc.RUN_LOOP_INPUT_TOKENS, sc.RUN_LOOP_OUTPUT_TOKENS, sc.RUN_LOOP_TOTAL_TOKENS,
        sc.RUN_LOOP_TURNS)
_SESSION = (sc.SESSION_LOOP_COST_USD, sc.SESSION_LOOP_INPUT_TOKENS, sc.SESSION_LOOP_OUTPUT_TOKENS,
            sc.SESSION_LOOP_TOTAL_TOKENS, sc.SESSION_LOOP_TURNS)


def anomaly_cost_attributes(cost: LoopCost | None) -> dict[str, Any]:
    """The anomaly event's cost attributes; the USD left out (and the reason given) when a call had no price."""
    if cost is None:
        return {}
    attributes: dict[str, Any] = {sc.ANOMALY_INPUT_TOKENS: cost.input_tokens,
                                  sc.ANOMALY_OUTPUT_TOKENS: cost.output_tokens,
                                  sc.ANOMALY_TOTAL_TOKENS: cost.total_tokens, sc.ANOMALY_TURNS: cost.turns}
    if cost.usd is not None:
        attributes[sc.ANOMALY_COST_USD] = cost.usd
    elif cost.unpriced:
        attributes[sc.ANOMALY_COST_UNPRICED] = cost.unpriced
    if cost.seconds is not None:
        attributes[sc.ANOMALY_DURATION_S] = round(cost.seconds, 3)
    if cost.since_turn is not None:
        attributes[sc.ANOMALY_SINCE_TURN] = cost.since_turn
    return attributes


def loop_total_attributes(run: LoopCost | None, session: LoopCost | None) -> dict[str, Any]:
    """The root span's loop totals: this run's, and the session's so far (when the run is part of one)."""
    attributes: dict[str, Any] = {}
    for names, cost in ((_RUN, run), (_SESSION, session)):
        if cost is None:
            continue
        usd_name, input_name, output_name, total_name, turns_name = names
        attributes.update({input_name: cost.input_tokens, output_name: cost.output_tokens,
                           total_name: cost.total_tokens, turns_name: cost.turns})
        if cost.usd is not None:
            attributes[usd_name] = cost.usd
    return attributes
