"""9. The local trace file: what writing it costs an agent, and what reading it back costs (issue 14, goals 1 and 3).

Goal 1, writing. One scripted run (``TURNS`` turns, a no-op tool per turn), interleaved samples of:

* off: ``Agent(..., telemetry=False, detector=False)``: the loop alone.
* on: looptrace's default telemetry as a user gets it: an ``Agent`` given no provider, in an environment that sets
  nothing but ``LOOPTRACE_TRACE_FILE`` (a temporary file), so the Agent's own pipeline writes the trace file (an SDK
  provider and ``TraceFileProcessor``); content capture on, detector off (it is not telemetry).
* on+detector: the same with the detector on, the Agent as it comes: its difference to "on" is the detector's share.
* sdk: the same file written through the SDK's spans (``TracerProvider`` + ``TraceFileProcessor``), as it is when an
  application's provider or ``configure()`` is in play: for comparison.
* raw: the very spans that run made (names, kinds, parents, attributes given at start and set at the end, events,
  statuses, recorded from a run, content included) created straight through the SDK tracer, into a provider whose
  ``BatchSpanProcessor`` hands them to an exporter that does nothing: the SDK's own cost of those spans, no export,
  and none of the work of building the attributes (they are replayed prebuilt).

Per-turn telemetry cost = median over paired samples of (on - off) / turns; raw = median(raw) / turns; goal: the
ratio at or below 1.0. For context, the SDK path and the detector against the same baseline, and the export alone:
the same finished spans encoded and written by our writer against the OpenTelemetry OTLP/JSON encoder
(``encode_spans(...).to_dict()`` then ``json.dumps``).

Goal 3, reading. Trace files of about 10 MB and 100 MB made of real runs' spans (replays of a recorded run written by
the trace file processor; the 100 MB file repeats the 10 MB one with new trace ids). Each command runs as its own
process, start-up included, interleaved with the baseline: a Python process reading the same file and calling
``json.loads`` on every line, nothing else. Goals: `looptrace detect FILE` <= 1.5x and `looptrace traces show --file
FILE` <= 2x the baseline's time; peak memory (max RSS) of the 100 MB read close to the 10 MB one (flat).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from looptrace.instrumentation.tracefile.encode import encode_line
from looptrace.instrumentation.tracefile.write import TraceFileProcessor
from looptrace.runtime import Agent
from looptrace.runtime.models import ScriptedModel

from . import scenario
from .common import Row, clock, fmt_s, interleave, median, paired_median_difference, say
from .replay import Recording, record, replay

TURNS = 20
GOAL_WRITE = 1.0
GOAL_DETECT = 1.5
GOAL_SHOW = 2.0
SIZES_MB = (10, 100)
BASELINE = "import json, sys\nfor line in open(sys.argv[1], 'rb'):\n    json.loads(line)\n"


class NullExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def record_run(turns: int) -> Recording:
    def run(provider: TracerProvider) -> Any:
        agent = Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, name="bench",
                      limits=scenario.LIMITS, client=ScriptedModel(scenario.script(turns)), tracer_provider=provider)
        return agent.run(scenario.task("run-0"))

    recording, result = record(run)
    assert result.turns == turns and result.status.value == "done", (result.status, result.error)
    return recording


# --- goal 1: writing --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def default_trace_file(path: str) -> Iterator[None]:
    """The environment of a user who configured nothing but where the trace file goes (LOOPTRACE_TRACE_FILE, read by
    ``Settings.from_env`` as the CLI and configure() read it): no backend, sampler or limit variables."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("OTEL_", "LANGFUSE_", "LOOPTRACE_")):
            del os.environ[name]
    os.environ["LOOPTRACE_TRACE_FILE"] = path
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def writing(quick: bool, tmp: str) -> list[Row]:
    runs_per_sample = 2 if quick else 5
    reps = 8 if quick else 40
    turns_per_sample = runs_per_sample * TURNS
    recording = record_run(TURNS)

    sdk_provider = TracerProvider()
    sdk_provider.add_span_processor(TraceFileProcessor(os.path.join(tmp, "sdk.jsonl")))
    raw_provider = TracerProvider()
    raw_provider.add_span_processor(BatchSpanProcessor(NullExporter()))
    raw_tracer = raw_provider.get_tracer("looptrace")
    default_file = os.path.join(tmp, "default.jsonl")

    def agent(**options: Any) -> Agent:
        return Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, name="bench",
                     limits=scenario.LIMITS, **options)

    with default_trace_file(default_file):
        agents = {
            "off": agent(telemetry=False, detector=False),  # the bare loop
            "on": agent(detector=False),  # default telemetry: no provider anywhere, the trace file by default
            "on+detector": agent(),  # the Agent as it comes: default telemetry and the detector
            "sdk": agent(tracer_provider=sdk_provider, detector=False),  # the same file through the SDK's spans
        }
        def raw_sample() -> float:
            started = clock()
            for _ in range(runs_per_sample):
                replay(raw_tracer, recording)
            raw_provider.force_flush()  # the null export is paid inside the sample, as the file write is in "on"
            return clock() - started

        say(f"  9: writing: {reps} x (off, on, on+detector, sdk, raw), {runs_per_sample} runs of {TURNS} turns "
            f"({recording.span_count} spans per run)")
        variants = {name: scenario.scripted_runs(agent, TURNS, runs_per_sample) for name, agent in agents.items()}
        samples = interleave({**variants, "raw": raw_sample}, reps=reps)
        path = default_path_taken(agents["on"])
    sdk_provider.shutdown()
    raw_provider.shutdown()
    written = 0
    if os.path.exists(default_file):
        with open(default_file, "rb") as handle:
            written = sum(1 for _ in handle)

    def per_turn(name: str) -> float:
        return paired_median_difference(samples[name], samples["off"]) / turns_per_sample

    cost, sdk_cost = per_turn("on"), per_turn("sdk")
    detector = paired_median_difference(samples["on+detector"], samples["on"]) / turns_per_sample
    raw = median(samples["raw"]) / turns_per_sample
    ratio = cost / raw
    ours, official = export_only(recording, 5 if quick else 30)
    spans_per_turn = recording.span_count / TURNS
    conditions = f"{reps} interleaved samples of {runs_per_sample}x{TURNS} turns"
    return [
        Row("9 trace file", "default telemetry per turn (file export) / raw SDK spans per turn (null exporter)",
            f"{ratio:.2f}x", f"<= {GOAL_WRITE:.1f}x", ratio <= GOAL_WRITE,
            f"ours {fmt_s(cost)}/turn (Agent given no provider, trace file by default [{path}], content capture on, "
            f"detector off, minus the bare loop), raw SDK {fmt_s(raw)}/turn (the same spans and attributes replayed, "
            f"prebuilt, BatchSpanProcessor + null exporter, no file); {spans_per_turn:.2f} spans/turn, {written:,} "
            f"lines written; {conditions}"),
        Row("9 trace file", "context: the same file through the SDK's spans (TracerProvider + TraceFileProcessor) "
            "/ raw SDK spans", f"{sdk_cost / raw:.2f}x", "", None,
            f"SDK path {fmt_s(sdk_cost)}/turn over the bare loop; the default path above is "
            f"{cost / sdk_cost:.2f}x of it"),
        Row("9 trace file", "context: the detector's share per turn (default agent - default telemetry) / raw SDK",
            f"{detector / raw:.2f}x", "", None,
            f"detector {fmt_s(detector)}/turn on top of default telemetry; the Agent as it comes (telemetry + "
            f"detector) costs {fmt_s(cost + detector)}/turn = {(cost + detector) / raw:.2f}x raw"),
        Row("9 trace file", "context: export alone per span, our writer / the OTel OTLP/JSON encoder + json.dumps",
            f"{ours / official:.2f}x", "", None,
            f"ours {fmt_s(ours)}/span (encode + one append write), OTel {fmt_s(official)}/span (encode_spans, "
            f"to_dict, json.dumps; no write)"),
    ]


