"""What every framework guard is tested on: three scripted agent runs, the tools they call, what looptrace's own
`Agent` does with the same script (the reference each guard must match), and the three alert sinks the tests read
(a webhook on loopback, an in-memory metric reader, the Langfuse stand-in's score endpoint).

A script is a list of turns; each turn is the tool calls the model asks for (name, arguments), and the run ends with
a final answer. The tools are plain functions with the same behaviour in every framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fakes.langfuse_api import FakeLangfuse
from fakes.webhook import WebhookReceiver as Webhook
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from looptrace import Agent, ScriptedModel, tool
from looptrace.instrumentation.alerts import Alerts, AnomalySinks
from looptrace.instrumentation.export.setup import Telemetry
from looptrace.instrumentation.langfuse.scores import LangfuseScores
from looptrace.runtime.events import AnomalyDetected

MODEL = "claude-sonnet-5-5"
Turn = list[tuple[str, dict[str, Any]]]


class OutOfStock(RuntimeError):
    pass


def reserve(item: str) -> str:
    """Reserve an item (always out of stock)."""
    raise OutOfStock(f"{item} is out of stock")


def make_job_status() -> Callable[[str], str]:
    """A job that advances by 10% on every poll: polling it is progress, not a loop."""
    polls: dict[str, int] = {}

    def job_status(job: str) -> str:
        """The job's progress."""
        polls[job] = polls.get(job, 0) + 1
        return f"{job} running, {polls[job] * 10}% done"

    return job_status


def read_file(path: str) -> str:
    """Read a file (the same contents every time)."""
    return f"contents of {path}: TODO"


@dataclass(frozen=True)
class Scenario:
    name: str
    turns: list[Turn]
    final: str

    def tools(self) -> dict[str, Callable[..., str]]:
        """Fresh tool functions for one run (the poller counts its polls)."""
        return {"reserve": reserve, "job_status": make_job_status(), "read_file": read_file}


FAILING_LOOP = Scenario("failing_loop", [[("reserve", {"item": "EQ-001"})]] * 6, "EQ-001 is reserved.")
POLLING = Scenario("polling", [[("job_status", {"job": "J-7"})]] * 6, "J-7 is 60% done.")
CYCLE = Scenario("cycle", [[("read_file", {"path": "a.txt"})], [("read_file", {"path": "b.txt"})]] * 4,
                 "Both files say TODO.")
SCENARIOS = [FAILING_LOOP, POLLING, CYCLE]


def call_id(turn: int, index: int) -> str:
    return f"call_{turn}_{index}"


def agent_actions(scenario: Scenario, **options: Any) -> list[tuple[int, str, str]]:
    """(turn, action, anomaly type) for every anomaly looptrace's own Agent reports on the same script."""
    tools = scenario.tools()
    responses = _responses(scenario)
    seen: list[tuple[int, str, str]] = []

    def on_event(event: Any) -> None:
        if isinstance(event, AnomalyDetected):
            seen.append((event.anomaly.turn, event.action, event.anomaly.type))

    options = {"telemetry": "tracer_provider" in options, "alerts": Alerts(log_warnings=False), **options}
    Agent(MODEL, tools=[tool(f) for f in tools.values()], client=ScriptedModel(responses), on_event=on_event,
          **options).run("task")
    return seen


def _responses(scenario: Scenario) -> list[dict[str, Any]]:
    """The scenario as the Messages API's responses: one per turn, then the final answer."""
    responses: list[dict[str, Any]] = []
    for n, turn in enumerate(scenario.turns, start=1):
        blocks = [{"type": "tool_use", "id": call_id(n, i), "name": name, "input": args}
                  for i, (name, args) in enumerate(turn)]
        responses.append({"id": f"msg_{n}", "type": "message", "role": "assistant", "model": MODEL,
                          "content": blocks, "stop_reason": "tool_use",
                          "usage": {"input_tokens": 10, "output_tokens": 5}})
    responses.append({"id": "msg_end", "type": "message", "role": "assistant", "model": MODEL,
                      "content": [{"type": "text", "text": scenario.final}], "stop_reason": "end_turn",
                      "usage": {"input_tokens": 10, "output_tokens": 5}})
    return responses


