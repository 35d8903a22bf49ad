"""The loop's core: one run as a generator of effects, the same for run() and arun(), run() and resume().

A run is observe, reason, act, write back: the core builds each turn's request, yields the model call
(``effects.ModelCall``) and receives the answer, yields the round of tool calls the model asked for
(``effects.ToolRound``, after the approval gate, ``effects.Gate``) and writes the results back, until a stop reason,
a limit or the detector ends the run. It performs no I/O itself: `Agent`'s drivers perform each effect, blocking or in
asyncio, and send the outcome back in. What a turn means for telemetry and the detector is the run's monitor's
(``monitor.RunMonitor``, which the framework guards use too); a paused run's state is ``resume``'s.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from looptrace.instrumentation.detector import DetectorConfig, LoopDetector, SessionDetectors
from looptrace.instrumentation.interface import AgentTelemetry, AnsweringModel, RunTrace, Usage, log
from looptrace.runtime import conversation, resume
from looptrace.runtime import policy as policies
from looptrace.runtime import tools as toolkit
from looptrace.runtime.approvals import BY_APPROVER, BY_PERSON, ApprovalRequest, Approver, PendingCall
from looptrace.runtime.effects import Effect, Gate, ModelCall, Outcome, PrepareModel, Raised, ToolRound
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
from looptrace.runtime.models import Model
from looptrace.runtime.monitor import Reaction, RunMonitor
from looptrace.runtime.pricing import Pricing
from looptrace.runtime.request import hint_for, model_request
from looptrace.runtime.result import STATUS_FOR_STOP_REASON, RunResult, RunStatus
from looptrace.runtime.run import Labels, Pause, Run
from looptrace.runtime.state import PendingAnomaly, RunState, StateError, anomaly_from_dict
from looptrace.runtime.tool_calls import ToolCallRun, plan_calls, tool_use_blocks

if TYPE_CHECKING:
    from looptrace.runtime.mcp_sessions import RunServers

__all__ = ["AgentLoop", "RunInterrupted", "UnknownStopReason"]

_Steps: TypeAlias = "Generator[Effect, Outcome, RunStatus | None]"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run. Raised after the run's spans were ended and flushed; ``result`` holds the partial run."""

    def __init__(self, result: RunResult) -> None:
        super().__init__("run interrupted")
        self.result = result


class UnknownStopReason(Exception):
    """The API returned a stop_reason this version of looptrace does not know."""


