"""The agent loop: observe, reason, act, write back, and every way a run can end.

The loop is written once, as a generator that *describes* each model call and each round of tool calls and receives
their outcomes. `Agent.run` and `Agent.arun` are two thin drivers that perform those effects, one blocking and one
with asyncio; every rule about stop reasons, budgets, spans and tool results lives in the shared core, so the two can
never drift apart.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as _replace
from typing import TYPE_CHECKING, Any, TypeAlias

from looptrace.instrumentation.agent_telemetry import agent_telemetry
from looptrace.instrumentation.detector import (
    Anomaly,
    DetectorConfig,
    JudgeSummary,
    LoopDetector,
    SessionDetectors,
    ToolCall,
    ToolErrorFacts,
    TurnUsage,
    UnresolvedToolError,
)
from looptrace.instrumentation.interface import (
    Action,
    AgentTelemetry,
    Alerts,
    ModelLike,
    RunTrace,
    Settings,
    ToolTrace,
    TurnTrace,
    Usage,
    log,
)
from looptrace.runtime import approvals
from looptrace.runtime import policy as policies
from looptrace.runtime import tools as toolkit
from looptrace.runtime.approvals import BY_APPROVER, BY_PERSON, ApprovalRequest, Approver, Decision, PendingCall
from looptrace.runtime.events import (
    AnomalyDetected,
    Event,
    ModelResponded,
    RunFinished,
    TextStreamed,
    ToolFinished,
    TurnStarted,
)
from looptrace.runtime.limits import Budget, Limits
from looptrace.runtime.models import AnthropicModel, Model, aprepare_model, prepare_model, streamed_text_to
from looptrace.runtime.pricing import DEFAULT_PRICES, Price, cost_usd, price_for
from looptrace.runtime.result import STATUS_FOR_STOP_REASON, RunResult, RunStatus
from looptrace.runtime.state import PendingAnomaly, RunState, StateError, anomaly_from_dict

if TYPE_CHECKING:
    from looptrace.instrumentation.agent_telemetry import Telemetry
    from looptrace.runtime.mcp_servers import MCPConnections, MCPServer

DEFAULT_MAX_TOKENS = 4096
DEFAULT_MAX_RESULT_CHARS = 100_000

# What a driver starts once the run's MCP servers are connected: the core's generator, given those connections.
_Start: TypeAlias = "Callable[[MCPConnections | None], Generator[_Effect, Any, RunResult]]"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run. Raised after the run's spans were ended and flushed; ``result`` holds the partial run."""

    def __init__(self, result: RunResult) -> None:
        super().__init__("run interrupted")
        self.result = result


