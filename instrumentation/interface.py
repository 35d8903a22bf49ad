"""What the agent loop needs of telemetry, and nothing more: the one door between runtime/ and instrumentation/.

The loop records a run through three traces (``RunTrace`` > ``TurnTrace`` > ``ToolTrace``) and reports each anomaly
once, with the action its policy took (``TurnTrace.report``); where a report goes (span events, the metric, the log
line, the webhook, the Langfuse score) was assembled by whoever built the telemetry, never by the loop. Model calls
are not the loop's business at all: ``AgentTelemetry.instrument`` wraps the loop's model, and the wrapper opens the
chat spans (and the judge's) under whichever turn is current while it runs.

``runtime/`` imports this module and the detector's public types, nothing else of instrumentation (a structure test
holds it to that), so this module also carries the few plain types both sides speak: ``Usage`` (with the one parser of
a response's usage), ``Action`` (what a policy did about an anomaly) and the log the loop writes to.

``NoTracing`` implements the protocols with nothing at all, for ``Agent(telemetry=False)`` and
``OTEL_SDK_DISABLED=true``; it still redacts tool arguments (``ToolTrace.arguments``, which the detector, the events
and the alerts quote) and still hands reports to the alert sinks it was given.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .content import redact
from .detector import Anomaly
from .logs import log

if TYPE_CHECKING:
    from .alerts import Alerts

__all__ = [
    "ACTIONS",
    "Action",
    "AgentTelemetry",
    "Anomaly",
    "CostOf",
    "ModelLike",
    "NoTracing",
    "RunTrace",
    "ToolTrace",
    "TurnTrace",
    "Usage",
    "agent_telemetry",
    "log",
    "redact",
    "report_first_chunk",
]

Action = Literal["warn", "nudge", "stop"]
"""What the policy did about an anomaly: alert only, alert and send one corrective message, or end the run."""
ACTIONS: tuple[Action, ...] = ("warn", "nudge", "stop")


@dataclass(slots=True)
class Usage:
    """Token counts the Anthropic way: ``input_tokens`` excludes the cache, which is counted apart."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @classmethod
    def from_response(cls, response: Mapping[str, Any]) -> Usage:
        """The usage of a Messages API response. A backend that sends "12" or 12.0 still gets counted, and one that
        sends garbage (null, a negative number, text, no usage at all) counts as zero rather than ending the run."""
        raw = response.get("usage")
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            input_tokens=_token_count(raw.get("input_tokens")),
            output_tokens=_token_count(raw.get("output_tokens")),
            cache_read_input_tokens=_token_count(raw.get("cache_read_input_tokens")),
            cache_creation_input_tokens=_token_count(raw.get("cache_creation_input_tokens")),
        )

    @staticmethod
    def one_hour_cache_writes(response: Mapping[str, Any]) -> int:
        """The cache writes of ``response`` kept for an hour (priced higher): Anthropic splits them by lifetime in
        ``usage.cache_creation``; without that split every write is a 5-minute one."""
        raw = response.get("usage")
        creation = raw.get("cache_creation") if isinstance(raw, Mapping) else None
        if not isinstance(creation, Mapping):
            return 0
        return min(_token_count(creation.get("ephemeral_1h_input_tokens")),
                   _token_count(raw.get("cache_creation_input_tokens")))  # type: ignore[union-attr]

    @property
    def total_tokens(self) -> int:
        """Everything the budget counts: input, output, cache reads and cache writes."""
        return self.input_tokens + self.output_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    @property
    def all_input_tokens(self) -> int:
        """Input with the cache added back: the GenAI conventions' Anthropic rule for ``gen_ai.usage.input_tokens``."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def add(self, other: Usage) -> None:
        """Count ``other`` in as well."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_input_tokens += other.cache_read_input_tokens
        self.cache_creation_input_tokens += other.cache_creation_input_tokens


def _token_count(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float):
        return max(int(value), 0) if value == value and abs(value) != float("inf") else 0
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 18:
        return int(value.strip())
    return 0


CostOf = Callable[[Mapping[str, Any]], "float | None"]
"""The USD cost of a Messages API response, or None when its model has no price (the agent's price table decides)."""


class ModelLike(Protocol):
    """The model seam as telemetry sees it (``runtime.models.Model`` is the loop's own, identical, description)."""

    stream: bool

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]: ...

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]: ...

    def server(self) -> tuple[str | None, int | None]: ...


# A streaming model reports its first chunk through this: the instrumented wrapper sets a receiver while the call
# runs, so a model implementation needs no telemetry of its own (and one called outside a run costs a lookup).
first_chunk_receiver: contextvars.ContextVar[Callable[[float], None] | None] = contextvars.ContextVar(
    "looptrace_first_chunk", default=None)


def report_first_chunk(seconds: float) -> None:
    """A streaming model call got its first chunk ``seconds`` after it was sent (the chat span's time to first
    chunk). Free when nothing listens."""
    receiver = first_chunk_receiver.get()
    if receiver is not None:
        receiver(seconds)


class ToolTrace(Protocol):
    """One tool call. ``arguments`` are the call's, secrets redacted: what may be quoted anywhere."""

    @property
    def arguments(self) -> Any: ...

    def activate(self) -> AbstractContextManager[Any]:
        """Current while the tool runs, so a tool's own spans nest under it."""
        ...

    def end(self, *, result: str, is_error: bool, outcome: str, error_type: str | None = None,
            duration_s: float = 0.0, full_length: int | None = None) -> None:
        """The call settled: what the model is sent, whether it is an error and why."""
        ...