def default_path_taken(agent: Agent) -> str:
    """Which provider an Agent given none records on here: its own pipeline's (the SDK's, since issue 29)."""
    provider = agent._tracing.providers[0]  # type: ignore[attr-defined]
    return f"{type(provider).__module__}.{type(provider).__name__}"


def export_only(recording: Recording, reps: int) -> tuple[float, float]:
    """Per span: our encoding and write, against the official encoder's object layer and json.dumps."""
    spans: list[ReadableSpan] = []

    class Keep(SpanExporter):
        def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
            spans.extend(batch)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Keep()))
    replay(provider.get_tracer("looptrace"), recording)
    provider.shutdown()
    with tempfile.TemporaryDirectory(prefix="looptrace-bench6-") as tmp:
        writer = TraceFileProcessor(os.path.join(tmp, "export.jsonl"))

        def ours() -> float:
            started = clock()
            for span in spans:
                writer.on_end(span)
            return clock() - started

        def official() -> float:
            started = clock()
            for span in spans:
                json.dumps(encode_spans([span]).to_dict(), separators=(",", ":"))
            return clock() - started

        samples = interleave({"ours": ours, "official": official}, reps=reps)
        writer.shutdown()
        assert encode_line(spans[0])  # the same spans went through both
    return median(samples["ours"]) / len(spans), median(samples["official"]) / len(spans)