class Agent:
    """An LLM agent on the Anthropic Messages API, traced by construction.

    >>> agent = Agent(model="claude-sonnet-5-5", tools=[search], limits=Limits(max_turns=10))
    >>> result = agent.run("Find the cheapest flight to Osaka")
    """

    def __init__(
        self,
        model: str,
        *,
        tools: Iterable[toolkit.Tool | Callable[..., Any]] = (),
        mcp_servers: Iterable[MCPServer] = (),
        system: str | None = None,
        name: str = "agent",
        limits: Limits | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        client: Model | Any = None,
        model_params: Mapping[str, Any] | None = None,
        prices: Mapping[str, Price] | None = None,
        max_tool_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        on_event: Callable[[Event], None] | None = None,
        on_anomaly: policies.Policy = None,
        detector: DetectorConfig | bool = True,
        alerts: Alerts | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        capture_content: bool | None = None,
        telemetry: bool | Telemetry = True,
        settings: Settings | None = None,
        approver: Approver | None = None,
    ) -> None:
        self.model = model
        # Decides, in process, each call of a tool with needs_approval; without one such a call pauses the run.
        self.approver = approver
        self._resumed_states: set[str] = set()  # ids of the states this agent resumed: each resumes once
        self.name = name
        self.system = system
        self.limits = limits or Limits()
        self.max_tokens = max_tokens
        self.tools = toolkit.as_tools(tools)
        # Connected per run, closed when the run ends (see mcp_servers): their tools join these at each run's start.
        self.mcp_servers = tuple(mcp_servers)
        if self.mcp_servers:
            from looptrace.runtime.mcp_servers import check_installed

            check_installed()
        self.model_params = dict(model_params or {})
        self.max_tool_result_chars = max_tool_result_chars
        self.on_event = on_event
        self._prices = DEFAULT_PRICES if prices is None else prices
        # The last response the instrumented model priced, with its usage and cost: the loop charges the budget with
        # them rather than parsing and pricing the same response again (see _charge).
        self._priced: tuple[Mapping[str, Any], Usage, float | None] | None = None
        self._price = price_for(model, self._prices)
        if self.limits.max_cost_usd is not None and self._price is None:
            raise ValueError(
                f"max_cost_usd needs a price for {model!r}, and the price table has none: "
                f"pass prices={{{model!r}: Price(input=..., output=..., ...)}}"
            )
        if self.limits.max_loop_cost_usd is not None and (self._price is None or detector is False):
            raise ValueError(
                f"max_loop_cost_usd needs the loop detector on and a price for {model!r}"
                + ("" if self._price is not None else
                   f": the price table has none; pass prices={{{model!r}: Price(input=..., output=..., ...)}}"))
        self.policy = policies.AnomalyPolicy(on_anomaly)
        # The one door to telemetry: spans, metrics, every anomaly sink and the trace link, from what configure()
        # returned when it is handed over, else from the settings (the environment's, read once here, when none are
        # given).
        self._tracing: AgentTelemetry = agent_telemetry(
            telemetry, tracer_provider=tracer_provider, meter_provider=meter_provider,
            capture_content=capture_content, alerts=alerts, settings=settings)
        self.client = _as_model(client)  # wrapped by the telemetry: the loop opens no chat span itself
        self._detector_config = None if detector is False else (
            detector if isinstance(detector, DetectorConfig) else DetectorConfig())
        if self._detector_config is not None:  # anomaly messages leave the process: no content when capture is off
            # The judge and its cap: the config's, else the settings' (LOOPTRACE_JUDGE, `looptrace run --judge`). The
            # settings' judge asks the Messages API only: on a scripted or custom model it would take the answers
            # meant for the agent's own turns.
            chosen = self._tracing.settings
            judge = self._detector_config.judge
            if judge is None and isinstance(self.client, AnthropicModel):
                judge = chosen.judge
            cap = self._detector_config.judge_max_calls
            if isinstance(judge, str):  # a model name: the judge asks it through this agent's own client
                from looptrace.runtime.judge import ModelJudge
                judge = ModelJudge(self.client, judge)
            judge = self._traced_judge(judge)
            self._detector_config = _replace(self._detector_config, capture_content=self._tracing.captures_content,
                                             judge=judge, judge_max_calls=cap if cap is not None
                                             else chosen.judge_max_calls)
        self._sessions = SessionDetectors(self._detector_config)  # runs sharing a session_id share detector memory
        # With the detector off, the error ledger alone records each run's unresolved tool errors: its config is made
        # once here, not per run (a config is checked as it is made).
        self._facts_config = None if self._detector_config is not None else DetectorConfig(
            capture_content=self._tracing.captures_content)
        self._tool_definitions = [t.definition() for t in self.tools.values()]

    @property
    def client(self) -> Model:
        """The model the agent calls (an AnthropicModel, a ScriptedModel, your own). Assignable."""
        return self._client

    @client.setter
    def client(self, model: Model) -> None:
        self._client = model
        self._model: ModelLike = self._tracing.instrument(model, cost_of=self._cost_of)

    # --- drivers ---------------------------------------------------------------------------------------------------

    def run(self, task: str | list[dict[str, Any]], *, session_id: str | None = None, user_id: str | None = None,
            tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> RunResult:
        """Run to completion on this thread. Ctrl-C ends the run's spans, then raises RunInterrupted.

        ``task`` is the user's request, or a whole message history to continue. ``session_id``, ``user_id``, ``tags``
        and ``metadata`` label the trace (Langfuse's trace attributes, on every span of the run).
        """
        labels = _Labels(session_id, user_id, tuple(tags), metadata)
        return self._drive_sync(lambda servers: self._loop(task, labels, servers))

    def resume(self, state: RunState | str | os.PathLike[str] | Mapping[str, Any], *,
               approve: Iterable[str] = (), reject: Mapping[str, str] | None = None, go_on: bool | None = None,
               message: str | None = None) -> RunResult:
        """Finish a paused run (``RunResult.state``, or a state file's path, or its JSON data).

        Every pending call is decided: its id in ``approve``, or in ``reject`` with the reason the model is told.
        A run paused on an anomaly whose policy says "ask" takes ``go_on=True`` (with an optional ``message`` the
        model receives) or ``go_on=False`` (the run stops). A state resumes once; anything wrong with it or with the
        decisions is a StateError, raised before anything runs. The resumed run is a new trace in the same session,
        linked to the paused one.
        """
        resumption = self._accepted(state, approve, reject, go_on, message)
        try:
            return self._drive_sync(lambda servers: self._resume_loop(resumption, servers))
        except BaseException:
            self._release(resumption)
            raise

    async def aresume(self, state: RunState | str | os.PathLike[str] | Mapping[str, Any], *,
                      approve: Iterable[str] = (), reject: Mapping[str, str] | None = None,
                      go_on: bool | None = None, message: str | None = None) -> RunResult:
        """``resume`` in asyncio."""
        resumption = self._accepted(state, approve, reject, go_on, message)
        try:
            return await self._drive_async(lambda servers: self._resume_loop(resumption, servers))
        except BaseException:
            self._release(resumption)
            raise

    def _drive_sync(self, start: _Start) -> RunResult:
        servers = self._open_servers()
        try:
            if servers is not None:
                servers.wait_ready()
            loop = start(servers)
            value: Any = None
            while True:
                try:
                    effect = loop.send(value)
                except StopIteration as stop:
                    return stop.value
                try:
                    value = effect.perform_sync(self)
                except BaseException as exc:  # hand it to the core, which decides what it means for the run
                    value = _Raised(exc)
        finally:  # however the run ends: its MCP servers do not outlive it
            if servers is not None:
                servers.close()

    # run() and arun() are the same few lines but for `await`: kept apart on purpose, since one function cannot both
    # block and await; everything they drive is shared in _loop.

    async def arun(self, task: str | list[dict[str, Any]], *, session_id: str | None = None,
                   user_id: str | None = None, tags: Iterable[str] = (),
                   metadata: Mapping[str, Any] | None = None) -> RunResult:
        """Run to completion in asyncio; parallel tool calls of one turn run concurrently. Arguments as for run()."""
        labels = _Labels(session_id, user_id, tuple(tags), metadata)
        return await self._drive_async(lambda servers: self._loop(task, labels, servers))

    async def _drive_async(self, start: _Start) -> RunResult:
        servers = self._open_servers()
        try:
            if servers is not None:
                await servers.await_ready()
            loop = start(servers)
            value: Any = None
            while True:
                try:
                    effect = loop.send(value)
                except StopIteration as stop:
                    return stop.value
                try:
                    value = await effect.perform_async(self)
                except BaseException as exc:
                    value = _Raised(exc)
        finally:  # a cancelled arun too: the close finishes before the cancellation goes on
            if servers is not None:
                await servers.aclose()

    def _open_servers(self) -> MCPConnections | None:
        """This run's connections to the agent's MCP servers (connecting in their own thread), or None."""
        if not self.mcp_servers:
            return None
        from looptrace.runtime.mcp_servers import MCPConnections

        return MCPConnections(self.mcp_servers, self._tracing, call_timeout_s=self.limits.tool_timeout_s)

    # --- the shared core -------------------------------------------------------------------------------------------

    def _loop(self, task: str | list[dict[str, Any]], labels: _Labels,
              servers: MCPConnections | None = None) -> Generator[_Effect, Any, RunResult]:
        messages = [{"role": "user", "content": task}] if isinstance(task, str) else list(task)
        tools, definitions = self._tools_with(servers)
        run = _Run(
            budget=Budget(self.limits),
            messages=messages,
            detector=None if self._detector_config is None else (
                self._sessions.detector_for(labels.session_id) if labels.session_id
                else LoopDetector(self._detector_config)),
            facts=None if self._facts_config is None else ToolErrorFacts(self._facts_config),
            span=self._tracing.start_run(
                agent=self.name,
                model=self.model,
                task=task if isinstance(task, str) else messages,
                system=self.system,
                tool_definitions=definitions,
                session_id=labels.session_id,
                user_id=labels.user_id,
                tags=labels.tags,
                metadata=labels.metadata,
            ),
            labels=labels,
            tools=tools,
            tool_definitions=definitions,
            servers=servers,
            servers_version=servers.version if servers is not None else 0,
        )
        return (yield from self._lifecycle(run, self._turns(run)))

    def _turns(self, run: _Run) -> Generator[_Effect, Any, RunStatus]:
        # The client's set-up is the run's time, before the first turn's spans (and bounded by the run's clock).
        prepared = yield _PrepareModel(run.budget.remaining_s())
        if isinstance(prepared, _Raised):
            raise prepared.exc  # Ctrl-C: a failed set-up is met again, and reported, by the model call itself
        while True:
            if run.budget.turns >= (self.limits.max_turns or float("inf")):
                return RunStatus.MAX_TURNS
            if run.budget.timed_out():
                return RunStatus.TIMEOUT
            status = yield from self._turn(run)
            if status is not None:
                return status

    def _lifecycle(self, run: _Run, steps: Generator[_Effect, Any, RunStatus]) -> Generator[_Effect, Any, RunResult]:
        """Drive a run's steps to its status, and end the run however they end (once: a fault in the ending itself
        is not met by ending the run again)."""
        try:
            status = yield from steps
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            result = self._finish(run, RunStatus.INTERRUPTED, error=exc)
            if isinstance(exc, KeyboardInterrupt):
                self._tracing.flush()  # the process is likely on its way out: get the spans out first
                raise RunInterrupted(result) from exc
            # A cancelled arun must not block its event loop on a slow backend: the flush goes to a thread.
            threading.Thread(target=self._tracing.flush, name="looptrace-flush", daemon=True).start()
            raise
        except Exception as exc:
            # A fault of looptrace's own (none is known): the run still ends, with its root span, as an error.
            log.error("run_failed", error=toolkit.error_text(exc), where=_where(exc))
            return self._finish(run, RunStatus.ERROR, error=exc)
        return self._finish(run, status)

    def _turn(self, run: _Run) -> Generator[_Effect, Any, RunStatus | None]:
        """One model call and whatever it asks for. Returns the run's status when this turn ends the run."""
        index = run.budget.turns + 1
        turn = run.span.start_turn(index)
        if self.on_event is not None:
            self._emit(TurnStarted(index))
        if run.servers is not None and run.servers.version != run.servers_version:  # a server's tool list changed
            run.servers_version = run.servers.version
            run.tools, run.tool_definitions = self._tools_with(run.servers)
        params = self._request(run.messages, run.budget, run.tool_definitions)
        started = time.perf_counter()
        wall_started = time.time()
        outcome = yield _ModelCall(params, turn, run.budget.remaining_s(), self._text_observer(index))
        if isinstance(outcome, _Raised):  # the instrumented model already ended its chat span with the error
            turn.end(stop_reason=None)
            if not isinstance(outcome.exc, Exception):
                raise outcome.exc
            run.error = outcome.exc
            status = RunStatus.TIMEOUT if run.budget.timed_out() else RunStatus.ERROR
            # Said where a library user sees it (the `looptrace` logger), not only in the RunResult they may not read.
            log.warning("model_call_failed", agent=self.name, turn=index, status=status.value,
                        error=toolkit.error_text(outcome.exc), hint=_hint_for(outcome.exc))
            return status
        response: dict[str, Any] = outcome
        run.budget.turns = index
        usage, cost = self._charge(run, response)
        self._record_usage(run, index, usage, cost, wall_started, time.time())
        content = response.get("content") or []
        run.messages.append({"role": "assistant", "content": content})
        stop_reason = response.get("stop_reason")
        run.stop_reason = stop_reason
        run.final_text = _text_of(content)
        if self.on_event is not None:
            self._emit(ModelResponded(index, stop_reason, usage, run.final_text, _tool_calls_of(content),
                                      time.perf_counter() - started))

        # Budgets first, as the seed loop does: a turn that crossed one ends the run even if it also said end_turn.
        spent = run.budget.spent()
        try:
            if spent is not None:
                if stop_reason == "tool_use":  # the history stays one a caller can send again
                    run.messages.append({"role": "user", "content": _not_run(content, spent)})
                return spent
            return (yield from self._act(run, turn, index, content, stop_reason))
        finally:
            turn.end(stop_reason=stop_reason)

    def _act(self, run: _Run, turn: TurnTrace, index: int, content: list[Any],
             stop_reason: str | None) -> Generator[_Effect, Any, RunStatus | None]:
        """What the response asks for: tools to run, a paused turn to resume, or the end of the run."""
        if stop_reason == "tool_use":
            early_nudges: list[str] = []
            detector = run.detector
            if detector is not None and detector.config.repeat_threshold == 1:
                # The strictest setting: a call asked for again right after it ran is reported before it runs, and a
                # policy that stops the run stops it before the repeat is made (no span: it never ran, as for a
                # budget).
                asked = [ToolCall(turn=index, tool=block.get("name") or "", arguments=block.get("input"))
                         for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]
                stopped, early_nudges = self._react(
                    run, turn, _detected(turn, detector, detector.before_calls, index, asked), [])
                if stopped:
                    run.messages.append({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": block.get("id", ""), "is_error": True,
                         "content": "(not run: the loop detector stopped the run before this repeated call)"}
                        for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]})
                    return RunStatus.STOPPED_BY_DETECTOR
            calls = [self._prepare_call(turn, block, run.tools) for block in content
                     if isinstance(block, dict) and block.get("type") == "tool_use"]
            if not calls:
                # tool_use with no tool_use block: nothing can answer it, so say so rather than send an empty message.
                run.messages.append({"role": "user", "content": [
                    {"type": "text", "text": "(no tool_use block was found in the previous response)"}]})
                return None
            yield from self._gate(run, index, calls)
            return (yield from self._tool_round(run, turn, index, calls, [c.call_id for c in calls], {},
                                                early_nudges))
        if stop_reason == "pause_turn":  # a server tool paused: the response goes back as it is
            stopped, _ = self._react(run, turn, self._end_turn_detected(run, turn, index), [])
            if stopped:
                return RunStatus.STOPPED_BY_DETECTOR
            return RunStatus.AWAITING_APPROVAL if run.asked is not None else None
        status = STATUS_FOR_STOP_REASON.get(stop_reason) if stop_reason is not None else None
        if status is None or stop_reason is None:
            run.error = UnknownStopReason(f"the model stopped with an unknown stop_reason {stop_reason!r}")
            return RunStatus.ERROR
        return self._check_finish(run, turn, index, stop_reason, status)

    def _check_finish(self, run: _Run, turn: TurnTrace, index: int, stop_reason: str,
                      status: RunStatus) -> RunStatus | None:
        """The model says it is finished: the moment to look for errors it never dealt with."""
        detector = run.detector
        if detector is None:
            return status
        stopped, nudges = self._react(run, turn, _detected(turn, detector, detector.end_run, stop_reason,
                                                           run.final_text, index), [])
        if stopped:
            return RunStatus.STOPPED_BY_DETECTOR
        if run.asked is not None:  # a person decides whether the run ends here, or goes on with their message
            run.asked = PendingAnomaly(run.asked.anomaly, at_end=True, finish_status=status.value)
            if nudges:
                run.messages.append({"role": "user", "content": [{"type": "text", "text": t} for t in nudges]})
            return RunStatus.AWAITING_APPROVAL
        if nudges and status is RunStatus.DONE:
            run.messages.append({"role": "user", "content": [{"type": "text", "text": t} for t in nudges]})
            return None  # one more turn, for the model to answer the nudge
        return status

    def _tool_round(self, run: _Run, turn: TurnTrace, index: int, calls: list[_Call], order: list[str],
                    settled: dict[str, dict[str, Any]],
                    early_nudges: Sequence[str] = ()) -> Generator[_Effect, Any, RunStatus | None]:
        """Run the turn's calls that may run, and write back one tool_result per tool_use block in ``order`` (the
        blocks' call ids; ``settled`` holds the results of those a paused round already ran), then any nudges
        (``early_nudges``: those the detector gave before the calls ran).

        A call still waiting for a decision pauses the run once the others have run. Returns the run's status when
        this round ends it (stopped or paused), else None."""
        ready = [call for call in calls if not call.waiting]
        outcome = yield _ToolRound(ready, run.budget)
        if isinstance(outcome, _Raised):  # interrupted mid-tool: close the spans of the calls, then let it through
            for call in calls:
                call.span.end(result="(interrupted)", is_error=True, outcome="interrupted")
            raise outcome.exc
        settled = {**settled, **{call.call_id: self._settle_call(run, index, call) for call in ready}}
        waiting = [call for call in calls if call.waiting]
        if waiting:  # the turn stays open: its detector turn closes when the round completes, after the pause
            for call in ready:
                self._end_call_span(call)
            for call in waiting:
                call.span.approval(decision="pending")
                call.span.end(result="(awaiting approval)", is_error=False, outcome="awaiting_approval")
            run.paused = _Pause([PendingCall(c.call_id, c.name, c.span.arguments, index) for c in waiting], settled)
            return RunStatus.AWAITING_APPROVAL
        results = [settled[call_id] for call_id in order]
        # with what the model said beside its calls: the user sees it, and it may already report a failure
        stopped, nudges = self._react(run, turn, self._end_turn_detected(run, turn, index, run.final_text), calls)
        for call in calls:  # after detection, so the spans of offending calls carry the anomaly
            self._end_call_span(call)
        results.extend({"type": "text", "text": text} for text in [*early_nudges, *nudges])
        run.messages.append({"role": "user", "content": results})
        if stopped:
            return RunStatus.STOPPED_BY_DETECTOR
        return RunStatus.AWAITING_APPROVAL if run.asked is not None else None

    @staticmethod
    def _end_call_span(call: _Call) -> None:
        call.span.end(result=call.result, is_error=call.is_error, outcome=call.outcome, error_type=call.error_type,
                      duration_s=call.duration_s, full_length=call.full_length)

    def _end_turn_detected(self, run: _Run, turn: TurnTrace, index: int, text: str | None = None) -> list[Anomaly]:
        """Close the detector's turn (kept in the run's detector feed, which a resumed run replays)."""
        detector = run.detector
        if detector is None:
            return []
        run.feed.append({"end_turn": index, "text": text})
        if text is None:
            return _detected(turn, detector, detector.end_turn, index)
        return _detected(turn, detector, detector.end_turn, index, text)

    def _gate(self, run: _Run, index: int, calls: list[_Call]) -> Generator[_Effect, Any, None]:
        """Which calls need approval (their tool's ``needs_approval``), and the approver's decision on each. A call
        needing approval with no approver waits: the run pauses after the others ran."""
        candidates = [call for call in calls if call.runnable and call.tool is not None
                      and call.tool.needs_approval is not False]
        if not candidates:
            return
        requests = [ApprovalRequest(tool=c.tool, arguments=dict(c.arguments) if isinstance(c.arguments, Mapping)
                                    else {}, call_id=c.call_id, turn=index, agent=self.name,
                                    trace_id=run.span.trace_id, session_id=run.labels.session_id)
                    for c in candidates if c.tool is not None]
        outcome = yield _Gate(candidates, requests, self.approver)
        if isinstance(outcome, _Raised):  # Ctrl-C at an approval prompt: close the turn's spans, then let it through
            for call in calls:
                call.span.end(result="(interrupted)", is_error=True, outcome="interrupted")
            raise outcome.exc
        for call, (needed, decision, waited) in zip(candidates, outcome, strict=True):
            if not needed:
                continue
            if decision is None:
                call.waiting = True
            else:
                run.budget.exclude(waited)  # the time it waited for a decision is not the run's running time
                self._apply_decision(call, decision, BY_APPROVER, waited)

    @staticmethod
    def _apply_decision(call: _Call, decision: Decision, by: approvals.DecidedBy, waited_s: float) -> None:
        call.span.approval(decision="approved" if decision.approved else "rejected", by=by, reason=decision.reason,
                           wait_s=waited_s)
        if not decision.approved:
            call.error = approvals.Rejected(call.name, decision.reason, by)

    def _prepare_call(self, turn: TurnTrace, block: dict[str, Any],
                      tools: Mapping[str, toolkit.Tool] | None = None) -> _Call:
        tools = self.tools if tools is None else tools
        name = block.get("name") or ""
        call_id = block.get("id") or ""
        arguments = block.get("input")
        tool = tools.get(name)
        span = turn.start_tool(call_id=call_id, name=name, description=tool.description if tool else None,
                               arguments=arguments)
        call = _Call(call_id=call_id, name=name, arguments=arguments, tool=tool, span=span)
        if tool is None:
            known = ", ".join(sorted(tools)) or "none"
            call.error = toolkit.UnknownTool(f"unknown tool {name!r}; the tools available are: {known}")
        else:
            try:
                call.kwargs = tool.validate(arguments)
            except toolkit.InvalidArguments as exc:
                call.error = exc
        return call

    def _settle_call(self, run: _Run, turn_index: int, call: _Call) -> dict[str, Any]:
        """The tool_result for a finished call; the detector sees the call as the model will."""
        if call.error is None:
            try:
                call.result, call.outcome = toolkit.result_text(call.value), "ok"
            except toolkit.UnreadableResult as exc:
                call.error = exc
        if call.error is not None:
            call.result, call.is_error = toolkit.error_text(call.error), True
            call.outcome = call.error.kind if isinstance(call.error, toolkit.ToolError) else "error"
            original = getattr(call.error, "original", call.error)
            call.error_type = type(original).__qualname__ if call.outcome == "error" else None
        call.full_length = len(call.result)
        call.result = _truncate_result(call.result, self.max_tool_result_chars)
        # The model gets the result as it is (it sent the secret itself); whatever reports on the call gets it as the
        # spans hold it, with a redacted argument's value scrubbed where the tool's text quotes it back.
        shown = call.span.scrub(call.result)
        watcher = run.detector if run.detector is not None else run.facts
        if watcher is not None:
            # A person's rejection is a decision, not a failure the model could leave unresolved: the detector sees
            # it as an answer (so asking again and again for a rejected call is still a repeated call).
            failed = call.is_error and call.outcome != approvals.Rejected.kind
            # Redacted as on the spans: anomaly messages quote arguments, and offline detection sees only these.
            watcher.observe(ToolCall(turn=turn_index, tool=call.name, arguments=call.span.arguments,
                                     call_id=call.call_id, is_error=failed, result=shown))
            run.feed.append({"call": {"turn": turn_index, "tool": call.name, "arguments": call.span.arguments,
                                      "call_id": call.call_id, "is_error": failed, "result": shown}})
        if self.on_event is not None:
            self._emit(ToolFinished(turn_index, call.call_id, call.name, call.span.arguments, shown,
                                    call.is_error, call.outcome, call.duration_s))
        content: str | list[dict[str, Any]] = call.result
        if not call.is_error and isinstance(call.value, toolkit.ContentBlocks):  # images and documents go as blocks
            content = call.value.message_content(self.max_tool_result_chars, _truncate_result)
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call.call_id, "content": content}
        if call.is_error:
            block["is_error"] = True
        return block

    def _react(self, run: _Run, turn: TurnTrace, anomalies: list[Anomaly],
               calls: list[_Call]) -> tuple[bool, list[str]]:
        """Report each anomaly once and apply the policy. Returns whether to stop and the nudges to send."""
        if not anomalies:  # the usual turn
            return False, []
        stop, nudges = False, []
        turns_left = self.limits.max_turns is None or run.budget.turns < self.limits.max_turns

        def decide(anomaly: Anomaly) -> Action:
            action = self.policy.decide(anomaly, anomaly.streak in run.nudged)
            if action == policies.NUDGE and not turns_left:
                action = policies.WARN  # a nudge the model will never read would only turn `done` into max_turns
            if self._over_loop_budget(anomaly):
                action = policies.STOP  # the loop's budget is spent: whatever the policy said
                run.loop_budget_spent = True
            return action

        for anomaly, action, nudge in policies.reported(
                anomalies, turn, decide=decide, latest=run.anomalies, nudged=run.nudged,
                offending=lambda ids: [c.span for c in calls if c.call_id in ids]):
            self._emit(AnomalyDetected(anomaly, action))
            if nudge is not None:
                nudges.append(nudge)
            elif action == policies.STOP:
                stop = True
            elif action == policies.ASK and run.asked is None:
                run.asked = PendingAnomaly(anomaly, at_end=False)
        return stop, nudges

    def _over_loop_budget(self, anomaly: Anomaly) -> bool:
        budget = self.limits.max_loop_cost_usd
        cost = anomaly.cost
        return budget is not None and cost is not None and cost.usd is not None and cost.usd > budget

    # --- helpers ---------------------------------------------------------------------------------------------------

    def _tools_with(self, servers: MCPConnections | None) -> tuple[dict[str, toolkit.Tool], list[dict[str, Any]]]:
        """The run's tools and their definitions: the agent's own, then its MCP servers' (which yield on a clash)."""
        if servers is None:
            return self.tools, self._tool_definitions
        tools = {**self.tools, **servers.tools(taken=self.tools)}
        return tools, [t.definition() for t in tools.values()]

    def _request(self, messages: list[dict[str, Any]], budget: Budget,
                 tool_definitions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, **self.model_params}
        output_left = budget.output_tokens_left(self._price.output / 1_000_000 if self._price else None)
        if output_left is not None and output_left < params["max_tokens"]:
            _lower_max_tokens(params, output_left)
        if self.system is not None:
            params["system"] = self.system
        definitions = self._tool_definitions if tool_definitions is None else tool_definitions
        if definitions:
            params["tools"] = definitions
        params["messages"] = list(messages)  # a snapshot: the history grows after the call
        return params

    def _record_usage(self, run: _Run, index: int, usage: Usage, cost: float | None, started: float,
                      ended: float) -> None:
        """Tell the detector what this model call used: each anomaly's cost is counted from it."""
        if run.detector is None:
            return
        entry = {"turn": index, "input_tokens": usage.all_input_tokens, "output_tokens": usage.output_tokens,
                 "usd": cost, "unpriced": None if cost is not None else f"no price for model {self.model!r}",
                 "started": started, "ended": ended}
        run.detector.record_usage(index, _turn_usage(entry))
        run.feed.append({"usage": entry})

    def _charge(self, run: _Run, response: Mapping[str, Any]) -> tuple[Usage, float | None]:
        priced = self._priced
        if priced is not None and priced[0] is response:  # the instrumented model has just parsed and priced it
            usage, cost = priced[1], priced[2]
        else:  # no telemetry (the model is not wrapped), or another run of this agent priced a response since
            usage = Usage.from_response(response)
            cost = self._price_of(response, usage)
        run.budget.charge(usage, cost)
        return usage, cost

    def _cost_of(self, response: Mapping[str, Any], usage: Usage) -> float | None:
        """The instrumented model's pricing of a response of this agent's model (``interface.CostOf``), kept for
        ``_charge``."""
        cost = self._price_of(response, usage)
        self._priced = (response, usage, cost)
        return cost

    def _price_of(self, response: Mapping[str, Any], usage: Usage) -> float | None:
        """What a response of this agent's model cost, by its price table; None when the model has no price."""
        if self._price is None:
            return None
        return cost_usd(usage, self._price, cache_write_1h_tokens=Usage.one_hour_cache_writes(response))

    def _traced_judge(self, judge: Any) -> Any:
        """A model judge whose calls are traced as the judge's (a copy: the one passed in is left as it was)."""
        from looptrace.runtime.judge import ModelJudge

        if not isinstance(judge, ModelJudge):
            return judge  # any other callable judges without a model call of ours to trace
        cost_of = self._judge_cost(judge.model)
        client = self._tracing.instrument(judge.client, cost_of=cost_of, judge=True)
        return ModelJudge(client, judge.model, timeout_s=judge.timeout_s, cost_of=judge.cost_of or cost_of)

    def _judge_cost(self, model: str) -> Callable[..., float | None]:
        """The judge's responses priced by the same table (its cost is shown, never charged to the run): called as
        ``interface.CostOf`` by the instrumented judge, and with the response alone by ``ModelJudge``."""
        price = price_for(model, self._prices)

        def cost(response: Mapping[str, Any], usage: Usage | None = None) -> float | None:
            if price is None:
                return None
            return cost_usd(usage or Usage.from_response(response), price,
                            cache_write_1h_tokens=Usage.one_hour_cache_writes(response))
        return cost

    def _finish(self, run: _Run, status: RunStatus, *, error: BaseException | None = None) -> RunResult:
        if status is RunStatus.STOPPED_BY_DETECTOR and run.loop_budget_spent:
            status = RunStatus.LOOP_BUDGET
        error = error if error is not None else run.error
        error_text = None if error is None else (f"{type(error).__name__}: {error}" if str(error)
                                                 else type(error).__name__)
        result = RunResult(
            status=status,
            turns=run.budget.turns,
            final_text=run.final_text,
            usage=run.budget.usage,
            cost_usd=run.budget.cost_usd,
            trace_id=run.span.trace_id,
            messages=run.messages,
            anomalies=list(run.anomalies.values()),
            error=error_text if status in (RunStatus.ERROR, RunStatus.TIMEOUT, RunStatus.INTERRUPTED) else None,
            stop_reason=run.stop_reason,
            trace_url=run.span.trace_url,
            unresolved_errors=run.unresolved_errors(),
            judge=run.detector.judge_summary if run.detector is not None else JudgeSummary(),
            loop_cost=run.detector.loop_cost if run.detector is not None else None,
            session_loop_cost=run.detector.session_loop_cost if run.detector is not None and run.labels.session_id
            else None,
        )
        session_id = None
        if status is RunStatus.AWAITING_APPROVAL:
            # A paused run without a session gets one, so that it and the run that resumes it share it.
            session_id = run.labels.session_id or (run.span.trace_id if run.span.trace_id.strip("0")
                                                   else uuid.uuid4().hex)
            result.state = self._state_of(run, session_id)
            result.pending = list(result.state.pending)
            result.pending_anomaly = run.asked.anomaly if run.asked is not None else None
        run.span.end(
            status=status.value, turns=result.turns, usage=result.usage, cost_usd=result.cost_usd,
            anomalies=len(result.anomalies), final_text=result.final_text,
            unresolved_errors=result.unresolved_errors,
            error=result.error if status is RunStatus.ERROR else None,
            error_type=type(error).__qualname__ if error is not None else None,
            session_id=session_id if run.labels.session_id is None else None,
            loop_cost=result.loop_cost, session_loop_cost=result.session_loop_cost,
            loop_cost_by_type=run.detector.loop_cost_by_type if run.detector is not None else None,
        )
        self._emit(RunFinished(result))
        return result

    def _text_observer(self, turn: int) -> Callable[[str], None] | None:
        """Where a streaming model call hands its text: the observer, as TextStreamed events (None: no one)."""
        if self.on_event is None or not getattr(self._client, "stream", False):
            return None
        return lambda text: self._emit(TextStreamed(turn, text))

    def _emit(self, event: Event) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception as exc:  # an observer's bug must not end someone's run
            log.warning("observer_failed", event_type=type(event).__name__, error=f"{type(exc).__name__}: {exc}")


    # --- pausing and resuming -------------------------------------------------------------------------------------

    def _state_of(self, run: _Run, session_id: str) -> RunState:
        """The paused run as data that resumes it, here or in another process."""
        from looptrace.version import __version__

        labels = run.labels
        paused = run.paused
        usage = run.budget.usage
        return RunState(
            agent=self.name, model=self.model, tools=sorted(self.tools), messages=run.messages,
            turns=run.budget.turns, usage={"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                                           "cache_read_input_tokens": usage.cache_read_input_tokens,
                                           "cache_creation_input_tokens": usage.cache_creation_input_tokens},
            cost_usd=run.budget.cost_usd, running_s=run.budget.running_s(), trace_id=run.span.trace_id,
            span_id=run.span.span_id, session_id=session_id, user_id=labels.user_id, tags=list(labels.tags),
            metadata=dict(labels.metadata) if labels.metadata is not None else None, final_text=run.final_text,
            stop_reason=run.stop_reason, pending=paused.pending if paused else [],
            settled=paused.settled if paused else {}, pending_anomaly=run.asked if paused is None else None,
            anomalies=[dict(a.to_dict()) for a in run.anomalies.values()], nudged=sorted(run.nudged),
            detector_feed=list(run.feed), looptrace_version=__version__,
        )

    def _accepted(self, state: RunState | str | os.PathLike[str] | Mapping[str, Any], approve: Iterable[str],
                  reject: Mapping[str, str] | None, go_on: bool | None, message: str | None) -> _Resumption:
        """The state and decisions of a resume, checked before anything runs; StateError says what does not fit."""
        if isinstance(state, RunState):
            loaded = state
        elif isinstance(state, Mapping):
            loaded = RunState.from_dict(state)
        elif isinstance(state, (str, os.PathLike)):
            loaded = RunState.load(state)
        else:
            raise TypeError(f"resume takes a RunState, a state file's path or its JSON data, "
                            f"not {type(state).__name__}")
        if loaded.resumed or loaded.state_id in self._resumed_states:
            raise StateError(f"run state {loaded.state_id[:12]} was resumed already; a paused run resumes once")
        mine = (self.name, self.model, sorted(self.tools))
        theirs = (loaded.agent, loaded.model, sorted(loaded.tools))
        if mine != theirs:
            raise StateError(f"this run state belongs to agent {loaded.agent!r} (model {loaded.model}, tools "
                             f"{', '.join(theirs[2]) or 'none'}), not to agent {self.name!r} (model {self.model}, "
                             f"tools {', '.join(mine[2]) or 'none'})")
        approved = list(approve)
        rejected = dict(reject or {})
        pending = {p.call_id: p for p in loaded.pending}
        for call_id in [*approved, *rejected]:
            if call_id not in pending:
                waiting = ", ".join(pending) or "none"
                raise StateError(f"call {call_id!r} is not pending in this run state (pending: {waiting})")
        both = set(approved) & set(rejected)
        if both:
            raise StateError(f"call {sorted(both)[0]!r} is both approved and rejected")
        undecided = [p for p in loaded.pending if p.call_id not in approved and p.call_id not in rejected]
        if undecided:
            raise StateError(f"call {undecided[0].call_id!r} ({undecided[0].tool}) waits for a decision: approve "
                             "or reject every pending call")
        if loaded.pending_anomaly is None and (go_on is not None or message is not None):
            raise StateError("no anomaly waits for a decision in this run state: go on / stop do not apply")
        if loaded.pending_anomaly is not None and go_on is None:
            raise StateError(f"the run waits for a decision on a {loaded.pending_anomaly.anomaly.type} anomaly: "
                             "go on (perhaps with a message for the model) or stop")
        if message is not None and not go_on:
            raise StateError("a message for the model goes with going on, not with stopping")
        loaded.claim()
        self._resumed_states.add(loaded.state_id)
        decisions = {call_id: Decision(True) for call_id in approved}
        decisions.update({call_id: Decision(False, reason) for call_id, reason in rejected.items()})
        return _Resumption(loaded, decisions, go_on, message)

    def _release(self, resumption: _Resumption) -> None:
        """A resume that failed before its run began (a required MCP server down, a damaged record) leaves the state
        resumable: the claim on it is taken back."""
        if not resumption.started:
            resumption.state.release()
            self._resumed_states.discard(resumption.state.state_id)

    def _resume_loop(self, resumption: _Resumption,
                     servers: MCPConnections | None = None) -> Generator[_Effect, Any, RunResult]:
        state = resumption.state
        tools, definitions = self._tools_with(servers)
        budget = Budget(self.limits, running_s=state.running_s)
        budget.turns = state.turns
        budget.usage = Usage(**state.usage)
        budget.cost_usd = state.cost_usd
        labels = _Labels(state.session_id, state.user_id, tuple(state.tags), state.metadata)
        messages = list(state.messages)
        run = _Run(
            budget=budget, messages=messages, labels=labels,
            # The run's own detector, fed again what it saw before the pause: its streaks go on where they were.
            detector=None if self._detector_config is None else LoopDetector(self._detector_config),
            facts=None if self._facts_config is None else ToolErrorFacts(self._facts_config),
            span=self._tracing.start_run(
                agent=self.name, model=self.model, task=messages, system=self.system,
                tool_definitions=definitions, session_id=labels.session_id, user_id=labels.user_id,
                tags=labels.tags, metadata=labels.metadata, resumes=(state.trace_id, state.span_id)),
            final_text=state.final_text, stop_reason=state.stop_reason,
            tools=tools, tool_definitions=definitions, servers=servers,
            servers_version=servers.version if servers is not None else 0,
        )
        try:
            _replay(run, state.detector_feed)
            run.anomalies = {a["streak"]: anomaly_from_dict(a) for a in state.anomalies}
        except (KeyError, TypeError, ValueError) as exc:  # a state file edited or damaged where from_dict does not look
            run.span.end(status="error", turns=state.turns, usage=budget.usage, cost_usd=budget.cost_usd, anomalies=0,
                         final_text=None, error=f"the run state's detector record is damaged: {exc!r}",
                         error_type="StateError")
            raise StateError(f"run state {state.state_id[:12]} cannot be resumed: its detector record is damaged "
                             f"({type(exc).__name__}: {exc})") from None
        run.nudged = set(state.nudged)
        resumption.started = True
        return (yield from self._lifecycle(run, self._resumed(run, resumption)))

    def _resumed(self, run: _Run, resumption: _Resumption) -> Generator[_Effect, Any, RunStatus]:
        """The paused run's decisions carried out, then its turns as usual."""
        state = resumption.state
        if state.pending:
            index = state.pending[0].turn
            turn = run.span.start_turn(index)
            if self.on_event is not None:
                self._emit(TurnStarted(index))  # the paused turn, completed
            blocks = [b for b in run.messages[-1].get("content") or []
                      if isinstance(b, dict) and b.get("type") == "tool_use"]
            calls = [self._prepare_call(turn, b, run.tools) for b in blocks if b.get("id") in resumption.decisions]
            waited = max(time.time() - state.paused_at, 0.0)
            for call in calls:
                self._apply_decision(call, resumption.decisions[call.call_id], BY_PERSON, waited)
            try:
                status = yield from self._tool_round(run, turn, index, calls, [b.get("id") or "" for b in blocks],
                                                     state.settled)
            finally:
                turn.end(stop_reason="tool_use")
            if status is not None:
                return status
        elif state.pending_anomaly is not None:
            asked = state.pending_anomaly
            log.info("anomaly_decided", agent=self.name, anomaly_type=asked.anomaly.type,
                     decision="go_on" if resumption.go_on else "stop")
            if not resumption.go_on:
                return RunStatus.STOPPED_BY_DETECTOR
            if resumption.message:
                text = {"type": "text", "text": resumption.message}
                last = run.messages[-1] if run.messages else None
                if last is not None and last.get("role") == "user" and isinstance(last.get("content"), list):
                    run.messages[-1] = {**last, "content": [*last["content"], text]}
                else:
                    run.messages.append({"role": "user", "content": [text]})
            elif asked.at_end:
                return RunStatus(asked.finish_status or RunStatus.DONE.value)
        return (yield from self._turns(run))


