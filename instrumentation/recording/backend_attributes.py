"""What backends read on a run's spans beyond the GenAI conventions and looptrace.*: the one place spans take vendor
attributes from.

``for_run`` is called once as a run starts, with the run's facts; it returns, per kind of span, the attributes each
span of that kind starts with (Langfuse's trace-level attributes on every span, since Langfuse v4 reads them per
observation; OpenInference's kind, which Phoenix shows and Langfuse takes as the observation type), and the few that
only a span's end knows (a generation's usage and cost in Langfuse's terms, the level of a call in an anomaly, the
run's trace output), and the input and output each span shows when content is captured (OpenInference's, which
Langfuse reads first too). The mappings themselves are ``langfuse`` and ``openinference``, one module per backend.

Every span keeps at least one ``gen_ai.*`` attribute (``gen_ai.agent.name`` among the shared ones): Langfuse's SDK,
when it is the application's exporter, drops spans without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..langfuse import mapping as langfuse
from . import openinference
from .labels import RunLabels


@dataclass(frozen=True, slots=True)
class RunBackendAttributes:
    """One run's vendor attributes: what each kind of span starts with, and what some spans add as they end."""

    agent: Mapping[str, Any]
    turn: Mapping[str, Any]
    chat: Mapping[str, Any]
    tool: Mapping[str, Any]
    judge: Mapping[str, Any]
    joins_outer_trace: bool

    def generation(self, *, input_tokens: int, output_tokens: int, cache_read_input_tokens: int,
                   cache_creation_input_tokens: int, cache_creation_1h_input_tokens: int,
                   cost_usd: float | None) -> dict[str, str]:
        """A model call's usage (Anthropic's own counts, cache excluded from ``input_tokens``) and cost, as Langfuse
        prices them: its own usage keys win over ``gen_ai.usage.*``, whose cache handling differs between versions."""
        return langfuse.generation_attributes(
            input_tokens=input_tokens, output_tokens=output_tokens, cache_read_input_tokens=cache_read_input_tokens,
            cache_creation_input_tokens=cache_creation_input_tokens,
            cache_creation_1h_input_tokens=cache_creation_1h_input_tokens, cost_usd=cost_usd)

    @staticmethod
    def flagged(message: str) -> dict[str, str]:
        """A turn or a call that is part of an anomaly (and did not fail): level WARNING, ``message`` (the anomaly,
        already cut to a status message's length) its status message."""
        return langfuse.warning_attributes(message)

    def run_end(self, *, output: str | None, unresolved_tool_errors: int) -> dict[str, Any]:
        """What the agent span adds as the run ends (``output``: the final answer as recorded, if content is)."""
        return langfuse.run_end_attributes(joins_outer_trace=self.joins_outer_trace, output=output,
                                           unresolved_tool_errors=unresolved_tool_errors)


def for_run(agent: str, labels: RunLabels, *, joins_outer_trace: bool, trace_input: str | None
            ) -> RunBackendAttributes:
    """The vendor attributes of one run of ``agent``: ``joins_outer_trace`` when it starts under a span that is not
    looptrace's (it must still be its trace's root in Langfuse), ``trace_input`` the task as recorded (or None)."""
    shared = langfuse.run_attributes(agent, labels)
    root = langfuse.root_attributes(joins_outer_trace=joins_outer_trace, trace_input=trace_input)
    return RunBackendAttributes(
        agent={**shared, **openinference.kind_attributes("agent"), **root},
        turn={**shared, **openinference.kind_attributes("turn")},
        chat={**shared, **openinference.kind_attributes("chat")},
        tool={**shared, **openinference.kind_attributes("tool")},
        judge=shared,
        joins_outer_trace=joins_outer_trace,
    )


def shown_input(text: str, *, json: bool = False) -> dict[str, str]:
    """What a span shows as its input in Phoenix and Langfuse (content captured only)."""
    return openinference.input_attributes(text, json=json)


def shown_output(text: str, *, json: bool = False) -> dict[str, str]:
    """What a span shows as its output in Phoenix and Langfuse (content captured only)."""
    return openinference.output_attributes(text, json=json)
