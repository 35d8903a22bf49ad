"""The direct path: spans of the OpenTelemetry *API*, written to the trace file and handed to the exporters as they end.

When looptrace sets up a provider of its own and its exporters are the trace file and the network ones (OTLP over
HTTP or gRPC, Langfuse), nothing needs what the SDK's span pipeline provides (a span's lock and its
``BoundedAttributes``, a ``ReadableSpan`` copy per span, the multi-processor): a finished span only has to become a
line of the file and a span in the next export batch. The SDK's spans cost more than writing the file (issue 14) and
were most of what the OTLP path paid over its floor (issue 23), so here a span keeps its attributes in a plain dict
and, at ``end()``, hands itself to the same encoder and writer the SDK path uses (``tracefile.encode.encode_line``,
``tracefile.write.TraceFileWriter``) and to each exporting processor's ``on_end``: looptrace's guarded
``BatchSpanProcessor``, whose OTLP exporter sends the span's protobuf, made once from its fields (``otlp_wire``; the
span keeps it in ``wire_message`` for the journal and every other network exporter), so batching, retries, the spill
file and the bounds are the SDK path's.

What the file holds is what the SDK path writes: the same resource (built by the same ``setup._resource``), the SDK's
``InstrumentationScope``, random ids from the same generator, the default sampler's decision (ParentBased(ALWAYS_ON):
a root is sampled, a child follows its parent's sampled flag, the parent's trace state carried over), the default
span limits (128 attributes, events, links, attributes per event and link; the oldest dropped first and counted), and
attribute values as the SDK stores them: the common case (str, bool, int, float, tuples of those) is checked by type
and kept as is; anything else goes through the API's own ``BoundedAttributes`` cleaning, warnings included (lists
become tuples, unsupported objects their ``str``).

The spans are real API spans: ``trace.set_span_in_context`` / ``trace.get_current_span`` and W3C propagation work
with them as with any other. Whatever this path does not reproduce sends the whole run to the SDK instead (see
``direct_path_blockers``): a sampler other than the default, span limits set in the environment, the SDK switched off
or its internal metrics switched on.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import random
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from time import time_ns
from types import MappingProxyType
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .settings import Settings
from .tracefile.write import TraceFileWriter

__all__ = ["DirectTracer", "DirectTracerProvider", "direct_path_blockers"]

_logger = logging.getLogger(__name__)

LIMIT = 128  # the SDK's default for every span limit: attributes, events, links, attributes per event and per link


def direct_path_blockers(settings: Settings) -> list[str]:
    """Why a run cannot take the direct path (the SDK must make its spans); empty when it can. What the environment
    asks of spans that only the SDK does (a sampler, span limits, its internal metrics) is read by Settings."""
    return list(settings.sdk_span_settings)


# --- attributes: the SDK's values at the cost of a type check ---------------------------------------------------------

_PLAIN = frozenset((str, bool, int, float))
_PLAIN_OR_TUPLE = _PLAIN | {tuple}
_TEXT = frozenset((str,))


def _all_clean(attributes: Mapping[Any, Any]) -> bool:
    """Whether every key is non-empty text and every value one the SDK would store unchanged (checked by type)."""
    values = attributes.values()
    kinds = set(map(type, values))
    if not kinds <= _PLAIN:
        if not kinds <= _PLAIN_OR_TUPLE:
            return False
        if not all([set(map(type, value)) <= _PLAIN for value in values if type(value) is tuple]):
            return False
    return set(map(type, attributes)) <= _TEXT and "" not in attributes


def _put_all(into: dict[str, Any], attributes: Mapping[Any, Any], limit: int) -> int:
    """Store ``attributes`` as the SDK's ``BoundedAttributes`` would; returns how many were dropped."""
    if len(into) + len(attributes) <= limit and into.keys().isdisjoint(attributes) and _all_clean(attributes):
        into.update(attributes)  # the usual case: clean values, new keys, room for all
        return 0
    dropped = 0
    for key, value in attributes.items():
        kind = type(value)
        plain = kind in _PLAIN or (kind is tuple and all([type(item) in _PLAIN for item in value]))
        if not plain or type(key) is not str or not key:
            # The SDK's own cleaning for the rare rest: None kept, lists as tuples, odd objects as str, bad keys
            # dropped, each with the SDK's warning.
            cleaned = BoundedAttributes(None, {key: value})
            dropped += 1 - len(cleaned)
            if not cleaned:
                continue
            (key, value), = cleaned.copy().items()
        if key in into:
            del into[key]  # a key set again moves to the end, as in the SDK
        elif len(into) >= limit:
            _logger.warning("Attributes dict is full. Dropping the oldest key-value pair from attributes to make "
                            "space for the new key-value pair.")
            del into[next(iter(into))]
            dropped += 1
        into[key] = value
    return dropped