class UnknownStopReason(Exception):
    """The API returned a stop_reason this version of looptrace does not know."""


# --- per-run state and the effects the core asks the drivers to perform ---------------------------------------------


@dataclass(slots=True)
class _Pause:
    """A round paused for decisions: the calls that wait, and the tool_results of those that ran."""

    pending: list[PendingCall]
    settled: dict[str, dict[str, Any]]


@dataclass(slots=True)
class _Resumption:
    state: RunState
    decisions: dict[str, Decision]
    go_on: bool | None
    message: str | None
    started: bool = False  # the resumed run began: from here on, however it ends, the state was used


@dataclass(slots=True)
class _Run:
    budget: Budget
    messages: list[dict[str, Any]]
    span: RunTrace
    labels: _Labels
    final_text: str = ""
    stop_reason: str | None = None
    error: BaseException | None = None
    detector: LoopDetector | None = None
    anomalies: dict[str, Anomaly] = field(default_factory=dict)  # streak key -> its latest firing
    nudged: set[str] = field(default_factory=set)  # streak keys already nudged: nudge once, then escalate
    facts: ToolErrorFacts | None = None  # the error ledger alone, when the detector is off
    feed: list[dict[str, Any]] = field(default_factory=list)  # what the detector was fed, for a resumed run's replay
    paused: _Pause | None = None
    asked: PendingAnomaly | None = None  # an anomaly whose policy said "ask"
    loop_budget_spent: bool = False  # a loop passed Limits.max_loop_cost_usd: the stop's status says so
    tools: dict[str, toolkit.Tool] = field(default_factory=dict)  # the agent's own and its MCP servers'
    tool_definitions: list[dict[str, Any]] = field(default_factory=list)
    servers: MCPConnections | None = None
    servers_version: int = 0  # of the servers' tool lists this run's tools were built from

    def unresolved_errors(self) -> list[UnresolvedToolError]:
        """The tool errors standing as the run ends, from the detector's ledger (or the ledger alone)."""
        watcher = self.detector if self.detector is not None else self.facts
        return watcher.unresolved_errors() if watcher is not None else []


