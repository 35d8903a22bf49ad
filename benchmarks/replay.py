"""Record what a looptrace run does to its spans, and do exactly that again straight through the OpenTelemetry SDK.

Benchmark 1 replays a recording as its "raw OpenTelemetry" baseline: the same spans, names, kinds, parents,
attributes (those given at start and those set at the end, as looptrace sets them), events and statuses, in the same
order, with none of looptrace's work of building them. Benchmark 3 replays recordings of several kinds of run to
write a large trace file quickly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider


class Recording(SpanProcessor):
    """A span processor that writes down every start and end, in order."""

    def __init__(self) -> None:
        self.specs: list[dict[str, Any]] = []
        self.ops: list[tuple[str, int]] = []
        self._index: dict[int, int] = {}

    def on_start(self, span, parent_context=None) -> None:
        index = len(self.specs)
        self._index[span.context.span_id] = index
        parent = self._index.get(span.parent.span_id) if span.parent is not None else None
        self.specs.append({"name": span.name, "kind": span.kind, "parent": parent,
                           "start": dict(span.attributes or {})})
        self.ops.append(("start", index))

    def on_end(self, span) -> None:
        index = self._index[span.context.span_id]
        spec = self.specs[index]
        start = spec["start"]
        spec["end"] = {k: v for k, v in (span.attributes or {}).items() if k not in start or start[k] != v}
        spec["events"] = [(e.name, dict(e.attributes or {})) for e in span.events]
        spec["status"] = span.status if not span.status.is_unset else None
        self.ops.append(("end", index))

    @property
    def span_count(self) -> int:
        return len(self.specs)


def record(run: Callable[[TracerProvider], Any]) -> tuple[Recording, Any]:
    """Call ``run(provider)`` with a provider that records; returns the recording and what ``run`` returned."""
    recording = Recording()
    provider = TracerProvider()
    provider.add_span_processor(recording)
    try:
        value = run(provider)
    finally:
        provider.shutdown()
    return recording, value


def replay(tracer: trace.Tracer, recording: Recording) -> None:
    """The recorded run's spans, created, filled and ended through the SDK directly (a new trace each time), one after
    the other."""
    Replayer(tracer, recording).rest()


class Replayer:
    """One replay of a recording that can stop part way: ``until`` runs the recorded operations up to a point (the
    start or the end of the next model call's or tool call's span), ``rest`` runs what is left.

    A loop instrumented by hand with the SDK makes its spans as the conversation goes: the chat span starts before the
    request and ends after the answer. Replaying a run that way, around the real calls, makes each span where such a
    loop would, with the SDK's work interleaved with the HTTP client's as it is in any instrumentation; replaying it
    all at once after the conversation runs the SDK's code and the recorded values in one warm burst.
    """

    __slots__ = ("_position", "_recording", "_spans", "_tracer")

    def __init__(self, tracer: trace.Tracer, recording: Recording) -> None:
        self._tracer = tracer
        self._recording = recording
        self._spans: list[Any] = [None] * len(recording.specs)
        self._position = 0

    def until(self, op: str, operation: str) -> None:
        """Run the operations up to and including the next ``op`` ("start" or "end") of a span whose
        ``gen_ai.operation.name`` is ``operation`` ("chat", "execute_tool")."""
        ops, specs = self._recording.ops, self._recording.specs
        while self._position < len(ops):
            kind, index = ops[self._position]
            self._position += 1
            self._do(kind, index)
            if kind == op and specs[index]["start"].get("gen_ai.operation.name") == operation:
                return
        raise AssertionError(f"the recording has no further {op} of a {operation} span")

    def rest(self) -> None:
        ops = self._recording.ops
        while self._position < len(ops):
            kind, index = ops[self._position]
            self._position += 1
            self._do(kind, index)

    def _do(self, op: str, index: int) -> None:
        spec = self._recording.specs[index]
        if op == "start":
            parent = spec["parent"]
            context = trace.set_span_in_context(self._spans[parent]) if parent is not None else None
            self._spans[index] = self._tracer.start_span(spec["name"], context=context, kind=spec["kind"],
                                                         attributes=spec["start"])
            return
        span = self._spans[index]
        for name, attributes in spec["events"]:
            span.add_event(name, attributes)
        if spec["status"] is not None:
            span.set_status(spec["status"])
        if spec["end"]:
            span.set_attributes(spec["end"])
        span.end()
