"""8. `looptrace watch`: spans per second one process ingests and checks, memory with 10,000 open runs, alert delay.

The spans are an agent's in the GenAI conventions, made by the OpenTelemetry SDK and encoded by its own OTLP encoder:
runs of ``TURNS`` turns (a chat span and an execute_tool span each), a root span last; one run in ten repeats a
failing call, so the detector has something to find.

* throughput: the runs' spans in export requests of ``BATCH`` spans (what a BatchSpanProcessor or a collector sends),
  POSTed over HTTP to a WatchServer in this process from one client thread, until watch has checked all of them.
  Context: the same requests only decoded (protobuf to span records, no detector), the floor any receiver pays.
  Both are passes of `common.interleave` (a warm-up pass each, then ``PASSES`` interleaved), so that the ratio is
  taken side by side: a single cold decoding pass first pays one-off costs the watch pass after it does not, which
  flattered the ratio by up to 2x.
* where the time goes: two more interleaved passes over the same requests, in process: ``RunWatcher.ingest`` of
  each decoded request (decoding + run assembly + detector), and the detector alone (each run's tool calls, read
  from the spans beforehand, fed straight to a `LoopDetector` turn by turn, as the rebuilder feeds it). Run assembly
  is what ingest costs beyond the two (readers, the rebuilder, the watcher's bookkeeping, result digests). Read from
  process CPU time, which other jobs' load does not inflate the way it does wall time.
* memory: ``OPEN_RUNS`` runs fed to watch's run assembler without their root spans (agents still running), measured
  with tracemalloc after a collection, per open run.
* alert delay: a run sent one span per request (what SimpleSpanProcessor does); the time from sending the span that
  completes the loop (the third failing call) to the alert callback, over ``DELAY_REPS`` runs.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import LoopDetector, ToolCall, result_digest
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.watch import RunWatcher, WatchMetrics, WatchServer, WatchSettings, spans_of_request
from looptrace.instrumentation.watch.decoding import parse_request

from .common import Row, fmt_s, interleave, median, percentile, say

TURNS = 5
BATCH = 512
OPEN_RUNS = 10_000
PASSES = 3


def make_runs(count: int, *, with_root: bool = True) -> list[Any]:
    """ReadableSpans of ``count`` agent runs, in end order."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    for n in range(count):
        looping = n % 10 == 0
        root = tracer.start_span("invoke_agent bench", attributes={sc.GEN_AI_OPERATION_NAME: "invoke_agent",
                                                                    sc.GEN_AI_AGENT_NAME: "bench"})
        with trace.use_span(root, end_on_exit=with_root):
            for turn in range(1, TURNS + 1):
                with tracer.start_as_current_span("chat", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}):
                    pass
                arguments = '{"order_id": "A-1"}' if looping else f'{{"order_id": "A-{turn}"}}'
                with tracer.start_as_current_span("execute_tool get_order", attributes={
                        sc.GEN_AI_OPERATION_NAME: "execute_tool", sc.GEN_AI_TOOL_NAME: "get_order",
                        sc.GEN_AI_TOOL_CALL_ID: f"call-{n}-{turn}", sc.GEN_AI_TOOL_CALL_ARGUMENTS: arguments,
                        sc.GEN_AI_TOOL_CALL_RESULT: "unavailable" if looping else f"order {turn}"}) as span:
                    if looping:
                        span.set_status(Status(StatusCode.ERROR))
    spans = list(exporter.get_finished_spans())
    provider.shutdown()
    return spans


def post(port: int, body: bytes) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


@dataclass
class Throughput:
    """Each pass's median seconds over the same requests, wall clock and process CPU, and what watch found.

    The passes: ``decode`` (the requests only decoded), ``watch`` (POSTed to a WatchServer until everything was
    checked), ``ingest`` (decoded and ingested by a RunWatcher in process: decoding + run assembly + detector) and
    ``detector`` (the runs' tool calls fed straight to a LoopDetector per run).
    """

    spans: int
    wall_s: dict[str, float]
    cpu_s: dict[str, float]  # process CPU time: what the breakdown is read from, as other jobs' load does not count
    flagged: int  # looping runs watch alerted on (repeated_call), in its last pass

    def rate(self, name: str) -> float:
        return self.spans / self.wall_s[name]


def throughput(runs: int, passes: int = PASSES) -> Throughput:
    spans = make_runs(runs)
    bodies = [encode_spans(spans[i:i + BATCH]).SerializeToString() for i in range(0, len(spans), BATCH)]
    calls_by_run = _calls_by_run(spans)
    alerts: list[str] = []
    cpu: dict[str, list[float]] = {}

    def measured(name: str, work: Any) -> Any:
        def sample() -> float:
            wall, process = time.perf_counter(), time.process_time()
            work()
            cpu.setdefault(name, []).append(time.process_time() - process)
            return time.perf_counter() - wall
        return sample

    def decode() -> None:
        for body in bodies:
            spans_of_request(trace_service_pb2.ExportTraceServiceRequest.FromString(body))

    def watch() -> None:
        alerts.clear()
        server = WatchServer(WatchSettings(port=0, grpc_port=None, queue_batches=len(bodies) + 1),
                             alerts=Alerts(callback=lambda a, c: alerts.append(a.type), log_warnings=False)).start()
        try:
            for body in bodies:
                post(server.port, body)
            server.wait_idle(600)
        finally:
            server.stop()

    def ingest() -> None:
        watcher = RunWatcher(Alerts(log_warnings=False), WatchMetrics())
        for body in bodies:
            watcher.ingest(parse_request(body, "application/x-protobuf"))

    def detector() -> None:
        for turns in calls_by_run:
            loop_detector = LoopDetector()
            for turn, calls in enumerate(turns, start=1):
                for call in calls:
                    loop_detector.observe(call)
                loop_detector.end_turn(turn)
            loop_detector.end_run(None, None, len(turns))

    passes_by_name = {"decode": decode, "watch": watch, "ingest": ingest, "detector": detector}
    walls = interleave({name: measured(name, work) for name, work in passes_by_name.items()}, reps=passes)
    # The warm-up pass is in `cpu` too: it is left out, as interleave leaves it out of the wall samples.
    return Throughput(spans=len(spans), wall_s={name: median(walls[name]) for name in passes_by_name},
                      cpu_s={name: median(cpu[name][1:]) for name in passes_by_name},
                      flagged=alerts.count("repeated_call"))