@dataclass(frozen=True, slots=True)
class _Labels:
    """What the caller says about a run, for the trace: Langfuse's session, user, tags and metadata."""

    session_id: str | None
    user_id: str | None
    tags: tuple[str, ...]
    metadata: Mapping[str, Any] | None


@dataclass(slots=True)
class _Raised:
    """An effect that raised; sent into the core instead of a value."""

    exc: BaseException


@dataclass(slots=True)
class _Call:
    call_id: str
    name: str
    arguments: Any
    tool: toolkit.Tool | None
    span: ToolTrace
    kwargs: dict[str, Any] | None = None
    value: Any = None
    error: BaseException | None = None
    duration_s: float = 0.0
    result: str = ""  # what the model is sent, once settled
    full_length: int = 0  # of the result before truncation
    is_error: bool = False
    outcome: str = "ok"
    error_type: str | None = None
    waiting: bool = False  # needs a decision no approver gave: the run pauses before it runs

    @property
    def runnable(self) -> bool:
        return self.error is None and self.tool is not None

    def invocation(self) -> tuple[toolkit.Tool, dict[str, Any]]:
        """The tool and its validated arguments, for a runnable call."""
        assert self.tool is not None, "only runnable calls are invoked"
        return self.tool, self.kwargs or {}


class _Effect:
    def perform_sync(self, agent: Agent) -> Any:
        raise NotImplementedError

    async def perform_async(self, agent: Agent) -> Any:
        raise NotImplementedError