class AgentLoop:
    """The core an `Agent` drives (see the module's note). It reads the agent's configuration, set by ``Agent``."""

    model: str
    name: str
    system: str | None
    limits: Limits
    max_tokens: int
    model_params: dict[str, Any]
    max_tool_result_chars: int
    tools: dict[str, toolkit.Tool]
    on_event: Callable[[Event], None] | None
    approver: Approver | None
    policy: policies.AnomalyPolicy
    _client: Model  # the agent's client, as given
    _model: AnsweringModel  # the agent's client, instrumented: each answer comes with its usage and cost
    _pricing: Pricing
    _tracing: AgentTelemetry
    _detector_config: DetectorConfig | None
    _facts_config: DetectorConfig | None
    _sessions: SessionDetectors
    _tool_definitions: list[dict[str, Any]]

    def _loop(self, task: str | list[dict[str, Any]], labels: Labels,
              servers: RunServers | None = None) -> Generator[Effect, Outcome, RunResult]:
        messages = [{"role": "user", "content": task}] if isinstance(task, str) else list(task)
        config = self._detector_config
        detector = None if config is None else (
            self._sessions.detector_for(labels.session_id) if labels.session_id else LoopDetector(config))
        ran_s = servers.waited_s if servers is not None else 0.0  # connecting them counted on the run's clock
        run = self._new_run(Budget(self.limits, running_s=ran_s), messages, labels, servers, detector, task=task)
        return (yield from self._lifecycle(run, self._turns(run)))

    def _new_run(self, budget: Budget, messages: list[dict[str, Any]], labels: Labels,
                 servers: RunServers | None, detector: LoopDetector | None, *,
                 task: str | list[dict[str, Any]], resumes: tuple[str, str] | None = None) -> Run:
        tools, definitions = self._tools_with(servers)
        trace = self._tracing.start_run(
            agent=self.name, model=self.model, task=task if isinstance(task, str) else messages, system=self.system,
            tool_definitions=definitions, session_id=labels.session_id, user_id=labels.user_id, tags=labels.tags,
            metadata=labels.metadata, resumes=resumes)
        monitor = RunMonitor(trace, self.policy, detector=detector, facts_config=self._facts_config,
                             max_loop_cost_usd=self.limits.max_loop_cost_usd)
        return Run(budget=budget, messages=messages, monitor=monitor, labels=labels, tools=tools,
                   tool_definitions=definitions, servers=servers,
                   servers_version=servers.version if servers is not None else 0)

    def _turns(self, run: Run) -> Generator[Effect, Outcome, RunStatus]:
        # The client's set-up is the run's time, before the first turn's spans (and bounded by the run's clock).
        prepared = yield PrepareModel(self._client, run.budget.remaining_s())
        if isinstance(prepared, Raised):
            raise prepared.exc  # Ctrl-C: a failed set-up is met again, and reported, by the model call itself
        while True:
            if run.budget.turns >= (self.limits.max_turns or float("inf")):
                return RunStatus.MAX_TURNS
            if run.budget.timed_out():
                return RunStatus.TIMEOUT
            status = yield from self._turn(run)
            if status is not None:
                return status

    def _lifecycle(self, run: Run,
                   steps: Generator[Effect, Outcome, RunStatus]) -> Generator[Effect, Outcome, RunResult]:
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

    def _turn(self, run: Run) -> _Steps:
        """One model call and whatever it asks for. Returns the run's status when this turn ends the run."""
        index = run.budget.turns + 1
        turn = run.monitor.start_turn(index)
        self._emit(TurnStarted(index))
        if run.servers is not None and run.servers.version != run.servers_version:  # a server's tool list changed
            run.servers_version = run.servers.version
            run.tools, run.tool_definitions = self._tools_with(run.servers)
        params = model_request(model=self.model, max_tokens=self.max_tokens, model_params=self.model_params,
                               system=self.system, tool_definitions=run.tool_definitions, messages=run.messages,
                               output_tokens_left=run.budget.output_tokens_left(self._pricing.output_usd_per_token))
        started, wall_started = time.perf_counter(), time.time()
        outcome = yield ModelCall(self._model, params, turn, run.budget.remaining_s(), self._text_observer(index))
        if isinstance(outcome, Raised):  # the instrumented model already ended its chat span with the error
            run.monitor.end_turn(None)
            return self._model_call_failed(run, index, outcome.exc)
        assert isinstance(outcome, tuple), "a model call is answered with an Answer (response, usage, cost)"
        response, usage, cost = outcome
        run.budget.turns = index
        run.budget.charge(usage, cost)
        run.monitor.model_called(usage, cost, model=self.model, started=wall_started, ended=time.time())
        content = response.get("content") or []
        run.messages.append({"role": "assistant", "content": content})
        stop_reason = run.stop_reason = response.get("stop_reason")
        run.final_text = conversation.text_of(content)
        if self.on_event is not None:
            self._emit(ModelResponded(index, stop_reason, usage, run.final_text, conversation.tool_calls_of(content),
                                      time.perf_counter() - started))
        # Budgets first, as the seed loop does: a turn that crossed one ends the run even if it also said end_turn.
        spent = run.budget.spent()
        try:
            if spent is not None:
                if stop_reason == "tool_use":  # the history stays one a caller can send again
                    run.messages.append({"role": "user", "content": conversation.not_run(content, spent.value)})
                return spent
            return (yield from self._act(run, index, content, stop_reason))
        finally:
            run.monitor.end_turn(stop_reason)

    def _model_call_failed(self, run: Run, index: int, exc: BaseException) -> RunStatus:
        if not isinstance(exc, Exception):
            raise exc
        run.error = exc
        status = RunStatus.TIMEOUT if run.budget.timed_out() else RunStatus.ERROR
        # Said where a library user sees it (the `looptrace` logger), not only in the RunResult they may not read.
        log.warning("model_call_failed", agent=self.name, turn=index, status=status.value,
                    error=toolkit.error_text(exc), hint=hint_for(exc))
        return status

    def _act(self, run: Run, index: int, content: list[Any], stop_reason: str | None) -> _Steps:
        """What the response asks for: tools to run, a paused turn to resume, or the end of the run."""
        if stop_reason == "tool_use":
            blocks = tool_use_blocks(content)
            early = self._reported(run, run.monitor.before_calls(
                [(block.get("name") or "", block.get("input")) for block in blocks], turns_left=self._turns_left(run)))
            if early.stop is not None:  # stopped before the repeat was made (no span: it never ran)
                run.messages.append({"role": "user", "content": conversation.not_run(
                    content, "", why="the loop detector stopped the run before this repeated call")})
                return RunStatus.STOPPED_BY_DETECTOR
            if not blocks:
                # tool_use with no tool_use block: nothing can answer it, so say so rather than send an empty message.
                run.messages.append({"role": "user", "content": [
                    {"type": "text", "text": "(no tool_use block was found in the previous response)"}]})
                return None
            calls = plan_calls(run.monitor, blocks, run.tools)
            yield from self._gate(run, index, calls)
            return (yield from self._tool_round(run, calls, [c.call_id for c in calls], {}, early.nudges))
        if stop_reason == "pause_turn":  # a server tool paused: the response goes back as it is
            reaction = self._reported(run, run.monitor.judge_turn(turns_left=self._turns_left(run)))
            if reaction.stop is not None:
                return RunStatus.STOPPED_BY_DETECTOR
            return RunStatus.AWAITING_APPROVAL if run.asked is not None else None
        status = STATUS_FOR_STOP_REASON.get(stop_reason) if stop_reason is not None else None
        if status is None or stop_reason is None:
            run.error = UnknownStopReason(f"the model stopped with an unknown stop_reason {stop_reason!r}")
            return RunStatus.ERROR
        return self._check_finish(run, stop_reason, status)

    def _check_finish(self, run: Run, stop_reason: str, status: RunStatus) -> RunStatus | None:
        """The model says it is finished: the moment to look for errors it never dealt with."""
        reaction = self._reported(run, run.monitor.judge_run(stop_reason, run.final_text,
                                                              turns_left=self._turns_left(run)))
        if reaction.stop is not None:
            return RunStatus.STOPPED_BY_DETECTOR
        if run.asked is not None:  # a person decides whether the run ends here, or goes on with their message
            run.asked = PendingAnomaly(run.asked.anomaly, at_end=True, finish_status=status.value)
            run.messages.extend(conversation.nudges(reaction.nudges))
            return RunStatus.AWAITING_APPROVAL
        if reaction.nudges and status is RunStatus.DONE:
            run.messages.extend(conversation.nudges(reaction.nudges))
            return None  # one more turn, for the model to answer the nudge
        return status

    def _tool_round(self, run: Run, calls: list[ToolCallRun], order: list[str], settled: dict[str, dict[str, Any]],
                    early_nudges: Sequence[str] = ()) -> _Steps:
        """Run the turn's calls that may run, and write back one tool_result per tool_use block in ``order`` (the
        blocks' call ids; ``settled`` holds the results of those a paused round already ran), then any nudges
        (``early_nudges``: those the detector gave before the calls ran).

        A call still waiting for a decision pauses the run once the others have run. Returns the run's status when
        this round ends it (stopped or paused), else None."""
        ready = [call for call in calls if not call.waiting]
        outcome = yield ToolRound(ready, run.budget)
        if isinstance(outcome, Raised):  # interrupted mid-tool: close the spans of the calls, then let it through
            for call in calls:
                call.interrupted()
            raise outcome.exc
        settled = {**settled, **{call.call_id: self._settled(run, call) for call in ready}}
        waiting = [call for call in calls if call.waiting]
        if waiting:  # the turn stays open: its verdict is given when the round completes, after the pause
            _pause(run, ready, waiting, settled)
            return RunStatus.AWAITING_APPROVAL
        results = [settled[call_id] for call_id in order]
        # With what the model said beside its calls: the user sees it, and it may already report a failure.
        reaction = self._reported(run, run.monitor.judge_turn(run.final_text, [call.trace for call in calls],
                                                               turns_left=self._turns_left(run)))
        results.extend({"type": "text", "text": text} for text in [*early_nudges, *reaction.nudges])
        run.messages.append({"role": "user", "content": results})
        if reaction.stop is not None:
            return RunStatus.STOPPED_BY_DETECTOR
        return RunStatus.AWAITING_APPROVAL if run.asked is not None else None

    def _settled(self, run: Run, call: ToolCallRun) -> dict[str, Any]:
        """The tool_result of a call that came back; the monitor (and through it the detector) sees it as the model
        will, redacted."""
        block = call.settle(self.max_tool_result_chars)
        run.monitor.call_settled(call.view)
        view = call.view
        if self.on_event is not None:
            self._emit(ToolFinished(run.monitor.turn_index, view.call_id, view.name, view.arguments, view.result or "",
                                    view.is_error, view.outcome, view.duration_s))
        return block

    def _gate(self, run: Run, index: int, calls: list[ToolCallRun]) -> Generator[Effect, Outcome, None]:
        """Which calls need approval (their tool's ``needs_approval``), and the approver's decision on each. A call
        needing approval with no approver waits: the run pauses after the others ran."""
        candidates = [call for call in calls if call.runnable and call.tool is not None
                      and call.tool.needs_approval is not False]
        if not candidates:
            return
        requests = [ApprovalRequest(tool=c.tool, arguments=dict(c.arguments) if isinstance(c.arguments, Mapping)
                                    else {}, call_id=c.call_id, turn=index, agent=self.name,
                                    trace_id=run.monitor.trace.trace_id, session_id=run.labels.session_id)
                    for c in candidates if c.tool is not None]
        outcome = yield Gate(candidates, requests, self.approver)
        if isinstance(outcome, Raised):  # Ctrl-C at an approval prompt: close the turn's spans, then let it through
            for call in calls:
                call.interrupted()
            raise outcome.exc
        assert isinstance(outcome, list), "a gate is answered with a GateAnswer per call"
        for call, (needed, decision, waited) in zip(candidates, outcome, strict=True):
            if not needed:
                continue
            if decision is None:
                call.waiting = True
            else:
                run.budget.exclude(waited)  # the time it waited for a decision is not the run's running time
                call.decided(decision, BY_APPROVER, waited)

    def _reported(self, run: Run, reaction: Reaction) -> Reaction:
        """What the loop keeps of a reaction beyond its nudges and stop: an event per report, and the first anomaly a
        person must decide on."""
        for anomaly, action in reaction.reports:
            self._emit(AnomalyDetected(anomaly, action))
        if reaction.asks and run.asked is None:
            run.asked = PendingAnomaly(reaction.asks[0], at_end=False)
        return reaction

    def _text_observer(self, turn: int) -> Callable[[str], None] | None:
        """Where a streaming model call hands its text: the observer, as TextStreamed events (None: no one)."""
        if self.on_event is None or not getattr(self._client, "stream", False):
            return None
        return lambda text: self._emit(TextStreamed(turn, text))

    def _turns_left(self, run: Run) -> bool:
        return self.limits.max_turns is None or run.budget.turns < self.limits.max_turns

    def _tools_with(self, servers: RunServers | None) -> tuple[dict[str, toolkit.Tool], list[dict[str, Any]]]:
        """The run's tools and their definitions: the agent's own, then its MCP servers' (which yield on a clash)."""
        if servers is None:
            return self.tools, self._tool_definitions
        return servers.tools_with(self.tools)

    def _finish(self, run: Run, status: RunStatus, *, error: BaseException | None = None) -> RunResult:
        monitor = run.monitor
        if status is RunStatus.STOPPED_BY_DETECTOR and monitor.loop_budget_spent:
            status = RunStatus.LOOP_BUDGET
        error = error if error is not None else run.error
        result = RunResult(
            status=status, turns=run.budget.turns, final_text=run.final_text, usage=run.budget.usage,
            cost_usd=run.budget.cost_usd, trace_id=monitor.trace.trace_id, messages=run.messages,
            anomalies=list(monitor.anomalies.values()), stop_reason=run.stop_reason, trace_url=monitor.trace.trace_url,
            error=_error_text(error) if status in (RunStatus.ERROR, RunStatus.TIMEOUT, RunStatus.INTERRUPTED) else None,
            unresolved_errors=monitor.unresolved_errors(), judge=monitor.judge_summary, loop_cost=monitor.loop_cost,
            session_loop_cost=monitor.session_loop_cost if run.labels.session_id else None)
        joins_session = None
        if status is RunStatus.AWAITING_APPROVAL:
            result.state = self._paused_state(run)
            result.pending = list(result.state.pending)
            result.pending_anomaly = run.asked.anomaly if run.asked is not None else None
            if run.labels.session_id is None:
                joins_session = result.state.session_id  # the run that resumes it continues in that session
        monitor.finish(status=status.value, turns=result.turns, usage=result.usage, cost_usd=result.cost_usd,
                       final_text=result.final_text, error=result.error if status is RunStatus.ERROR else None,
                       error_type=type(error).__qualname__ if error is not None else None,
                       unresolved_errors=result.unresolved_errors, session_id=joins_session,
                       in_session=run.labels.session_id is not None)
        self._emit(RunFinished(result))
        return result

    def _emit(self, event: Event) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception as exc:  # an observer's bug must not end someone's run
            log.warning("observer_failed", event_type=type(event).__name__, error=f"{type(exc).__name__}: {exc}")

    # --- pausing and resuming ---------------------------------------------------------------------------------

    @property
    def _identity(self) -> resume.AgentIdentity:
        return resume.AgentIdentity(self.name, self.model, tuple(sorted(self.tools)))

    def _paused_state(self, run: Run) -> RunState:
        """The paused run as data. A paused run without a session gets one, so that it and the run that resumes it
        share it."""
        from looptrace.version import __version__

        trace_id = run.monitor.trace.trace_id
        session_id = run.labels.session_id or (trace_id if trace_id.strip("0") else uuid.uuid4().hex)
        return resume.state_of(run, self._identity, session_id, __version__)

    def _resume_loop(self, resumption: resume.Resumption,
                     servers: RunServers | None = None) -> Generator[Effect, Outcome, RunResult]:
        state = resumption.state
        budget = Budget(self.limits, running_s=state.running_s + (servers.waited_s if servers is not None else 0.0))
        budget.turns, budget.usage, budget.cost_usd = state.turns, Usage(**state.usage), state.cost_usd
        labels = Labels(state.session_id, state.user_id, tuple(state.tags), state.metadata)
        # The run's own detector, fed again what it saw before the pause: its streaks go on where they were.
        config = self._detector_config
        run = self._new_run(budget, list(state.messages), labels, servers,
                            None if config is None else LoopDetector(config), task=list(state.messages),
                            resumes=(state.trace_id, state.span_id))
        run.final_text, run.stop_reason = state.final_text, state.stop_reason
        try:
            run.monitor.replay(state.detector_feed)
            run.monitor.anomalies = {a["streak"]: anomaly_from_dict(a) for a in state.anomalies}
        except (KeyError, TypeError, ValueError) as exc:  # a state file edited or damaged where from_dict does not look
            _end_damaged(run.monitor.trace, state, budget, exc)
            raise StateError(f"run state {state.state_id[:12]} cannot be resumed: its detector record is damaged "
                             f"({type(exc).__name__}: {exc})") from None
        run.monitor.nudged = set(state.nudged)
        resumption.started = True
        return (yield from self._lifecycle(run, self._resumed(run, resumption)))

    def _resumed(self, run: Run, resumption: resume.Resumption) -> Generator[Effect, Outcome, RunStatus]:
        """The paused run's decisions carried out, then its turns as usual."""
        state = resumption.state
        if state.pending:
            status = yield from self._decided_round(run, resumption)
            if status is not None:
                return status
        elif state.pending_anomaly is not None:
            asked = state.pending_anomaly
            log.info("anomaly_decided", agent=self.name, anomaly_type=asked.anomaly.type,
                     decision="go_on" if resumption.go_on else "stop")
            if not resumption.go_on:
                return RunStatus.STOPPED_BY_DETECTOR
            if resumption.message:
                conversation.add_user_text(run.messages, resumption.message)
            elif asked.at_end:
                return RunStatus(asked.finish_status or RunStatus.DONE.value)
        return (yield from self._turns(run))

    def _decided_round(self, run: Run, resumption: resume.Resumption) -> _Steps:
        """The paused turn, completed: the decided calls run (or are rejected) beside the results that ran before."""
        state = resumption.state
        index = state.pending[0].turn
        run.monitor.start_turn(index)
        self._emit(TurnStarted(index))
        blocks = tool_use_blocks(run.messages[-1].get("content") or [])
        calls = plan_calls(run.monitor, [b for b in blocks if b.get("id") in resumption.decisions], run.tools)
        waited = max(time.time() - state.paused_at, 0.0)
        for call in calls:
            call.decided(resumption.decisions[call.call_id], BY_PERSON, waited)
        try:
            return (yield from self._tool_round(run, calls, [b.get("id") or "" for b in blocks], state.settled))
        finally:
            run.monitor.end_turn("tool_use")

