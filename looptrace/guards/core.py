"""The framework-neutral half of every guard: calls and results in, the policy's reaction out.

A framework adapter tells a `GuardedRun` what its loop did (a model call answered, a tool call started and came back,
the model stopped) and gets back a `Reaction`: the nudges to put in front of the model, or the reason to stop. Between
the two sits the same `RunMonitor` looptrace's own `Agent` uses (``runtime/monitor.py``): it feeds the detector the
turn's calls in the order the model asked for them, lets the policy decide (warn, nudge once, stop), reports each
anomaly once through the telemetry an Agent would use (span events, metric, log line, webhook, Langfuse score), and
records the run as invoke_agent > turn > chat and execute_tool spans, so that ``looptrace detect`` over the stored
trace finds what the guard found live.

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

from looptrace.instrumentation import (
    AgentTelemetry,
    Alerts,
    Answer,
    Settings,
    ToolCallView,
    ToolTrace,
    Usage,
    build_agent_telemetry,
)
from looptrace.instrumentation.detector import DetectorConfig, LoopDetector, SessionDetectors
from looptrace.runtime import NOTHING, AnomalyPolicy, Policy, Pricing, Reaction, RunMonitor

if TYPE_CHECKING:
    from looptrace.instrumentation.export import Telemetry

__all__ = ["GuardedRun", "LoopGuard", "ModelCall", "Reaction"]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call the framework made, with the tokens it reported (for the loop's cost)."""

    turn: int
    model: str | None
    usage: Usage


