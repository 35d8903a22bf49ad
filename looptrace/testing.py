"""Testing your agent: scripted model responses, a run's spans in memory, and assertions that read as specifications.

The pytest plugin (``looptrace.pytest_plugin``, registered as a ``pytest11`` entry point) turns these into fixtures;
everything here also works without pytest::

    from looptrace.testing import CapturedSpans, assert_no_anomalies, assert_tool_called, final_answer, tool_use

    spans = CapturedSpans()
    agent = Agent("claude-sonnet-5-5", tools=[search], tracer_provider=spans.provider,
                  client=ScriptedModel([tool_use("search", {"q": "otel"}), final_answer("Found it.")]))
    result = agent.run("look it up")
    assert_tool_called(result, "search", q="otel")
    assert_no_anomalies(result)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

    from looptrace.runtime.result import RunResult

__all__ = [
    "CapturedSpans", "ToolCallRecord", "assert_no_anomalies", "assert_tool_called", "capture_logs", "final_answer",
    "tool_calls", "tool_use",
]

_ids = itertools.count(1)


def tool_use(name: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None,
             text: str | None = None) -> dict[str, Any]:
    """A model response asking for one tool call (``stop_reason="tool_use"``), for ``ScriptedModel``.

    Args:
        name: The tool the model calls.
        arguments: The call's arguments (the ``input`` of the tool_use block).
        call_id: The tool_use id; a fresh ``toolu_test_<n>`` when omitted.
        text: Words the model says before the call, if any.
    """
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": call_id or f"toolu_test_{next(_ids)}", "name": name,
                    "input": dict(arguments or {})})
    return {"stop_reason": "tool_use", "content": content}


def final_answer(text: str) -> dict[str, Any]:
    """A model response that ends the run with ``text`` (``stop_reason="end_turn"``)."""
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}


class ToolCallRecord:
    """One tool call the model made in a run: its name, arguments, and whether its result was an error."""

    __slots__ = ("arguments", "call_id", "is_error", "name", "result")

    def __init__(self, name: str, arguments: Any, call_id: str, result: Any = None, is_error: bool = False) -> None:
        self.name = name
        self.arguments = arguments
        self.call_id = call_id
        self.result = result
        self.is_error = is_error

    def __repr__(self) -> str:
        flag = " (error)" if self.is_error else ""
        return f"{self.name}({self.arguments!r}){flag}"


def tool_calls(result: RunResult) -> list[ToolCallRecord]:
    """Every tool call of a run, in order, read from its message history (works with telemetry on or off)."""
    calls: dict[str, ToolCallRecord] = {}
    for message in result.messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                call_id = str(block.get("id", ""))
                calls[call_id] = ToolCallRecord(str(block.get("name", "")), block.get("input"), call_id)
            elif block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                record = calls[block["tool_use_id"]]
                record.result, record.is_error = block.get("content"), bool(block.get("is_error"))
    return list(calls.values())


def assert_tool_called(result: RunResult, name: str, /, **arguments: Any) -> ToolCallRecord:
    """Assert the run called tool ``name`` with at least these ``arguments`` (others may be present); returns the
    first matching call. The message names the calls that were made when none matches."""
    calls = tool_calls(result)
    for call in calls:
        given = call.arguments if isinstance(call.arguments, Mapping) else {}
        if call.name == name and all(key in given and given[key] == value for key, value in arguments.items()):
            return call
    wanted = f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
    raise AssertionError(f"expected a call to {wanted}; the run made {calls or 'no tool calls'}")


def assert_no_anomalies(result: RunResult) -> None:
    """Assert the loop detector flagged nothing in the run, listing what it flagged otherwise."""
    if result.anomalies:
        found = "; ".join(f"{a.type} at turn {a.turn}: {a.message}" for a in result.anomalies)
        raise AssertionError(f"expected no loop anomalies, found {len(result.anomalies)}: {found}")


class CapturedSpans:
    """A tracer provider whose finished spans stay in memory. Pass ``provider`` to ``Agent(tracer_provider=...)``.

    The spans carry the GenAI conventions and looptrace.* only; ``sent_to_langfuse`` holds the same spans as
    Langfuse's exporter sends them (its attributes, and OpenInference's, added at export)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from looptrace.instrumentation.export.mapped import MappedSpanProcessor, mappings_for

        self.exporter = InMemorySpanExporter()
        self.provider: TracerProvider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self._langfuse = InMemorySpanExporter()
        self.provider.add_span_processor(MappedSpanProcessor(SimpleSpanProcessor(self._langfuse),
                                                             mappings_for(["langfuse"])))

    @property
    def sent_to_langfuse(self) -> list[ReadableSpan]:
        """Every finished span as Langfuse's exporter sends it, in the order they ended."""
        return list(self._langfuse.get_finished_spans())

    def sent(self, prefix: str) -> ReadableSpan:
        """The single span named ``prefix...`` as Langfuse's exporter sends it."""
        found = [span for span in self.sent_to_langfuse if span.name.startswith(prefix)]
        if len(found) != 1:
            raise AssertionError(f"expected one span named {prefix}*, found {[s.name for s in found]}")
        return found[0]

    @property
    def all(self) -> list[ReadableSpan]:
        """Every finished span, in the order they ended."""
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        """The spans whose name starts with ``prefix`` (``"execute_tool"``, ``"chat"``, ``"turn"``, ...)."""
        return [span for span in self.all if span.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        """The single span named ``prefix...``; fails naming the spans there are otherwise."""
        found = self.named(prefix)
        if len(found) != 1:
            raise AssertionError(f"expected one span named {prefix}*, found {[s.name for s in self.all]}")
        return found[0]

    def children_of(self, parent: ReadableSpan) -> list[ReadableSpan]:
        """The spans whose parent is ``parent``."""
        parent_id = parent.context.span_id if parent.context is not None else None
        return [s for s in self.all if s.parent is not None and s.parent.span_id == parent_id]

    def clear(self) -> None:
        """Forget the spans captured so far."""
        self.exporter.clear()
        self._langfuse.clear()


class _Collect(logging.Handler):
    def __init__(self, into: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        fields = dict(getattr(record, "looptrace", None) or {"event": record.getMessage()})
        self.into.append({**fields, "log_level": record.levelname.lower()})


@contextlib.contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """looptrace's log records while the block runs, each a dict: ``event``, ``log_level`` and the fields."""
    from looptrace.instrumentation.logs import logger

    records: list[dict[str, Any]] = []
    handler = _Collect(records)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)