# --- small helpers ------------------------------------------------------------------------------------------------


def _pause(run: Run, ready: list[ToolCallRun], waiting: list[ToolCallRun], settled: dict[str, dict[str, Any]]) -> None:
    """A round that waits for decisions: the calls that ran end their spans, the waiting ones end theirs as pending,
    and the run keeps what a resume needs."""
    for call in ready:
        call.trace.end()
    for call in waiting:
        call.trace.approval(decision="pending")
        call.view.settle("(awaiting approval)", is_error=False, outcome="awaiting_approval")
        call.trace.end()
    run.paused = Pause([PendingCall(c.call_id, c.name, c.view.arguments, run.monitor.turn_index) for c in waiting],
                       settled)


def _end_damaged(trace: RunTrace, state: RunState, budget: Budget, exc: BaseException) -> None:
    """The trace of a resume whose state turned out damaged ends, saying so."""
    trace.end(status="error", turns=state.turns, usage=budget.usage, cost_usd=budget.cost_usd, anomalies=0,
              final_text=None, error=f"the run state's detector record is damaged: {exc!r}", error_type="StateError")


def _error_text(error: BaseException | None) -> str | None:
    if error is None:
        return None
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _where(exc: BaseException) -> str:
    """file:line where an exception was raised, for a report that has no room for a traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "" if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
