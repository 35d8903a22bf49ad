"""A model as the detector's judge: confirms an ignored_error before it is reported, and decides the open cases.

``Agent(detector=DetectorConfig(judge="claude-haiku-4-5"))`` asks that model, through the agent's own client, whether
the final answer ignored the failed call. The prompt is short and the answer structured (a forced tool call); the
judge's tokens and cost go on a span of its own (``chat {model}``, marked with semconv's ``JUDGE`` attribute) and are
never charged to the run's budget. A judge that fails, times out or answers nonsense leaves the rule's own verdict: it
never blocks for longer than its timeout, and never crashes the run. With content capture off the judge still sends
the failed call and the answer to the model: the same provider that already received them during the run.
"""

from __future__ import annotations

from typing import Any

from looptrace.instrumentation.detector import JudgeRequest

JUDGE_TIMEOUT_S = 20.0
JUDGE_MAX_TOKENS = 200
_VERDICT_TOOL = {
    "name": "verdict",
    "description": "Record whether the final answer ignored the failed tool call.",
    "input_schema": {
        "type": "object",
        "properties": {
            "ignored": {"type": "boolean",
                        "description": "true if the answer presents the failed work as done or states a result the "
                                       "error contradicts; false if it reports the failure, a limitation, or asks "
                                       "the user how to proceed"},
            "reason": {"type": "string", "description": "one short sentence"},
        },
        "required": ["ignored"],
    },
}
_PROMPT = ("An agent's tool call failed and was never retried successfully. Did its final answer to the user ignore "
           "that failure?\n\nFailed call: {tool}({arguments})\nError: {error}\n\nFinal answer:\n{answer}")


class ModelJudge:
    """Callable judge over a `Model` (the agent's client, instrumented as a judge's: its calls get spans of their own):
    True = ignored, False = not ignored, None = no opinion."""

    def __init__(self, client: Any, model: str, *, timeout_s: float = JUDGE_TIMEOUT_S) -> None:
        self.client = client
        self.model = model
        self.timeout_s = timeout_s

    def __call__(self, request: JudgeRequest) -> bool | None:
        params = {
            "model": self.model, "max_tokens": JUDGE_MAX_TOKENS, "tools": [_VERDICT_TOOL],
            "tool_choice": {"type": "tool", "name": "verdict"},
            "messages": [{"role": "user", "content": _PROMPT.format(
                tool=request.tool, arguments=request.arguments[:1000], error=request.error_text[:1000],
                answer=request.final_text[:4000])}],
        }
        response = self.client.create(params, timeout=self.timeout_s)  # raises: the detector keeps its verdict
        return _verdict(response)


def _verdict(response: dict[str, Any]) -> bool | None:
    for block in response.get("content") or ():
        if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "verdict":
            ignored = (block.get("input") or {}).get("ignored")
            return ignored if isinstance(ignored, bool) else None
    return None
