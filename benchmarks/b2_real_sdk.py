"""2. Through the real anthropic SDK: looptrace against a bare loop like the seed article's.

Both talk to the same FakeMessagesAPI (its own process, the real wire format, no artificial delay) through
``anthropic.Anthropic`` and get the same answers: ``TURNS`` turns per run, a no-op tool call in each but the last.

* bare: the seed's loop: ``client.messages.create(...)`` in a for loop, the assistant content appended as the SDK
  returns it, the tools called directly, one tool_result each; token counting as the seed does. The client is made
  with ``open_telemetry=False``, so the SDK records no spans of its own.
* looptrace: ``Agent(..., client=anthropic.Anthropic(...))`` with telemetry fully on: a private TracerProvider with a
  BatchSpanProcessor writing OTLP/JSON to a file (flushed inside each sample), the detector and content capture on.
  looptrace switches the SDK's own spans off itself.
* looptrace, telemetry off (context): the same Agent with ``telemetry=False, detector=False``, which separates the cost
  of the runtime (validation, a thread per sync tool call, limits) from the cost of telemetry.
* looptrace, spans exported nowhere (context): a TracerProvider without processors: spans are made and ended, the
  detector runs, nothing is encoded or written.
* looptrace, content capture off (context): ``capture_content=False``, file export on.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import anthropic
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from looptrace.instrumentation.tracefile import OTLPJsonFileExporter
from looptrace.runtime import Agent

from . import scenario
from .common import Row, clock, fmt_s, interleave, median, paired_median_difference, say
from .servers import MessagesAPIServer

TURNS = 20
GOAL = 0.10  # at most 10% more wall time per turn
MAX_TOKENS = 4096


def bare_loop(client: Any, task: str, tools: list[dict[str, Any]], impls: dict[str, Any],
              max_steps: int = 1000) -> tuple[str, int]:
    """The seed article's loop, with the stop conditions it has (steps, stop_reason)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    used = 0
    for step in range(1, max_steps + 1):
        response = client.messages.create(model=scenario.MODEL, max_tokens=MAX_TOKENS, system=scenario.SYSTEM,
                                          tools=tools, messages=messages)
        usage = response.usage
        used += (usage.input_tokens + usage.output_tokens + (usage.cache_creation_input_tokens or 0)
                 + (usage.cache_read_input_tokens or 0))
        messages.append({"role": "assistant", "content": response.content})
        if response.stop_reason == "end_turn":
            return "done", step
        if response.stop_reason != "tool_use":
            return str(response.stop_reason), step
        results = []
        for block in response.content:
            if block.type != "tool_use":
                continue
            try:
                out = impls[block.name](**block.input)
                results.append({"type": "tool_result", "tool_use_id": block.id,
                                "content": out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)})
            except Exception as exc:
                results.append({"type": "tool_result", "tool_use_id": block.id, "content": str(exc),
                                "is_error": True})
        messages.append({"role": "user", "content": results})
    return "max_steps", max_steps


def run(quick: bool = False) -> list[Row]:
    runs_per_sample = 1 if quick else 2
    reps = 6 if quick else 30
    turns_per_sample = runs_per_sample * TURNS
    task = scenario.task("run-0")
    tool_definitions = [scenario.lookup.definition()]
    impls = {"lookup": scenario.lookup_plain}

    with MessagesAPIServer(turns=TURNS) as server, tempfile.TemporaryDirectory(prefix="looptrace-bench2-") as tmp:
        def client(**options: Any) -> anthropic.Anthropic:
            return anthropic.Anthropic(base_url=server.url, api_key=server.api_key, max_retries=0, **options)

        def file_provider(name: str) -> TracerProvider:
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(OTLPJsonFileExporter(os.path.join(tmp, name))))
            return provider

        def agent(**options: Any) -> Agent:
            return Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, name="bench",
                         limits=scenario.LIMITS, max_tokens=MAX_TOKENS, client=client(), **options)

        provider, no_content_provider = file_provider("traces.jsonl"), file_provider("no-content.jsonl")
        bare_client = client(open_telemetry=False)
        traced = agent(tracer_provider=provider)
        untraced = agent(telemetry=False, detector=False)
        # Context: where the telemetry's cost goes. Spans made but exported nowhere; and content capture off.
        unexported = agent(tracer_provider=TracerProvider())
        no_content = agent(tracer_provider=no_content_provider, capture_content=False)

        def bare() -> float:
            started = clock()
            for _ in range(runs_per_sample):
                status, steps = bare_loop(bare_client, task, tool_definitions, impls)
                assert (status, steps) == ("done", TURNS), (status, steps)
            return clock() - started

        def looptrace(target: Agent, flush: TracerProvider | None):
            def sample() -> float:
                started = clock()
                for _ in range(runs_per_sample):
                    result = target.run(task)
                    assert result.turns == TURNS and result.status.value == "done", (result.status, result.error)
                if flush is not None:
                    flush.force_flush()
                return clock() - started
            return sample

        say(f"  2: {reps} x (bare, looptrace, and 3 variants of looptrace for context), {runs_per_sample} run(s) of "
            f"{TURNS} turns each, anthropic {anthropic.__version__} against a local FakeMessagesAPI")
        samples = interleave({
            "bare": bare,
            "looptrace": looptrace(traced, provider),
            "looptrace-off": looptrace(untraced, None),
            "unexported": looptrace(unexported, None),
            "no-content": looptrace(no_content, no_content_provider),
        }, reps=reps, warmup=2)
        provider.shutdown()
        no_content_provider.shutdown()

    bare_turn = median(samples["bare"]) / turns_per_sample
    ours_turn = median(samples["looptrace"]) / turns_per_sample
    off_turn = median(samples["looptrace-off"]) / turns_per_sample
    extra = paired_median_difference(samples["looptrace"], samples["bare"]) / turns_per_sample
    overhead = extra / bare_turn
    runtime_extra = paired_median_difference(samples["looptrace-off"], samples["bare"]) / turns_per_sample
    unexported_extra = paired_median_difference(samples["unexported"], samples["bare"]) / turns_per_sample
    no_content_extra = paired_median_difference(samples["no-content"], samples["bare"]) / turns_per_sample
    return [
        Row("2 real SDK", "looptrace wall time per turn vs bare loop", f"+{overhead:.1%}", f"<= +{GOAL:.0%}",
            overhead <= GOAL,
            f"bare {fmt_s(bare_turn)}/turn, looptrace {fmt_s(ours_turn)}/turn (+{fmt_s(extra)}); "
            f"{reps} interleaved samples of {runs_per_sample}x{TURNS} turns, server in its own process"),
        Row("2 real SDK", "of which the runtime alone (telemetry off)", f"+{runtime_extra / bare_turn:.1%}", "", None,
            f"looptrace telemetry off {fmt_s(off_turn)}/turn (+{fmt_s(runtime_extra)})"),
        Row("2 real SDK", "context: telemetry on, spans exported nowhere", f"+{unexported_extra / bare_turn:.1%}", "",
            None, f"+{fmt_s(unexported_extra)}/turn: making the spans, the detector, no export"),
        Row("2 real SDK", "context: telemetry on, content capture off", f"+{no_content_extra / bare_turn:.1%}", "",
            None, f"+{fmt_s(no_content_extra)}/turn: file export of spans without messages, arguments, results"),
    ]
