"""One variant of benchmark 10, in a process of its own: ``python -m benchmarks.peer_worker VARIANT``.

Every variant runs the same conversation through the real ``anthropic`` SDK against the benchmark's fake Messages API:
3 model calls, 2 tool calls, then ``end_turn``. Instrumentations patch the SDK for the whole process, and some peers
cannot even be installed side by side, so each variant gets its own process (the peers their own venvs); the parent
(``b10_peers``) tells the workers in turn to take one sample, rotating the order.

Only the standard library and ``anthropic`` are imported at module level: the peers' venvs do not have looptrace, and
each variant imports what it needs when it is set up.

Protocol, one line each way (JSON): the worker sets up, runs a warm-up, and prints ``{"ready": ..., "versions": ...}``.
Then, for each line on stdin: ``{"sample": N}`` runs N conversations, makes the variant export everything it recorded
(flush), and answers ``{"cpu_s": ..., "wall_s": ...}`` — process CPU time, all threads (the export thread included);
``{"count": true}`` runs one conversation and answers what it recorded where the worker can see it itself
(``{"spans": ..., "attributes": ...}`` or nulls when the spans went over the network: the parent asks the sink).
End of stdin shuts the variant down.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anthropic

#: What the conversation sends; the parent passes the same values to every worker (BENCH_PEERS_CONFIG).
CONFIG: dict[str, Any] = json.loads(os.environ.get("BENCH_PEERS_CONFIG", "{}"))
API_URL = os.environ.get("BENCH_PEERS_API_URL", "")
SINK_URL = os.environ.get("BENCH_PEERS_SINK_URL", "")
API_KEY = os.environ.get("BENCH_PEERS_API_KEY", "bench-key")

ModelCall = Callable[..., Any]
ToolCall = Callable[[str, dict[str, Any]], str]


def lookup(item: str, step: int) -> str:
    """The conversation's tool: a no-op."""
    return "ok"


def make_client() -> anthropic.Anthropic:
    # The SDK's own spans are off in every variant (looptrace switches them off itself), so each variant records
    # only what its instrumentation records.
    return anthropic.Anthropic(base_url=API_URL, api_key=API_KEY, max_retries=0, open_telemetry=False)


def conversation(call_model: ModelCall, call_tool: ToolCall) -> int:
    """The bare loop (the seed article's): call, run the tools asked for, send the results back, until end_turn.

    Returns the number of model calls. ``call_model`` and ``call_tool`` are the seams a peer that decorates
    functions (Langfuse's ``@observe``) wraps; the other variants pass the plain ones.
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": CONFIG["task"]}]
    for calls in range(1, 50):
        response = call_model(model=CONFIG["model"], max_tokens=CONFIG["max_tokens"], system=CONFIG["system"],
                              tools=CONFIG["tools"], messages=messages)
        messages.append({"role": "assistant", "content": response.content})
        if response.stop_reason != "tool_use":
            assert response.stop_reason == "end_turn", response.stop_reason
            return calls
        results = [{"type": "tool_result", "tool_use_id": block.id, "content": call_tool(block.name, block.input)}
                   for block in response.content if block.type == "tool_use"]
        messages.append({"role": "user", "content": results})
    raise AssertionError("the conversation did not end")


def plain_tool(name: str, arguments: dict[str, Any]) -> str:
    return lookup(**arguments)


class Variant:
    """A way of running the conversation: ``run_once`` does one, ``flush`` exports what was recorded."""

    packages: tuple[str, ...] = ()  # distributions whose versions the table reports

    def run_once(self) -> None:
        client = self.client
        calls = conversation(client.messages.create, plain_tool)
        assert calls == CONFIG["calls"], calls

    def flush(self) -> None:
        pass

    def count(self) -> dict[str, int | None]:
        """Spans and attributes of one conversation, when this process can see them (else the sink counts)."""
        return {"spans": None, "attributes": None}

    def shutdown(self) -> None:
        pass


def _otlp_exporter():
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"{SINK_URL}/v1/traces")


def _otlp_provider():
    """A TracerProvider exporting over OTLP/HTTP (protobuf) to the sink, batched: what a peer's user sets up."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
    return provider


