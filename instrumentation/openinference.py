"""OpenInference's span kinds on looptrace's spans: what Phoenix (and Arize) show each span as.

Langfuse reads the same attribute as an observation type (``ObservationTypeMapper.ts``: ``langfuse.observation.type``
first, then ``openinference.span.kind``, then ``gen_ai.operation.name``), so one attribute serves both and no
Langfuse-only type is sent: a run shows as an agent, a turn as a chain, a model call as a generation (LLM), a tool
call as a tool. The judge's calls carry no kind: they are the detector's, not the agent's.
"""

from __future__ import annotations

from . import semconv as sc

SPAN_KIND = sc.OPENINFERENCE_SPAN_KIND
KINDS = {"agent": sc.SPAN_KIND_AGENT, "turn": sc.SPAN_KIND_CHAIN, "chat": sc.SPAN_KIND_LLM, "tool": sc.SPAN_KIND_TOOL}


def kind_attributes(kind: str) -> dict[str, str]:
    """The OpenInference kind of one of looptrace's spans: ``agent``, ``turn``, ``chat`` or ``tool``."""
    try:
        return {SPAN_KIND: KINDS[kind]}
    except KeyError:
        raise ValueError(f"unknown span kind {kind!r}; expected one of {', '.join(KINDS)}") from None
