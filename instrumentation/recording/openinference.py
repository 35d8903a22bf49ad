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


def input_attributes(text: str, *, json: bool = False) -> dict[str, str]:
    """A span's input as Phoenix lists it (``input.value``; JSON text says so). Langfuse reads it first too, before
    ``gen_ai.input.messages`` or ``gen_ai.tool.call.arguments``, so both show the same text."""
    return {sc.INPUT_VALUE: text, sc.INPUT_MIME_TYPE: sc.MIME_JSON} if json else {sc.INPUT_VALUE: text}


def output_attributes(text: str, *, json: bool = False) -> dict[str, str]:
    """A span's output as Phoenix lists it (``output.value``), which Langfuse reads first as well."""
    return {sc.OUTPUT_VALUE: text, sc.OUTPUT_MIME_TYPE: sc.MIME_JSON} if json else {sc.OUTPUT_VALUE: text}