@dataclass(slots=True)
class _PrepareModel(_Effect):
    """The model's set-up (an AnthropicModel builds its client, importing the SDK), once a run has started and before
    its first turn: counted on the run, not on the first model call, and waited for no longer than the run's time."""

    timeout_s: float | None

    def perform_sync(self, agent: Agent) -> None:
        prepare_model(agent.client, timeout_s=self.timeout_s)

    async def perform_async(self, agent: Agent) -> None:
        await aprepare_model(agent.client, timeout_s=self.timeout_s)


@dataclass(slots=True)
class _ModelCall(_Effect):
    """The turn's model call, made with the turn current so that the instrumented model opens its chat span there;
    a streaming call hands its text to ``on_text`` as it arrives."""

    params: dict[str, Any]
    turn: TurnTrace
    timeout_s: float | None
    on_text: Callable[[str], None] | None = None

    def perform_sync(self, agent: Agent) -> Any:
        with self.turn.activate(), streamed_text_to(self.on_text):
            return agent._model.create(self.params, timeout=self.timeout_s)

    async def perform_async(self, agent: Agent) -> Any:
        with self.turn.activate(), streamed_text_to(self.on_text):
            return await agent._model.acreate(self.params, timeout=self.timeout_s)


@dataclass(slots=True)
class _ToolRound(_Effect):
    calls: list[_Call]
    budget: Budget

    def perform_sync(self, agent: Agent) -> None:
        for call in self.calls:
            if call.runnable:
                with call.span.activate():
                    _timed(call, functools.partial(toolkit.run_sync, *call.invocation(),
                                                   self.budget.tool_timeout_s()))

    async def perform_async(self, agent: Agent) -> None:
        async def one(call: _Call) -> None:
            started = time.perf_counter()
            with call.span.activate():
                try:
                    call.value = await toolkit.run_async(*call.invocation(), self.budget.tool_timeout_s())
                except (KeyboardInterrupt, asyncio.CancelledError):
                    raise
                except BaseException as exc:
                    call.error = exc
            call.duration_s = time.perf_counter() - started

        await asyncio.gather(*(one(call) for call in self.calls if call.runnable))


