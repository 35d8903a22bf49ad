"""Scripted agents instrumented by OTHER producers' real packages, for the reader and watch tests.

Run as a script, one producer per process (instrumentations patch the anthropic SDK globally, and two of them must
never patch the same process):

    python tests/foreign_agents.py --producer openllmetry --scenario repeat_failing --file out.jsonl
    python tests/foreign_agents.py --producer openinference --scenario clean --otlp http://127.0.0.1:4318/v1/traces
    python tests/foreign_agents.py --producer openllmetry --bare --scenario repeat --otlp http://127.0.0.1:4318/v1/traces
    python tests/foreign_agents.py --producer langfuse --bare --scenario repeat --file out.jsonl

The agent talks to the local fake Messages API (tests/fakes/messages_api.py) through the real anthropic SDK, and the
producer's own instrumentation makes the spans. Spans go to a local OTLP/JSON file (looptrace's file exporter, the
Collector's file format) and/or to an OTLP/HTTP endpoint through the SDK's real exporter.

Producers:
  semconv        OpenTelemetry's GenAI utilities (opentelemetry-util-genai): invoke_agent, chat spans with
                 gen_ai.input.messages / gen_ai.output.messages, execute_tool spans
  semconv-chat   the same without execute_tool spans: tool calls only as message parts
  openllmetry    traceloop's opentelemetry-instrumentation-anthropic: gen_ai.prompt.N.* / gen_ai.completion.N.*
  openinference  openinference-instrumentation-anthropic (LLM spans) and OpenInference TOOL spans
  pydantic-ai    pydantic-ai's own instrumentation (instrument=True) with its Anthropic model
  genai-anthropic  OpenTelemetry contrib's own Anthropic instrumentation (opentelemetry-instrumentation-genai-anthropic,
                 built on opentelemetry-util-genai): chat spans with gen_ai.input.messages / gen_ai.output.messages
  anthropic-sdk  no instrumentation at all: the anthropic SDK's own `anthropic.messages.create` spans, which it makes
                 whenever a tracer provider is set globally (model, usage, stop reason; no messages)
  langfuse       the Langfuse SDK: `@observe` around the loop and, for the model calls, the instrumentation Langfuse
                 documents for Anthropic in Python (OpenInference's); Langfuse's own span processor and exporter
                 write the spans (to the file / OTLP endpoint here, instead of a Langfuse server)

``--bare`` runs the loop as most people instrument it: no agent or workflow span around it, no session id and no tool
spans, the tracer provider set globally (so the anthropic SDK's own spans go to the same exporter beside the
instrumentation's). Every model call is then a trace of its own (pydantic-ai keeps its own agent-run span); only the
conversation in each call's input messages ties them together. semconv needs the app to make every span, so it has
no bare form.

Scenarios:
  repeat_failing  the model calls get_order(A-1) four times; it fails every time; the answer admits it
  ignored_error   refund(A-1) fails, is retried and fails again; the agent moves on (notify_customer) and the answer
                  states the refund done without a word about its failure
  repeat          the model calls get_order(A-1) eight times; it succeeds with the same answer every time
  clean           get_order(A-1) succeeds; the answer reports it
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRODUCERS = ("semconv", "semconv-chat", "openllmetry", "openinference", "pydantic-ai", "genai-anthropic",
             "anthropic-sdk", "langfuse")
SCENARIOS = ("repeat_failing", "repeat", "ignored_error", "clean")
BARE_PRODUCERS = ("openllmetry", "openinference", "pydantic-ai", "genai-anthropic", "anthropic-sdk", "langfuse")
MODEL = "claude-sonnet-4-6"
SESSION_ID = "session-under-watch"


class ToolFailed(Exception):
    """What a tool raises when its backend says no."""


def get_order(order_id: str) -> str:
    """Look up an order."""
    if SCENARIO == "repeat_failing":
        raise ToolFailed(f"order service unavailable for {order_id}")
    return json.dumps({"order_id": order_id, "status": "shipped"})


def refund(order_id: str) -> str:
    """Refund an order."""
    raise ToolFailed(f"refund rejected for {order_id}: payment provider timeout")


def notify_customer(message: str) -> str:
    """Send the customer a message."""
    return "sent"


TOOLS = {"get_order": get_order, "refund": refund, "notify_customer": notify_customer}
TOOL_SCHEMAS = [
    {"name": name, "description": function.__doc__,
     "input_schema": {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]}}
    for (name, function), argument in zip(TOOLS.items(), ("order_id", "order_id", "message"), strict=True)
]
SCENARIO = "clean"
# Tool-use ids are unique per process, as the real API's are: two agents' identical conversations sent to one watch
# must not share a history.
RUN_TAG = os.urandom(4).hex()


def model_script(scenario: str) -> list[dict[str, Any]]:
    """What the fake Messages API answers, turn by turn."""
    def call(tool: str, n: int, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"stop_reason": "tool_use", "content": [
            {"type": "tool_use", "id": f"toolu_{tool}_{n}_{RUN_TAG}", "name": tool,
             "input": arguments or {"order_id": "A-1"}}]}
    if scenario == "repeat_failing":
        return [call("get_order", n) for n in range(1, 5)] + [
            {"content": "I could not look up order A-1: the order service failed every time."}]
    if scenario == "repeat":
        return [call("get_order", n) for n in range(1, 9)] + [{"content": "Order A-1 has shipped."}]
    if scenario == "ignored_error":
        # The detector's ignored_error rule alone fires on a failure the model knew about and left behind: retried,
        # failed again, then other work, and an answer that states the refund done, neither naming the order nor
        # quoting the error.
        return [call("refund", 1), call("refund", 2),
                call("notify_customer", 1, {"message": "Your request has been handled."}),
                {"content": "All done: the refund is issued and the customer has been notified."}]
    return [call("get_order", 1), {"content": "Order A-1 has shipped."}]


# --- the agent loop, plain anthropic SDK -------------------------------------------------------------------------

def run_plain_loop(client: Any, on_chat: Any = None, on_tool: Any = None) -> str:
    """The agent loop every SDK user writes. ``on_chat``/``on_tool`` wrap each call when the producer needs the app's
    help to make spans (OpenTelemetry's GenAI utilities, OpenInference TOOL spans)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What happened to order A-1? Refund it if needed."}]
    for _ in range(10):
        request = {"model": MODEL, "max_tokens": 512, "tools": TOOL_SCHEMAS, "messages": messages}
        response = on_chat(client, request) if on_chat else client.messages.create(**request)
        messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True)
                                                           for block in response.content]})
        if response.stop_reason != "tool_use":
            return "".join(block.text for block in response.content if block.type == "text")
        results = []
        for block in response.content:
            if block.type != "tool_use":
                continue
            run_tool = on_tool or _run_tool
            text, is_error = run_tool(block.name, dict(block.input), block.id)
            results.append({"type": "tool_result", "tool_use_id": block.id, "content": text, "is_error": is_error})
        messages.append({"role": "user", "content": results})
    return ""