@dataclass
class _Call:
    view: ToolCallView
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
    ``max_loop_cost_usd``, as ``Limits.max_loop_cost_usd``: a loop that costs more is stopped.
    """

    def __init__(self, *, name: str = "agent", model: str = "unknown", on_anomaly: Policy = None,
                 detector: DetectorConfig | None = None, alerts: Alerts | None = None, tracer_provider: Any = None,
                 meter_provider: Any = None, capture_content: bool | None = None,
                 settings: Settings | None = None, telemetry: bool | Telemetry = True,
                 max_loop_cost_usd: float | None = None) -> None:
        self.name = name
        self.model = model
        self.policy = AnomalyPolicy(on_anomaly)
        self.max_loop_cost_usd = max_loop_cost_usd
        self.telemetry: AgentTelemetry = build_agent_telemetry(
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
        monitor = RunMonitor(trace, self.policy, detector=detector, max_loop_cost_usd=self.max_loop_cost_usd)
        run = self.last_run = GuardedRun(self, monitor)
        return run


class GuardedRun:
    """One run of a framework's agent under the guard. Thread-safe: frameworks run tool calls in parallel."""

    def __init__(self, guard: LoopGuard, monitor: RunMonitor) -> None:
        self.id = uuid.uuid4().hex
        self.guard = guard
        self.monitor = monitor
        self.turn = 0  # the current turn: the number of model calls so far
        self.model_calls: list[ModelCall] = []
        self.cost_usd: float | None = None  # of the model calls whose model has a price
        self.stopped: str | None = None  # why the guard stopped the run
        self.actions: list[tuple[int, str, str]] = []  # (turn, action, anomaly type) for every report, in order
        self.ended = False
        self.final_text: str | None = None
        self._lock = threading.RLock()
        self._turn_text: str | None = None
        self._calls: dict[str, _Call] = {}  # this turn's calls, in the order they started
        self._answer = _Recorded()
        self._recorder = guard.telemetry.instrument(self._answer, cost_of=_priced_by_its_model)

    @property
    def trace_id(self) -> str:
        return self.monitor.trace.trace_id

    @property
    def detector(self) -> LoopDetector | None:
        return self.monitor.detector

    @property
    def anomalies(self) -> dict[str, Any]:
        """Streak -> its latest firing, as in RunResult.anomalies."""
        return self.monitor.anomalies

    @property
    def usage(self) -> Usage:
        """The tokens of every model call so far."""
        total = Usage()
        for call in self.model_calls:
            total.add(call.usage)
        return total

    @property
    def in_turn(self) -> bool:
        """Whether a turn is open (its model call answered, its calls not yet judged)."""
        return self.monitor.turn is not None

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
            self.monitor.end_turn(None)  # a turn the framework showed no calls or answer of ends here
            self.turn += 1
            self.monitor.start_turn(self.turn)
            self._turn_text = None
            return self.turn

    def model_responded(self, *, usage: Usage | None = None, model: str | None = None, text: str | None = None,
                        tool_calls: Sequence[tuple[str, str, Any]] = (), response_id: str | None = None) -> int:
        """The model answered with ``text`` and ``tool_calls`` (call id, tool name, arguments), opening the turn if
        ``start_turn`` was not called. Its tokens count towards the run, and it gets a chat span: offline detection
        tells the turns apart by their model calls."""
        with self._lock:
            if self.monitor.turn is None:
                self.start_turn()
            if text:
                self._turn_text = text
                self.final_text = text
            name = model or self.guard.model
            self._answer.response = _as_messages_response(self.turn, name, text, tool_calls, usage or Usage(),
                                                          response_id)
            turn = self.monitor.turn
            assert turn is not None
            with turn.activate():  # the instrumented model opens its chat span under the current turn
                answer: Answer = self._recorder.answer({"model": name, "messages": []}, timeout=None)
            if usage is not None:  # None: the framework does not say (its tokens are not counted as zero)
                self._count(answer.usage, answer.cost_usd, name)
            return self.turn

    def add_model_call(self, usage: Usage, model: str | None = None) -> None:
        """Tokens of a model call learnt apart from its answer (a framework that reports them on another channel)."""
        with self._lock:
            name = model or self.guard.model
            self._count(usage, Pricing(name).cost_of({}, usage), name)

    def _count(self, usage: Usage, cost: float | None, model: str) -> None:
        """A model call's tokens: on the run, and in the detector's cost ledger, so anomalies say what the loop cost
        (as an Agent's do)."""
        self.model_calls.append(ModelCall(self.turn, model, usage))
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost
        now = time.time()
        self.monitor.model_called(usage, cost, model=model, started=now, ended=now)

    def tool_started(self, call_id: str, name: str, arguments: Any) -> None:
        with self._lock:
            if self.monitor.turn is None:  # a framework that shows us no model call: each batch of calls is a turn
                self.model_responded(tool_calls=[(call_id, name, arguments)])
            view = ToolCallView(call_id, name, _parsed(arguments))
            self._calls[call_id] = _Call(view, self.monitor.start_call(view), time.perf_counter())

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
            if self.monitor.turn is None:  # a framework that shows us no model call: the answer is a turn of its own
                self.model_responded(text=final_text)
            at_end = self._kept(self.monitor.judge_run(stop_reason, self.final_text))
            self.monitor.end_turn(stop_reason)
            return reaction.then(at_end)

    def end(self, *, status: str | None = None, error: BaseException | None = None) -> None:
        """The run is over: close its spans (idempotent)."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
            self._close_open_turn()
            self.monitor.end_turn(None)
            if status is None:
                status = "stopped_by_detector" if self.stopped else ("error" if error else "done")
            self.monitor.finish(status=status, turns=self.turn, usage=self.usage, cost_usd=self.cost_usd,
                                final_text=self.final_text, error=str(error) if error else None,
                                error_type=type(error).__qualname__ if error else None)

    # ---- the turn's verdict, through the monitor the Agent uses

    def _close_open_turn(self) -> Reaction:
        if self.monitor.turn is None or not self._calls:
            return NOTHING
        calls = list(self._calls.values())
        for call in calls:
            finished = call.finished if call.finished is not None else time.perf_counter()
            result = call.result
            came_back = result is not None
            call.view.settle(result if result is not None else "(no result)", is_error=call.is_error or not came_back,
                             failed=call.is_error, duration_s=finished - call.started,
                             outcome="error" if call.is_error else ("ok" if came_back else "interrupted"))
            self.monitor.call_settled(call.view)
        reaction = self._kept(self.monitor.judge_turn(self._turn_text, [call.trace for call in calls]))
        self._calls = {}
        self.monitor.end_turn("tool_use")
        return reaction

    def _kept(self, reaction: Reaction) -> Reaction:
        """What the guard keeps of a reaction: every report's action, and why it stopped the run."""
        self.actions.extend((anomaly.turn, action, anomaly.type) for anomaly, action in reaction.reports)
        if reaction.stop is not None:
            self.stopped = reaction.stop
        return reaction


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


def _priced_by_its_model(response: Mapping[str, Any], usage: Usage) -> float | None:
    """A recorded answer priced by its own model's row of the price table (a framework may switch models)."""
    return Pricing(str(response.get("model") or "")).cost_of(response, usage)


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
