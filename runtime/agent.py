"""`Agent`: an agent's configuration, and the two drivers of its loop.

The loop is written once (``loop.AgentLoop``), as a generator that *describes* each model call and each round of tool
calls (``effects``) and receives their outcomes. `Agent.run` and `Agent.arun` are two thin drivers that perform those
effects, one blocking and one with asyncio; every rule about stop reasons, budgets and tool results lives in the
shared core, so the two can never drift apart (the shape of httpx's clients over one I/O-free base). ``resume`` and
``aresume`` drive the same core from a paused run's state.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from looptrace.instrumentation.agent_telemetry import agent_telemetry
from looptrace.instrumentation.detector import DetectorConfig, SessionDetectors
from looptrace.instrumentation.interface import AgentTelemetry, Alerts, AnsweringModel, Settings
from looptrace.runtime import policy as policies
from looptrace.runtime import tools as toolkit
from looptrace.runtime.approvals import Approver
from looptrace.runtime.effects import Effect, Raised
from looptrace.runtime.events import Event
from looptrace.runtime.judge import judged_config
from looptrace.runtime.limits import Limits
from looptrace.runtime.loop import AgentLoop, RunInterrupted, UnknownStopReason
from looptrace.runtime.models import AnthropicModel, Model
from looptrace.runtime.pricing import DEFAULT_PRICES, Price, Pricing
from looptrace.runtime.result import RunResult
from looptrace.runtime.resume import Resumption, accept
from looptrace.runtime.resume_claims import claims_directory
from looptrace.runtime.run import Labels
from looptrace.runtime.state import RunState

if TYPE_CHECKING:
    from looptrace.instrumentation.agent_telemetry import Telemetry
    from looptrace.runtime.mcp_servers import MCPServer
    from looptrace.runtime.mcp_sessions import MCPSessions, RunServers

__all__ = ["DEFAULT_MAX_RESULT_CHARS", "DEFAULT_MAX_TOKENS", "Agent", "RunInterrupted", "UnknownStopReason"]

DEFAULT_MAX_TOKENS = 4096
DEFAULT_MAX_RESULT_CHARS = 100_000

# What a driver starts once the run's MCP servers are connected: the core's generator, given those connections.
_Start: TypeAlias = "Callable[[RunServers | None], Generator[Effect, Any, RunResult]]"


class Agent(AgentLoop):
    """An LLM agent on the Anthropic Messages API, traced by construction.

    >>> agent = Agent(model="claude-sonnet-5-5", tools=[search], limits=Limits(max_turns=10))
    >>> result = agent.run("Find the cheapest flight to Osaka")

    Every option is described in docs/python-api.md. In brief: ``tools`` (``@tool`` functions) and ``mcp_servers``;
    ``limits``; ``client`` (an anthropic client, a ``Model`` such as ``ScriptedModel``); ``prices`` for the cost
    limits; ``on_event`` to watch a run live; ``on_anomaly`` and ``detector`` for the loop detector; ``approver`` for
    the calls that need a person's decision; ``telemetry`` (what ``configure()`` returned), or the providers,
    ``capture_content``, ``alerts`` and ``settings`` it would otherwise be built from.
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
        self.model, self.name, self.system = model, name, system
        self.limits = limits or Limits()
        self.max_tokens, self.max_tool_result_chars = max_tokens, max_tool_result_chars
        self.model_params = dict(model_params or {})
        self.tools = toolkit.as_tools(tools)
        # Connected per run, or held across runs by `with agent:` (see mcp_sessions): their tools join these.
        self.mcp_servers = _checked_servers(mcp_servers)
        self.on_event = on_event
        self.approver = approver  # decides, in process, each call needing approval; without one the run pauses
        self.policy = policies.AnomalyPolicy(on_anomaly)
        self._prices = DEFAULT_PRICES if prices is None else prices
        self._pricing = Pricing(model, self._prices)
        self._pricing.check(max_cost_usd=self.limits.max_cost_usd, max_loop_cost_usd=self.limits.max_loop_cost_usd,
                            detector_on=detector is not False)
        # The one door to telemetry: spans, metrics, every anomaly sink and the trace link, from what configure()
        # returned when it is handed over, else from the settings (the environment's, read once here, when none).
        self._tracing = agent_telemetry(telemetry, tracer_provider=tracer_provider, meter_provider=meter_provider,
                                        capture_content=capture_content, alerts=alerts, settings=settings)
        self.client = _as_model(client)  # wrapped by the telemetry: the loop opens no chat span itself
        self._detector_config = judged_config(detector, telemetry=self._tracing, client=self.client,
                                              prices=self._prices)
        self._sessions = SessionDetectors(self._detector_config)  # runs sharing a session_id share detector memory
        # With the detector off, the error ledger alone records each run's unresolved tool errors.
        self._facts_config = None if self._detector_config is not None else DetectorConfig(
            capture_content=self._tracing.captures_content)
        self._tool_definitions = [t.definition() for t in self.tools.values()]
        self._resumed_states: set[str] = set()  # ids of the states this agent resumed: each resumes once
        self._mcp = _sessions(self.mcp_servers, self._tracing, call_timeout_s=self.limits.tool_timeout_s)

    @property
    def client(self) -> Model:
        """The model the agent calls (an AnthropicModel, a ScriptedModel, your own). Assignable."""
        return self._client

    @client.setter
    def client(self, model: Model) -> None:
        self._client = model
        self._model: AnsweringModel = self._tracing.instrument(model, cost_of=self._pricing.cost_of)

    # --- MCP servers held across runs ------------------------------------------------------------------------------

    def __enter__(self) -> Agent:
        """``with agent:`` connects the agent's MCP servers once, for every run and resume inside the block."""
        if self._mcp is not None:
            self._mcp.hold()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._mcp is not None:
            self._mcp.release()

    async def __aenter__(self) -> Agent:
        """``async with agent:``, the same in asyncio."""
        if self._mcp is not None:
            await self._mcp.ahold()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._mcp is not None:
            await self._mcp.arelease()

    def close(self) -> None:
        """Close the MCP servers this agent holds (stopping the processes it started). Later runs connect per run."""
        if self._mcp is not None:
            self._mcp.close()

    async def aclose(self) -> None:
        """``close`` in asyncio."""
        if self._mcp is not None:
            await self._mcp.aclose()

    # --- drivers ---------------------------------------------------------------------------------------------------

    def run(self, task: str | list[dict[str, Any]], *, session_id: str | None = None, user_id: str | None = None,
            tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> RunResult:
        """Run to completion on this thread. Ctrl-C ends the run's spans, then raises RunInterrupted.

        ``task`` is the user's request, or a whole message history to continue. ``session_id``, ``user_id``, ``tags``
        and ``metadata`` label the trace (Langfuse's trace attributes, on every span of the run).
        """
        labels = Labels(session_id, user_id, tuple(tags), metadata)
        return self._drive_sync(lambda servers: self._loop(task, labels, servers))

    async def arun(self, task: str | list[dict[str, Any]], *, session_id: str | None = None,
                   user_id: str | None = None, tags: Iterable[str] = (),
                   metadata: Mapping[str, Any] | None = None) -> RunResult:
        """Run to completion in asyncio; parallel tool calls of one turn run concurrently. Arguments as for run()."""
        labels = Labels(session_id, user_id, tuple(tags), metadata)
        return await self._drive_async(lambda servers: self._loop(task, labels, servers))

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
            return self._drive_sync(lambda servers: self._resume_loop(resumption, servers),
                                    ran_s=resumption.state.running_s)
        except BaseException:
            resumption.release()
            raise

    async def aresume(self, state: RunState | str | os.PathLike[str] | Mapping[str, Any], *,
                      approve: Iterable[str] = (), reject: Mapping[str, str] | None = None,
                      go_on: bool | None = None, message: str | None = None) -> RunResult:
        """``resume`` in asyncio."""
        resumption = self._accepted(state, approve, reject, go_on, message)
        try:
            return await self._drive_async(lambda servers: self._resume_loop(resumption, servers),
                                           ran_s=resumption.state.running_s)
        except BaseException:
            resumption.release()
            raise

    # _drive_sync() and _drive_async() are the same lines but for `await`: kept apart on purpose, since one function
    # cannot both block and await; everything they drive is shared in the core below.

    def _drive_sync(self, start: _Start, *, ran_s: float = 0.0) -> RunResult:
        # The run's MCP servers (held, or connected for it), within what is left of its timeout_s.
        servers = None if self._mcp is None else self._mcp.for_run(self._time_left(ran_s))
        try:
            loop = start(servers)
            value: Any = None
            while True:
                try:
                    effect = loop.send(value)
                except StopIteration as stop:
                    return stop.value
                try:
                    value = effect.perform_sync()
                except BaseException as exc:  # hand it to the core, which decides what it means for the run
                    value = Raised(exc)
        finally:  # however the run ends: MCP servers connected for it do not outlive it
            if servers is not None:
                servers.done()

    async def _drive_async(self, start: _Start, *, ran_s: float = 0.0) -> RunResult:
        servers = None if self._mcp is None else await self._mcp.afor_run(self._time_left(ran_s))
        try:
            loop = start(servers)
            value: Any = None
            while True:
                try:
                    effect = loop.send(value)
                except StopIteration as stop:
                    return stop.value
                try:
                    value = await effect.perform_async()
                except BaseException as exc:
                    value = Raised(exc)
        finally:  # a cancelled arun too: the close finishes before the cancellation goes on
            if servers is not None:
                await servers.adone()

    def _accepted(self, state: RunState | str | os.PathLike[str] | Mapping[str, Any], approve: Iterable[str],
                  reject: Mapping[str, str] | None, go_on: bool | None, message: str | None) -> Resumption:
        return accept(state, self._identity, approve=approve, reject=reject, go_on=go_on, message=message,
                      resumed_here=self._resumed_states, claims=claims_directory(self._tracing.settings.state_home))

    def _time_left(self, ran_s: float) -> float | None:
        """What is left of the run's timeout_s, for connecting its MCP servers (which counts on its clock)."""
        return None if self.limits.timeout_s is None else max(self.limits.timeout_s - ran_s, 0.0)


def _checked_servers(servers: Iterable[MCPServer]) -> tuple[MCPServer, ...]:
    servers = tuple(servers)
    if servers:
        from looptrace.runtime.mcp_servers import check_installed

        check_installed()
    return servers


def _sessions(servers: tuple[MCPServer, ...], telemetry: AgentTelemetry, *,
              call_timeout_s: float | None) -> MCPSessions | None:
    """The holder of an agent's MCP servers (connected per run, or held by ``with agent:``), or None without any."""
    if not servers:
        return None
    from looptrace.runtime.mcp_sessions import MCPSessions

    return MCPSessions(servers, telemetry, call_timeout_s=call_timeout_s)


def _as_model(client: Any) -> Model:
    if client is None:
        return AnthropicModel()
    if hasattr(client, "create") and hasattr(client, "acreate"):
        return client
    if hasattr(client, "messages"):  # an anthropic.Anthropic or AsyncAnthropic instance
        # The SDK decorates create(): only the function underneath says whether it is a coroutine.
        import inspect

        create = getattr(client.messages, "create", None)
        is_async = create is not None and inspect.iscoroutinefunction(inspect.unwrap(create))
        return AnthropicModel(async_client=client) if is_async else AnthropicModel(client=client)
    raise TypeError(f"client must be an anthropic client or a Model, got {type(client).__name__}")