def _run_tool(name: str, arguments: dict[str, Any], call_id: str) -> tuple[str, bool]:
    try:
        return TOOLS[name](**arguments), False
    except ToolFailed as exc:
        return f"Error: {exc}", True


# --- producers ---------------------------------------------------------------------------------------------------

def produce_semconv(client: Any, provider: Any, with_tool_spans: bool) -> None:
    from opentelemetry.util.genai.handler import TelemetryHandler
    from opentelemetry.util.genai.types import (
        InputMessage,
        OutputMessage,
        Text,
        ToolCallRequestPart,
        ToolCallResponsePart,
    )

    handler = TelemetryHandler(tracer_provider=provider)

    def parts_of(content: Any) -> list[Any]:
        if isinstance(content, str):
            return [Text(content=content)]
        parts: list[Any] = []
        for block in content:
            kind = block["type"]
            if kind == "text":
                parts.append(Text(content=block["text"]))
            elif kind == "tool_use":
                parts.append(ToolCallRequestPart(name=block["name"], id=block["id"], arguments=block["input"]))
            elif kind == "tool_result":
                parts.append(ToolCallResponsePart(id=block["tool_use_id"], response=block["content"]))
        return parts

    def on_chat(client: Any, request: dict[str, Any]) -> Any:
        with handler.inference("anthropic", request_model=MODEL) as invocation:
            invocation.input_messages = [InputMessage(role=m["role"], parts=parts_of(m["content"]))
                                         for m in request["messages"]]
            response = client.messages.create(**request)
            invocation.output_messages = [OutputMessage(
                role="assistant", parts=parts_of([b.model_dump() for b in response.content]),
                finish_reason="tool_call" if response.stop_reason == "tool_use" else "stop")]
            invocation.finish_reasons = ["tool_call" if response.stop_reason == "tool_use" else "stop"]
            invocation.response_id = response.id
            return response

    def on_tool(name: str, arguments: dict[str, Any], call_id: str) -> tuple[str, bool]:
        invocation = handler.tool(name)
        invocation.tool_call_id = call_id
        invocation.arguments = arguments
        try:
            result = TOOLS[name](**arguments)
        except ToolFailed as exc:
            invocation.fail(exc)
            return f"Error: {exc}", True
        invocation.tool_result = result
        invocation.stop()
        return result, False

    with handler.invoke_local_agent(agent_name="support-agent", request_model=MODEL,
                                    conversation_id=SESSION_ID):
        run_plain_loop(client, on_chat, on_tool if with_tool_spans else None)