def _calls_by_run(spans: list[Any]) -> list[list[list[ToolCall]]]:
    """Each run's tool calls by turn, as the run rebuilder hands them to the detector (digests made beforehand)."""
    runs: dict[int, list[list[ToolCall]]] = {}
    for span in sorted(spans, key=lambda s: s.start_time):
        turns = runs.setdefault(span.context.trace_id, [])
        attributes = span.attributes
        operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
        if operation == "chat":
            turns.append([])
        elif operation == "execute_tool":
            turns[-1].append(ToolCall(
                turn=len(turns), tool=str(attributes[sc.GEN_AI_TOOL_NAME]),
                arguments=attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS], call_id=str(attributes[sc.GEN_AI_TOOL_CALL_ID]),
                is_error=span.status.status_code == StatusCode.ERROR, result=str(attributes[sc.GEN_AI_TOOL_CALL_RESULT]),
                result_digest=result_digest(str(attributes[sc.GEN_AI_TOOL_CALL_RESULT]))))
    return list(runs.values())


def memory_per_open_run(runs: int) -> tuple[float, int]:
    records = spans_of_request(encode_spans(make_runs(runs, with_root=False)))
    watcher = RunWatcher(Alerts(log_warnings=False), WatchMetrics(), idle_timeout_s=3600, max_open_runs=runs,
                         capture_content=True)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(0, len(records), BATCH):
        watcher.ingest(records[i:i + BATCH])
    del records
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return grown / watcher.open_runs, watcher.open_runs


def alert_delays(reps: int) -> list[float]:
    fired = threading.Event()
    fired_at = [0.0]

    def on_alert(anomaly: Any, context: Any) -> None:
        if anomaly.type == "repeated_call" and not fired.is_set():
            fired_at[0] = time.perf_counter()
            fired.set()

    delays = []
    server = WatchServer(WatchSettings(port=0, grpc_port=None),
                         alerts=Alerts(callback=on_alert, log_warnings=False)).start()
    try:
        for _ in range(reps):
            spans = make_runs(1, with_root=False)  # one looping run: chat, tool, chat, tool, ...
            third_failure = [s for s in spans if s.name.startswith("execute_tool")][2]
            fired.clear()
            for span in spans:
                if span is third_failure:
                    sent_at = time.perf_counter()
                post(server.port, encode_spans([span]).SerializeToString())
                if span is third_failure:
                    fired.wait(10)
                    delays.append(fired_at[0] - sent_at)
    finally:
        server.stop()
    return delays


def run(quick: bool = False) -> list[Row]:
    runs = 300 if quick else 3000
    passes = 1 if quick else PASSES
    say(f"  throughput: {runs} runs of {TURNS} turns in requests of {BATCH} spans, {passes} interleaved passes")
    measured = throughput(runs, passes)
    open_runs = 1000 if quick else OPEN_RUNS
    say(f"  memory: {open_runs} open runs")
    per_run, held = memory_per_open_run(open_runs)
    reps = 20 if quick else 100
    say(f"  alert delay: {reps} runs, one span per request")
    delays = alert_delays(reps)
    watch_rate, decode_rate = measured.rate("watch"), measured.rate("decode")
    cpu = measured.cpu_s
    parts = {
        "decoding": cpu["decode"],
        "run assembly": cpu["ingest"] - cpu["decode"] - cpu["detector"],
        "detector": cpu["detector"],
    }
    shares = " · ".join(f"{name} {seconds / cpu['ingest']:.0%}" for name, seconds in parts.items())
    per_span = ", ".join(f"{name} {fmt_s(seconds / measured.spans)}" for name, seconds in parts.items())
    return [
        Row("8 watch", "spans/s ingested and checked (one process, HTTP protobuf)", f"{watch_rate:,.0f}", "", None,
            f"{measured.spans:,} spans, {runs:,} runs, {measured.flagged} looping runs flagged of {runs // 10}; "
            f"decoding alone {decode_rate:,.0f} spans/s (watch at {watch_rate / decode_rate:.2f}x of it); medians "
            f"of {passes} interleaved passes after a warm-up"),
        Row("8 watch", "where ingest's CPU time goes (in process, no HTTP)", shares, "", None,
            f"CPU per span: {per_span}; the HTTP pass took {cpu['watch'] / cpu['ingest']:.2f}x the CPU of ingest "
            "in process; process CPU time of passes interleaved with the HTTP pass (detector: the runs' calls fed "
            "straight to a LoopDetector; run assembly: RunWatcher.ingest beyond decoding and detector)"),
        Row("8 watch", f"memory per open run ({held:,} open)", f"{per_run / 1024:.1f} KiB", "", None,
            f"{per_run * held / 1024 / 1024:.1f} MiB for {held:,} runs of {TURNS} turns without their root span "
            "(tracemalloc, after gc)"),
        Row("8 watch", "loop-completing span sent -> alert, median / p95",
            f"{fmt_s(median(delays))} / {fmt_s(percentile(delays, 95))}", "", None,
            f"{len(delays)} runs sent one span per request over HTTP; includes the request itself"),
    ]