# --- goal 3: reading --------------------------------------------------------------------------------------------------


def write_file(path: str, recording: Recording, megabytes: int) -> int:
    """Replays of the recording written by the trace file processor until the file holds ``megabytes``."""
    provider = TracerProvider()
    provider.add_span_processor(TraceFileProcessor(path))
    tracer = provider.get_tracer("looptrace")
    runs = 0
    while not os.path.exists(path) or os.path.getsize(path) < megabytes * 1_000_000:
        replay(tracer, recording)
        runs += 1
    provider.shutdown()
    return runs


def repeat_file(source: str, target: str, times: int) -> None:
    """``times`` copies of the source's lines, each copy with its own trace ids."""
    trace_id = re.compile(rb'"traceId":"([0-9a-f]{2})')
    with open(source, "rb") as handle:
        content = handle.read()
    with open(target, "wb") as out:
        for copy in range(times):
            prefix = f'"traceId":"{copy:02x}'.encode()
            out.write(trace_id.sub(prefix, content))


def command(*argv: str) -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "looptrace")
    return [script, *argv] if os.path.exists(script) else [sys.executable, "-m", "looptrace.cli.entry", *argv]


TIME = "/usr/bin/time"  # GNU time: the child's own peak RSS (a forked child's counts the parent's pages too)