class _Event:
    """A span event as the encoder reads it (the SDK's Event's fields)."""

    __slots__ = ("attributes", "dropped_attributes", "name", "timestamp")

    def __init__(self, name: str, attributes: Mapping[str, Any] | None, timestamp: int | None) -> None:
        self.name = name
        self.timestamp = time_ns() if timestamp is None else timestamp
        self.attributes: dict[str, Any] = {}
        self.dropped_attributes = _put_all(self.attributes, attributes, LIMIT) if attributes else 0


class _Link:
    __slots__ = ("attributes", "context", "dropped_attributes")

    def __init__(self, context: SpanContext, attributes: Mapping[str, Any] | None) -> None:
        self.context = context
        self.attributes: dict[str, Any] = {}
        self.dropped_attributes = _put_all(self.attributes, attributes, LIMIT) if attributes else 0


def _valid_link(context: Any, attributes: Any) -> bool:
    return bool(context and (context.is_valid or (attributes or context.trace_state)))


def _appended(items: list[Any] | tuple[()], item: Any) -> tuple[list[Any], int]:
    """``items`` with ``item`` added last, as the SDK keeps events and links: a list from the first item on (most
    spans have none), the oldest dropped beyond the limit. Returns the list and how many were dropped (0 or 1)."""
    if not items:
        return [item], 0
    assert isinstance(items, list)
    dropped = 0
    if len(items) >= LIMIT:
        del items[0]
        dropped = 1
    items.append(item)
    return items, dropped


# --- spans ------------------------------------------------------------------------------------------------------------

_UNSET = Status(StatusCode.UNSET)
_END_LOCK = threading.Lock()  # ending is the one step two threads must not both take; setting values is GIL-atomic


