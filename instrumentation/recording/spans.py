"""The spans of one run: invoke_agent at the root, a span per turn, and under each turn its chat and execute_tool spans.

Only the OpenTelemetry API is used. Spans are started with an explicit parent rather than by attaching contexts, since
the loop's generator hops between frames; code that runs *inside* a model or tool call (an httpx instrumentation, a
tool's own spans) sees the right parent through `activate()`. When the tracer does not record (no SDK configured, or
telemetry switched off), every method returns before building a single attribute.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import Token
from typing import Any, ParamSpec, Protocol, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics as metrics_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, Status, StatusCode

from ..detector import Anomaly, LoopCost, UnresolvedToolError
from ..logs import telemetry_failed
from ..settings import Settings
from . import semconv as sc
from .content import (
    CaptureMode,
    MessageLog,
    cap,
    genai_message,
    genai_tool_definition,
    resolve_capture,
    to_json,
)
from .instrumented_model import CurrentTurn, InstrumentedModel, ModelLike, current_turn_var
from .labels import RunLabels, checked, run_labels
from .loop_cost import anomaly_cost_attributes, loop_total_attributes
from .metrics import LoopMetrics
from .providers import DefaultProviders, RunProviders, providers_for_run
from .sinks import Action, AlertContext, AnomalySink, TraceLinks
from .tool_call import ToolCallView
from .usage import CostOf, Usage

CONTENT_EVENT = sc.CONTENT_EVENT

P = ParamSpec("P")
R = TypeVar("R")


def _never_raises(where: str, fallback: Callable[..., R]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Telemetry never raises into the run it describes: a span method that fails (a value no encoder takes, an
    exporter's bug) is counted and said once (``logs.telemetry_failed``), and ``fallback`` (called with the same
    arguments) keeps the trace whole around it: the span still ends, a child still gets a place to hang from.

    The methods every turn calls (``start_turn``, ``start_tool`` and the turn's, chat's and tool's ``end``) hold the
    same guard written out in place, a ``try`` around their body: it costs nothing until it catches, where this
    wrapper costs a call frame and the packing of the arguments on every call."""
    def decorate(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                telemetry_failed(where, exc)
                return fallback(*args, **kwargs)
        return guarded
    return decorate


def _end_span(owner: _HasSpan, *args: object, **kwargs: object) -> None:
    """The fallback of an ``end``: the span ends as it is, without what could not be recorded."""
    try:
        if owner.span.is_recording():
            owner.span.end()
    except Exception as exc:  # the span cannot even end (its processor fails): it is lost, and counted
        telemetry_failed("span end", exc)


def _nothing(owner: object, *args: object, **kwargs: object) -> None:
    return None


class _HasSpan(Protocol):
    span: Span


class Tracing:
    """Span factory for an agent (``interface.AgentTelemetry`` with OpenTelemetry). Cheap to create; holds no per-run
    state. Which providers a run records on is decided per run (``providers.providers_for_run``: the Agent's, the
    global one, else ``default_providers``, a pipeline of the Agent's own built on first use); where its anomaly
    reports go (``sinks``) and its link in a backend's UI (``trace_links``) are what it was built with.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        capture_content: bool | str | CaptureMode | None = None,
        max_attribute_chars: int | None = None,
        meter_provider: metrics_api.MeterProvider | None = None,
        sinks: AnomalySink | None = None,
        trace_links: TraceLinks | None = None,
        default_providers: DefaultProviders | None = None,
    ) -> None:
        self.settings = settings
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._default_providers = default_providers
        self._resolved: RunProviders | None = None  # the providers of the latest run ...
        self._tracer: trace.Tracer = trace.NoOpTracer()  # ... and their tracer and instruments, kept for the next
        self.metrics: LoopMetrics | None = None
        self.sinks = sinks
        self.trace_links = trace_links
        self.captures_content = settings.capture_content if capture_content is None else bool(capture_content)
        self.capture = resolve_capture(settings.capture_setting if capture_content is None else capture_content)
        self.capture_content = self.capture.on_spans  # content attributes on spans
        self.capture_events = self.capture.in_events  # content on each chat span's content event
        self.max_chars = max_attribute_chars or settings.max_attribute_chars
        # (system prompt, tool definitions list, their attributes): see _run_content.
        self._kept_run_content: tuple[str | None, list[dict[str, Any]], dict[str, str]] | None = None

    @property
    def tracer(self) -> trace.Tracer:
        """The tracer of the current run's provider."""
        return self._tracer

    @property
    def providers(self) -> RunProviders:
        """The tracer and meter providers the current run records through: for instrumentation that is not ours but
        must record where the run does (the mcp package's client spans, see ``mcp_tracing``)."""
        if self._resolved is None:
            self._select_providers()
        assert self._resolved is not None
        return self._resolved

    def instrument(self, model: ModelLike, *, cost_of: CostOf | None = None, judge: bool = False) -> InstrumentedModel:
        """``model`` with a chat span per call, opened under the turn current while it runs."""
        return InstrumentedModel(model, cost_of=cost_of, judge=judge)

    def _select_providers(self) -> None:
        providers = providers_for_run(self._tracer_provider, self._meter_provider, self._default_providers)
        if providers != self._resolved:
            self._resolved = providers
            self._tracer = trace.get_tracer(sc.SCOPE_NAME, sc.SCOPE_VERSION, tracer_provider=providers[0])
            # An explicit no-op meter provider (the own pipeline's when no reader would see its metrics) gets no
            # instruments at all: the loop then skips building the metrics' attributes too.
            wanted = not isinstance(providers[1], metrics_api.NoOpMeterProvider)
            self.metrics = LoopMetrics(providers[1]) if wanted else None

    def flush(self, timeout_ms: int = 5_000) -> None:
        """Push out what the tracer provider buffers, if it buffers (the API's no-op provider has nothing to flush).

        Best effort: called on the way out of an interrupted run, where a failing exporter must not mask the interrupt.
        """
        provider = self._resolved[0] if self._resolved else trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            try:
                flush(timeout_ms)
            except Exception:
                pass

    def trace_url(self, trace_id: str) -> str | None:
        """The trace's link in a backend's UI (Langfuse's) when the telemetry's settings send runs there."""
        return self.trace_links.url(trace_id) if self.trace_links is not None else None

    def start_run(
        self,
        *,
        agent: str,
        model: str,
        task: str | list[dict[str, Any]],
        system: str | None,
        tool_definitions: list[dict[str, Any]],
        session_id: str | None = None,
        user_id: str | None = None,
        tags: Iterable[str] = (),
        metadata: Mapping[str, Any] | None = None,
        resumes: tuple[str, str] | None = None,
    ) -> RunSpan:
        """``task`` is the user's request, or the whole message history a run continues. ``resumes``: the (trace id,
        root span id) of the paused run this one resumes; the root span links to it."""
        # Checked even when nothing records: an empty session id should fail in tests, not in production.
        checked("trace name", agent)
        labels = run_labels(session_id=session_id, user_id=user_id, tags=tags, metadata=metadata)
        return self._open_run(agent, model, task, system, tool_definitions, labels, resumes)

    def _untraced_run(self, agent: str, *args: object) -> RunSpan:
        return RunSpan(self, trace.INVALID_SPAN, agent, {}, MessageLog())

    @_never_raises("invoke_agent span", _untraced_run)
    def _open_run(self, agent: str, model: str, task: str | list[dict[str, Any]], system: str | None,
                  tool_definitions: list[dict[str, Any]], labels: RunLabels,
                  resumes: tuple[str, str] | None = None) -> RunSpan:
        self._select_providers()
        # On every span of the run: the agent and the session (gen_ai.conversation.id, which Langfuse and Phoenix
        # both read as the session). The other labels go on the root alone (run_label_attributes): a backend that
        # wants them on every span gets them there from its mapping, at export.
        common = {sc.GEN_AI_AGENT_NAME: agent}
        if labels.session_id is not None:
            common[sc.GEN_AI_CONVERSATION_ID] = labels.session_id
        attributes: dict[str, Any] = {sc.GEN_AI_OPERATION_NAME: sc.OPERATION_INVOKE_AGENT,
                                      sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_ANTHROPIC, sc.GEN_AI_REQUEST_MODEL: model,
                                      **common, **run_label_attributes(labels)}
        messages = MessageLog()
        if self.capture_content:
            # The same encoding, and the same size cap (the newest messages that fit), as each model call's input:
            # the first call's input is then this very text, and the trace file records it once (tracefile.history).
            history = [{"role": "user", "content": task}] if isinstance(task, str) else task
            encoded, omitted = messages.input_messages_json(history, self.max_chars)
            attributes[sc.GEN_AI_INPUT_MESSAGES] = encoded
            if omitted:
                attributes[sc.INPUT_MESSAGES_OMITTED] = omitted
        run_content: dict[str, str] = {}
        if self.capture_content or self.capture_events:
            run_content = self._run_content(system, tool_definitions)
        if self.capture_content:
            attributes.update(run_content)  # once per run: the conventions allow them on the agent span
        links = _resumed_run_link(resumes)
        if links and resumes is not None:
            attributes[sc.RUN_RESUMES_TRACE_ID] = resumes[0]
        span = self._tracer.start_span(sc.agent_span_name(agent), kind=SpanKind.INTERNAL, attributes=attributes,
                                       links=links)
        return RunSpan(self, span, agent, common, messages, run_content)

    def _run_content(self, system: str | None, tool_definitions: list[dict[str, Any]]) -> dict[str, str]:
        """The system instructions and tool definitions of a run: on its root span, and on each model call's content
        event when content goes to events. The system prompt is capped inside its JSON, so the attribute always
        parses (a mapping at export rebuilds the prompt from it).

        Encoded once for all the runs that send the same ones: an Agent passes the same system prompt and the same
        list of definitions run after run (a run with MCP servers makes a list of its own, encoded afresh)."""
        kept = self._kept_run_content
        if kept is not None and kept[0] == system and kept[1] is tool_definitions:
            return kept[2]
        content: dict[str, str] = {}
        if system:
            content[sc.GEN_AI_SYSTEM_INSTRUCTIONS] = to_json([{"type": "text", "content": cap(system, self.max_chars)}])
        if tool_definitions:
            content[sc.GEN_AI_TOOL_DEFINITIONS] = cap(to_json([genai_tool_definition(d) for d in tool_definitions]),
                                                      self.max_chars)
        self._kept_run_content = (system, tool_definitions, content)
        return content


def run_label_attributes(labels: RunLabels) -> dict[str, Any]:
    """A run's user, tags and metadata as its root span carries them (the session is on every span)."""
    attributes: dict[str, Any] = {}
    if labels.user_id is not None:
        attributes[sc.USER_ID] = labels.user_id
    if labels.tags:
        attributes[sc.RUN_TAGS] = labels.tags
    for key, text in labels.metadata:
        attributes[sc.RUN_METADATA_PREFIX + key] = text
    return attributes


def _resumed_run_link(resumes: tuple[str, str] | None) -> list[trace.Link]:
    """A link from a resumed run's root to the root of the paused run it continues (another trace)."""
    if resumes is None:
        return []
    try:
        context = trace.SpanContext(trace_id=int(resumes[0], 16), span_id=int(resumes[1], 16), is_remote=True,
                                    trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    except (TypeError, ValueError):
        return []
    return [trace.Link(context, {sc.RUN_RESUMES_TRACE_ID: resumes[0]})] if context.is_valid else []


class RunSpan:
    """The root span of a run and the factory of its turns."""

    __slots__ = ("agent", "content", "context", "finish_reason", "messages", "recording", "span",
                 "span_attributes", "tracing")

    def __init__(self, tracing: Tracing, span: Span, agent: str, common: dict[str, Any], messages: MessageLog,
                 content: dict[str, str] | None = None) -> None:
        self.tracing = tracing
        self.span = span
        self.agent = agent
        self.recording = span.is_recording()
        # The context its turns start in, made once for all of them (a Context is immutable).
        self.context = trace.set_span_in_context(span) if self.recording else None
        self.messages = messages
        self.content = content or {}  # the system instructions and tool definitions, for the content events
        self.finish_reason: str | None = None  # of the newest model response (or "error"), for the root span
        self.span_attributes = common  # what every span of the run starts with: the agent and the session

    @property
    def trace_url(self) -> str | None:
        """The run's trace in Langfuse's UI, when its spans go to Langfuse and the project is known."""
        return self.tracing.trace_url(self.trace_id) if self.recording else None

    @property
    def trace_id(self) -> str:
        return format(self.span.get_span_context().trace_id, "032x")

    @property
    def span_id(self) -> str:
        return format(self.span.get_span_context().span_id, "016x")

    def start_turn(self, index: int) -> TurnSpan:
        try:
            if not self.recording:
                return TurnSpan(self, _NON_RECORDING)
            span = self.tracing.tracer.start_span(
                sc.TURN_SPAN_NAME,
                context=self.context,
                kind=SpanKind.INTERNAL,
                attributes={sc.TURN_INDEX: index, **self.span_attributes},
            )
            return TurnSpan(self, span)
        except Exception as exc:  # never into the run (see _never_raises)
            telemetry_failed("turn span", exc)
            return TurnSpan(self, _NON_RECORDING)

    @_never_raises("invoke_agent span", _end_span)
    def end(self, *, status: str, turns: int, usage: Usage, cost_usd: float | None, anomalies: int,
            final_text: str | None, error: str | None = None, error_type: str | None = None,
            unresolved_errors: Sequence[UnresolvedToolError] = (), session_id: str | None = None,
            loop_cost: LoopCost | None = None, session_loop_cost: LoopCost | None = None,
            loop_cost_by_type: Mapping[str, LoopCost] | None = None) -> None:
        metrics = self.tracing.metrics
        if metrics is not None:
            metrics.record_run(agent=self.agent, status=status, turns=turns)
            for anomaly_type, cost in (loop_cost_by_type or {}).items():
                if cost.usd is not None:
                    metrics.record_loop_cost(agent=self.agent, type=anomaly_type, usd=cost.usd)
        self._scored(loop_cost_by_type or {})
        if not self.recording:
            return
        attributes: dict[str, Any] = {
            sc.RUN_STATUS: status,
            sc.RUN_TURNS: turns,
            sc.RUN_USAGE_INPUT_TOKENS: usage.input_tokens,
            sc.RUN_USAGE_OUTPUT_TOKENS: usage.output_tokens,
            sc.RUN_USAGE_CACHE_READ_TOKENS: usage.cache_read_input_tokens,
            sc.RUN_USAGE_CACHE_CREATION_TOKENS: usage.cache_creation_input_tokens,
            sc.RUN_USAGE_TOTAL_TOKENS: usage.total_tokens,
            sc.RUN_ANOMALY_COUNT: anomalies,
            **unresolved_attributes(unresolved_errors),
            **loop_total_attributes(loop_cost, session_loop_cost),
        }
        if cost_usd is not None:
            attributes[sc.RUN_COST_USD] = cost_usd
        if session_id is not None and sc.GEN_AI_CONVERSATION_ID not in self.span_attributes:
            # A paused run joins the session its resumption continues in (Langfuse shows both traces together).
            attributes[sc.GEN_AI_CONVERSATION_ID] = checked("session_id", session_id)
        if self.finish_reason is not None:
            attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (self.finish_reason,)  # of the response the run ended on
        if final_text and self.tracing.capture_content:
            # Capped inside its JSON, so that the attribute always parses: a mapping at export reads the answer back.
            attributes[sc.GEN_AI_OUTPUT_MESSAGES] = to_json([{"role": "assistant", "parts": [
                {"type": "text", "content": cap(final_text, self.tracing.max_chars)}]}])
        self._record_unresolved(unresolved_errors)
        if error is not None:
            attributes[sc.RUN_ERROR] = cap(error, self.tracing.max_chars)
            attributes[sc.ERROR_TYPE] = error_type or "error"
            self.span.set_status(Status(StatusCode.ERROR, cap(error, 1024)))
        self.span.set_attributes(attributes)
        self.span.end()

    @_never_raises("run scores", _nothing)
    def _scored(self, loop_cost_by_type: Mapping[str, LoopCost]) -> None:
        if self.tracing.sinks is not None:
            self.tracing.sinks.run_ended(self.trace_id, self.span_id, loop_cost_by_type)

    def _record_unresolved(self, errors: Sequence[UnresolvedToolError]) -> None:
        """An event per tool error left unresolved (the most recent), for a reader of the stored run (`traces show`):
        tool, call id, turn and failures always; its target and error text (redacted as on the tool span) only with
        content capture."""
        content = self.tracing.capture_content
        for e in errors[-MAX_UNRESOLVED_EVENTS:]:
            event: dict[str, Any] = {sc.GEN_AI_TOOL_NAME: e.tool, sc.UNRESOLVED_TURN: e.turn,
                                     sc.UNRESOLVED_FAILURES: e.failures}
            if e.call_id:
                event[sc.GEN_AI_TOOL_CALL_ID] = e.call_id
            if e.reported:
                event[sc.UNRESOLVED_REPORTED] = e.reported
            if content and e.target:
                event[sc.UNRESOLVED_TARGET] = cap(e.target, 1024)
            if content and e.error:
                event[sc.UNRESOLVED_ERROR] = cap(e.error, 1024)
            self.span.add_event(sc.UNRESOLVED_TOOL_ERROR_EVENT, event)


MAX_UNRESOLVED_EVENTS = 20  # root-span events for the most recent; the count attribute says how many there were


def unresolved_attributes(errors: Sequence[UnresolvedToolError]) -> dict[str, Any]:
    """The root span's record of the tool errors a run left standing: their count and their tools. Tool names only:
    a target or an error text is content, and the execute_tool spans already hold it, as capture allows."""
    attributes: dict[str, Any] = {sc.RUN_UNRESOLVED_TOOL_ERRORS: len(errors)}
    if errors:
        attributes[sc.RUN_UNRESOLVED_TOOLS] = tuple(dict.fromkeys(e.tool for e in errors))
    return attributes


class TurnSpan:
    __slots__ = ("context", "recording", "run", "span")

    def __init__(self, run: RunSpan, span: Span) -> None:
        self.run = run
        self.span = span
        self.recording = span.is_recording()
        # The context its chat, tool and judge spans start in, made once for all of them.
        self.context = trace.set_span_in_context(span) if self.recording else None

    def activate(self) -> contextlib.AbstractContextManager[None]:
        """This turn current while its model call (or a judge's check) runs: the instrumented model opens the chat
        span under it. Only the turn is made current, not its span: the chat and judge spans name it as their parent
        explicitly, so the OpenTelemetry context is attached once per call (by the chat span), as before the seam."""
        return _TurnCurrent(self)

    def report(self, anomaly: Anomaly, action: Action, tool_spans: Sequence[object]) -> None:
        """The one report of an anomaly: an event on this turn and on each offending call, the metric, and the run's
        sinks (log line, webhook, Langfuse score). A sink that fails is the sink's business, never the run's."""
        if not anomaly.is_update:  # a streak nudged, then stopped, is one anomaly
            self._count(anomaly)
        if self.recording:
            self._record_anomaly(anomaly, action, tool_spans)
        self._send(anomaly, action)

    @_never_raises("anomaly metric", _nothing)
    def _count(self, anomaly: Anomaly) -> None:
        metrics = self.run.tracing.metrics
        if metrics is not None:
            metrics.record_anomaly(agent=self.run.agent, type=anomaly.type, tool=anomaly.tool)

    @_never_raises("anomaly alert", _nothing)
    def _send(self, anomaly: Anomaly, action: Action) -> None:
        sinks = self.run.tracing.sinks
        if sinks is None:
            return
        sinks.send(anomaly, AlertContext(agent=self.run.agent, trace_id=self.run.trace_id, span_id=self.run.span_id,
                                         action=action))

    @_never_raises("anomaly event", _nothing)
    def _record_anomaly(self, anomaly: Anomaly, action: Action, tool_spans: Sequence[object]) -> None:
        event: dict[str, Any] = {
            # The conventions' evaluation verdict, with looptrace's own attributes beside it.
            sc.GEN_AI_EVALUATION_NAME: sc.ANOMALY_EVALUATION_NAME,
            sc.GEN_AI_EVALUATION_SCORE_LABEL: anomaly.type,
            sc.GEN_AI_EVALUATION_EXPLANATION: anomaly.message,
            sc.ANOMALY_TYPE: anomaly.type,
            sc.ANOMALY_MESSAGE: anomaly.message,
            sc.ANOMALY_COUNT: anomaly.count,
            sc.ANOMALY_STREAK: anomaly.streak,
            sc.ANOMALY_ACTION: action,
        }
        if anomaly.tool:
            event[sc.ANOMALY_TOOL] = anomaly.tool
        if anomaly.arguments is not None and self.run.tracing.capture_content:
            event[sc.ANOMALY_ARGUMENTS] = cap(anomaly.arguments, 1024)
        event.update(anomaly_cost_attributes(anomaly.cost))
        # The event is the record of the anomaly on the turn and on each call in it; a backend that marks such spans
        # (Langfuse's level WARNING) reads it from there, at export.
        self.span.add_event(sc.ANOMALY_EVENT, event)
        for tool_span in tool_spans:
            if isinstance(tool_span, ToolSpan):
                tool_span.flag(event)

    @_never_raises("nudge attribute", _nothing)
    def nudged(self, text: str) -> None:
        if self.recording:
            self.span.set_attribute(sc.NUDGE_TEXT, text)

    def start_chat(self, params: Mapping[str, Any], *, server_address: str | None, server_port: int | None,
                   stream: bool, judge: bool = False) -> ChatSpan | JudgeSpan:
        """The span of one model call of this turn (see instrumented_model); ``judge`` for the detector's judge."""
        model = params.get("model", "")
        if judge:
            return JudgeSpan.start(self, model)
        if not self.recording:
            return ChatSpan(self.run, _NON_RECORDING, model, server_address, server_port)
        attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT,
            sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_ANTHROPIC,
            sc.GEN_AI_REQUEST_MODEL: model,
            sc.GEN_AI_REQUEST_MAX_TOKENS: params.get("max_tokens", 0),
            **self.run.span_attributes,
        }
        if stream:
            attributes[sc.GEN_AI_REQUEST_STREAM] = True
        for key, attribute in _REQUEST_PARAMETERS:
            if params.get(key) is not None:
                attributes[attribute] = params[key]
        if params.get("stop_sequences"):
            attributes[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = tuple(params["stop_sequences"])
        if server_address:
            attributes[sc.SERVER_ADDRESS] = server_address
            if server_port:
                attributes[sc.SERVER_PORT] = server_port
        tracing = self.run.tracing
        history = None
        if tracing.capture_content or tracing.capture_events:
            history, omitted = self.run.messages.input_messages_json(params.get("messages", []), tracing.max_chars)
            if omitted:
                attributes[sc.INPUT_MESSAGES_OMITTED] = omitted
        if tracing.capture_content and history is not None:
            # The system instructions and tool definitions the call was sent are the run's, on its root span.
            attributes[sc.GEN_AI_INPUT_MESSAGES] = history
        span = tracing.tracer.start_span(
            sc.chat_span_name(model), context=self.context, kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        return ChatSpan(self.run, span, model, server_address, server_port,
                        history if tracing.capture_events else None)

    def start_tool(self, view: ToolCallView, *, description: str | None) -> ToolSpan:
        """The span of one tool call, written from the view the loop made of it (its arguments redacted)."""
        try:
            if not self.recording:
                return ToolSpan(self.run, _NON_RECORDING, view)
            attributes = {
                sc.GEN_AI_OPERATION_NAME: sc.OPERATION_EXECUTE_TOOL,
                sc.GEN_AI_TOOL_NAME: view.name,
                sc.GEN_AI_TOOL_CALL_ID: view.call_id,
                sc.GEN_AI_TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
                **self.run.span_attributes,
            }
            if description:
                attributes[sc.GEN_AI_TOOL_DESCRIPTION] = description
            tracing = self.run.tracing
            if tracing.capture_content:
                attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = cap(to_json(view.arguments), tracing.max_chars)
            else:
                attributes[sc.TOOL_ARGUMENTS_DIGEST] = view.arguments_digest
            span = tracing.tracer.start_span(
                sc.tool_span_name(view.name), context=self.context, kind=SpanKind.INTERNAL,
                attributes=attributes,
            )
            return ToolSpan(self.run, span, view)
        except Exception as exc:  # never into the run (see _never_raises)
            telemetry_failed("execute_tool span", exc)
            return ToolSpan(self.run, _NON_RECORDING, view)

    def end(self, *, stop_reason: str | None) -> None:
        try:
            if not self.recording:
                return
            attributes: dict[str, Any] = {}
            if stop_reason is not None:
                attributes[sc.STOP_REASON] = stop_reason
            if attributes:
                self.span.set_attributes(attributes)
            self.span.end()
        except Exception as exc:  # never into the run (see _never_raises)
            telemetry_failed("turn span", exc)
            _end_span(self)

_REQUEST_PARAMETERS = (("temperature", sc.GEN_AI_REQUEST_TEMPERATURE), ("top_p", sc.GEN_AI_REQUEST_TOP_P),
                       ("top_k", sc.GEN_AI_REQUEST_TOP_K))


class ChatSpan:
    __slots__ = ("history", "model", "run", "server_address", "server_port", "span", "started")

    def __init__(self, run: RunSpan, span: Span, model: str, server_address: str | None,
                 server_port: int | None = None, history: str | None = None) -> None:
        self.run = run
        self.span = span
        self.model = model
        self.server_address = server_address
        self.server_port = server_port
        self.started = time.perf_counter()
        self.history = history  # the input messages, kept for the content event when content goes to events

    def activate(self) -> contextlib.AbstractContextManager[None]:
        return _activate(self.span)

    def learned_server(self, address: str | None, port: int | None) -> None:
        """Where the call went, learned only once it was made (a client built by the call itself, on the run's
        clock): set now, as it would have been at the start."""
        if self.server_address is not None or not address:
            return
        self.server_address, self.server_port = address, port
        if self.span.is_recording():
            self.span.set_attributes({sc.SERVER_ADDRESS: address, **({sc.SERVER_PORT: port} if port else {})})

    def first_chunk(self, seconds: float) -> None:
        """A streaming call's first chunk arrived ``seconds`` after the request was sent."""
        if self.span.is_recording():
            self.span.set_attribute(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, seconds)

    def end(self, response: Mapping[str, Any], usage: Usage, *, cost_usd: float | None) -> None:
        try:
            # The conventions' Anthropic rule: input_tokens is all input, so cache reads and writes are added back.
            input_tokens = usage.all_input_tokens
            metrics = self.run.tracing.metrics
            if metrics is not None:
                metrics.record_chat(agent=self.run.agent, request_model=self.model,
                                    response_model=response.get("model"), input_tokens=input_tokens,
                                    output_tokens=usage.output_tokens, duration_s=time.perf_counter() - self.started,
                                    cost_usd=cost_usd, server_address=self.server_address,
                                    server_port=self.server_port)
            stop_reason = response.get("stop_reason")
            finish = sc.finish_reason(stop_reason)
            self.run.finish_reason = finish
            if not self.span.is_recording():
                return
            attributes = {
                sc.GEN_AI_RESPONSE_ID: response.get("id") or "",
                sc.GEN_AI_RESPONSE_MODEL: response.get("model") or "",
                sc.GEN_AI_RESPONSE_FINISH_REASONS: (finish,),
                sc.STOP_REASON: stop_reason or "",
                sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
                sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
                sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: usage.cache_read_input_tokens,
                sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: usage.cache_creation_input_tokens,
            }
            if cost_usd is not None:
                attributes[sc.CHAT_COST_USD] = cost_usd
            one_hour = Usage.one_hour_cache_writes(response)
            if one_hour:  # priced higher than the 5-minute writes: Langfuse's usage (its mapping) and replay read it
                attributes[sc.CHAT_CACHE_WRITES_1H] = one_hour
            tracing = self.run.tracing
            if tracing.capture_content or tracing.capture_events:
                # Encoded once: the same message opens the next call's input history, as the loop appends it unchanged.
                encoded = to_json(genai_message({"role": "assistant", "content": response.get("content")},
                                                self.run.messages.secrets))
                self.run.messages.remember(encoded)
                # No finish_reason inside the message: the conventions deprecate it there in favour of
                # gen_ai.response.finish_reasons, which this span carries.
                output = cap(f"[{encoded}]", tracing.max_chars)
                if tracing.capture_content:
                    attributes[sc.GEN_AI_OUTPUT_MESSAGES] = output
                if tracing.capture_events:
                    event = {sc.GEN_AI_INPUT_MESSAGES: self.history} if self.history else {}
                    self.span.add_event(CONTENT_EVENT, {**event, sc.GEN_AI_OUTPUT_MESSAGES: output, **self.run.content})
            self.span.set_attributes(attributes)
            self.span.end()
        except Exception as exc:  # never into the run (see _never_raises)
            telemetry_failed("chat span", exc)
            _end_span(self)

    @_never_raises("chat span", _end_span)
    def fail(self, exc: BaseException) -> None:
        metrics = self.run.tracing.metrics
        if metrics is not None:
            metrics.record_chat(agent=self.run.agent, request_model=self.model, response_model=None, input_tokens=0,
                                output_tokens=0, duration_s=time.perf_counter() - self.started,
                                error_type=type(exc).__qualname__, server_address=self.server_address,
                                server_port=self.server_port)
        self.run.finish_reason = "error"
        if not self.span.is_recording():
            return
        _record_error(self.span, exc)
        self.span.end()


class JudgeSpan:
    """The span of one call of the detector's judge: a chat span of its own kind, marked ``looptrace.judge``, with
    its tokens and cost (``looptrace.judge.cost_usd``), which are never the run's (no generation cost, no metric)."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    @classmethod
    def start(cls, turn: TurnSpan, model: str) -> JudgeSpan:
        try:
            return cls._start(turn, model)
        except Exception as exc:  # never into the run (see _never_raises): the judge's call goes on, untraced
            telemetry_failed("judge span", exc)
            return cls(_NON_RECORDING)

    @classmethod
    def _start(cls, turn: TurnSpan, model: str) -> JudgeSpan:
        if not turn.recording:
            return cls(_NON_RECORDING)
        attributes = {sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT, sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_ANTHROPIC,
                      sc.GEN_AI_REQUEST_MODEL: model, sc.JUDGE: True, **turn.run.span_attributes}
        return cls(turn.run.tracing.tracer.start_span(sc.chat_span_name(model), context=turn.context,
                                                      kind=SpanKind.CLIENT, attributes=attributes))

    def activate(self) -> contextlib.AbstractContextManager[None]:
        return _activate(self.span)

    def first_chunk(self, seconds: float) -> None:
        pass

    def learned_server(self, address: str | None, port: int | None) -> None:
        pass  # the judge's span names no server (it is not the agent's model call)

    @_never_raises("judge span", _end_span)
    def end(self, response: Mapping[str, Any], usage: Usage, *, cost_usd: float | None) -> None:
        if not self.span.is_recording():
            return
        attributes: dict[str, Any] = {sc.GEN_AI_RESPONSE_ID: response.get("id") or "",
                                      sc.GEN_AI_USAGE_INPUT_TOKENS: usage.all_input_tokens,
                                      sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens}
        if cost_usd is not None:
            attributes[sc.JUDGE_COST_USD] = cost_usd
        self.span.set_attributes(attributes)
        self.span.end()

    @_never_raises("judge span", _end_span)
    def fail(self, exc: BaseException) -> None:
        if self.span.is_recording():
            _record_error(self.span, exc)
            self.span.end()


class ToolSpan:
    __slots__ = ("run", "span", "view")

    def __init__(self, run: RunSpan, span: Span, view: ToolCallView) -> None:
        self.run = run
        self.span = span
        self.view = view  # the loop's one view of the call: redacted arguments, then the settled result

    def activate(self) -> contextlib.AbstractContextManager[None]:
        return _activate(self.span)

    def approval(self, *, decision: str, by: str | None = None, reason: str | None = None,
                 wait_s: float | None = None) -> None:
        """The approval decision of this call (pending, approved, rejected): attributes, and the approval metrics."""
        try:
            metrics = self.run.tracing.metrics
            if metrics is not None:
                metrics.record_approval(agent=self.run.agent, tool=self.view.name, decision=decision, by=by,
                                        wait_s=wait_s)
            if not self.span.is_recording():
                return
            attributes: dict[str, Any] = {sc.TOOL_APPROVAL: decision}
            if by is not None:
                attributes[sc.TOOL_APPROVAL_BY] = by
            if wait_s is not None:
                attributes[sc.TOOL_APPROVAL_WAIT_S] = wait_s
            if reason and self.run.tracing.capture_content:  # a person's words may quote anything: content
                attributes[sc.TOOL_APPROVAL_REASON] = cap(self.view.scrub(reason), 1024)
            self.span.set_attributes(attributes)
        except Exception as exc:  # never into the run (see _never_raises)
            telemetry_failed("execute_tool span", exc)

    def flag(self, anomaly_event: Mapping[str, Any]) -> None:
        """Mark this call as part of an anomaly: the anomaly's event on its span too."""
        if self.span.is_recording():
            self.span.add_event(sc.ANOMALY_EVENT, anomaly_event)

    def end(self) -> None:
        try:
            view = self.view
            metrics = self.run.tracing.metrics
            if metrics is not None:
                metrics.record_tool(agent=self.run.agent, tool=view.name, outcome=view.outcome,
                                    duration_s=view.duration_s)
            if not self.span.is_recording():
                return
            result = view.result if view.result is not None else ""  # scrubbed: the model alone got the secret
            attributes: dict[str, Any] = {
                sc.TOOL_RESULT_DIGEST: view.result_digest or "",
                sc.TOOL_IS_ERROR: view.is_error,
                sc.TOOL_OUTCOME: view.outcome,
                sc.TOOL_RESULT_CHARS: view.result_chars,
            }
            tracing = self.run.tracing
            if tracing.capture_content:
                attributes[sc.GEN_AI_TOOL_CALL_RESULT] = cap(result, tracing.max_chars)
            if view.is_error:
                # Without content capture the error's text stays off the span too: it can quote the arguments. The
                # error is the status message (Langfuse shows it, with level ERROR, from the span status alone); an
                # anomaly the call is part of stays beside it, as the span's evaluation event.
                said = cap(result, 1024) if tracing.capture_content else view.error_type or view.outcome
                attributes[sc.ERROR_TYPE] = view.error_type or view.outcome
                self.span.set_status(Status(StatusCode.ERROR, said))
            self.span.set_attributes(attributes)
            self.span.end()
        except Exception as exc:  # never into the run (see _never_raises)
            telemetry_failed("execute_tool span", exc)
            _end_span(self)


def _record_error(span: Span, exc: BaseException) -> None:
    span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:1024]))
    span.record_exception(exc)


class _activate:
    """Makes ``span`` current while a model or tool call runs, so spans made inside it nest under it.

    A plain class rather than trace.use_span: the loop enters one per call, and use_span's generator machinery and
    exception handling (which we do not want here: failures are recorded by the caller) cost more than the attach.
    """

    __slots__ = ("span", "token")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.token: Token[Context] | None = None  # of the attach

    def __enter__(self) -> None:
        if self.span.is_recording():
            self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def __exit__(self, *exc_info: object) -> None:
        if self.token is not None:
            otel_context.detach(self.token)


class _TurnCurrent:
    """Makes ``turn`` the current turn (``instrumented_model.current_turn_var``) while its model call runs: a context
    variable set, no OpenTelemetry attach."""

    __slots__ = ("token", "turn")

    def __init__(self, turn: TurnSpan) -> None:
        self.turn = turn
        self.token: Token[CurrentTurn | None] | None = None

    def __enter__(self) -> None:
        self.token = current_turn_var.set(self.turn)

    def __exit__(self, *exc_info: object) -> None:
        if self.token is not None:
            current_turn_var.reset(self.token)


_NON_RECORDING = NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