def timed_process(argv: list[str], tmp: str) -> tuple[float, int]:
    """Wall time and peak resident memory (KB; 0 when GNU time is missing) of one process, start-up included."""
    report = os.path.join(tmp, "rss.txt")
    measured = [TIME, "-f", "%M", "-o", report, *argv] if os.path.exists(TIME) else argv
    started = time.perf_counter()
    process = subprocess.run(measured, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    # detect exits 1 when it finds anomalies; a crash exits 1 too, and says so
    if process.returncode not in (0, 1) or b"Traceback" in process.stderr:
        raise RuntimeError(f"{argv} exited {process.returncode}: {process.stderr[-2000:].decode(errors='replace')}")
    try:
        with open(report, encoding="ascii") as handle:
            peak = int(handle.read().split()[-1])
    except (OSError, ValueError, IndexError):
        peak = 0
    return elapsed, peak


def compile_bytecode() -> None:
    """Bytecode for looptrace's modules, as an installed package has it (pip compiles at install; an editable
    install under PYTHONDONTWRITEBYTECODE would otherwise compile every module at every start)."""
    import compileall

    import looptrace
    import looptrace.instrumentation
    import looptrace.runtime

    for package in (looptrace, looptrace.instrumentation, looptrace.runtime):
        compileall.compile_dir(os.path.dirname(package.__file__), quiet=1, maxlevels=0)


# `looptrace detect` parses with msgspec's decoder when it is installed (a dependency), else with json.loads
DETECT_PARSER = "msgspec" if importlib.util.find_spec("msgspec") else "json.loads"


def reading(quick: bool, tmp: str) -> list[Row]:
    reps = 2 if quick else 5
    recording = record_run(TURNS)
    small = os.path.join(tmp, "10mb.jsonl")
    runs = write_file(small, recording, SIZES_MB[0])
    big = os.path.join(tmp, "100mb.jsonl")
    repeat_file(small, big, SIZES_MB[1] // SIZES_MB[0])
    compile_bytecode()
    rows = []
    memory: dict[str, dict[int, int]] = {"detect": {}, "show": {}, "json.loads": {}}
    for megabytes, path in zip(SIZES_MB, (small, big), strict=True):
        size = os.path.getsize(path) / 1e6
        variants = {
            "json.loads": [sys.executable, "-c", BASELINE, path],
            "detect": command("detect", path),
            "show": command("traces", "show", "--file", path),
        }
        rss: dict[str, int] = {}

        def sample(argv: list[str], name: str, rss: dict[str, int] = rss):
            def run() -> float:
                elapsed, peak = timed_process(argv, tmp)
                rss[name] = max(rss.get(name, 0), peak)
                return elapsed

            return run

        say(f"  9: reading: {reps} x (json.loads, detect, show) over {size:.0f} MB")
        samples = interleave({name: sample(argv, name) for name, argv in variants.items()}, reps=reps)
        baseline = median(samples["json.loads"])
        for name, goal in (("detect", GOAL_DETECT), ("show", GOAL_SHOW)):
            ratio = median(samples[name]) / baseline
            memory[name][megabytes] = rss[name]
            parser = f"; detect parses with {DETECT_PARSER}" if name == "detect" else ""
            rows.append(Row("9 trace file", f"`looptrace {'detect' if name == 'detect' else 'traces show'}` / "
                            f"json.loads, {megabytes} MB file, start-up included", f"{ratio:.2f}x", f"<= {goal}x",
                            ratio <= goal, f"{fmt_s(median(samples[name]))} vs {fmt_s(baseline)} for {size:.1f} MB "
                            f"({runs:,} runs of {TURNS} turns per 10 MB); peak RSS {rss[name] / 1024:.0f} MB "
                            f"(json.loads alone {rss['json.loads'] / 1024:.0f} MB); {reps} interleaved samples"
                            f"{parser}"))
        memory["json.loads"][megabytes] = rss["json.loads"]
    for name in ("detect", "show"):
        if not memory[name][SIZES_MB[0]]:
            continue  # no GNU time to measure with
        growth = memory[name][SIZES_MB[1]] / memory[name][SIZES_MB[0]]
        rows.append(Row("9 trace file", f"peak memory of `{name}`, 100 MB file / 10 MB file", f"{growth:.2f}x",
                        "flat (<= 1.2x)", growth <= 1.2,
                        f"{memory[name][SIZES_MB[0]] / 1024:.0f} MB -> {memory[name][SIZES_MB[1]] / 1024:.0f} MB"))
    return rows


ONLY_ENV = "LOOPTRACE_BENCH_ONLY"  # "reading" or "writing": one half of this benchmark (both when unset)


def run(quick: bool = False) -> list[Row]:
    only = os.environ.get(ONLY_ENV, "").strip().lower()
    with tempfile.TemporaryDirectory(prefix="looptrace-bench6-") as tmp:
        return ((writing(quick, tmp) if only in ("", "writing") else [])
                + (reading(quick, tmp) if only in ("", "reading") else []))
