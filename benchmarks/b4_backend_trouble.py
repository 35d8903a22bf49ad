"""4. Backend trouble: per-turn latency while spans go to an OTLP backend that is healthy, refusing, or slow.

Three agents, identical but for where their spans go, each set up the way an application would:
``looptrace.configure(exporters="otlp", set_global=False)`` with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at

* healthy: an OTLPReceiver (the test fake, in a process of its own) that answers at once;
* refused: a port nothing listens on (``unused_port()``): every export is refused;
* slow: an OTLPReceiver that holds every answer for 2 s (``fail_next(Delay(2.0))`` for every request).

and, as the reference, none: telemetry on, no exporter at all.

The states take turns in phases of scripted runs (``TURNS`` turns, a no-op tool each), the order rotating from round
to round. Each phase sets up its own pipeline (an agent gets the Telemetry's tracer and meter providers; metrics go
over OTLP too) and shuts it down at the end (bounded; not on the clock), so one state's exporter is not working in
the background while another state is measured. A turn's latency is the time from one TurnStarted event to the next
(or to RunFinished). Goal: p99 with a troubled backend at most 1 ms above p99 with a healthy one.

When ``configure`` does not offer ``otlp`` (an older tree), the exporter is built by hand: the SDK's OTLPSpanExporter
behind a BatchSpanProcessor.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from looptrace.runtime import Agent
from looptrace.runtime.events import RunFinished, TurnStarted
from looptrace.runtime.models import ScriptedModel

from . import scenario
from .common import Row, clock, fmt_s, percentile, say
from .servers import OTLPBackend

TURNS = 20
GOAL_S = 0.001
STATES = ("healthy", "refused", "slow", "none")  # none: telemetry on, no exporter at all (the reference)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _Pipeline:
    """Where one agent's telemetry goes: configure()'s otlp pipeline, or the SDK's exporter if there is none."""

    def __init__(self, endpoint: str | None, undelivered_file: str) -> None:
        from looptrace.instrumentation.export import setup

        self.telemetry = None
        self.how = ""
        if endpoint is None:  # spans are made, recorded and ended, and go nowhere
            from opentelemetry.sdk.trace import TracerProvider

            self.tracer_provider = TracerProvider(shutdown_on_exit=False)
            self.meter_provider = None
        elif "otlp" in getattr(setup, "KNOWN_EXPORTERS", ()):
            with _environment(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf"):
                self.telemetry = setup.configure(exporters="otlp", set_global=False, undelivered_file=undelivered_file)
            self.tracer_provider = self.telemetry.tracer_provider
            self.meter_provider = self.telemetry.meter_provider
            self.how = "configure(exporters='otlp'): guarded OTLP/HTTP exporter, undelivered list, OTLP metrics"
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self.tracer_provider = TracerProvider(shutdown_on_exit=False)
            self.tracer_provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")))
            self.meter_provider = None
            self.how = "SDK OTLPSpanExporter (HTTP) behind a BatchSpanProcessor"

    def undelivered(self) -> int:
        return self.telemetry.undelivered_spans if self.telemetry is not None else 0

    def shutdown(self) -> None:
        if self.telemetry is not None:
            self.telemetry.shutdown(timeout_ms=1_000)
        else:  # the SDK's shutdown waits for an export in flight; let it do so on a thread of its own
            import threading

            threading.Thread(target=self.tracer_provider.shutdown, daemon=True).start()


class _TurnClock:
    """on_event hook: the duration of every turn, from TurnStarted to the next TurnStarted or RunFinished."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self._started: float | None = None

    def __call__(self, event: Any) -> None:
        now = clock()
        if isinstance(event, (TurnStarted, RunFinished)):
            if self._started is not None:
                self.durations.append(now - self._started)
            self._started = now if isinstance(event, TurnStarted) else None


def run(quick: bool = False) -> list[Row]:
    from tests.fakes.otlp_receiver import unused_port

    rounds = 2 if quick else 4
    runs_per_phase = 15 if quick else 60
    responses = scenario.script(TURNS)
    task = scenario.task("run-0")
    clocks = {state: _TurnClock() for state in STATES}
    undelivered = dict.fromkeys(STATES, 0)
    shutdown_s = dict.fromkeys(STATES, 0.0)
    with tempfile.TemporaryDirectory(prefix="looptrace-bench4-") as tmp, \
            OTLPBackend() as healthy, OTLPBackend(delay_s=2.0) as slow:
        endpoints = {"healthy": healthy.url, "refused": f"http://127.0.0.1:{unused_port()}", "slow": slow.url,
                     "none": None}
        how = ""

        def phase(state: str, number: int, runs: int, measured: bool = True) -> None:
            nonlocal how
            pipeline = _Pipeline(endpoints[state], os.path.join(tmp, f"undelivered-{state}-{number}.jsonl"))
            how = how or pipeline.how
            agent = Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, name="bench",
                          limits=scenario.LIMITS, tracer_provider=pipeline.tracer_provider,
                          meter_provider=pipeline.meter_provider,
                          on_event=clocks[state] if measured else None)
            for _ in range(runs):
                agent.client = ScriptedModel(responses)
                result = agent.run(task)
                assert result.turns == TURNS, (result.status, result.error)
            started = clock()
            pipeline.shutdown()
            shutdown_s[state] = max(shutdown_s[state], clock() - started)
            undelivered[state] += pipeline.undelivered()

        for state in STATES:  # warm-up, not measured
            phase(state, -1, 2, measured=False)
        say(f"  4: {rounds} rounds x {len(STATES)} backend states x {runs_per_phase} runs of {TURNS} turns, a fresh "
            f"pipeline per phase; {how}")
        started = clock()
        for number in range(rounds):
            shift = number % len(STATES)
            for state in STATES[shift:] + STATES[:shift]:
                phase(state, number, runs_per_phase)
        elapsed = clock() - started
        received = {"healthy": healthy.stop_and_count(), "slow": slow.stop_and_count()}
    # root + turn + chat per turn, + a tool span but the last; the warm-up phase's spans count too
    spans_made = (rounds * runs_per_phase + 2) * (3 * TURNS)

    rows = []
    stats = {state: (percentile(clocks[state].durations, 50), percentile(clocks[state].durations, 99),
                     max(clocks[state].durations), len(clocks[state].durations)) for state in STATES}
    healthy_p99 = stats["healthy"][1]
    for state in STATES:
        p50, p99, worst, n = stats[state]
        delta = p99 - healthy_p99
        context = f"p50 {fmt_s(p50)}, p99 {fmt_s(p99)}, max {fmt_s(worst)} over {n:,} turns"
        if state != "none":
            accepted = received.get(state, (0, 0))[1]
            lost = max(spans_made - accepted - undelivered[state], 0)
            context += (f"; of {spans_made:,} spans: {accepted:,} accepted by the backend, {undelivered[state]:,} in the "
                        f"undelivered list, {lost:,} neither (dropped from the full queue); shutdown took up to "
                        f"{fmt_s(shutdown_s[state])}")
        if state == "healthy":
            rows.append(Row("4 backend trouble", "per-turn p50 / p99, healthy backend",
                            f"{fmt_s(p50)} / {fmt_s(p99)}", "", None,
                            context + f"; {elapsed:.1f} s in all"))
        elif state == "none":
            rows.append(Row("4 backend trouble", "reference: per-turn p50 / p99, no exporter at all",
                            f"{fmt_s(p50)} / {fmt_s(p99)}", "", None, context))
        else:
            what = "refusing connections" if state == "refused" else "answering after 2 s"
            rows.append(Row("4 backend trouble", f"p99 change vs healthy, backend {what}", f"{delta * 1e3:+.2f} ms",
                            "<= +1 ms", delta <= GOAL_S, context))
    return rows