@dataclass(slots=True)
class _Gate(_Effect):
    """Whether each call needs approval (its tool's predicate, perhaps async) and, with an approver, its decision.
    Answers (needed, decision or None, seconds waited) per call."""

    calls: list[_Call]
    requests: list[ApprovalRequest]
    approver: Approver | None

    def perform_sync(self, agent: Agent) -> list[tuple[bool, Decision | None, float]]:
        answers: list[tuple[bool, Decision | None, float]] = []
        for call, request in zip(self.calls, self.requests, strict=True):
            needed = _needs_approval(call, approvals.resolve_sync)
            answers.append(_decided(needed, self.approver, request, approvals.resolve_sync))
        return answers

    async def perform_async(self, agent: Agent) -> list[tuple[bool, Decision | None, float]]:
        answers: list[tuple[bool, Decision | None, float]] = []
        for call, request in zip(self.calls, self.requests, strict=True):
            needed = await _needs_approval_async(call)
            if not needed or self.approver is None:
                answers.append((needed, None, 0.0))
                continue
            started = time.perf_counter()
            decision: Decision | None
            try:
                decision = approvals.as_decision(await approvals.resolve_async(self.approver(request)))
            except Exception as exc:
                decision = _approver_failed(call, exc)
            answers.append((True, decision, time.perf_counter() - started))
        return answers