class Bare(Variant):
    def __init__(self) -> None:
        self.client = make_client()


class ProviderVariant(Variant):
    """A variant whose spans go through a TracerProvider it holds: flush is the provider's force_flush."""

    provider: Any

    def flush(self) -> None:
        assert self.provider.force_flush(), "force_flush timed out"

    def shutdown(self) -> None:
        self.provider.shutdown()


class Instrumentor(ProviderVariant):
    """An OpenTelemetry instrumentor of the anthropic SDK, exporting over OTLP to the sink."""

    def __init__(self, module: str, packages: tuple[str, ...]) -> None:
        self.packages = packages
        self.provider = _otlp_provider()
        instrumentor = importlib.import_module(module).AnthropicInstrumentor
        instrumentor().instrument(tracer_provider=self.provider)
        self.client = make_client()


def openllmetry() -> Variant:
    os.environ.setdefault("TRACELOOP_TRACE_CONTENT", "true")  # its default, stated
    return Instrumentor("opentelemetry.instrumentation.anthropic", ("opentelemetry-instrumentation-anthropic",))


def otel_genai() -> Variant:
    # Content on the span, as looptrace records it (the default is no content).
    os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    return Instrumentor("opentelemetry.instrumentation.genai.anthropic",
                        ("opentelemetry-instrumentation-genai-anthropic", "opentelemetry-util-genai"))


def openinference() -> Variant:
    return Instrumentor("openinference.instrumentation.anthropic", ("openinference-instrumentation-anthropic",))


class LangfuseObserve(Variant):
    """Langfuse's SDK: ``@observe`` on the conversation, each model call (a generation) and each tool call."""

    packages = ("langfuse",)

    def __init__(self) -> None:
        from langfuse import Langfuse, observe

        # Its own TracerProvider and OTLP exporter, pointed at the sink as if it were a Langfuse server.
        self.langfuse = Langfuse(public_key="pk-lf-bench", secret_key="sk-lf-bench", base_url=SINK_URL)
        client = make_client()
        call_model = observe(name="anthropic.messages.create", as_type="generation")(client.messages.create)
        call_tool = observe(name="tool", as_type="tool")(plain_tool)

        @observe(name="conversation")
        def observed() -> int:
            return conversation(call_model, call_tool)

        self._observed = observed

    def run_once(self) -> None:
        assert self._observed() == CONFIG["calls"]

    def flush(self) -> None:
        self.langfuse.flush()

    def shutdown(self) -> None:
        self.langfuse.shutdown()


class Logfire(Variant):
    """Pydantic Logfire: ``instrument_anthropic()``; nothing sent to Logfire, no console, spans to the sink."""

    packages = ("logfire",)

    def __init__(self) -> None:
        import logfire
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.logfire = logfire
        logfire.configure(send_to_logfire=False, console=False, service_name="bench",
                          additional_span_processors=[BatchSpanProcessor(_otlp_exporter())])
        logfire.instrument_anthropic()
        self.client = make_client()

    def flush(self) -> None:
        self.logfire.force_flush()

    def shutdown(self) -> None:
        self.logfire.shutdown()


def looptrace_agent(provider, *, tool_timeout_s: float | None = None, **options: Any):
    """looptrace's Agent for the conversation: the tool the bare loop describes, the same client settings.

    No per-tool time limit by default: the bare loop and the floors run the tool on the loop's thread with none, and
    so does an Agent given none. With one (``tool_timeout_s``, 60 s unless set) each call goes to a tool thread the
    run can leave behind, which the benchmark's reference rows price."""
    from benchmarks import scenario  # the tool whose definition the parent put in CONFIG["tools"]
    from looptrace.runtime import Agent, Limits

    assert [scenario.lookup.definition()] == CONFIG["tools"]
    return Agent(CONFIG["model"], tools=[scenario.lookup], system=CONFIG["system"], name="bench",
                 limits=Limits(max_turns=50, tool_timeout_s=tool_timeout_s), max_tokens=CONFIG["max_tokens"],
                 client=make_client(), tracer_provider=provider, **options)