def produce_openllmetry(client_factory: Any, provider: Any, bare: bool = False) -> None:
    from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor

    if bare:  # the user's setup: the global provider, instrument() with no arguments, the loop alone
        _set_global_provider(provider)
        AnthropicInstrumentor().instrument()
        run_plain_loop(client_factory())
        return
    AnthropicInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("support-app")
    # OpenLLMetry makes one span per model call; the app's own span makes them one trace (what @workflow does).
    with tracer.start_as_current_span("support-agent.workflow"):
        run_plain_loop(client_factory())


def produce_openinference(client_factory: Any, provider: Any, bare: bool = False) -> None:
    from openinference.instrumentation import OITracer, TraceConfig
    from openinference.instrumentation.anthropic import AnthropicInstrumentor

    if bare:  # LLM spans only: no agent span, no session, no TOOL spans
        _set_global_provider(provider)
        AnthropicInstrumentor().instrument()
        run_plain_loop(client_factory())
        return
    AnthropicInstrumentor().instrument(tracer_provider=provider)
    tracer = OITracer(provider.get_tracer("support-app"), config=TraceConfig())

    def on_tool(name: str, arguments: dict[str, Any], call_id: str) -> tuple[str, bool]:
        with tracer.start_as_current_span(name, openinference_span_kind="tool") as span:
            span.set_tool(name=name, description=TOOLS[name].__doc__, parameters=arguments)
            span.set_input(json.dumps(arguments), mime_type="application/json")
            try:
                result = TOOLS[name](**arguments)
            except ToolFailed as exc:
                from opentelemetry.trace import Status, StatusCode
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                return f"Error: {exc}", True
            span.set_output(result)
            return result, False

    with tracer.start_as_current_span("support-agent", openinference_span_kind="agent") as span:
        from openinference.instrumentation import using_session
        with using_session(SESSION_ID):
            span.set_input("What happened to order A-1?")
            answer = run_plain_loop(client_factory(), on_tool=on_tool)
            span.set_output(answer)


