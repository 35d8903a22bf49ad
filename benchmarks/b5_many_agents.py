"""5. Many agents at once: 200 concurrent ``arun`` calls in one process, against one at a time.

One Agent (telemetry fully on: a private TracerProvider, a BatchSpanProcessor into an InMemorySpanExporter with a queue
big enough to drop nothing, the detector and content capture on) and one ``anthropic.AsyncAnthropic`` client, against
a FakeMessagesAPI in its own process that answers every request after 50 ms: ``TURNS`` turns per run, an async no-op
tool in each but the last. The server decides each answer from the request (the run's name in its task, the turn from
the length of its history), so any number of runs can share it.

* one at a time: ``SEQUENTIAL`` runs awaited one after the other;
* concurrent: ``CONCURRENT`` runs started together with ``asyncio.gather``;
* concurrent, telemetry off (context): the same with ``telemetry=False, detector=False``.

Interleaved, a few repetitions, medians. Then every concurrent repetition's spans are checked: one trace per run and
no other, and in each trace exactly the root, ``TURNS`` turn spans under it, one chat span under each turn and one
execute_tool span under each turn but the last; every span's parent in the same trace; the run's name in the root's
input, in every chat span's input and every tool call's arguments, and each tool call's step equal to its turn's
index, so a span that strayed into another run's trace (or another turn) would show.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import Any

import anthropic
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace.instrumentation.alerts import Alerts
from looptrace.runtime import Agent
from looptrace.runtime.models import AnthropicModel

from . import scenario
from .common import Row, clock, fmt_s, median, percentile, say
from .servers import MessagesAPIServer

TURNS = 5
DELAY_S = 0.05
CONCURRENT = 200
SEQUENTIAL = 10


def check_traces(spans: list[Any], results: dict[str, Any]) -> list[str]:
    """Everything wrong with the traces of these runs (run name -> RunResult); [] when all is well."""
    problems: list[str] = []
    by_trace: dict[int, list[Any]] = defaultdict(list)
    for span in spans:
        by_trace[span.context.trace_id].append(span)
    expected = {int(result.trace_id, 16): name for name, result in results.items()}
    if set(by_trace) != set(expected):
        problems.append(f"{len(by_trace)} traces for {len(results)} runs "
                        f"({len(set(by_trace) - set(expected))} unexpected, {len(set(expected) - set(by_trace))} missing)")
    for trace_id, trace_spans in by_trace.items():
        name = expected.get(trace_id)
        if name is None:
            continue
        problems.extend(f"{name}: {p}" for p in _check_trace(name, trace_spans))
    return problems


def _check_trace(name: str, spans: list[Any]) -> list[str]:
    problems = []
    ids = {s.context.span_id: s for s in spans}
    roots = [s for s in spans if s.parent is None]
    if len(roots) != 1 or not roots[0].name.startswith("invoke_agent"):
        return [f"{len(roots)} root spans"]
    root = roots[0]
    if name not in str(root.attributes.get("gen_ai.input.messages", "")):
        problems.append("the root's input is another run's task")
    for span in spans:
        if span.parent is not None and span.parent.span_id not in ids:
            problems.append(f"{span.name}: its parent is not in this trace")
    turns = {s.attributes.get("looptrace.turn.index"): s for s in spans
             if s.parent is not None and s.parent.span_id == root.context.span_id and s.name.startswith("turn")}
    if sorted(turns) != list(range(1, TURNS + 1)):
        problems.append(f"turn spans {sorted(turns)}")
    children: dict[int, list[Any]] = defaultdict(list)
    for span in spans:
        if span.parent is not None and span.parent.span_id != root.context.span_id:
            children[span.parent.span_id].append(span)
    for index, turn in turns.items():
        kids = children.get(turn.context.span_id, [])
        chats = [s for s in kids if s.attributes.get("gen_ai.operation.name") == "chat"]
        tools = [s for s in kids if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
        if len(chats) != 1 or len(tools) != (1 if index < TURNS else 0) or len(kids) != len(chats) + len(tools):
            problems.append(f"turn {index}: {len(chats)} chat, {len(tools)} tool, {len(kids)} spans in all")
            continue
        if name not in str(chats[0].attributes.get("gen_ai.input.messages", "")):
            problems.append(f"turn {index}: the chat span's input is another run's")
        for tool_span in tools:
            arguments = json.loads(tool_span.attributes.get("gen_ai.tool.call.arguments") or "{}")
            if arguments.get("item") != f"widget for {name}" or arguments.get("step") != index:
                problems.append(f"turn {index}: a tool call of another run or turn: {arguments}")
    if len(spans) != 3 * TURNS:
        problems.append(f"{len(spans)} spans, expected {3 * TURNS}")
    return problems


def run(quick: bool = False) -> list[Row]:
    reps = 1 if quick else 3
    concurrent = 50 if quick else CONCURRENT
    sequential = 4 if quick else SEQUENTIAL

    with MessagesAPIServer(turns=TURNS, delay_s=DELAY_S) as server:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=200_000, max_export_batch_size=2048))
        # Wrapped explicitly: Agent(client=AsyncAnthropic(...)) takes anthropic 2.14's async client for a sync one
        # (its messages.create is a decorated method, so asyncio.iscoroutinefunction says no) and arun then makes a
        # client of its own from the environment.
        client = AnthropicModel(async_client=anthropic.AsyncAnthropic(base_url=server.url, api_key=server.api_key))
        common: dict[str, Any] = {"tools": [scenario.alookup], "system": scenario.SYSTEM, "name": "bench",
                                  "limits": scenario.LIMITS, "client": client, "alerts": Alerts(log_warnings=False)}
        traced = Agent(scenario.MODEL, tracer_provider=provider, **common)
        untraced = Agent(scenario.MODEL, telemetry=False, detector=False, **common)
        counter = iter(range(10**9))

        async def one(agent: Agent) -> tuple[str, Any, float]:
            name = f"run-{next(counter)}"
            started = clock()
            result = await agent.arun(scenario.task(name))
            return name, result, clock() - started

        async def sequential_runs() -> tuple[float, list]:
            started = clock()
            outcomes = [await one(traced) for _ in range(sequential)]
            return clock() - started, outcomes

        cpu: dict[str, list[float]] = defaultdict(list)  # this process's CPU seconds per turn, by variant

        async def concurrent_runs(agent: Agent) -> tuple[float, list]:
            started, cpu_started = clock(), time.process_time()
            outcomes = await asyncio.gather(*(one(agent) for _ in range(concurrent)))
            elapsed = clock() - started
            cpu["on" if agent is traced else "off"].append((time.process_time() - cpu_started) / (concurrent * TURNS))
            return elapsed, list(outcomes)

        async def main() -> dict[str, Any]:
            await one(traced)  # warm-up: connections, imports
            await one(untraced)
            provider.force_flush()
            exporter.clear()
            rates: dict[str, list[float]] = defaultdict(list)
            run_times: list[float] = []
            problems: list[str] = []
            failed = 0
            for _ in range(reps):
                for variant in ("sequential", "concurrent", "concurrent-off"):
                    if variant == "sequential":
                        elapsed, outcomes = await sequential_runs()
                    else:
                        elapsed, outcomes = await concurrent_runs(traced if variant == "concurrent" else untraced)
                    rates[variant].append(len(outcomes) / elapsed)
                    failed += sum(1 for _, r, _ in outcomes if r.status.value != "done" or r.turns != TURNS)
                    if variant == "concurrent":
                        run_times.extend(t for _, _, t in outcomes)
                        provider.force_flush()
                        spans = exporter.get_finished_spans()
                        exporter.clear()
                        problems += check_traces(list(spans), {n: r for n, r, _ in outcomes})
                    elif variant == "sequential":
                        provider.force_flush()
                        exporter.clear()
            return {"rates": rates, "run_times": run_times, "problems": problems, "failed": failed, "cpu": cpu}

        say(f"  5: {reps} x (one at a time: {sequential} runs, {concurrent} concurrent runs, the same with telemetry "
            f"off), {TURNS} turns per run, every answer after {DELAY_S * 1e3:.0f} ms")
        outcome = asyncio.run(main())
        provider.shutdown()

    rates = outcome["rates"]
    sequential_rate, concurrent_rate = median(rates["sequential"]), median(rates["concurrent"])
    off_rate = median(rates["concurrent-off"])
    speedup = concurrent_rate / sequential_rate
    problems, failed = outcome["problems"], outcome["failed"]
    checked = reps * concurrent
    run_times = outcome["run_times"]
    cpu_on, cpu_off = median(outcome["cpu"]["on"]), median(outcome["cpu"]["off"])
    return [
        Row("5 many agents", f"runs/s, {concurrent} concurrent arun vs one at a time", f"{speedup:.1f}x", "", None,
            f"{concurrent_rate:.1f} runs/s concurrent vs {sequential_rate:.2f} runs/s one at a time "
            f"({TURNS} turns, {DELAY_S * 1e3:.0f} ms per model answer); telemetry off: {off_rate:.1f} runs/s; "
            f"a concurrent run takes p50 {fmt_s(percentile(run_times, 50))}, p99 {fmt_s(percentile(run_times, 99))} "
            f"(one at a time: {fmt_s(TURNS * DELAY_S)} of model latency); the agents' process spends "
            f"{fmt_s(cpu_on)} of CPU per turn ({fmt_s(cpu_off)} with telemetry off), the server its own; "
            f"median of {reps}"),
        Row("5 many agents", "traces complete, correctly parented, no span in the wrong trace",
            f"{checked - len({p.split(':')[0] for p in problems}):,} / {checked:,} runs", "all", not problems and not failed,
            (f"{failed} runs did not finish as scripted; " if failed else "")
            + ("; ".join(problems[:3]) if problems else
               f"each trace: 1 root, {TURNS} turns, {TURNS} chat and {TURNS - 1} tool spans, all inside it")),
    ]