class Looptrace(ProviderVariant):
    """looptrace's Agent through the same client. File export: the Agent as it comes, given no provider, writing
    the default trace file (the environment names its path), as a library user gets it. OTLP export: the exporters
    as ``configure`` sets them up (traces only)."""

    packages = ("looptrace",)

    def __init__(self, exporter: str, tool_timeout_s: float | None = None) -> None:
        from looptrace import configure

        self._tmp = tempfile.TemporaryDirectory(prefix="looptrace-bench10-")
        self.trace_file = os.path.join(self._tmp.name, "traces.jsonl")
        self.exporter = exporter
        if exporter == "file":
            os.environ["LOOPTRACE_TRACE_FILE"] = self.trace_file
            os.environ["LOOPTRACE_UNDELIVERED_FILE"] = os.path.join(self._tmp.name, "undelivered.jsonl")
            self.telemetry = self.provider = None
            self.agent = looptrace_agent(None, tool_timeout_s=tool_timeout_s)
            return
        if exporter == "otlp":
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = SINK_URL
            os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
        self.telemetry = configure(exporters=exporter, trace_file=self.trace_file, set_global=False,
                                   undelivered_file=os.path.join(self._tmp.name, "undelivered.jsonl"))
        self.provider = self.telemetry.tracer_provider
        # Traces only, like the file row (whose own pipeline records no metrics) and the floors: the no-op meter
        # provider is how an Agent is told to record no metrics. Given none, it would record them through the global
        # API's (a no-op proxy here), some 15 µs a turn of metric attributes that no floor makes.
        from opentelemetry.metrics import NoOpMeterProvider

        self.agent = looptrace_agent(self.provider, tool_timeout_s=tool_timeout_s, meter_provider=NoOpMeterProvider())

    def run_once(self) -> None:
        result = self.agent.run(CONFIG["task"])
        assert result.status.value == "done" and result.turns == CONFIG["calls"], (result.status, result.error)

    def flush(self) -> None:
        if self.provider is not None:  # the default file path writes each span as it ends: nothing to flush
            super().flush()

    def count(self) -> dict[str, int | None]:
        if self.exporter != "file":
            return super().count()
        return _count_file(self.trace_file, lambda: (self.run_once(), self.flush()))

    def shutdown(self) -> None:
        if self.telemetry is not None:
            self.telemetry.shutdown()
        self._tmp.cleanup()


def _count_file(path: str, produce: Callable[[], Any]) -> dict[str, int | None]:
    """Spans and span attributes that ``produce`` appended to an OTLP/JSON lines file."""
    before = os.path.getsize(path) if os.path.exists(path) else 0
    produce()
    spans = attributes = 0
    with open(path, "rb") as handle:
        handle.seek(before)
        for line in handle:
            for resource_spans in json.loads(line).get("resourceSpans", ()):
                for scope_spans in resource_spans.get("scopeSpans", ()):
                    for span in scope_spans.get("spans", ()):
                        spans += 1
                        attributes += len(span.get("attributes", ()))
    return {"spans": spans, "attributes": attributes}


class LooptraceOff(Variant):
    """looptrace's Agent with telemetry and the detector off: the runtime's own cost (validation, limits, the answer
    read as JSON rather than the SDK's models), which the file and OTLP rows include and the raw rows do not."""

    packages = ("looptrace",)

    def __init__(self) -> None:
        self.agent = looptrace_agent(None, telemetry=False, detector=False)

    def run_once(self) -> None:
        result = self.agent.run(CONFIG["task"])
        assert result.status.value == "done" and result.turns == CONFIG["calls"], (result.status, result.error)


