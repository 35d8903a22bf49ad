"""Backends' mappings, applied where their spans leave: each exporter sends looptrace's spans with the attributes its
backend reads added, and the spans themselves (what an application's processors and the trace file get) carry the
GenAI conventions and looptrace.* alone.

* ``langfuse``: Langfuse's mapping (``langfuse.mapping``: trace attributes on every span, usage and cost in its terms,
  the tools and the prompt on every generation, levels) with OpenInference's, which Langfuse reads too;
* ``openinference``: OpenInference's (``openinference``: Phoenix's kinds, input and output).

The Langfuse exporter applies ``langfuse``; an OTLP exporter applies what ``LOOPTRACE_OTLP_MAPPINGS`` asks for (a
collector that forwards to Langfuse or Phoenix), nothing by default. ``MappedSpanProcessor`` wraps the exporter's
processor: it learns each run from its root span as the root starts (a processor sees that before any child), and as
each span ends hands its processor a copy with the backend's attributes added (the SDK's ``ReadableSpan``).
``traces push`` does the same from the trace file (``StoredRuns``), where the model calls' inputs are first made whole
again (``tracefile.history``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..langfuse import mapping as langfuse
from ..logs import telemetry_failed
from ..offline.run_facts import RunFacts
from ..recording import semconv as sc
from ..settings import Settings
from ..tracefile.encodable import with_attributes
from ..tracefile.history import StoredHistories, tool_descriptions
from . import openinference

__all__ = ["MAPPINGS", "MappedSpanExporter", "MappedSpanProcessor", "SpanMapping", "StoredRuns", "backend_mappings",
           "mappings_for"]

SpanMapping = Callable[[Any, "RunFacts | None"], dict[str, Any]]
"""A backend's attributes for one of looptrace's finished spans, given its run's facts (None: its root unseen)."""

MAPPINGS: dict[str, tuple[SpanMapping, ...]] = {
    "langfuse": (openinference.span_attributes, langfuse.span_attributes),
    "openinference": (openinference.span_attributes,),
}
_MAX_OPEN_SPANS = 100_000  # spans that start and never end must not grow the tracker without bound


def backend_mappings(name: str, settings: Settings) -> tuple[str, ...]:
    """The mappings a network exporter applies: ``langfuse`` for Langfuse, ``LOOPTRACE_OTLP_MAPPINGS`` for OTLP."""
    return ("langfuse",) if name == "langfuse" else settings.otlp_mappings


def mappings_for(names: Iterable[str]) -> tuple[SpanMapping, ...]:
    """The mappings of the backends ``names`` (``langfuse``, ``openinference``), each once, in order."""
    chosen: list[SpanMapping] = []
    for name in names:
        for mapping in MAPPINGS[name]:
            if mapping not in chosen:
                chosen.append(mapping)
    return tuple(chosen)


def mapped(span: ReadableSpan, mappings: Sequence[SpanMapping], run: RunFacts | None) -> ReadableSpan:
    """``span`` with the attributes ``mappings`` add for it (the span's own win); ``span`` itself when there are none.
    A mapping that fails costs its attributes, never the span: the export goes on without them."""
    if not mappings or not _ours(span):
        return span
    added: dict[str, Any] = {}
    try:
        for mapping in mappings:
            added.update(mapping(span, run))
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not cost the span its export
        telemetry_failed("backend mapping", exc)
        return span
    return with_attributes(span, {**added, **(span.attributes or {})}) if added else span


def _ours(span: Any) -> bool:
    scope = span.instrumentation_scope
    return scope is not None and scope.name == sc.SCOPE_NAME


class RunTracker:
    """Which run each of looptrace's spans belongs to, learned as the spans start: a run's root gives its facts, and
    every span started under a span of the run belongs to it."""

    def __init__(self) -> None:
        self._runs: OrderedDict[int, RunFacts] = OrderedDict()  # span id -> its run

    def started(self, span: Span, parent_context: Context | None) -> None:
        if not _ours(span):
            return
        attributes = span.attributes or {}
        facts: RunFacts | None
        if attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
            facts = RunFacts.of_root(attributes, joins_outer_trace=self._joins_outer_trace(span, parent_context))
        else:
            facts = self._runs.get(span.parent.span_id) if span.parent is not None else None
            if facts is None:
                return
        self._runs[span.context.span_id] = facts
        if len(self._runs) > _MAX_OPEN_SPANS:
            self._runs.popitem(last=False)

    def ended(self, span: ReadableSpan) -> RunFacts | None:
        return self._runs.pop(span.context.span_id, None)

    def _joins_outer_trace(self, span: Span, parent_context: Context | None) -> bool:
        """Whether a run starts under a span that is not looptrace's: one from another process (a traceparent) or one
        the application made, which may never reach the backend. Such a run must still be its trace's root there."""
        parent = span.parent
        if parent is None or not parent.is_valid:
            return False
        if parent.is_remote:
            return True
        if parent.span_id in self._runs:  # a span of another of looptrace's runs: a run used as a tool
            return False
        current = trace.get_current_span(parent_context)
        same = current.get_span_context().span_id == parent.span_id
        scope = getattr(current, "instrumentation_scope", None) if same else None
        return getattr(scope, "name", None) != sc.SCOPE_NAME


