"""The loop guards' cost per tool call, against each framework's own loop without the guard, measured in one run.

A scripted agent polls a job that makes progress (so the guard finds nothing and the run goes the whole way): N turns
of one tool call, then an answer, on each framework's offline model stand-in (LangChain's fake chat model, a `Model`
of the Agents SDK that replays responses). The same run with and without the guard, interleaved; the figure is
CPU time (``time.process_time``), so a busy machine's waiting does not count. The guard records its spans to an
in-memory exporter (the SDK's span processor included), as it would to any exporter.

Claude Agent SDK: its loop is Claude Code's, in another process, so there is no in-process loop to compare with;
the figure is the hook callables' CPU per call (PreToolUse + PostToolUse, with the turn judged), in microseconds.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from .common import Row, interleave, say

TURNS = 20


def _cpu(work: Callable[[], Any]) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def _guard_options() -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from looptrace.instrumentation.alerts import Alerts

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return {"tracer_provider": provider, "alerts": Alerts(log_warnings=False)}


def _poller() -> Callable[[str], str]:
    polls = [0]

    def job_status(job: str) -> str:
        """The job's progress."""
        polls[0] += 1
        return f"{job} running, {polls[0]}% done"

    return job_status


# ---- LangChain


def _langchain_run(guarded: bool | str) -> Callable[[], Callable[[], Any]]:
    """``guarded="hooks only"``: a middleware with the guard's hooks doing nothing, to tell LangGraph's cost of a
    middleware's nodes from the guard's own work."""
    from langchain.agents import create_agent
    from langchain.agents.middleware.types import AgentMiddleware, hook_config
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import StructuredTool

    from looptrace.guards import LoopGuardMiddleware

    class Fake(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    class HooksOnly(AgentMiddleware):
        state_schema = LoopGuardMiddleware.state_schema

        def before_agent(self, state: Any, runtime: Any) -> None:
            return None

        def after_agent(self, state: Any, runtime: Any) -> None:
            return None

        @hook_config(can_jump_to=["end"])
        def before_model(self, state: Any, runtime: Any) -> None:
            return None

        @hook_config(can_jump_to=["model", "end"])
        def after_model(self, state: Any, runtime: Any) -> None:
            return None

        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            return handler(request)

    middleware: list[Any] = ([HooksOnly()] if guarded == "hooks only" else
                             [LoopGuardMiddleware(**_guard_options())] if guarded else [])

    def prepared() -> Callable[[], Any]:
        replies = [AIMessage("", tool_calls=[{"name": "job_status", "args": {"job": "J-7"}, "id": f"c{n}"}])
                   for n in range(TURNS)] + [AIMessage("done")]
        tool = StructuredTool.from_function(_poller(), name="job_status")
        agent = create_agent(Fake(messages=iter(replies)), [tool], middleware=middleware)
        return lambda: agent.invoke({"messages": [HumanMessage("task")]})

    return prepared


# ---- OpenAI Agents SDK


def _openai_agents_run(guarded: bool) -> Callable[[], Callable[[], Any]]:
    from agents import Agent, Model, ModelResponse, RunConfig, Runner, function_tool
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from looptrace.guards import OpenAIAgentsGuard

    class Replay(Model):
        def __init__(self) -> None:
            self.responses = [ModelResponse(output=[ResponseFunctionToolCall(
                type="function_call", call_id=f"c{n}", name="job_status", arguments=json.dumps({"job": "J-7"}))],
                usage=Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15), response_id=None)
                for n in range(TURNS)]
            self.responses.append(ModelResponse(output=[ResponseOutputMessage(
                id="m", role="assistant", status="completed", type="message",
                content=[ResponseOutputText(text="done", type="output_text", annotations=[])])],
                usage=Usage(requests=1), response_id=None))

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self.responses.pop(0)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    guard = OpenAIAgentsGuard(**_guard_options()) if guarded else None

    def prepared() -> Callable[[], Any]:
        tools = [function_tool(_poller())]
        agent = Agent(name="agent", model=Replay(), tools=guard.protect(tools) if guard else tools)
        return lambda: asyncio.run(Runner.run(agent, "task", hooks=guard, max_turns=TURNS + 5,
                                              run_config=RunConfig(tracing_disabled=True)))

    return prepared


