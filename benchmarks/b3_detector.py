"""3. The detector: its cost per call live, its memory over a very long run, and `looptrace detect` over a big file.

Live: one LoopDetector fed ``LIVE_CALLS`` tool calls the way the loop feeds it (a ToolCall with its result text per
call, ``end_turn`` per turn), as one endless run that goes through every pattern in turn: steady progress, polling
with changing results, a repeated call, an A-B cycle, a failing tool with varying arguments then a success, parallel
batches. Time per call is the median of a few passes; memory is tracemalloc's count of what the detector holds at
checkpoints along the way (a separate pass, since tracing allocations slows everything down): it should be flat.

Offline: a trace file of at least ``FILE_SPANS`` spans, written with looptrace's own file exporter from recordings of
four kinds of run (a steady 12-turn run, a runaway repeated call stopped by the detector, an ignored tool error, a
cycle) replayed until the file is big enough. Then, interleaved: ``looptrace detect FILE --json`` (in-process, output
discarded) against reading the file and ``json.loads`` of every line, and nothing else. Goal: detect / parse <= 2.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import tempfile
import tracemalloc
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import LoopDetector, ToolCall
from looptrace.instrumentation.tracefile import OTLPJsonFileExporter
from looptrace.runtime import Agent, tool
from looptrace.runtime.models import ScriptedModel

from . import scenario
from .common import Row, clock, fmt_s, interleave, median, say
from .replay import Recording, record, replay

LIVE_CALLS = 100_000
FILE_SPANS = 100_000
GOAL_RATIO = 2.0


# --- live --------------------------------------------------------------------------------------------------------

_RESULT = "Found 3 items: " + ", ".join(f'{{"id": "EQ-{i:03d}", "name": "Projector {i}", "stock": {i % 4}}}'
                                         for i in range(3))


def live_turns() -> Iterator[list[tuple[str, dict[str, Any], bool, str]]]:
    """An endless run: each item is one turn's calls as (tool, arguments, is_error, result)."""
    cycle = 0
    while True:
        cycle += 1
        for step in range(12):  # steady progress, sometimes two calls at once
            calls = [("search", {"query": f"projector {cycle}-{step}", "limit": 10}, False, _RESULT + str(step))]
            if step % 3 == 0:
                calls.append(("fetch", {"id": f"EQ-{step:03d}", "fields": ["name", "stock"]}, False, _RESULT))
            yield calls
        for step in range(6):  # polling a job whose status moves on: not a loop
            yield [("job_status", {"job": f"job-{cycle}"}, False, f'{{"state": "running", "progress": {step * 15}}}')]
        for _ in range(5):  # the same call, the same answer: repeated_call at 3, 4, 5
            yield [("search", {"limit": 10.0, "query": "projector"}, False, _RESULT)]
        for step in range(8):  # A B A B ...: a cycle
            yield [("open_page", {"page": step % 2 + 1}, False, f"page {step % 2 + 1} of 2")]
        for step in range(6):  # a broken tool called with varying arguments: failing_tool
            yield [("reserve", {"item_id": f"EQ-{step:03d}", "date": "2026-10-08"}, True,
                    f"RuntimeError: backend unavailable (request {cycle}-{step})")]
        yield [("reserve", {"item_id": "EQ-009", "date": "2026-10-09"}, False, '{"reserved": "EQ-009"}')]
        yield []  # a turn where the model only talks
        for _ in range(3):  # the same parallel batch three turns running
            yield [("weather", {"city": "Osaka"}, False, "sunny"), ("weather", {"city": "Kyoto"}, False, "rain")]


def feed(calls: int, checkpoints: tuple[int, ...] = ()) -> tuple[float, LoopDetector, dict[int, int]]:
    """Feed ``calls`` calls to one detector as the loop does. Returns (seconds, the detector, memory at checkpoints)."""
    turns = []
    total = 0
    for turn_calls in live_turns():  # generated ahead, so only the detector is on the clock
        turns.append(turn_calls)
        total += len(turn_calls)
        if total >= calls:
            break
    memory: dict[int, int] = {}
    wanted = list(checkpoints)
    detector = LoopDetector()
    fed = 0
    baseline = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    started = clock()
    for index, turn_calls in enumerate(turns, start=1):
        for number, (name, arguments, is_error, result) in enumerate(turn_calls):
            detector.observe(ToolCall(turn=index, tool=name, arguments=arguments, call_id=f"toolu_{index}_{number}",
                                      is_error=is_error, result=result))
        detector.end_turn(index)
        fed += len(turn_calls)
        if wanted and fed >= wanted[0]:
            memory[wanted.pop(0)] = tracemalloc.get_traced_memory()[0] - baseline
    detector.end_run("end_turn", "Done.", len(turns))
    return clock() - started, detector, memory


# --- offline -------------------------------------------------------------------------------------------------------


@tool
def reserve(item_id: str) -> str:
    """Reserve an item (always fails: the backend is down).

    Args:
        item_id: The item.
    """
    raise RuntimeError(f"backend unavailable while reserving {item_id}")


def _recordings() -> list[Recording]:
    def agent(provider: TracerProvider, responses: list[dict[str, Any]]) -> Agent:
        return Agent(scenario.MODEL, tools=[scenario.lookup, reserve], system=scenario.SYSTEM, name="bench",
                     limits=scenario.LIMITS, client=ScriptedModel(responses), tracer_provider=provider,
                     alerts=Alerts(log_warnings=False))

    def call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
        return {"stop_reason": "tool_use", "usage": {"input_tokens": 500, "output_tokens": 40},
                "content": [{"type": "tool_use", "id": f"toolu_{n:03d}", "name": name, "input": arguments}]}

    done = {"content": [{"type": "text", "text": "All done."}], "usage": {"input_tokens": 900, "output_tokens": 20}}
    runs = {
        "steady": scenario.script(12),
        "runaway": [call("lookup", {"item": "projector", "step": 1}, n) for n in range(10)] + [done],
        "ignored_error": [call("lookup", {"item": "projector", "step": 1}, 1),
                          call("reserve", {"item_id": "EQ-001"}, 2), done],
        "cycle": [call("lookup", {"item": "projector", "step": n % 2 + 1}, n) for n in range(8)] + [done],
    }
    recordings = []
    for name, responses in runs.items():
        recording, result = record(lambda provider, r=responses: agent(provider, r).run(scenario.task(name)))
        recordings.append(recording)
    return recordings