class TurnTrace(Protocol):
    """One loop iteration: a model call and the tool calls it asked for."""

    def activate(self) -> AbstractContextManager[Any]:
        """Current while the turn's model call runs: the instrumented model opens its chat span under it."""
        ...

    def start_tool(self, *, call_id: str, name: str, description: str | None, arguments: Any) -> ToolTrace: ...

    def report(self, anomaly: Anomaly, action: Action, tool_calls: Sequence[ToolTrace]) -> None:
        """The detector flagged ``anomaly`` in this turn, involving ``tool_calls``, and the policy took ``action``:
        the one report of it, which reaches every sink the telemetry was built with."""
        ...

    def nudged(self, text: str) -> None:
        """A corrective message was sent to the model."""
        ...

    def end(self, *, stop_reason: str | None) -> None: ...


class RunTrace(Protocol):
    """One run of an agent: the root of its trace."""

    @property
    def trace_id(self) -> str:
        """32 hex digits; all zeros when nothing records."""
        ...

    @property
    def span_id(self) -> str: ...

    @property
    def trace_url(self) -> str | None:
        """The trace in a backend's UI (Langfuse), when the run's spans go there; else None."""
        ...

    def start_turn(self, index: int) -> TurnTrace: ...

    def end(self, *, status: str, turns: int, usage: Usage, cost_usd: float | None, anomalies: int,
            final_text: str | None, error: str | None = None, error_type: str | None = None) -> None: ...


class AgentTelemetry(Protocol):
    """An agent's telemetry: wraps its model, starts the trace of each run."""

    captures_content: bool
    """Whether content (arguments, messages, results) may leave the process: anomaly messages are written to match."""

    def instrument(self, model: ModelLike, *, cost_of: CostOf | None = None, judge: bool = False) -> ModelLike:
        """``model`` with its calls traced: a chat span per call, under the current turn. ``judge`` marks the calls
        of the detector's judge, whose tokens are not the run's."""
        ...

    def start_run(self, *, agent: str, model: str, task: str | list[dict[str, Any]], system: str | None,
                  tool_definitions: list[dict[str, Any]], session_id: str | None = None, user_id: str | None = None,
                  tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> RunTrace: ...

    def flush(self, timeout_ms: int = 5_000) -> None:
        """Best effort: push out what is buffered (on the way out of an interrupted run)."""
        ...


def agent_telemetry(*, enabled: bool = True, tracer_provider: Any = None, meter_provider: Any = None,
                    capture_content: bool | None = None, alerts: Alerts | None = None,
                    settings: Any = None) -> AgentTelemetry:
    """The telemetry of an ``Agent``: its entry point into instrumentation (see ``embedded.agent_telemetry``)."""
    from .embedded import agent_telemetry as build

    return build(enabled=enabled, tracer_provider=tracer_provider, meter_provider=meter_provider,
                 capture_content=capture_content, alerts=alerts, settings=settings)


# --- the no-op implementation ---------------------------------------------------------------------------------------

_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16


class _NoTool:
    __slots__ = ("arguments",)

    def __init__(self, arguments: Any) -> None:
        self.arguments = arguments

    def activate(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def end(self, *, result: str, is_error: bool, outcome: str, error_type: str | None = None,
            duration_s: float = 0.0, full_length: int | None = None) -> None:
        pass


class _NoTurn:
    __slots__ = ("run",)

    def __init__(self, run: _NoRun) -> None:
        self.run = run

    def activate(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def start_tool(self, *, call_id: str, name: str, description: str | None, arguments: Any) -> ToolTrace:
        return _NoTool(redact(arguments))

    def report(self, anomaly: Anomaly, action: Action, tool_calls: Sequence[ToolTrace]) -> None:
        alerts = self.run.alerts
        if alerts is not None:
            from .alerts import AlertContext

            alerts.send(anomaly, AlertContext(agent=self.run.agent, trace_id=_ZERO_TRACE_ID, span_id=_ZERO_SPAN_ID,
                                              action=action))

    def nudged(self, text: str) -> None:
        pass

    def end(self, *, stop_reason: str | None) -> None:
        pass


class _NoRun:
    __slots__ = ("agent", "alerts", "turn")

    trace_id = _ZERO_TRACE_ID
    span_id = _ZERO_SPAN_ID
    trace_url = None

    def __init__(self, agent: str, alerts: Alerts | None) -> None:
        self.agent = agent
        self.alerts = alerts
        self.turn = _NoTurn(self)

    def start_turn(self, index: int) -> TurnTrace:
        return self.turn

    def end(self, *, status: str, turns: int, usage: Usage, cost_usd: float | None, anomalies: int,
            final_text: str | None, error: str | None = None, error_type: str | None = None) -> None:
        pass


class NoTracing:
    """Telemetry switched off: no span, no metric, no exporter. Tool arguments are still redacted, and anomalies still
    reach ``alerts`` (the log line, the webhook, a callback) when given."""

    def __init__(self, alerts: Alerts | None = None, *, captures_content: bool = True) -> None:
        self.alerts = alerts
        self.captures_content = captures_content

    def instrument(self, model: ModelLike, *, cost_of: CostOf | None = None, judge: bool = False) -> ModelLike:
        return model

    def start_run(self, *, agent: str, model: str, task: str | list[dict[str, Any]], system: str | None,
                  tool_definitions: list[dict[str, Any]], session_id: str | None = None, user_id: str | None = None,
                  tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> RunTrace:
        from .langfuse import trace_attributes

        # Checked even here: a label Langfuse would drop should fail in tests, not once telemetry is switched on.
        trace_attributes(agent, session_id=session_id, user_id=user_id, tags=tags, metadata=metadata)
        return _NoRun(agent, self.alerts)

    def flush(self, timeout_ms: int = 5_000) -> None:
        pass