def _needs_approval(call: _Call, resolve: Callable[[Any], Any]) -> bool:
    """The tool's answer for this call; a predicate that fails holds the call for a decision (fail closed)."""
    rule = call.tool.needs_approval if call.tool is not None else False
    if isinstance(rule, bool):
        return rule
    try:
        return bool(resolve(rule(call.kwargs or {})))
    except Exception as exc:
        return _predicate_failed(call, exc)


async def _needs_approval_async(call: _Call) -> bool:
    rule = call.tool.needs_approval if call.tool is not None else False
    if isinstance(rule, bool):
        return rule
    try:
        return bool(await approvals.resolve_async(rule(call.kwargs or {})))
    except Exception as exc:
        return _predicate_failed(call, exc)


def _predicate_failed(call: _Call, exc: Exception) -> bool:
    log.warning("approval_predicate_failed", tool=call.name, call_id=call.call_id, error=toolkit.error_text(exc),
                hint="the call waits for a decision, as if the predicate had said it needs one")
    return True


def _decided(needed: bool, approver: Approver | None, request: ApprovalRequest,
             resolve: Callable[[Any], Any]) -> tuple[bool, Decision | None, float]:
    if not needed or approver is None:
        return needed, None, 0.0
    started = time.perf_counter()
    decision: Decision | None
    try:
        decision = approvals.as_decision(resolve(approver(request)))
    except Exception as exc:  # an approver's bug rejects the call: a call nobody approved does not run
        decision = _approver_failed(request, exc)
    return True, decision, time.perf_counter() - started