class _Batches(SpanProcessor):
    """Hands ended spans to an exporter in batches of 512 on this thread (the BatchSpanProcessor's line size)."""

    def __init__(self, exporter: OTLPJsonFileExporter) -> None:
        self.exporter = exporter
        self.batch: list[ReadableSpan] = []
        self.count = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.batch.append(span)
        self.count += 1
        if len(self.batch) >= 512:
            self.force_flush()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self.batch:
            self.exporter.export(self.batch)
            self.batch = []
        return True


def write_trace_file(path: str, spans: int) -> tuple[int, int]:
    """A trace file of at least ``spans`` spans. Returns (spans written, runs written)."""
    recordings = _recordings()
    batches = _Batches(OTLPJsonFileExporter(path))
    provider = TracerProvider()
    provider.add_span_processor(batches)
    tracer = provider.get_tracer("looptrace")
    runs = 0
    while batches.count < spans:
        replay(tracer, recordings[runs % len(recordings)])
        runs += 1
    provider.shutdown()
    return batches.count, runs


def detect_file(path: str, verdicts: list[int] | None = None) -> float:
    """``looptrace detect PATH --json`` in this process, its output kept in memory; the seconds it took."""
    from looptrace.cli import app

    sink = io.StringIO()
    started = clock()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(io.StringIO()):
        code = app.main(["detect", path, "--json"])
    elapsed = clock() - started
    assert code in (0, 1), code
    if verdicts is not None:
        verdicts.append(sum(1 for line in sink.getvalue().splitlines() if line.strip()))
    return elapsed


def parse_file(path: str) -> float:
    started = clock()
    with open(path, "rb") as handle:
        for line in handle:
            json.loads(line)
    return clock() - started


# --- the benchmark -------------------------------------------------------------------------------------------------


def run(quick: bool = False) -> list[Row]:
    live_calls = 20_000 if quick else LIVE_CALLS
    file_spans = 20_000 if quick else FILE_SPANS
    passes = 1 if quick else 3
    rows: list[Row] = []

    say(f"  3: live detector, {passes} pass(es) of {live_calls:,} calls")
    timings = []
    for _ in range(passes):
        gc.collect()
        seconds, detector, _ = feed(live_calls)
        timings.append(seconds)
    per_call = median(timings) / live_calls
    anomalies = detector.anomalies_reported
    internal_errors = detector.internal_errors

    checkpoints = tuple(live_calls * k // 10 for k in range(1, 11))
    gc.collect()
    tracemalloc.start()
    try:
        _, detector, memory = feed(live_calls, checkpoints)
        sizes = detector.container_sizes()
    finally:
        tracemalloc.stop()
    first, middle, last = memory[checkpoints[0]], memory[checkpoints[4]], memory[checkpoints[-1]]
    flat = last - middle <= max(64 * 1024, 0.05 * middle)
    rows.append(Row("3 detector", "live cost per tool call", fmt_s(per_call), "", None,
                    f"{live_calls:,} calls in one run, observe + end_turn as the loop feeds it; "
                    f"{anomalies:,} anomalies fired, {internal_errors} internal errors; median of {passes}"))
    rows.append(Row("3 detector", f"memory at {checkpoints[0]:,} / {checkpoints[4]:,} / {live_calls:,} calls",
                    f"{first / 1024:.0f} / {middle / 1024:.0f} / {last / 1024:.0f} KiB", "flat", flat,
                    "tracemalloc: memory allocated since the first call and still held (the detector and the "
                    "anomalies it returned); "
                    f"at the end: {sizes['anomalies']} anomalies kept, window {sizes['window']}, "
                    f"{sizes['call_streaks']} streaks, {sizes['unresolved_errors']} unresolved errors"))

    with tempfile.TemporaryDirectory(prefix="looptrace-bench3-") as tmp:
        path = os.path.join(tmp, "traces.jsonl")
        say(f"  3: writing a trace file of {file_spans:,}+ spans")
        spans, runs = write_trace_file(path, file_spans)
        size_mb = os.path.getsize(path) / 1e6
        found: list[int] = []
        reps = 2 if quick else 3
        say(f"  3: {reps} x (looptrace detect, json.loads) over {size_mb:.0f} MB")
        samples = interleave({"detect": lambda: detect_file(path, found), "parse": lambda: parse_file(path)},
                             reps=reps, warmup=0)
    detect_s, parse_s = median(samples["detect"]), median(samples["parse"])
    verdicts = found[0]
    ratio = detect_s / parse_s
    rows.append(Row("3 detector", "`looptrace detect` time / `json.loads` time, same file", f"{ratio:.2f}x",
                    f"<= {GOAL_RATIO:.0f}x", ratio <= GOAL_RATIO,
                    f"{spans:,} spans, {runs:,} runs, {size_mb:.0f} MB; detect {fmt_s(detect_s)} "
                    f"({spans / detect_s:,.0f} spans/s, {verdicts:,} traces with anomalies), json.loads alone "
                    f"{fmt_s(parse_s)}; median of {reps} interleaved"))
    return rows