class DirectSpan(trace.Span):
    """An API span that records into plain containers and writes itself to the trace file when it ends.

    It has the fields of the SDK's ``ReadableSpan`` that the encoder reads (``context``, ``parent``, ``kind``,
    ``attributes``, ``events``, ``links``, ``status``, ``resource``, ``instrumentation_scope``, times and drop counts).
    """

    __slots__ = ("_attributes", "_ended_hooks", "_record_exception", "_set_status_on_exception", "context",
                 "dropped_attributes", "dropped_events", "dropped_links", "end_time", "events",
                 "instrumentation_scope", "kind", "links", "name", "parent", "resource", "start_time", "status",
                 "wire_message")

    def __init__(self, tracer: DirectTracer, name: str, context: SpanContext, parent: SpanContext | None,
                 kind: SpanKind, attributes: Mapping[str, Any] | None, links: Sequence[Link] | None,
                 start_time: int | None, record_exception: bool, set_status_on_exception: bool) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.resource = tracer.provider.resource
        self.instrumentation_scope = tracer.scope
        self._ended_hooks = tracer.provider.ended_hooks  # the provider's list: what is added later applies too
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception
        self._attributes: dict[str, Any] = {}
        self.dropped_attributes = _put_all(self._attributes, attributes, LIMIT) if attributes else 0
        self.events: list[_Event] | tuple[()] = ()  # a list from the first event on: most spans have none
        self.dropped_events = 0
        self.links: list[_Link] | tuple[()] = ()
        self.dropped_links = 0
        for link in links or ():
            if link and _valid_link(link.context, link.attributes):
                self._append_link(_Link(link.context, link.attributes))
        self.status = _UNSET  # Status objects are not changed, only replaced
        self.end_time: int | None = None
        self.start_time = start_time if start_time is not None else time_ns()
        self.wire_message: bytes | None = None  # its OTLP protobuf, made once when it has ended (otlp_wire)

    def __repr__(self) -> str:
        return f'{type(self).__name__}(name="{self.name}", context={self.context})'

    @property
    def attributes(self) -> Mapping[str, Any]:
        return MappingProxyType(self._attributes)

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def _ended(self, what: str) -> bool:
        if self.end_time is None:
            return False
        _logger.warning("Tried calling %s on an ended span.", what)
        return True

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.end_time is not None:
            _logger.warning("Setting attribute on ended span.")
            return
        self.dropped_attributes += _put_all(self._attributes, attributes, LIMIT)

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is not None:
            _logger.warning("Setting attribute on ended span.")
            return
        if not key or not isinstance(key, str):  # set_attribute drops a key that is not text, set_attributes not
            _logger.warning("invalid key `%s`. must be non-empty string. Dropping key from attributes.", key)
            self.dropped_attributes += 1
            return
        self.dropped_attributes += _put_all(self._attributes, {key: value}, LIMIT)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        event = _Event(name, attributes, timestamp)
        if self._ended("_add_event"):
            return
        self.events, dropped = _appended(self.events, event)
        self.dropped_events += dropped

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if not _valid_link(context, attributes):
            return
        link = _Link(context, attributes)
        if not self._ended("_add_link"):
            self._append_link(link)

    def _append_link(self, link: _Link) -> None:
        self.links, dropped = _appended(self.links, link)
        self.dropped_links += dropped

    def update_name(self, name: str) -> None:
        if not self._ended("update_name"):
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._ended("set_status"):
            return
        # As the SDK: an OK status is final, and UNSET never replaces anything.
        if self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is StatusCode.UNSET:
                return
            if description is not None:
                _logger.warning("Description %s ignored. Use either `Status` or `(StatusCode, Description)`",
                                description)
            self.status = status
        elif isinstance(status, StatusCode) and status is not StatusCode.UNSET:
            self.status = Status(status, description)

    def record_exception(self, exception: BaseException, attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        recorded: dict[str, Any] = {
            "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        with _END_LOCK:
            if self.end_time is not None:
                _logger.warning("Calling end() on an ended span.")
                return
            self.end_time = end_time if end_time is not None else time_ns()
        for ended in self._ended_hooks:
            ended(self)

    def __exit__(self, exc_type: Any, exc_val: BaseException | None, exc_tb: Any) -> None:
        if exc_val is not None and self.is_recording():
            if self._record_exception:
                self.record_exception(exception=exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        super().__exit__(exc_type, exc_val, exc_tb)


# --- the tracer and its provider ------------------------------------------------------------------------------------


def _span_id() -> int:
    span_id = random.getrandbits(64)  # as the SDK's RandomIdGenerator
    while not span_id:
        span_id = random.getrandbits(64)
    return span_id


def _trace_id() -> int:
    trace_id = random.getrandbits(128)
    while not trace_id:
        trace_id = random.getrandbits(128)
    return trace_id


_ROOT_FLAGS = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)  # the SDK's ids are random
_FLAGS = {(True, True): _ROOT_FLAGS, (True, False): TraceFlags(TraceFlags.SAMPLED),
          (False, True): TraceFlags(TraceFlags.RANDOM_TRACE_ID), (False, False): TraceFlags(TraceFlags.DEFAULT)}


class DirectTracer(trace.Tracer):
    """Starts ``DirectSpan``s: the default sampler's decisions and the SDK's ids, without the SDK's pipeline."""

    def __init__(self, provider: DirectTracerProvider, scope: InstrumentationScope) -> None:
        self.provider = provider
        self.scope = scope

    def start_span(self, name: str, context: context_api.Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = (),
                   start_time: int | None = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> trace.Span:
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        if parent is not None and not isinstance(parent, SpanContext):
            raise TypeError("parent_span_context must be a SpanContext or None.")
        if parent is None or not parent.is_valid:
            parent = None
            span_context = SpanContext(_trace_id(), _span_id(), False, _ROOT_FLAGS)
        else:
            # ParentBased(ALWAYS_ON): a child is sampled exactly when its parent is; the parent's state carries over.
            flags = parent.trace_flags
            sampled = flags.sampled
            span_context = SpanContext(parent.trace_id, _span_id(), False,
                                       _FLAGS[sampled, flags.random_trace_id], parent.trace_state)
            if not sampled:
                return trace.NonRecordingSpan(span_context)
        span = DirectSpan(self, name, span_context, parent, kind, attributes, links, start_time, record_exception,
                          set_status_on_exception)
        if self.provider._starting:  # an application's processor (add_span_processor) sees the start as in the SDK
            self.provider._started(span, context)
        return span

    # The API types the result as its own private context-manager class; this one behaves as that one does.
    def start_as_current_span(  # type: ignore[override]
            self, name: str, context: context_api.Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
            attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = (),
            start_time: int | None = None, record_exception: bool = True, set_status_on_exception: bool = True,
            end_on_exit: bool = True) -> _CurrentSpan:
        return _CurrentSpan(self, {"name": name, "context": context, "kind": kind, "attributes": attributes,
                                   "links": links, "start_time": start_time, "record_exception": record_exception,
                                   "set_status_on_exception": set_status_on_exception}, end_on_exit)


class _CurrentSpan:
    """What ``DirectTracer.start_as_current_span`` returns, behaving as what the API's own tracers return: a context
    manager that starts the span on entry and makes it current (through the API's ``use_span``), and a decorator that
    does so around each call of a function, where a coroutine function's span lasts until its coroutine is done, not
    only until the coroutine is made."""

    __slots__ = ("_end_on_exit", "_scope", "_start", "_tracer")

    def __init__(self, tracer: DirectTracer, start: dict[str, Any], end_on_exit: bool) -> None:
        self._tracer = tracer
        self._start = start  # start_span's arguments
        self._end_on_exit = end_on_exit
        self._scope: AbstractContextManager[trace.Span] | None = None

    def __enter__(self) -> trace.Span:
        span = self._tracer.start_span(**self._start)
        self._scope = trace.use_span(span, end_on_exit=self._end_on_exit,
                                     record_exception=self._start["record_exception"],
                                     set_status_on_exception=self._start["set_status_on_exception"])
        return self._scope.__enter__()

    def __exit__(self, exc_type: Any, exc_value: BaseException | None, exc_tb: Any) -> bool | None:
        assert self._scope is not None, "exited before it was entered"
        return self._scope.__exit__(exc_type, exc_value, exc_tb)

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                with self._fresh():
                    return await function(*args, **kwargs)

            return call_async

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._fresh():
                return function(*args, **kwargs)

        return call

    def _fresh(self) -> _CurrentSpan:
        # One span per call of a decorated function: each call enters a new one.
        return _CurrentSpan(self._tracer, self._start, self._end_on_exit)


class DirectTracerProvider(trace.TracerProvider):
    """A provider of ``DirectTracer``s: a span that ends is written to the trace file (when there is one) and handed
    to each span processor's ``on_end`` (looptrace's network exporters: a ``BatchSpanProcessor`` whose exporter
    encodes the span as it is, no SDK span in between).

    ``force_flush`` flushes the processors (the file has nothing to flush: a span is on disk when it has ended);
    ``shutdown`` shuts them down and closes the file, reporting spans that could not be written.
    """

    def __init__(self, resource: Resource, trace_file: str | os.PathLike[str] | None = None) -> None:
        self.resource = resource
        self.writer = TraceFileWriter(trace_file) if trace_file is not None else None
        #: What each span's end calls, in order (the file first: on disk before anything is queued).
        self.ended_hooks: list[Callable[[DirectSpan], object]] = [self.writer.write_span] if self.writer else []
        self.processors: list[Any] = []
        self._starting: list[Any] = []  # processors added by the application, whose on_start is called
        self._tracers: dict[InstrumentationScope, DirectTracer] = {}
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):  # as the SDK: a forked child's process-dependent resource is its own
            self._detected = _detected_resource()
            weak = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (method := weak()) and method())

    @property
    def trace_file(self) -> os.PathLike[str] | None:
        return self.writer.path if self.writer is not None else None

    @property
    def lost_spans(self) -> int:
        return self.writer.lost_spans if self.writer is not None else 0

    def add_exporting_processor(self, processor: Any) -> None:
        """A processor that only exports (``on_start`` does nothing, as a BatchSpanProcessor's): its ``on_end`` gets
        every span that ends from now on; flushed and shut down with the provider."""
        with self._lock:
            self.processors.append(processor)
            self.ended_hooks.append(processor.on_end)

    def add_span_processor(self, processor: Any) -> None:
        """As the SDK provider's: ``processor.on_start(span, parent_context)`` when a span starts and
        ``processor.on_end(span)`` when it ends, for spans started from now on. The span it gets is a ``DirectSpan``,
        which has the fields of the SDK's ``ReadableSpan`` that exporters read."""
        with self._lock:
            self.processors.append(processor)
            self._starting.append(processor)
            self.ended_hooks.append(processor.on_end)

    def _started(self, span: DirectSpan, parent_context: context_api.Context | None) -> None:
        for processor in self._starting:
            processor.on_start(span, parent_context=parent_context)

    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: str | None = None,
                   schema_url: str | None = None, attributes: Mapping[str, Any] | None = None) -> trace.Tracer:
        if not instrumenting_module_name:
            instrumenting_module_name = ""
            _logger.error("get_tracer called with missing module name.")
        scope = InstrumentationScope(instrumenting_module_name, instrumenting_library_version or "", schema_url,
                                     attributes)
        with self._lock:
            tracer = self._tracers.get(scope)
            if tracer is None:
                tracer = self._tracers[scope] = DirectTracer(self, scope)
            return tracer

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        deadline = time_ns() + max(timeout_millis, 0) * 1_000_000
        flushed = True
        for processor in list(self.processors):
            remaining = max((deadline - time_ns()) // 1_000_000, 0)
            flushed = bool(processor.force_flush(remaining)) and flushed
        return flushed

    def shutdown(self) -> None:
        for processor in list(self.processors):
            processor.shutdown()
        if self.writer is not None:
            self.writer.close()

    def _after_fork(self) -> None:
        # The SDK's provider merges in what its process-dependent detectors say in the child: a new
        # service.instance.id, and the process.* attributes when that detector is configured. Which detectors are
        # configured is the SDK's business: Resource.create() runs them all again, and what differs from the parent's
        # detection is what depends on the process (the rest describes the host and the environment, which a fork
        # keeps).
        detected = _detected_resource()
        changed = {key: value for key, value in detected.items() if self._detected.get(key) != value}
        self._detected = detected
        if changed:
            self.resource = self.resource.merge(Resource(changed))


def _detected_resource() -> dict[str, Any]:
    """What the SDK's configured resource detectors say about this process, through its public Resource.create()."""
    return dict(Resource.create().attributes)

