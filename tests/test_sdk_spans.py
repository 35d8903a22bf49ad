"""looptrace's spans are the OpenTelemetry SDK's: an application's own span processor, added to the provider
``configure()`` makes or to the application's own provider, gets every span of a run as an SDK ``ReadableSpan``.

The run is real: the anthropic SDK's client against the local Messages-API fake, one tool call then an answer.
"""

from __future__ import annotations

import anthropic
import pytest
from fakes.messages_api import FakeMessagesAPI
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

import looptrace
from looptrace import Agent, tool
from looptrace.instrumentation.tracefile.read import read_spans


@tool
def lookup(q: str) -> str:
    """Looks something up."""
    return "found " + q


SCRIPT = [
    {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup",
                                             "input": {"q": "x"}}]},
    {"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]},
]


class Collecting(SpanProcessor):
    """An application's processor: keeps whatever the provider hands it when a span ends."""

    def __init__(self) -> None:
        self.ended: list[object] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def run_on(provider: object) -> str:
    with FakeMessagesAPI(SCRIPT) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
        result = Agent("claude-sonnet-4-5", tools=[lookup], client=client, tracer_provider=provider).run("find x")
    assert result.status == "done", result
    return result.trace_id


@pytest.mark.parametrize("whose", ["configure's own", "the application's"])
def test_an_applications_processor_gets_every_span_of_a_run_as_an_sdk_readable_span(whose, tmp_path):
    trace_file = tmp_path / "traces.jsonl"
    if whose == "configure's own":
        telemetry = looptrace.configure(exporters="file", trace_file=trace_file, set_global=False)
        provider = telemetry.tracer_provider
    else:
        provider = TracerProvider()
        telemetry = looptrace.configure(tracer_provider=provider, exporters="file", trace_file=trace_file)
    assert isinstance(provider, TracerProvider)
    mine = Collecting()
    provider.add_span_processor(mine)
    try:
        trace_id = run_on(provider)
    finally:
        telemetry.shutdown()
    assert mine.ended and all(isinstance(span, ReadableSpan) for span in mine.ended)
    seen = {format(span.context.span_id, "016x") for span in mine.ended}  # type: ignore[attr-defined]
    written = {record.span_id for record in read_spans(trace_file) if record.trace_id == trace_id}
    assert seen == written  # every span the run wrote, the application's processor got
    names = sorted(span.name.split(" ")[0] for span in mine.ended)  # type: ignore[attr-defined]
    assert names == ["chat", "chat", "execute_tool", "invoke_agent", "turn", "turn"]
