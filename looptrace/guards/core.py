"""The framework-neutral half of every guard: calls and results in, the policy's reaction out.

A framework adapter tells a `GuardedRun` what its loop did (a model call answered, a tool call started and came back,
the model stopped) and gets back a `Reaction`: the nudges to put in front of the model, or the reason to stop. Between
the two, the run does what looptrace's own `Agent` does with the same events: it feeds the detector the turn's calls in
the order the model asked for them, lets the policy decide (``runtime/policy.py``: warn, nudge once, stop), reports each
anomaly once through the telemetry an Agent would use (span events, metric, log line, webhook, Langfuse score), and
records the run as invoke_agent > turn > execute_tool spans, so that ``looptrace detect`` over the stored trace finds
what the guard found live.

Turns are model calls, as in the Agent: turn N is the N-th model call of the run, and its tool calls are judged when
the last of them has come back (``end_turn``), before the model sees their results.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from looptrace.instrumentation.agent_telemetry import agent_telemetry
from looptrace.instrumentation.detector import (
    Anomaly,
    DetectorConfig,
    LoopDetector,
    SessionDetectors,
    ToolCall,
    TurnUsage,
)
from looptrace.instrumentation.interface import (
    AgentTelemetry,
    Alerts,
    RunTrace,
    Settings,
    ToolTrace,
    TurnTrace,
    Usage,
)
from looptrace.runtime import policy as policies
from looptrace.runtime.pricing import cost_usd, price_for

if TYPE_CHECKING:
    from looptrace.instrumentation.export.setup import Telemetry

__all__ = ["GuardedRun", "LoopGuard", "ModelCall", "Reaction"]


@dataclass(frozen=True, slots=True)
class Reaction:
    """What the framework's loop should do now: nothing, show the model ``nudges``, or end the run (``stop``)."""

    nudges: tuple[str, ...] = ()
    stop: str | None = None  # why the run stops (the anomaly's message), when the policy says stop
    reports: tuple[tuple[Anomaly, str], ...] = ()  # every anomaly reported with the action taken
    # Anomalies the policy wants a person to decide on (an action beyond warn, nudge and stop, such as "ask"): each
    # adapter maps them to its framework's own human-in-the-loop idiom; until it does, they are reported only.
    asks: tuple[Anomaly, ...] = ()

    @property
    def nudge_text(self) -> str | None:
        """The nudges as one message, or None."""
        return "\n\n".join(self.nudges) if self.nudges else None