# ---- Claude Agent SDK (the hooks alone)


def _claude_hooks_run() -> Callable[[], Any]:
    from looptrace.guards import ClaudeAgentGuard

    guard = ClaudeAgentGuard(**_guard_options())
    hooks = {event: matcher.hooks[0] for event, [matcher] in guard.hooks.items()}
    base = {"session_id": "bench", "transcript_path": "/dev/null", "cwd": "/"}
    job_status = _poller()

    async def session() -> None:
        await hooks["UserPromptSubmit"]({**base, "hook_event_name": "UserPromptSubmit", "prompt": "task"}, None,
                                        {"signal": None})
        for n in range(TURNS):
            arguments = {"job": "J-7"}
            await hooks["PreToolUse"]({**base, "hook_event_name": "PreToolUse", "tool_name": "job_status",
                                       "tool_input": arguments, "tool_use_id": f"c{n}"}, f"c{n}", {"signal": None})
            await hooks["PostToolUse"]({**base, "hook_event_name": "PostToolUse", "tool_name": "job_status",
                                        "tool_input": arguments, "tool_response": job_status("J-7"),
                                        "tool_use_id": f"c{n}"}, f"c{n}", {"signal": None})
        await hooks["Stop"]({**base, "hook_event_name": "Stop", "stop_hook_active": False,
                             "last_assistant_message": "done"}, None, {"signal": None})

    return lambda: asyncio.run(session())


def _per_call_ratio(name: str, make: Callable[[bool], Callable[[], Callable[[], Any]]], reps: int) -> Row:
    """Each sample builds its agent outside the clock (a framework's graph compile is not its loop) and runs it."""
    bare, guarded = make(False), make(True)
    samples = interleave({"bare": lambda: _cpu(bare()), "guarded": lambda: _cpu(guarded())}, reps)
    plain, with_guard = statistics.median(samples["bare"]), statistics.median(samples["guarded"])
    per_call_us = (with_guard - plain) / TURNS * 1e6
    return Row("12 guards", f"{name}: CPU per tool call, guarded / the framework's loop alone",
               f"{with_guard / plain:.2f}x",
               context=f"{plain / TURNS * 1e6:.0f} µs vs {with_guard / TURNS * 1e6:.0f} µs per call "
                       f"(+{per_call_us:.0f} µs), {TURNS} turns, {reps} interleaved runs")


def _langchain_split(reps: int) -> Row:
    """The guard's own work in LangChain: guarded against a middleware with the same hooks doing nothing."""
    hooks, guarded = _langchain_run("hooks only"), _langchain_run(True)
    samples = interleave({"hooks": lambda: _cpu(hooks()), "guarded": lambda: _cpu(guarded())}, reps)
    empty, with_guard = statistics.median(samples["hooks"]), statistics.median(samples["guarded"])
    return Row("12 guards", "LangChain: CPU per tool call, guarded / the same hooks doing nothing",
               f"{with_guard / empty:.2f}x",
               context=f"{empty / TURNS * 1e6:.0f} µs vs {with_guard / TURNS * 1e6:.0f} µs per call: the rest of the "
                       "first ratio is LangGraph running a middleware's nodes")


def run(quick: bool = False) -> list[Row]:
    reps = 3 if quick else 15
    rows = []
    for name, make in (("LangChain create_agent", _langchain_run), ("OpenAI Agents SDK", _openai_agents_run)):
        say(f"  {name}: {reps} interleaved runs of {TURNS} turns, with and without the guard")
        try:
            rows.append(_per_call_ratio(name, make, reps))
        except ImportError as exc:
            rows.append(Row("12 guards", name, "skipped", context=f"framework not installed: {exc}"))
    try:
        rows.append(_langchain_split(reps))
    except ImportError:
        pass
    try:
        hooks = _claude_hooks_run()
        samples = [_cpu(hooks) for _ in range(reps)]
        rows.append(Row("12 guards", "Claude Agent SDK: CPU of the guard's hooks per tool call",
                        f"{statistics.median(samples) / TURNS * 1e6:.0f} µs",
                        context="Claude Code's own loop runs in another process: no in-process baseline"))
    except ImportError as exc:
        rows.append(Row("12 guards", "Claude Agent SDK", "skipped", context=f"framework not installed: {exc}"))
    return rows
