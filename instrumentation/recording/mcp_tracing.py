"""The mcp package's own client spans, recorded where the run records, with what the MCP conventions add.

The ``mcp`` package (2.x) opens a CLIENT span per request it sends ("MCP send tools/call {tool}", with
``mcp.method.name`` and ``jsonrpc.request.id``) and injects the W3C trace context into the request's ``params._meta``,
so an instrumented server parents its own spans on it. It takes its tracer once, at import, from the *global* tracer
provider, and offers no parameter to pass another. looptrace leaves the global provider alone on purpose (its
embedded default records through a provider of its own), so left as it is the package would record a tool call's
span nowhere, or in a different backend than the run's, and with a no-op global provider the server would be sent no
traceparent at all.

So this module replaces that one module-level tracer with a routing tracer: inside ``mcp_call_scope`` (which the
runtime opens around each call a run makes) a span is started by the tracer of the run's own provider, as a child of
the current ``execute_tool`` span, with the attributes the conventions ask for and the package does not set
(``mcp.session.id``, ``mcp.protocol.version``, ``network.transport``, ``server.address``/``port``,
``gen_ai.tool.name``); its duration goes to the ``mcp.client.operation.duration`` histogram on the run's meter
provider. Outside a scope every call goes to the package's original tracer unchanged, so an application's own MCP
clients behave exactly as before. The span and the propagation stay the package's: none is written here.

``gen_ai.operation.name`` is deliberately not put on the MCP span: the run's ``execute_tool`` span already is the
tool call, and readers that count ``execute_tool`` operations (looptrace's own offline detector among them) would
count every MCP call twice.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes, mcp_attributes
from opentelemetry.semconv._incubating.metrics import mcp_metrics
from opentelemetry.semconv.attributes import error_attributes, network_attributes, server_attributes
from opentelemetry.util.types import Attributes

from ..logs import log, telemetry_failed

MCP_SESSION_ID = mcp_attributes.MCP_SESSION_ID
MCP_PROTOCOL_VERSION = mcp_attributes.MCP_PROTOCOL_VERSION
MCP_METHOD_NAME = mcp_attributes.MCP_METHOD_NAME
NETWORK_TRANSPORT = network_attributes.NETWORK_TRANSPORT
TRANSPORT_PIPE = network_attributes.NetworkTransportValues.PIPE.value  # stdio
TRANSPORT_TCP = network_attributes.NetworkTransportValues.TCP.value  # streamable HTTP
SERVER_ADDRESS = server_attributes.SERVER_ADDRESS
SERVER_PORT = server_attributes.SERVER_PORT
GEN_AI_TOOL_NAME = gen_ai_attributes.GEN_AI_TOOL_NAME
ERROR_TYPE = error_attributes.ERROR_TYPE
METRIC_CLIENT_OPERATION_DURATION = mcp_metrics.MCP_CLIENT_OPERATION_DURATION
# The conventions' advice for MCP operation durations, in seconds.
DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
# What the duration metric is broken down by (a session id or request id would make every point its own series).
_METRIC_KEYS = (MCP_METHOD_NAME, ERROR_TYPE, GEN_AI_TOOL_NAME, NETWORK_TRANSPORT, MCP_PROTOCOL_VERSION, SERVER_ADDRESS,
                SERVER_PORT)
_SCOPE = "mcp-python-sdk"  # the package's own instrumentation scope, kept on the spans it makes


@dataclass(frozen=True, slots=True)
class _Route:
    tracer: trace.Tracer
    duration: metrics.Histogram | None
    attributes: Mapping[str, Any]


_ROUTE: contextvars.ContextVar[_Route | None] = contextvars.ContextVar("looptrace_mcp_route", default=None)


@contextlib.contextmanager
def mcp_call_scope(telemetry: Any, *, transport: str, session_id: str | None, protocol_version: str | None,
                   tool: str | None = None, server_address: str | None = None,
                   server_port: int | None = None) -> Iterator[None]:
    """The mcp package's requests made inside this block are recorded by the run's providers (``telemetry`` is the
    Agent's), under the current span, with the session's attributes. Without providers (telemetry off) it does
    nothing: the package records as it would anyway."""
    try:
        providers = getattr(telemetry, "providers", None)
        if providers is None or not _install():
            route = None
        else:
            tracer_provider, meter_provider = providers
            attributes: dict[str, Any] = {NETWORK_TRANSPORT: transport}
            for key, value in ((MCP_SESSION_ID, session_id), (MCP_PROTOCOL_VERSION, protocol_version),
                               (GEN_AI_TOOL_NAME, tool), (SERVER_ADDRESS, server_address),
                               (SERVER_PORT, server_port)):
                if value is not None:
                    attributes[key] = value
            route = _Route(_tracer_of(tracer_provider), _duration_of(meter_provider), attributes)
    except Exception as exc:  # telemetry never becomes the tool's error: the call goes on, recorded as mcp would
        telemetry_failed("mcp call scope", exc)
        route = None
    if route is None:
        yield
        return
    token = _ROUTE.set(route)
    try:
        yield
    finally:
        _ROUTE.reset(token)


# --- the routing tracer -------------------------------------------------------------------------------------------


class _RoutingTracer(trace.Tracer):
    """The mcp package's tracer while looptrace is installed: the run's tracer inside a scope, the original outside."""

    def __init__(self, original: trace.Tracer) -> None:
        self.original = original

    def start_span(self, name: str, context: Any = None, kind: trace.SpanKind = trace.SpanKind.INTERNAL,
                   attributes: Attributes = None, links: Any = None, start_time: int | None = None,
                   record_exception: bool = True, set_status_on_exception: bool = True) -> trace.Span:
        route = _ROUTE.get()
        tracer = self.original if route is None else route.tracer
        merged = attributes if route is None else {**route.attributes, **(attributes or {})}
        return tracer.start_span(name, context, kind, merged, links, start_time, record_exception,
                                 set_status_on_exception)

    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]  # the API types its own decorator's context manager
            self, name: str, context: Any = None, kind: trace.SpanKind = trace.SpanKind.INTERNAL,
                              attributes: Attributes = None, links: Any = None, start_time: int | None = None,
                              record_exception: bool = True, set_status_on_exception: bool = True,
                              end_on_exit: bool = True) -> Iterator[trace.Span]:
        route = _ROUTE.get()
        if route is None:
            with self.original.start_as_current_span(name, context, kind, attributes, links, start_time,
                                                     record_exception, set_status_on_exception,
                                                     end_on_exit) as span:
                yield span
            return
        merged = {**route.attributes, **(attributes or {})}
        started = time.perf_counter()
        failure: str | None = None
        opened: trace.Span | None = None
        try:
            with route.tracer.start_as_current_span(name, context, kind, merged, links, start_time, record_exception,
                                                    set_status_on_exception, end_on_exit) as opened:
                yield opened
        except BaseException as exc:
            failure = type(exc).__qualname__
            raise
        finally:
            _record_duration(route, opened, merged, failure, time.perf_counter() - started)


def _record_duration(route: _Route, span: Any, attributes: Mapping[str, Any], failure: str | None,
                     seconds: float) -> None:
    if route.duration is None:
        return
    try:
        ended = dict(getattr(span, "attributes", None) or attributes)  # the SDK span holds error.type once set
        if failure is not None:
            ended.setdefault(ERROR_TYPE, failure)
        route.duration.record(seconds, {key: ended[key] for key in _METRIC_KEYS if key in ended})
    except Exception:  # a metric must never cost the call
        pass


_installed: bool | None = None
_install_lock = threading.Lock()


def _install() -> bool:
    """Put the routing tracer in the mcp package's place, once. False when this mcp has no such seam (a release
    that moved it): its spans then go to the global provider, as they would without looptrace."""
    global _installed
    if _installed is not None:
        return _installed
    with _install_lock:
        if _installed is None:
            module = _mcp_otel_module()
            original = getattr(module, "_tracer", None)
            if isinstance(original, trace.Tracer):
                if not isinstance(original, _RoutingTracer):
                    module._tracer = _RoutingTracer(original)
                _installed = True
            else:
                log.warning("mcp_tracing_unavailable",
                            reason="this mcp release has no module tracer to route; its spans follow the global "
                                   "tracer provider")
                _installed = False
    return _installed


def _mcp_otel_module() -> Any:
    try:
        from mcp.shared import _otel
    except ImportError:
        return None
    return _otel


_tracers: dict[int, tuple[Any, trace.Tracer]] = {}
_durations: dict[int, tuple[Any, metrics.Histogram | None]] = {}


def _tracer_of(provider: Any) -> trace.Tracer:
    cached = _tracers.get(id(provider))
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = trace.get_tracer(_SCOPE, tracer_provider=provider)
    _tracers[id(provider)] = (provider, tracer)
    return tracer


def _duration_of(provider: Any) -> metrics.Histogram | None:
    if isinstance(provider, metrics.NoOpMeterProvider):
        return None
    cached = _durations.get(id(provider))
    if cached is not None and cached[0] is provider:
        return cached[1]
    histogram = metrics.get_meter(_SCOPE, meter_provider=provider).create_histogram(
        METRIC_CLIENT_OPERATION_DURATION, unit="s",
        description="The duration of the MCP request as observed on the sender, until the response is received.",
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
    _durations[id(provider)] = (provider, histogram)
    return histogram
