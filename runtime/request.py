"""The Messages API request of a turn, and what a failed call tells the user to try."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MIN_THINKING_BUDGET", "hint_for", "model_request"]

MIN_THINKING_BUDGET = 1024  # the Messages API's floor for thinking.budget_tokens


def model_request(*, model: str, max_tokens: int, model_params: Mapping[str, Any], system: str | None,
                  tool_definitions: list[dict[str, Any]], messages: list[dict[str, Any]],
                  output_tokens_left: int | None) -> dict[str, Any]:
    """One turn's request: ``model_params`` over the defaults, ``max_tokens`` lowered to what the budget has left of
    output (``output_tokens_left``, None: no such bound), and a snapshot of the history (it grows after the call)."""
    params: dict[str, Any] = {"model": model, "max_tokens": max_tokens, **model_params}
    if output_tokens_left is not None and output_tokens_left < params["max_tokens"]:
        _lower_max_tokens(params, output_tokens_left)
    if system is not None:
        params["system"] = system
    if tool_definitions:
        params["tools"] = tool_definitions
    params["messages"] = list(messages)
    return params


def _lower_max_tokens(params: dict[str, Any], max_tokens: int) -> None:
    """Ask for at most ``max_tokens``. Extended thinking must stay below max_tokens and above its own floor: it is
    shrunk to fit, or switched off for this request when even the floor no longer fits."""
    params["max_tokens"] = max_tokens
    thinking = params.get("thinking")
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int) and budget >= max_tokens:
        if max_tokens - 1 >= MIN_THINKING_BUDGET:
            params["thinking"] = {**thinking, "budget_tokens": max_tokens - 1}
        else:
            params["thinking"] = {"type": "disabled"}


def hint_for(exc: BaseException) -> str:
    """What to try for a failed model call, from the error's kind (the anthropic SDK's exception names)."""
    kind = type(exc).__name__
    text = str(exc)
    if kind == "AuthenticationError" or "authentication" in text.lower() or "api_key" in text:
        return "set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN), or pass client=anthropic.Anthropic(api_key=...)"
    if kind in ("APIConnectionError", "APITimeoutError", "ModelCallTimeout"):
        return "is ANTHROPIC_BASE_URL reachable? the run's timeout_s bounds each call"
    if kind in ("NotFoundError", "BadRequestError"):
        return "check the model name and the request parameters"
    return "RunResult.error has the whole message"