NOTHING = Reaction()


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call the framework made, with the tokens it reported (for the loop's cost)."""

    turn: int
    model: str | None
    usage: Usage


@dataclass
class _Call:
    call_id: str
    name: str
    trace: ToolTrace
    started: float
    result: str | None = None
    is_error: bool = False
    finished: float | None = None


class LoopGuard:
    """The detector, the policy and looptrace's telemetry for another framework's agent loop.

    One guard serves many runs (``start_run`` for each); runs that share a ``session_id`` share detector memory, as
    an Agent's do. ``on_anomaly``, ``detector``, ``alerts``, the providers, ``capture_content`` and ``settings`` mean
    what they mean for ``Agent``; with no settings given, the environment is read once, here. ``telemetry``, as for
    ``Agent``: what ``configure()`` returned, handed over whole (its providers, settings, sinks and trace links).
    """

    def __init__(self, *, name: str = "agent", model: str = "unknown", on_anomaly: policies.Policy = None,
                 detector: DetectorConfig | None = None, alerts: Alerts | None = None, tracer_provider: Any = None,
                 meter_provider: Any = None, capture_content: bool | None = None,
                 settings: Settings | None = None, telemetry: bool | Telemetry = True) -> None:
        self.name = name
        self.model = model
        self.policy = policies.AnomalyPolicy(on_anomaly)
        self.telemetry: AgentTelemetry = agent_telemetry(
            telemetry, tracer_provider=tracer_provider, meter_provider=meter_provider,
            capture_content=capture_content, alerts=alerts, settings=settings)
        # Anomaly messages leave the process: they quote arguments only when content may leave it too.
        config = replace(detector or DetectorConfig(), capture_content=self.telemetry.captures_content)
        self.config = config
        self._sessions = SessionDetectors(config)
        self.last_run: GuardedRun | None = None  # the latest run started, to look at after the framework returns

    def start_run(self, task: str | list[dict[str, Any]] = "", *, session_id: str | None = None,
                  tool_definitions: Sequence[Mapping[str, Any]] = (), model: str | None = None) -> GuardedRun:
        detector = self._sessions.detector_for(session_id) if session_id else LoopDetector(self.config)
        trace = self.telemetry.start_run(agent=self.name, model=model or self.model, task=task, system=None,
                                         tool_definitions=[dict(d) for d in tool_definitions],
                                         session_id=session_id)
        run = self.last_run = GuardedRun(self, detector, trace)
        return run


class GuardedRun:
    """One run of a framework's agent under the guard. Thread-safe: frameworks run tool calls in parallel."""

    def __init__(self, guard: LoopGuard, detector: LoopDetector, trace: RunTrace) -> None:
        self.id = uuid.uuid4().hex
        self.guard = guard
        self.detector = detector
        self.trace = trace
        self.turn = 0  # the current turn: the number of model calls so far
        self.model_calls: list[ModelCall] = []
        self.cost_usd: float | None = None  # of the model calls whose model has a price
        self.anomalies: dict[str, Anomaly] = {}  # streak -> its latest firing, as in RunResult.anomalies
        self.stopped: str | None = None  # why the guard stopped the run
        self.actions: list[tuple[int, str, str]] = []  # (turn, action, anomaly type) for every report, in order
        self.ended = False
        self.final_text: str | None = None
        self._nudged: set[str] = set()
        self._lock = threading.RLock()
        self._turn_trace: TurnTrace | None = None
        self._turn_text: str | None = None
        self._calls: dict[str, _Call] = {}  # this turn's calls, in the order they started
        self._answer = _Recorded()
        self._recorder = guard.telemetry.instrument(self._answer)

    @property
    def trace_id(self) -> str:
        return self.trace.trace_id

    @property
    def usage(self) -> Usage:
        """The tokens of every model call so far."""
        return Usage(input_tokens=sum(c.usage.input_tokens for c in self.model_calls),
                     output_tokens=sum(c.usage.output_tokens for c in self.model_calls),
                     cache_read_input_tokens=sum(c.usage.cache_read_input_tokens for c in self.model_calls),
                     cache_creation_input_tokens=sum(c.usage.cache_creation_input_tokens for c in self.model_calls))

    @property
    def in_turn(self) -> bool:
        """Whether a turn is open (its model call answered, its calls not yet judged)."""
        return self._turn_trace is not None

    @property
    def pending(self) -> int:
        """Tool calls of this turn that started and have not come back."""
        with self._lock:
            return sum(1 for call in self._calls.values() if call.finished is None)

    # ---- what the framework's loop did

    def start_turn(self) -> int:
        """A model call is about to be made: a new turn (the previous one is judged first if still open)."""
        with self._lock:
            self._close_open_turn()
            self.turn += 1
            self._turn_trace = self.trace.start_turn(self.turn)
            self._turn_text = None
            return self.turn

    def model_responded(self, *, usage: Usage | None = None, model: str | None = None, text: str | None = None,
                        tool_calls: Sequence[tuple[str, str, Any]] = (), response_id: str | None = None) -> int:
        """The model answered with ``text`` and ``tool_calls`` (call id, tool name, arguments), opening the turn if
        ``start_turn`` was not called. Its tokens count towards the run, and it gets a chat span: offline detection
        tells the turns apart by their model calls."""
        with self._lock:
            if self._turn_trace is None:
                self.start_turn()
            assert self._turn_trace is not None
            if usage is not None:  # None: the framework does not say (its tokens are not counted as zero)
                self._count(usage, model)
            if text:
                self._turn_text = text
                self.final_text = text
            response = _as_messages_response(self.turn, model or self.guard.model, text, tool_calls,
                                             usage or Usage(), response_id)
            self._answer.response = response
            with self._turn_trace.activate():  # the instrumented model opens its chat span under the current turn
                self._recorder.create({"model": response["model"], "messages": []}, timeout=None)
            return self.turn

    def add_model_call(self, usage: Usage, model: str | None = None) -> None:
        """Tokens of a model call learnt apart from its answer (a framework that reports them on another channel)."""
        with self._lock:
            self._count(usage, model)

    def _count(self, usage: Usage, model: str | None) -> None:
        """A model call's tokens: on the run, and in the detector's ledger, priced, so anomalies say what the loop
        cost (as an Agent's do)."""
        call = ModelCall(self.turn, model, usage)
        self.model_calls.append(call)
        self.detector.record_usage(self.turn, self._priced(call))

    def _priced(self, call: ModelCall) -> TurnUsage:
        usage, name = call.usage, call.model or self.guard.model
        now = time.time()
        price = price_for(name)
        if price is None:
            return TurnUsage(input_tokens=usage.all_input_tokens, output_tokens=usage.output_tokens,
                             unpriced=f"no price for model {name!r} in the price table", started=now, ended=now)
        usd = cost_usd(usage, price)  # the Agent's own pricing of a model call
        self.cost_usd = (self.cost_usd or 0.0) + usd
        return TurnUsage(input_tokens=usage.all_input_tokens, output_tokens=usage.output_tokens, usd=usd,
                         started=now, ended=now)

    def tool_started(self, call_id: str, name: str, arguments: Any) -> None:
        with self._lock:
            if self._turn_trace is None:  # a framework that shows us no model call: each batch of calls is a turn
                self.model_responded(tool_calls=[(call_id, name, arguments)])
            assert self._turn_trace is not None
            trace = self._turn_trace.start_tool(call_id=call_id, name=name, description=None,
                                                arguments=_parsed(arguments))
            self._calls[call_id] = _Call(call_id, name, trace, time.perf_counter())

    def tool_finished(self, call_id: str, result: Any, *, is_error: bool = False) -> None:
        with self._lock:
            call = self._calls.get(call_id)
            if call is None:  # a result we never saw start: a framework's retry, or a call made before the guard
                return
            call.result, call.is_error, call.finished = _as_text(result), bool(is_error), time.perf_counter()

    def end_turn(self) -> Reaction:
        """Every call of the turn came back: judge the turn. The reaction is for the model's next call."""
        with self._lock:
            return self._close_open_turn()

    def model_finished(self, final_text: str | None = None, stop_reason: str = "end_turn") -> Reaction:
        """The model answered without calling a tool: judge the run (ignored errors). A nudge asks for one more turn."""
        with self._lock:
            reaction = self._close_open_turn()
            if final_text:
                self.final_text = final_text
            if self._turn_trace is None:  # a framework that shows us no model call: the answer is a turn of its own
                self.model_responded(text=final_text)
            turn_trace = self._turn_trace
            assert turn_trace is not None
            at_end = self._react(self.detector.end_run(stop_reason, self.final_text, self.turn), turn_trace, [])
            turn_trace.end(stop_reason=stop_reason)
            self._turn_trace = None
            return _merged(reaction, at_end)

    def end(self, *, status: str | None = None, error: BaseException | None = None) -> None:
        """The run is over: close its spans (idempotent)."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
            self._close_open_turn()
            if status is None:
                status = "stopped_by_detector" if self.stopped else ("error" if error else "done")
            detector = self.detector
            self.trace.end(status=status, turns=self.turn, usage=self.usage, cost_usd=self.cost_usd,
                           anomalies=len(self.anomalies), final_text=self.final_text,
                           error=str(error) if error else None,
                           error_type=type(error).__qualname__ if error else None,
                           unresolved_errors=detector.unresolved_errors(), loop_cost=detector.loop_cost,
                           session_loop_cost=detector.session_loop_cost, loop_cost_by_type=detector.loop_cost_by_type)

    # ---- the Agent's own reaction, step for step

    def _close_open_turn(self) -> Reaction:
        turn_trace = self._turn_trace
        if turn_trace is None or not self._calls:
            return NOTHING
        calls = list(self._calls.values())
        for call in calls:
            # Redacted as on the spans, as the Agent feeds it: anomaly messages quote arguments.
            result = call.trace.scrub(call.result if call.result is not None else "")
            self.detector.observe(ToolCall(turn=self.turn, tool=call.name, arguments=call.trace.arguments,
                                           call_id=call.call_id, is_error=call.is_error, result=result))
        reaction = self._react(self.detector.end_turn(self.turn, self._turn_text), turn_trace, calls)
        for call in calls:  # after detection, so the spans of offending calls carry the anomaly
            finished = call.finished if call.finished is not None else time.perf_counter()
            call.trace.end(result=call.result if call.result is not None else "(no result)",
                           is_error=call.is_error or call.result is None,
                           outcome="error" if call.is_error else ("ok" if call.result is not None else "interrupted"),
                           duration_s=finished - call.started)
        self._calls = {}
        turn_trace.end(stop_reason="tool_use")
        self._turn_trace = None
        return reaction

    def _react(self, found: list[Anomaly], turn: TurnTrace, calls: list[_Call]) -> Reaction:
        if not found:
            return NOTHING
        nudges: list[str] = []
        reports: list[tuple[Anomaly, str]] = []
        stop: str | None = None
        asks: list[Anomaly] = []
        for anomaly, action, nudge in policies.reported(
                found, turn, decide=lambda a: self.guard.policy.decide(a, a.streak in self._nudged),
                latest=self.anomalies, nudged=self._nudged,
                offending=lambda ids: [c.trace for c in calls if c.call_id in ids]):
            reports.append((anomaly, action))
            self.actions.append((anomaly.turn, action, anomaly.type))
            if nudge is not None:
                nudges.append(nudge)
            elif action == policies.STOP:
                stop = stop or anomaly.message
            elif action != policies.WARN:
                asks.append(anomaly)
        if stop is not None:
            self.stopped = stop
        return Reaction(tuple(nudges), stop, tuple(reports), tuple(asks))


class _Recorded:
    """A "model" that answers with the response it is handed: the framework made the call, and the telemetry's own
    instrumented model turns it into the chat span an Agent's call would have (tokens, finish reason, output)."""

    stream = False
    response: dict[str, Any] = {}

    def create(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        return self.response

    async def acreate(self, params: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
        return self.create(params, timeout=timeout)

    def server(self) -> tuple[str | None, int | None]:
        return None, None


def _as_messages_response(turn: int, model: str, text: str | None, tool_calls: Sequence[tuple[str, str, Any]],
                          usage: Usage, response_id: str | None) -> dict[str, Any]:
    """The model's answer in the Messages API's shape, the one looptrace's spans are written from."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": call_id, "name": name, "input": _parsed(arguments)}
                for call_id, name, arguments in tool_calls]
    return {"id": response_id or f"turn_{turn}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": "tool_use" if tool_calls else "end_turn",
            "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                      "cache_read_input_tokens": usage.cache_read_input_tokens,
                      "cache_creation_input_tokens": usage.cache_creation_input_tokens}}


def _merged(first: Reaction, second: Reaction) -> Reaction:
    if first is NOTHING:
        return second
    if second is NOTHING:
        return first
    return Reaction(first.nudges + second.nudges, first.stop or second.stop, first.reports + second.reports,
                    first.asks + second.asks)


def _parsed(arguments: Any) -> Any:
    """Arguments as the detector compares them: a JSON text (the OpenAI wire form) is parsed."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(result)


@dataclass
class RunRegistry:
    """The open runs of a guard by a key the framework hands every hook; bounded, so an abandoned run is forgotten."""

    limit: int = 1000
    _runs: dict[Any, GuardedRun] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: Any, run: GuardedRun) -> GuardedRun:
        with self._lock:
            self._runs[key] = run
            while len(self._runs) > self.limit:
                stale = self._runs.pop(next(iter(self._runs)))
                stale.end(status="interrupted")
        return run

    def get(self, key: Any) -> GuardedRun | None:
        with self._lock:
            return self._runs.get(key)

    def pop(self, key: Any) -> GuardedRun | None:
        with self._lock:
            return self._runs.pop(key, None)