class MappedSpanProcessor(SpanProcessor):
    """A backend's processor (``processor``), handed each span with the backend's attributes added."""

    def __init__(self, processor: SpanProcessor, mappings: Sequence[SpanMapping]) -> None:
        self.processor = processor
        self.mappings = tuple(mappings)
        self._runs = RunTracker()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._runs.started(span, parent_context)
        self.processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.processor.on_end(mapped(span, self.mappings, self._runs.ended(span)))

    def shutdown(self) -> None:
        self.processor.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.processor.force_flush(timeout_millis)


class StoredRuns:
    """What ``traces push`` needs to send spans from the trace file as they were first sent: the model calls' whole
    inputs (``tracefile.history``) and each span's run, for the mappings. Fed every span of the traces it sends, in
    file order (a run's root comes after its children there), before any of them is sent."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self.histories = StoredHistories()
        self._parents: dict[str, str | None] = {}  # span id -> parent span id, for looptrace's spans
        self._roots: dict[str, RunFacts] = {}  # a run's root span id -> the run's facts
        self._tools: dict[str, Mapping[str, str]] = {}  # a run's tool definitions -> each tool's description

    def read(self, trace_file: str, trace_ids: Iterable[str] | None, max_line_bytes: int) -> None:
        """Learn the traces ``trace_ids`` (hex; None: all) of ``trace_file`` and its rotated files, forgetting any
        learned before (a push reads one trace file at a time)."""
        from ..tracefile.read import TraceFileError, decode_attributes, raw_spans, read_lines

        self._forget()
        wanted = None if trace_ids is None else set(trace_ids)
        try:
            for _, data in read_lines(trace_file, max_line_bytes=max_line_bytes, regular_only=True):
                try:
                    for span, _, scope in raw_spans(data):
                        if wanted is None or span["traceId"].lower() in wanted:
                            parent = span.get("parentSpanId")
                            self.add(span["spanId"].lower(), parent.lower() if isinstance(parent, str) and parent
                                     else None, scope, decode_attributes(span.get("attributes")))
                except (ValueError, TypeError, KeyError, AttributeError):
                    continue  # a line push cannot read: its spans are reported by the send pass
        except TraceFileError:
            return  # gone or unreadable: the send pass says so

    def add(self, span_id: str, parent_id: str | None, scope: str, attributes: Mapping[str, Any]) -> None:
        if scope != sc.SCOPE_NAME:
            return
        self._parents[span_id] = parent_id
        self.histories.add(span_id, attributes)
        if attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
            self._roots[span_id] = RunFacts.of_root(attributes)

    def run_of(self, span_id: str) -> RunFacts | None:
        """The run a span belongs to: its nearest ancestor that is a run's root (itself, for a root)."""
        seen: set[str] = set()
        current: str | None = span_id
        while current is not None and current not in seen:
            facts = self._roots.get(current)
            if facts is not None:
                return _with_joins(facts, self._parents.get(current), self._parents)
            seen.add(current)
            current = self._parents.get(current)
        return None

    def prepared(self, span: ReadableSpan, mappings: Sequence[SpanMapping]) -> ReadableSpan:
        """``span`` as its backend gets it: what the file holds once put back (a model call's whole input, a tool
        call's description), then the backend's attributes."""
        span_id = format(span.context.span_id, "016x")
        attributes = span.attributes or {}
        run = self.run_of(span_id)
        if sc.INPUT_CONTINUES in attributes:
            whole = self.histories.restored(span_id)
            restored = {k: v for k, v in attributes.items() if k not in (sc.INPUT_CONTINUES, sc.INPUT_CONTINUES_FROM)}
            if whole is not None:
                restored[sc.GEN_AI_INPUT_MESSAGES] = whole
            span = with_attributes(span, restored)
        elif (attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_EXECUTE_TOOL and run is not None
              and sc.GEN_AI_TOOL_DESCRIPTION not in attributes):
            definitions = run.tool_definitions or ""
            known = self._tools.get(definitions)
            if known is None:
                known = self._tools[definitions] = tool_descriptions(definitions)
            description = known.get(str(attributes.get(sc.GEN_AI_TOOL_NAME)))
            if description is not None:
                span = with_attributes(span, {**attributes, sc.GEN_AI_TOOL_DESCRIPTION: description})
        return mapped(span, mappings, run)


def _with_joins(facts: RunFacts, parent: str | None, parents: Mapping[str, str | None]) -> RunFacts:
    """A root's facts with whether it joined an outer trace: its parent is none of looptrace's spans in the file."""
    joins = parent is not None and parent not in parents
    return facts if joins == facts.joins_outer_trace else replace(facts, joins_outer_trace=joins)


class MappedSpanExporter(SpanExporter):
    """A backend's exporter for ``traces push``: each span prepared by ``runs`` (whole inputs, the backend's
    attributes) before ``exporter`` sends it."""

    def __init__(self, exporter: SpanExporter, mappings: Sequence[SpanMapping], runs: StoredRuns) -> None:
        self.exporter = exporter
        self.mappings = tuple(mappings)
        self.runs = runs

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export([self.runs.prepared(span, self.mappings) for span in spans])

    @property
    def last_failure(self) -> Any:
        """The wrapped exporter's last failure, when it keeps one (a guarded exporter: push reads its cause)."""
        return getattr(self.exporter, "last_failure", None)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.exporter.shutdown()