def produce_pydantic_ai(api_url: str, provider: Any, bare: bool = False) -> None:
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.capabilities import Instrumentation
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from pydantic_ai.providers.anthropic import AnthropicProvider

    model = AnthropicModel(MODEL, provider=AnthropicProvider(api_key="test-key", base_url=api_url))
    # pydantic-ai 2.x turns instrumentation on as a capability (1.x took instrument=True).
    if bare:  # the global provider, which the anthropic SDK's own spans also go to
        _set_global_provider(provider)
    settings = InstrumentationSettings(tracer_provider=None if bare else provider, include_content=True)
    agent = Agent(model, name="support-agent", retries=10, capabilities=[Instrumentation(settings=settings)])

    def as_tool(function: Any) -> Any:
        @functools.wraps(function)  # the tool's own signature and docstring, which pydantic-ai reads
        def wrapped(**arguments: Any) -> str:
            try:
                return function(**arguments)
            except ToolFailed as exc:  # pydantic-ai's way to hand a tool error back to the model
                raise ModelRetry(f"Error: {exc}") from None
        return wrapped

    for function in TOOLS.values():
        agent.tool_plain(as_tool(function))
    agent.run_sync("What happened to order A-1? Refund it if needed.")


def produce_genai_anthropic(client_factory: Any, provider: Any, bare: bool = False) -> None:
    from opentelemetry.instrumentation.genai.anthropic import AnthropicInstrumentor

    if bare:
        _set_global_provider(provider)
        AnthropicInstrumentor().instrument()
        run_plain_loop(client_factory())
        return
    AnthropicInstrumentor().instrument(tracer_provider=provider)
    with provider.get_tracer("support-app").start_as_current_span("support-agent.workflow"):
        run_plain_loop(client_factory())


def produce_anthropic_sdk(client_factory: Any, provider: Any, bare: bool = False) -> None:
    # The SDK takes the global provider (or open_telemetry={"tracer_provider": ...}); no instrumentation is installed.
    _set_global_provider(provider)
    if bare:
        run_plain_loop(client_factory())
        return
    with provider.get_tracer("support-app").start_as_current_span("support-agent.workflow"):
        run_plain_loop(client_factory())


def produce_langfuse(client_factory: Any, service: str, exporters: list[Any], bare: bool = False) -> None:
    from langfuse import Langfuse, observe
    from openinference.instrumentation.anthropic import AnthropicInstrumentor

    # The setup Langfuse documents: its client makes the tracer provider (and sets it globally, so the instrumentation
    # and the anthropic SDK's own spans use it too); its own processor (its span filter, its transforming exporter)
    # sends what it would send to a Langfuse server, here to the file / OTLP endpoint. The loopback base URL keeps
    # anything else it tries on this machine.
    global _LANGFUSE
    if _LANGFUSE is None:  # one client per process, as an app has (a second scenario reuses it)
        os.environ["OTEL_SERVICE_NAME"] = service
        _LANGFUSE = Langfuse(public_key="pk-lf-test", secret_key="sk-lf-test", base_url="http://127.0.0.1:9",
                             span_exporter=_FanOutExporter(exporters), flush_at=1)
        AnthropicInstrumentor().instrument()
    try:
        if bare:
            run_plain_loop(client_factory())
            return

        @observe(name="support-agent")
        def support_agent() -> str:
            return run_plain_loop(client_factory())

        support_agent()
    finally:
        _LANGFUSE.flush()  # its batch processor: every span exported before the file is switched or the process ends


_LANGFUSE: Any = None


class _SwitchableFileExporter:
    """The OTLP/JSON file exporter, pointed at another file for the next scenario of the same process."""

    def __init__(self, path: str) -> None:
        from looptrace.instrumentation.tracefile import OTLPJsonFileExporter

        self._make = OTLPJsonFileExporter
        self.current = OTLPJsonFileExporter(path)

    def switch(self, path: str) -> None:
        self.current.shutdown()
        self.current = self._make(path)

    def export(self, spans: Any) -> Any:
        return self.current.export(spans)

    def shutdown(self) -> None:
        self.current.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return getattr(self.current, "force_flush", lambda _timeout: True)(timeout_millis)


class _FanOutExporter:
    """One span exporter that hands every batch to several (Langfuse takes a single ``span_exporter``)."""

    def __init__(self, exporters: list[Any]) -> None:
        self.exporters = exporters

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        results = [exporter.export(spans) for exporter in self.exporters]
        ok = all(result == SpanExportResult.SUCCESS for result in results)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        for exporter in self.exporters:
            exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(getattr(exporter, "force_flush", lambda _timeout: True)(timeout_millis)
                   for exporter in self.exporters)


