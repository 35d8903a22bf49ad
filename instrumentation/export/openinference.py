"""OpenInference's view of looptrace's spans: what Phoenix (and Arize) show each span as, added at export.

Phoenix shows a span's kind from ``openinference.span.kind`` and its input and output from ``input.value`` and
``output.value`` alone (rendered as JSON when their mime type says so), whatever gen_ai.* the span has. Langfuse reads
the same attributes first (``ObservationTypeMapper.ts``: ``langfuse.observation.type``, then
``openinference.span.kind``, then ``gen_ai.operation.name``; ``extractInputAndOutput``: ``input.value`` and
``output.value`` before the gen_ai.* content), so its exporter adds them too, each exactly what Langfuse would make
of the gen_ai.* attributes: a run shows as an agent with the task and the answer, a turn as a chain, a model call as
a generation (LLM) whose input is the system prompt followed by the history, a tool call as a tool with its arguments
and result. The judge's calls carry no kind: they are the detector's, not the agent's.

The spans themselves (and the trace file) carry none of this: ``span_attributes`` is applied by the exporters that
ask for it (``mapped``), and by ``traces push``.
"""

from __future__ import annotations

from typing import Any

from ..offline.run_facts import RunFacts, answer_text, span_kind, task_text
from ..recording import semconv as sc
from ..recording.content import to_json

SPAN_KIND = sc.OPENINFERENCE_SPAN_KIND
KINDS = {"agent": sc.SPAN_KIND_AGENT, "turn": sc.SPAN_KIND_CHAIN, "chat": sc.SPAN_KIND_LLM, "tool": sc.SPAN_KIND_TOOL}


def span_attributes(span: Any, run: RunFacts | None) -> dict[str, Any]:
    """What Phoenix reads on one of looptrace's finished spans (``span``: attributes as an SDK ``ReadableSpan`` has
    them), given its run's facts (None when its root was not seen)."""
    a = span.attributes
    kind = span_kind(a)
    if kind is None or kind == "judge":
        return {}
    attributes: dict[str, Any] = {SPAN_KIND: KINDS[kind]}
    if kind == "agent":
        task, answer = task_text(a), answer_text(a)
        if task is not None:
            attributes.update(input_attributes(task))
        if answer:
            attributes.update(output_attributes(answer))
    elif kind == "chat":
        history = a.get(sc.GEN_AI_INPUT_MESSAGES)
        if isinstance(history, str):
            attributes.update(input_attributes(input_view(history, run), json=True))
        output = a.get(sc.GEN_AI_OUTPUT_MESSAGES)
        if isinstance(output, str):
            attributes.update(output_attributes(output, json=True))
    elif kind == "tool":
        arguments, result = a.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS), a.get(sc.GEN_AI_TOOL_CALL_RESULT)
        if isinstance(arguments, str):
            attributes.update(input_attributes(arguments, json=True))
        if isinstance(result, str):
            attributes.update(output_attributes(result))
    return attributes


def input_view(history: str, run: RunFacts | None) -> str:
    """A model call's input as Langfuse shows it from gen_ai.*: the system prompt as a first system message, then
    the messages, so Phoenix and Langfuse show one view and Langfuse users keep the system prompt. A history cut
    mid-message (no longer a JSON list) is left as it is, as Langfuse leaves it."""
    system = run.system_prompt if run is not None else None
    if not system or not (history.startswith("[") and history.endswith("]")):
        return history
    message = to_json({"role": "system", "content": system})
    return f"[{message}]" if history == "[]" else f"[{message},{history[1:]}"


def input_attributes(text: str, *, json: bool = False) -> dict[str, str]:
    """A span's input as Phoenix lists it (``input.value``; JSON text says so)."""
    return {sc.INPUT_VALUE: text, sc.INPUT_MIME_TYPE: sc.MIME_JSON} if json else {sc.INPUT_VALUE: text}


def output_attributes(text: str, *, json: bool = False) -> dict[str, str]:
    """A span's output as Phoenix lists it (``output.value``)."""
    return {sc.OUTPUT_VALUE: text, sc.OUTPUT_MIME_TYPE: sc.MIME_JSON} if json else {sc.OUTPUT_VALUE: text}