# ---- what the run monitor decided, for the Agent and for a guard alike


@dataclass
class Reactions:
    """Every reaction a `RunMonitor` gave, per monitor, in order: (turn, nudges, stop, reported anomalies with
    their actions and what their loop had cost, without the wall time)."""

    by_monitor: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)

    def record(self, monitor: Any, reaction: Any) -> None:
        if reaction.reports or reaction.nudges or reaction.stop:
            reports = tuple((a.type, a.turn, a.count, a.streak, a.first_turn, action, cost_key(a.cost))
                            for a, action in reaction.reports)
            self.by_monitor.setdefault(id(monitor), []).append(
                (monitor.turn_index, len(reaction.nudges), reaction.stop is not None, reports))

    def runs(self) -> list[list[tuple[Any, ...]]]:
        return list(self.by_monitor.values())


def cost_key(cost: Any) -> tuple[Any, ...] | None:
    return None if cost is None else (cost.since_turn, cost.turns, cost.input_tokens, cost.output_tokens, cost.usd)


@contextmanager
def monitored(monkeypatch: Any) -> Iterator[Reactions]:
    """Record every reaction of every RunMonitor made inside the block (the Agent's and a guard's)."""
    from looptrace.runtime.monitor import RunMonitor

    seen = Reactions()
    for verdict in ("before_calls", "judge_turn", "judge_run"):
        original = getattr(RunMonitor, verdict)

        def spy(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            reaction = _original(self, *args, **kwargs)
            seen.record(self, reaction)
            return reaction

        monkeypatch.setattr(RunMonitor, verdict, spy)
    yield seen


def agent_loop_cost(scenario: Scenario, **options: Any) -> Any:
    """What looptrace's own Agent says the loop of ``scenario`` cost (its run's loop cost)."""
    tools = scenario.tools()
    result = Agent(MODEL, tools=[tool(f) for f in tools.values()], client=ScriptedModel(_responses(scenario)),
                   telemetry=False, alerts=Alerts(log_warnings=False), **options).run("task")
    return cost_key(result.loop_cost)


# ---- the sinks




@dataclass
class Sinks:
    """Where a guard's anomalies go in a test: the providers and alerts to build the guard with, and what arrived."""

    webhook: Webhook
    langfuse: FakeLangfuse
    tracer_provider: Any
    exporter: Any
    reader: InMemoryMetricReader = field(default_factory=InMemoryMetricReader)

    def __post_init__(self) -> None:
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.alerts = Alerts(webhook_url=self.webhook.url, log_warnings=False)
        self.scores = LangfuseScores(self.langfuse.url, self.langfuse.public_key, self.langfuse.secret_key)
        # What configure() hands a guard or an Agent: its providers and the sinks its runs report to.
        self.telemetry = Telemetry(tracer_provider=self.tracer_provider, exporters=[],
                                   meter_provider=self.meter_provider,
                                   sinks=AnomalySinks(alerts=self.alerts, scores=self.scores))

    def guard_options(self) -> dict[str, Any]:
        return {"telemetry": self.telemetry}

    def settle(self) -> None:
        self.alerts.wait(10)
        self.scores.flush(10)

    def metric_points(self) -> list[tuple[dict, int]]:
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [(dict(p.attributes), p.value) for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == "looptrace.anomalies" for p in m.data.data_points]

    @property
    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())


def as_records(finished_spans: list[Any]) -> list[Any]:
    """SDK spans as the trace reader's records, the way `looptrace detect` reads them back from the file."""
    from looptrace.instrumentation.tracefile.read import SpanRecord

    return [SpanRecord(trace_id=format(s.context.trace_id, "032x"), span_id=format(s.context.span_id, "016x"),
                        parent_span_id=format(s.parent.span_id, "016x") if s.parent else None, name=s.name,
                        start_ns=s.start_time, attributes=dict(s.attributes), status_code=s.status.status_code.value)
            for s in finished_spans]