def _approver_failed(where: Any, exc: Exception) -> Decision:
    text = toolkit.error_text(exc)
    log.warning("approver_failed", call_id=getattr(where, "call_id", None), error=text,
                hint="the call was rejected: a call nobody approved does not run")
    return Decision(False, f"the approver failed ({text})")


def _replay(run: _Run, feed: list[dict[str, Any]]) -> None:
    """Feed a resumed run's detector (or error ledger) what the paused run's saw, in order: its streaks, cycles and
    standing errors continue. What the replay fires was reported before the pause, and is not reported again."""
    watcher = run.detector if run.detector is not None else run.facts
    if watcher is None:
        return
    for entry in feed:
        call = entry.get("call")
        usage = entry.get("usage")
        if isinstance(usage, Mapping):
            if run.detector is not None:
                run.detector.record_usage(int(usage["turn"]), _turn_usage(usage))
        elif isinstance(call, Mapping):
            watcher.observe(ToolCall(turn=int(call["turn"]), tool=str(call["tool"]), arguments=call.get("arguments"),
                                     call_id=call.get("call_id"), is_error=bool(call.get("is_error")),
                                     result=call.get("result")))
        elif "end_turn" in entry and run.detector is not None:
            text = entry.get("text")
            if text is None:
                run.detector.end_turn(int(entry["end_turn"]))
            else:
                run.detector.end_turn(int(entry["end_turn"]), text)
        run.feed.append(entry)


def _turn_usage(entry: Mapping[str, Any]) -> TurnUsage:
    """A model call's usage as the detector takes it, from the entry the run's feed keeps."""
    return TurnUsage(input_tokens=int(entry["input_tokens"]), output_tokens=int(entry["output_tokens"]),
                     usd=entry.get("usd"), unpriced=entry.get("unpriced"), started=entry.get("started"),
                     ended=entry.get("ended"))


def _timed(call: _Call, work: Callable[[], Any]) -> None:
    started = time.perf_counter()
    try:
        call.value = work()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        call.error = exc
    call.duration_s = time.perf_counter() - started


# --- small pure helpers -------------------------------------------------------------------------------------------


def _detected(turn: TurnTrace, detector: LoopDetector, check: Callable[..., list[Anomaly]],
              *args: Any) -> list[Anomaly]:
    """A detector check, made with the turn current: a judge it asks opens its span under the turn. Without a judge
    nothing opens a span, so the check runs as it is (making the turn current costs a context switch per check)."""
    if detector.config.judge is None:
        return check(*args)
    with turn.activate():
        return check(*args)


def _as_model(client: Any) -> Model:
    if client is None:
        return AnthropicModel()
    if hasattr(client, "create") and hasattr(client, "acreate"):
        return client
    if hasattr(client, "messages"):  # an anthropic.Anthropic or AsyncAnthropic instance
        # The SDK decorates create(): only the function underneath says whether it is a coroutine.
        create = getattr(client.messages, "create", None)
        is_async = create is not None and inspect.iscoroutinefunction(inspect.unwrap(create))
        return AnthropicModel(async_client=client) if is_async else AnthropicModel(client=client)
    raise TypeError(f"client must be an anthropic client or a Model, got {type(client).__name__}")


def _text_of(content: list[Any]) -> str:
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def _tool_calls_of(content: list[Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((b.get("name", ""), b.get("input")) for b in content
                 if isinstance(b, dict) and b.get("type") == "tool_use")


def _not_run(content: list[Any], limit: RunStatus) -> list[dict[str, Any]]:
    """is_error results for tool calls the run stopped before making, so the history stays valid to continue."""
    return [{"type": "tool_result", "tool_use_id": block.get("id", ""), "is_error": True,
             "content": f"(not run: the run stopped on its {limit.value} limit)"}
            for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]


MIN_THINKING_BUDGET = 1024  # the Messages API's floor for thinking.budget_tokens


def _lower_max_tokens(params: dict[str, Any], max_tokens: int) -> None:
    """Ask for at most ``max_tokens``. Extended thinking must stay below max_tokens and above its own floor: it is
    shrunk to fit, or switched off for this request when even the floor no longer fits."""
    params["max_tokens"] = max_tokens
    thinking = params.get("thinking")
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int) and budget >= max_tokens:
        if max_tokens - 1 >= MIN_THINKING_BUDGET:
            params["thinking"] = {**thinking, "budget_tokens": max_tokens - 1}
        else:
            params["thinking"] = {"type": "disabled"}


def _hint_for(exc: BaseException) -> str:
    """What to try for a failed model call, from the error's kind (the anthropic SDK's exception names)."""
    kind = type(exc).__name__
    text = str(exc)
    if kind == "AuthenticationError" or "authentication" in text.lower() or "api_key" in text:
        return "set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN), or pass client=anthropic.Anthropic(api_key=...)"
    if kind in ("APIConnectionError", "APITimeoutError", "ModelCallTimeout"):
        return "is ANTHROPIC_BASE_URL reachable? the run's timeout_s bounds each call"
    if kind in ("NotFoundError", "BadRequestError"):
        return "check the model name and the request parameters"
    return "RunResult.error has the whole message"


def _where(exc: BaseException) -> str:
    """file:line where an exception was raised, for a report that has no room for a traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "" if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def _truncate_result(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return (f"{text[:limit]}\n[looptrace: the result was {len(text):,} characters; only the first {limit:,} are "
            f"shown. Ask for less, e.g. a narrower query or a page of the result.]")