def _set_global_provider(provider: Any) -> None:
    from opentelemetry import trace

    trace.set_tracer_provider(provider)


def main(argv: list[str] | None = None) -> int:
    global SCENARIO
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producer", choices=PRODUCERS, required=True)
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--file", help="write spans to this OTLP/JSON lines file")
    parser.add_argument("--otlp", help="send spans to this OTLP/HTTP traces URL (the SDK's protobuf exporter)")
    parser.add_argument("--grpc", help="send spans to this OTLP/gRPC endpoint (host:port)")
    parser.add_argument("--header", action="append", default=[], help="NAME=VALUE sent with every OTLP export")
    parser.add_argument("--service", default="support-app")
    parser.add_argument("--bare", action="store_true",
                        help="no parent span, no session id, no tool spans, the global tracer provider")
    parser.add_argument("--then", action="append", default=[], metavar="SCENARIO=FILE",
                        help="then run SCENARIO in the same process, its spans to FILE (with --file only): the "
                             "instrumentation set up once, as in an app; saves a process start")
    args = parser.parse_args(argv)
    if args.bare and args.producer not in BARE_PRODUCERS:
        parser.error(f"--bare is for {', '.join(BARE_PRODUCERS)} only")
    runs = [(args.scenario, args.file)]
    for then in args.then:
        scenario, _, path = then.partition("=")
        if scenario not in SCENARIOS or not path or not args.file:
            parser.error(f"--then {then!r}: SCENARIO=FILE with a scenario of {', '.join(SCENARIOS)}, after --file")
        runs.append((scenario, path))

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tests.fakes.messages_api import FakeMessagesAPI

    provider = TracerProvider(resource=Resource.create({"service.name": args.service}))
    headers = dict(h.split("=", 1) for h in args.header)
    exporters: list[Any] = []
    file_exporter = _SwitchableFileExporter(args.file) if args.file else None
    if file_exporter is not None:
        exporters.append(file_exporter)
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporters.append(OTLPSpanExporter(endpoint=args.otlp, headers=headers))
    if args.grpc:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        exporters.append(GrpcExporter(endpoint=args.grpc, insecure=True, headers=tuple(headers.items())))
    if args.producer != "langfuse":  # Langfuse brings its own span processor and takes the exporters itself
        for exporter in exporters:
            provider.add_span_processor(SimpleSpanProcessor(exporter))

    os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    for index, (scenario, path) in enumerate(runs):
        SCENARIO = scenario
        if index and file_exporter is not None:
            file_exporter.switch(path)
        run_scenario(args.producer, scenario, provider, exporters, args.service, args.bare, FakeMessagesAPI)
    if _LANGFUSE is not None:
        _LANGFUSE.shutdown()
    provider.shutdown()
    return 0


def run_scenario(producer: str, scenario: str, provider: Any, exporters: list[Any], service: str, bare: bool,
                 fake_api: Any) -> None:
    """One conversation of the scenario under the producer, against a fake Messages API of its own."""
    import anthropic

    with fake_api(model_script(scenario)) as api:
        def client_factory() -> anthropic.Anthropic:
            return anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
        if producer in ("semconv", "semconv-chat"):
            produce_semconv(client_factory(), provider, with_tool_spans=producer == "semconv")
        elif producer == "openllmetry":
            produce_openllmetry(client_factory, provider, bare=bare)
        elif producer == "openinference":
            produce_openinference(client_factory, provider, bare=bare)
        elif producer == "genai-anthropic":
            produce_genai_anthropic(client_factory, provider, bare=bare)
        elif producer == "anthropic-sdk":
            produce_anthropic_sdk(client_factory, provider, bare=bare)
        elif producer == "langfuse":
            produce_langfuse(client_factory, service, exporters, bare=bare)
        else:
            produce_pydantic_ai(api.url, provider, bare=bare)


if __name__ == "__main__":
    raise SystemExit(main())