class RawSDK(ProviderVariant):
    """The bare loop, plus the spans a real looptrace run made of this conversation (recorded once at start-up:
    names, kinds, parents, every attribute, content included, events, statuses, in order), made again straight
    through the OpenTelemetry SDK: no instrumentation logic, only the SDK's object layer and the exporter.

    Each span is made where a loop instrumented by hand would make it (``replay.Replayer``): the run's and the turn's
    as the conversation reaches them, a chat span around each request, a tool span around each tool call. ``burst``
    replays them all after the conversation instead, in one warm run of the SDK's code (a reference, not a floor: no
    instrumentation can make its spans after the calls they time)."""

    packages = ("opentelemetry-sdk",)

    def __init__(self, exporter: str, *, burst: bool = False) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.recording = self._record()
        self.exporter_name = exporter
        self.burst = burst
        self.null = _NullExporter()
        self.provider = TracerProvider(resource=self._looptrace_resource())
        self.provider.add_span_processor(BatchSpanProcessor(self.null if exporter == "null" else _otlp_exporter()))
        self.tracer = self.provider.get_tracer("looptrace")
        self.client = make_client()

    @staticmethod
    def _record():
        """Spans of one real looptrace run of the conversation (file export's settings: content captured)."""
        from benchmarks.replay import record

        recording, result = record(lambda provider: looptrace_agent(provider).run(CONFIG["task"]))
        assert result.turns == CONFIG["calls"], (result.status, result.error)
        return recording

    @staticmethod
    def _looptrace_resource():
        """The resource looptrace's configure() gives its provider, so both rows send the same bytes per batch."""
        from looptrace import configure

        with tempfile.TemporaryDirectory() as tmp:
            telemetry = configure(exporters="file", trace_file=os.path.join(tmp, "t.jsonl"), set_global=False)
            resource = telemetry.tracer_provider.resource
            telemetry.shutdown()
        return resource

    def run_once(self) -> None:
        from benchmarks.replay import Replayer, replay

        if self.burst:
            super().run_once()
            replay(self.tracer, self.recording)
            return
        replayer = Replayer(self.tracer, self.recording)
        create = self.client.messages.create

        def call_model(**request: Any) -> Any:
            replayer.until("start", "chat")
            response = create(**request)
            replayer.until("end", "chat")
            return response

        def call_tool(name: str, arguments: dict[str, Any]) -> str:
            replayer.until("start", "execute_tool")
            result = plain_tool(name, arguments)
            replayer.until("end", "execute_tool")
            return result

        calls = conversation(call_model, call_tool)
        assert calls == CONFIG["calls"], calls
        replayer.rest()

    def count(self) -> dict[str, int | None]:
        if self.exporter_name != "null":
            return super().count()
        spans, attributes = self.null.spans, self.null.attributes
        self.run_once()
        self.flush()
        return {"spans": self.null.spans - spans, "attributes": self.null.attributes - attributes}


class _NullExporter:
    """Takes every batch and drops it (counting spans and attributes: a few additions per batch)."""

    def __init__(self) -> None:
        self.spans = self.attributes = 0

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans += len(spans)
        self.attributes += sum(len(span.attributes or ()) for span in spans)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        pass


VARIANTS: dict[str, Callable[[], Variant]] = {
    "bare": Bare,
    "looptrace-file": lambda: Looptrace("file"),
    "looptrace-otlp": lambda: Looptrace("otlp"),
    "looptrace-off": LooptraceOff,
    "raw-null": lambda: RawSDK("null"),
    "raw-otlp": lambda: RawSDK("otlp"),
    "openllmetry": openllmetry,
    "otel-genai": otel_genai,
    "openinference": openinference,
    "langfuse": LangfuseObserve,
    "logfire": Logfire,
}


def versions(variant: Variant) -> dict[str, str]:
    found = {}
    for name in ("anthropic", "opentelemetry-sdk", *variant.packages):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "?"
    return found


def sample(variant: Variant, conversations: int) -> dict[str, float]:
    gc.collect()  # the previous sample's garbage is not collected on this one's clock
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(conversations):
        variant.run_once()
    variant.flush()
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}


def main() -> None:
    variant = VARIANTS[sys.argv[1]]()
    for _ in range(int(os.environ.get("BENCH_PEERS_WARMUP", "3"))):
        variant.run_once()
    variant.flush()
    print(json.dumps({"ready": True, "versions": versions(variant)}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if "sample" in command:
            answer: dict[str, Any] = sample(variant, int(command["sample"]))
        elif "count" in command:
            answer = variant.count()
            if answer["spans"] is None:  # the parent counts at the sink instead: produce the spans all the same
                variant.run_once()
                variant.flush()
        else:
            answer = {"error": f"unknown command {command!r}"}
        print(json.dumps(answer), flush=True)
    variant.shutdown()


if __name__ == "__main__":
    main()
