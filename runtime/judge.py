"""A model as the detector's judge: confirms an ignored_error before it is reported, and decides the open cases.

``Agent(detector=DetectorConfig(judge="claude-haiku-4-5"))``, ``LOOPTRACE_JUDGE=claude-haiku-4-5`` or ``looptrace run
--judge claude-haiku-4-5`` asks that model, through the agent's own client, whether the final answer ignored the
failed call, at most ``LOOPTRACE_JUDGE_MAX_CALLS`` times a run (``DetectorConfig.judge_max_calls``; the detector's
`Judging` holds the cap). The prompt is short and the answer structured (a forced tool call); the
judge's tokens and cost go on a span of its own (``chat {model}``, marked with semconv's ``JUDGE`` attribute) and are
never charged to the run's budget. A judge that fails, times out or answers nonsense leaves the rule's own verdict: it
never blocks for longer than its timeout, and never crashes the run. With content capture off the judge still sends
the failed call and the answer to the model: the same provider that already received them during the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from looptrace.instrumentation.detector import DetectorConfig, JudgeRequest, JudgeVerdict
from looptrace.instrumentation.interface import AgentTelemetry, Usage
from looptrace.runtime.models import AnthropicModel, Model
from looptrace.runtime.pricing import Price, Pricing

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
    """Callable judge over a `Model` (the agent's client, instrumented as a judge's: its calls get spans of their own).

    Returns a `JudgeVerdict`: ``ignored`` True, False or None (no opinion), with the response's tokens and its cost by
    ``cost_of`` (None without one, or when the model has no price)."""

    def __init__(self, client: Any, model: str, *, timeout_s: float = JUDGE_TIMEOUT_S,
                 cost_of: Callable[[Mapping[str, Any]], float | None] | None = None) -> None:
        self.client = client
        self.model = model
        self.timeout_s = timeout_s
        self.cost_of = cost_of

    def __call__(self, request: JudgeRequest) -> JudgeVerdict:
        params = {
            "model": self.model, "max_tokens": JUDGE_MAX_TOKENS, "tools": [_VERDICT_TOOL],
            "tool_choice": {"type": "tool", "name": "verdict"},
            "messages": [{"role": "user", "content": _PROMPT.format(
                tool=request.tool, arguments=request.arguments[:1000], error=request.error_text[:1000],
                answer=request.final_text[:4000])}],
        }
        response = self.client.create(params, timeout=self.timeout_s)  # raises: the detector keeps its verdict
        usage = Usage.from_response(response)
        return JudgeVerdict(ignored=_verdict(response), input_tokens=usage.all_input_tokens,
                            output_tokens=usage.output_tokens,
                            cost_usd=None if self.cost_of is None else self.cost_of(response))


def judged_config(detector: DetectorConfig | bool, *, telemetry: AgentTelemetry, client: Model,
                  prices: Mapping[str, Price]) -> DetectorConfig | None:
    """An agent's detector config (None: the detector is off), with its judge made ready: the config's, else the
    settings' (``LOOPTRACE_JUDGE``, ``looptrace run --judge``), a model name turned into a `ModelJudge` over the agent's
    own client, and a model judge's calls traced as the judge's. The settings' judge asks the Messages API only: on a
    scripted or custom model it would take the answers meant for the agent's own turns. Anomaly messages leave the
    process, so the config quotes content only when the telemetry captures it."""
    if detector is False:
        return None
    config = detector if isinstance(detector, DetectorConfig) else DetectorConfig()
    settings = telemetry.settings
    judge = config.judge
    if judge is None and isinstance(client, AnthropicModel):
        judge = settings.judge
    if isinstance(judge, str):  # a model name: the judge asks it through this agent's own client
        judge = ModelJudge(client, judge)
    if isinstance(judge, ModelJudge):  # a copy traced as the judge's: the one passed in is left as it was
        pricing = Pricing(judge.model, prices)
        traced = telemetry.instrument(judge.client, cost_of=pricing.cost_of, judge=True)
        judge = ModelJudge(traced, judge.model, timeout_s=judge.timeout_s, cost_of=judge.cost_of or pricing.cost_of)
    cap = config.judge_max_calls
    return replace(config, capture_content=telemetry.captures_content, judge=judge,
                   judge_max_calls=cap if cap is not None else settings.judge_max_calls)


def _verdict(response: dict[str, Any]) -> bool | None:
    for block in response.get("content") or ():
        if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "verdict":
            ignored = (block.get("input") or {}).get("ignored")
            return ignored if isinstance(ignored, bool) else None
    return None
