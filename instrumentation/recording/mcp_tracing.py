"""The MCP requests a run makes, recorded as the MCP semantic conventions describe them, where the run records.

looptrace makes its own CLIENT span around each request it sends to an MCP server (``initialize``, ``tools/list``,
``tools/call``), on the run's providers, named ``{mcp.method.name} {target}`` with ``mcp.method.name``,
``jsonrpc.request.id``, ``mcp.session.id``, ``mcp.protocol.version``, ``network.transport``, ``server.address`` and
``server.port``, ``gen_ai.tool.name``, ``error.type`` and ``rpc.response.status_code``; the request's duration goes to
the ``mcp.client.operation.duration`` histogram and a session's to ``mcp.client.session.duration``. The span is
current while the request is sent, so the W3C trace context the ``mcp`` package injects into the request's
``params._meta`` names it (or the package's own span under it) as the server's parent.

The ``mcp`` package opens a span of its own for every request it sends, on the *global* tracer provider, and offers no
public way to send it elsewhere: that span is left to whatever the application made global (nothing, by default).
Nothing here reaches into the package.

Redaction holds on everything recorded here: a span carries no arguments and no result (the ``execute_tool`` span
above it has them, redacted, when content capture is on), and a server's JSON-RPC error message, which may quote the
arguments, becomes the status description only with content capture on and only scrubbed of what the call's
redaction hid (``MCPRequest.scrub``). ``gen_ai.operation.name`` is deliberately not set on ``tools/call``: the run's
``execute_tool`` span already is the tool call, and readers that count ``execute_tool`` operations (looptrace's own
offline detector among them) would count every MCP call twice.

Connecting (``initialize`` and the first ``tools/list``) happens before a run's trace begins, so it is recorded in a
trace of its own, under a root span ``mcp connect {server}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.semconv._incubating.attributes import (
    gen_ai_attributes,
    jsonrpc_attributes,
    mcp_attributes,
    rpc_attributes,
)
from opentelemetry.semconv._incubating.metrics import mcp_metrics
from opentelemetry.semconv.attributes import error_attributes, network_attributes, server_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..logs import telemetry_failed
from . import semconv as sc
from .content import redact_with_secrets, scrub

MCP_SESSION_ID = mcp_attributes.MCP_SESSION_ID
MCP_PROTOCOL_VERSION = mcp_attributes.MCP_PROTOCOL_VERSION
MCP_METHOD_NAME = mcp_attributes.MCP_METHOD_NAME
JSONRPC_REQUEST_ID = jsonrpc_attributes.JSONRPC_REQUEST_ID
RPC_RESPONSE_STATUS_CODE = rpc_attributes.RPC_RESPONSE_STATUS_CODE
NETWORK_TRANSPORT = network_attributes.NETWORK_TRANSPORT
TRANSPORT_PIPE = network_attributes.NetworkTransportValues.PIPE.value  # stdio
TRANSPORT_TCP = network_attributes.NetworkTransportValues.TCP.value  # streamable HTTP
SERVER_ADDRESS = server_attributes.SERVER_ADDRESS
SERVER_PORT = server_attributes.SERVER_PORT
GEN_AI_TOOL_NAME = gen_ai_attributes.GEN_AI_TOOL_NAME
ERROR_TYPE = error_attributes.ERROR_TYPE
METRIC_CLIENT_OPERATION_DURATION = mcp_metrics.MCP_CLIENT_OPERATION_DURATION
METRIC_CLIENT_SESSION_DURATION = mcp_metrics.MCP_CLIENT_SESSION_DURATION
TOOL_ERROR = "tool_error"  # error.type of a tools/call answered with isError, as the conventions say
# The conventions' advice for MCP operation durations, in seconds.
DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
SESSION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400)
# What the duration metrics are broken down by (a session id or request id would make every point its own series).
_METRIC_KEYS = (MCP_METHOD_NAME, ERROR_TYPE, GEN_AI_TOOL_NAME, NETWORK_TRANSPORT, MCP_PROTOCOL_VERSION,
                RPC_RESPONSE_STATUS_CODE, SERVER_ADDRESS, SERVER_PORT)
SCOPE_NAME = sc.MCP_SCOPE_NAME


@dataclasses.dataclass(frozen=True, slots=True)
class _Instruments:
    tracer: trace.Tracer | None
    operation: metrics.Histogram | None
    session: metrics.Histogram | None
    capture_content: bool


class MCPRequest:
    """One request sent to an MCP server: its span (when telemetry records) and what it may say of the answer."""

    __slots__ = ("_arguments", "_secrets", "attributes", "failure", "span")

    def __init__(self, span: trace.Span | None, attributes: dict[str, Any], arguments: object) -> None:
        self.span = span
        self.attributes = attributes  # also the duration metric's, once the request ends
        self.failure: str | None = None
        self._arguments = arguments
        self._secrets: tuple[str, ...] | None = None

    def scrub(self, text: str) -> str:
        """``text`` (a server's error, a log line about the call) without the values the call's redaction hides,
        wherever it quotes them."""
        if self._secrets is None:
            self._secrets = redact_with_secrets(self._arguments)[1] if self._arguments else ()
        return scrub(text, self._secrets) if self._secrets else text

    def sent(self, request_id: object) -> None:
        """The JSON-RPC id the request went out with."""
        if request_id is None:
            return
        self.attributes[JSONRPC_REQUEST_ID] = str(request_id)
        if self.span is not None:
            self.span.set_attribute(JSONRPC_REQUEST_ID, str(request_id))

    def answered_error(self, code: int, message: str, *, capture_content: bool) -> None:
        """The server answered with a JSON-RPC error: ``error.type`` and the status code are the code; the message
        is the status description only with content capture on, and scrubbed."""
        text = str(code)
        self.attributes[RPC_RESPONSE_STATUS_CODE] = text
        self.failed(text, self.scrub(message)[:1024] if capture_content else text)

    def failed(self, error_type: str, description: str | None = None) -> None:
        """The request ended without a result (a timeout, a closed connection, an unreadable answer) or, for
        ``tool_error``, with the tool's own error."""
        self.failure = error_type
        self.attributes[ERROR_TYPE] = error_type
        if self.span is not None:
            status_code = self.attributes.get(RPC_RESPONSE_STATUS_CODE)
            self.span.set_attributes({ERROR_TYPE: error_type} if status_code is None else
                                     {ERROR_TYPE: error_type, RPC_RESPONSE_STATUS_CODE: status_code})
            self.span.set_status(Status(StatusCode.ERROR, description or error_type))


class MCPServerTelemetry:
    """Where one MCP server's requests are recorded: built per server, from the Agent's telemetry (or none)."""

    def __init__(self, telemetry: object, *, server: str, transport: str, server_address: str | None = None,
                 server_port: int | None = None) -> None:
        # The Agent's telemetry, whatever implements it: its run's providers are used when it has them (``Tracing``).
        self._telemetry = telemetry
        self.server = server
        self.facts: dict[str, Any] = {NETWORK_TRANSPORT: transport}
        if server_address is not None:
            self.facts[SERVER_ADDRESS] = server_address
        if server_port is not None:
            self.facts[SERVER_PORT] = server_port

    def session(self, *, session_id: str | None, protocol_version: str | None) -> None:
        """What the server's session said of itself: on every later span and metric point."""
        for key, value in ((MCP_SESSION_ID, session_id), (MCP_PROTOCOL_VERSION, protocol_version)):
            if value is None:
                self.facts.pop(key, None)
            else:
                self.facts[key] = value

    @contextlib.contextmanager
    def connecting(self) -> Iterator[MCPRequest]:
        """The root span of a connection's own trace (``mcp connect {server}``), current while it lasts: the
        ``initialize`` and ``tools/list`` spans nest under it. Yields a handle whose ``failed`` marks it failed."""
        instruments = self._instruments()
        span = None
        if instruments.tracer is not None:
            span = _started(instruments.tracer, f"mcp connect {self.server}", SpanKind.INTERNAL, dict(self.facts),
                            otel_context.Context())  # a trace of its own, whatever is current
        handle = MCPRequest(span, {}, None)

        def ended() -> None:
            if span is not None:
                _ended(span, {**self.facts, **({ERROR_TYPE: handle.failure} if handle.failure else {})})

        with _in_span(span, handle, ended):
            yield handle

    @contextlib.contextmanager
    def request(self, method: str, *, tool: str | None = None, arguments: object = None) -> Iterator[MCPRequest]:
        """One request's CLIENT span, current while it is sent and answered, and its duration on the metric."""
        instruments = self._instruments()
        attributes: dict[str, Any] = {MCP_METHOD_NAME: method, **self.facts}
        if tool is not None:
            attributes[GEN_AI_TOOL_NAME] = tool
        span = None
        if instruments.tracer is not None:
            span = _started(instruments.tracer, method if tool is None else f"{method} {tool}", SpanKind.CLIENT,
                            attributes, None)
        handle = MCPRequest(span, attributes, arguments)
        started = time.perf_counter()

        def ended() -> None:
            if span is not None:
                _ended(span, None)
            _record(instruments.operation, time.perf_counter() - started, handle.attributes)

        with _in_span(span, handle, ended):
            yield handle

    def session_ended(self, seconds: float, error_type: str | None = None) -> None:
        """A session closed after ``seconds``: ``error_type`` when it was lost rather than closed."""
        attributes = dict(self.facts)
        if error_type is not None:
            attributes[ERROR_TYPE] = error_type
        _record(self._instruments().session, seconds, attributes)

    @property
    def capture_content(self) -> bool:
        return self._instruments().capture_content

    def _instruments(self) -> _Instruments:
        """The instruments of the providers the Agent's runs record through now (chosen per run by the telemetry);
        none at all without telemetry or when it is switched off."""
        try:
            providers = getattr(self._telemetry, "providers", None)
            if providers is None or not getattr(self._telemetry, "enabled", True):
                return _NOTHING
            return _instruments_of(*providers, capture_content=bool(getattr(self._telemetry, "capture_content",
                                                                            False)))
        except Exception as exc:  # telemetry never becomes the call's error: it goes on unrecorded
            telemetry_failed("mcp span", exc)
            return _NOTHING


_NOTHING = _Instruments(None, None, None, False)


def _started(tracer: trace.Tracer, name: str, kind: SpanKind, attributes: dict[str, Any],
             context: otel_context.Context | None) -> trace.Span | None:
    try:
        return tracer.start_span(name, context, kind, attributes)
    except Exception as exc:
        telemetry_failed("mcp span", exc)
        return None


def _ended(span: trace.Span, attributes: Mapping[str, Any] | None) -> None:
    try:
        if attributes:
            span.set_attributes(attributes)
        span.end()
    except Exception as exc:
        telemetry_failed("mcp span", exc)


@contextlib.contextmanager
def _current(span: trace.Span | None) -> Iterator[None]:
    """``span`` current in this task while the block runs (so the package's span and the injected traceparent follow
    it); nothing without one."""
    if span is None:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def _in_span(span: trace.Span | None, handle: MCPRequest, ended: Callable[[], None]) -> Iterator[None]:
    """The block run with ``span`` current: whatever escapes it marks ``handle`` failed (unless the handle already
    says why), and ``ended`` runs last, still inside the span's context (so a metric point can link to it)."""
    with _current(span):
        try:
            yield
        except BaseException as exc:
            if handle.failure is None:
                handle.failed(_error_type(exc))
            raise
        finally:
            ended()


def _error_type(exc: BaseException) -> str:
    """``error.type`` of an exception: the conventions' ``timeout``, ``cancelled``, else its class (the innermost of
    an exception group: the mcp package's task groups wrap what went wrong)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "cancelled" if type(exc).__name__ == "CancelledError" else type(exc).__qualname__


def _record(histogram: metrics.Histogram | None, seconds: float, attributes: Mapping[str, Any]) -> None:
    if histogram is None:
        return
    try:
        histogram.record(seconds, {key: attributes[key] for key in _METRIC_KEYS if key in attributes})
    except Exception:  # a metric must never cost the call
        pass


_cache: dict[tuple[int, int, bool], tuple[trace.TracerProvider, metrics.MeterProvider | None, _Instruments]] = {}


def _instruments_of(tracer_provider: trace.TracerProvider, meter_provider: metrics.MeterProvider | None, *,
                    capture_content: bool) -> _Instruments:
    key = (id(tracer_provider), id(meter_provider), capture_content)
    cached = _cache.get(key)
    if cached is not None and cached[0] is tracer_provider and cached[1] is meter_provider:
        return cached[2]
    tracer = trace.get_tracer(SCOPE_NAME, tracer_provider=tracer_provider)
    operation = session = None
    if not isinstance(meter_provider, metrics.NoOpMeterProvider):  # None: the global meter provider, as the run's
        meter = metrics.get_meter(SCOPE_NAME, meter_provider=meter_provider)
        operation = meter.create_histogram(
            METRIC_CLIENT_OPERATION_DURATION, unit="s",
            description="The duration of the MCP request as observed on the sender, until the response is received.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        session = meter.create_histogram(
            METRIC_CLIENT_SESSION_DURATION, unit="s", description="The duration of the MCP session as observed on "
            "the MCP client.", explicit_bucket_boundaries_advisory=SESSION_BUCKETS)
    instruments = _Instruments(tracer, operation, session, capture_content)
    _cache[key] = (tracer_provider, meter_provider, instruments)
    return instruments
