"""1. Telemetry cost per turn, against the raw OpenTelemetry cost of the same spans.

Three variants of one scripted run (``TURNS`` turns, a no-op tool per turn), interleaved:

* off: ``Agent(..., telemetry=False, detector=False)``: the loop alone.
* on: a private ``TracerProvider`` with ``BatchSpanProcessor(OTLPJsonFileExporter(tmpfile))``, the detector on, content
  capture on (the default). Metrics go to the API's no-op meter (no MeterProvider configured), as for an application
  that sets up tracing only; a fourth variant, on+metrics, adds an SDK ``MeterProvider`` with an in-memory reader.
* raw: the same spans (invoke_agent, then per turn: turn, chat, execute_tool) created directly with the SDK tracer,
  with the very attributes, events and statuses looptrace produced (recorded from a run), in the same order, into an
  identical provider, processor and exporter. No agent loop, no context attach: the floor any instrumentation pays.

For context, on-unexported and raw-unexported do the same with a TracerProvider that has no processor: the spans are
made, recorded and ended, and go nowhere, which shows how the cost splits between making spans and exporting them.

Every sample ends with ``force_flush``, so the export (encoding and writing the file) is paid inside the sample that
produced the spans, equally by on and raw.

Per-turn telemetry cost = median over paired samples of (on - off) / turns; raw cost = median(raw) / turns.
The sync tool path starts a thread per call in both on and off, so it cancels out of the difference.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from looptrace.instrumentation.tracefile import OTLPJsonFileExporter
from looptrace.runtime import Agent
from looptrace.runtime.models import ScriptedModel

from . import scenario
from .common import Row, clock, fmt_s, interleave, median, paired_median_difference, say
from .replay import Recording, record, replay

TURNS = 20
GOAL_RATIO = 1.5


def record_run(turns: int) -> Recording:
    """A recording of the very run the on variant makes."""
    def run(provider: TracerProvider):
        agent = Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, name="bench",
                      limits=scenario.LIMITS, client=ScriptedModel(scenario.script(turns)), tracer_provider=provider)
        return agent.run(scenario.task("run-0"))

    recording, result = record(run)
    assert result.turns == turns and result.status.value == "done", (result.status, result.error)
    return recording


def _file_provider(path: str) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPJsonFileExporter(path)))
    return provider


def run(quick: bool = False) -> list[Row]:
    runs_per_sample = 2 if quick else 5
    reps = 8 if quick else 40
    turns_per_sample = runs_per_sample * TURNS
    with tempfile.TemporaryDirectory(prefix="looptrace-bench1-") as tmp:
        recorder = record_run(TURNS)
        spans_per_run = recorder.span_count

        on_provider = _file_provider(os.path.join(tmp, "on.jsonl"))
        raw_provider = _file_provider(os.path.join(tmp, "raw.jsonl"))
        metrics_provider = _file_provider(os.path.join(tmp, "on_metrics.jsonl"))
        meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        raw_tracer = raw_provider.get_tracer("looptrace")
        # Context: the same two without any exporter, to show how the cost splits between making and exporting.
        bare_provider = TracerProvider()
        bare_tracer = TracerProvider().get_tracer("looptrace")

        def agent(**options: Any) -> Agent:
            return Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, name="bench",
                         limits=scenario.LIMITS, **options)

        agents = {
            "off": agent(telemetry=False, detector=False),
            "on": agent(tracer_provider=on_provider),
            "on+metrics": agent(tracer_provider=metrics_provider, meter_provider=meter_provider),
            "on-unexported": agent(tracer_provider=bare_provider),
        }
        def looptrace_sample(name: str, provider: TracerProvider | None):
            return scenario.scripted_runs(agents[name], TURNS, runs_per_sample,
                                          provider.force_flush if provider is not None else None)

        def raw_sample(tracer, provider: TracerProvider | None):
            def sample() -> float:
                started = clock()
                for _ in range(runs_per_sample):
                    replay(tracer, recorder)
                if provider is not None:
                    provider.force_flush()
                return clock() - started

            return sample

        say(f"  1: {reps} x (off, on, raw, and 3 more for context), {runs_per_sample} runs of {TURNS} turns each "
            f"({spans_per_run} spans per run)")
        samples = interleave({
            "off": looptrace_sample("off", None),
            "on": looptrace_sample("on", on_provider),
            "on+metrics": looptrace_sample("on+metrics", metrics_provider),
            "raw": raw_sample(raw_tracer, raw_provider),
            "on-unexported": looptrace_sample("on-unexported", None),
            "raw-unexported": raw_sample(bare_tracer, None),
        }, reps=reps)
        for provider in (on_provider, raw_provider, metrics_provider):
            provider.shutdown()
        meter_provider.shutdown()

    off = median(samples["off"]) / turns_per_sample
    on = median(samples["on"]) / turns_per_sample
    cost = paired_median_difference(samples["on"], samples["off"]) / turns_per_sample
    cost_metrics = paired_median_difference(samples["on+metrics"], samples["off"]) / turns_per_sample
    raw = median(samples["raw"]) / turns_per_sample
    ratio = cost / raw
    spans_per_turn = spans_per_run / TURNS
    cost_unexported = paired_median_difference(samples["on-unexported"], samples["off"]) / turns_per_sample
    raw_unexported = median(samples["raw-unexported"]) / turns_per_sample
    return [
        Row("1 telemetry cost", "looptrace telemetry per turn / raw OTel per turn", f"{ratio:.2f}x",
            f"<= {GOAL_RATIO}x", ratio <= GOAL_RATIO,
            f"ours {fmt_s(cost)}/turn (on {fmt_s(on)} - off {fmt_s(off)}), raw SDK {fmt_s(raw)}/turn "
            f"({spans_per_turn:.2f} spans/turn incl. root amortised); BSP + OTLP/JSON file, detector and content "
            f"capture on, no MeterProvider; {reps} interleaved samples of {runs_per_sample}x{TURNS} turns"),
        Row("1 telemetry cost", "same, with an SDK MeterProvider (in-memory reader)",
            f"{cost_metrics / raw:.2f}x", "", None,
            f"ours {fmt_s(cost_metrics)}/turn with metrics recorded"),
        Row("1 telemetry cost", "context: the same without export (spans made, recorded, ended; no processor)",
            f"{cost_unexported / raw_unexported:.2f}x", "", None,
            f"ours {fmt_s(cost_unexported)}/turn, raw SDK {fmt_s(raw_unexported)}/turn: the export (encoding and "
            f"writing, same spans in both) is ~{fmt_s(raw - raw_unexported)} of the raw cost per turn"),
    ]
