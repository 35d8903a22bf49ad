"""10. Side by side with the peers: extra CPU per turn over a bare loop, one conversation, one harness.

The conversation: 3 calls through the real ``anthropic`` SDK (``anthropic.Anthropic``, its own spans off) to the fake
Messages API in its own process, 2 of them answered with a tool call (a no-op tool), the last with ``end_turn``.
Every variant runs it in a process of its own (``peer_worker.py``; the peers in venvs of their own, ``peer_venvs.py``),
and exports what it recorded inside the clock (each sample ends with the variant's flush). The clock is the worker's
process CPU time, all threads included, so a background export thread's work counts; the servers' work does not.

Variants, each against the same bare loop (no instrumentation at all):

* looptrace, file export (the default: an ``Agent`` given no provider, writing the trace file the environment names)
  and OTLP export (``configure(exporters="otlp")`` to a local OTLP/HTTP sink that accepts and discards): ``Agent``
  with the detector and content capture on, traces only (no MeterProvider given to the Agent), and no per-tool time
  limit, as the bare loop runs its tool (the in-process set prices the default 60 s limit in rows of its own).
* the peers, each exporting over OTLP/HTTP (protobuf, batched) to the same sink: OpenLLMetry's anthropic
  instrumentation (content on: its default), OpenTelemetry's genai-anthropic instrumentation (content on the span:
  ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY``, not its default), OpenInference's anthropic
  instrumentation (content on: its default), Langfuse's SDK with ``@observe`` on the conversation, each model call (as a
  generation) and each tool call, exporting to the sink as its Langfuse host, and Logfire's ``instrument_anthropic()``
  with ``send_to_logfire=False``, no console, and a BatchSpanProcessor to the sink.
* raw SDK: the bare loop plus the spans of a real looptrace run of this conversation (recorded at start-up: every
  attribute, content included, events, statuses, same order) made straight through the OpenTelemetry SDK into a
  ``BatchSpanProcessor`` with a null exporter (goal 1's baseline) or the OTLP/HTTP exporter to the sink (goal 2's).

Runs x repetitions: each run starts every worker afresh; within a run the order rotates every repetition and each
variant's extra = median over repetitions of (its sample - the bare sample of the same repetition) per turn. The table
gives the median over runs and the range; ratios are taken per run, then the median.

The in-process goals are printed with a 95% bootstrap interval (each process's repetitions drawn again, a
repetition's samples together) and the bare loop's own spread, the machine's noise. A goal is met when the whole
interval is at or under it, missed when the whole interval is over it, and undecided when the interval spans it: a
run on a busy machine cannot tell a ratio of 1.1x from one of 1.3x, and says so instead of a verdict by chance.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import scenario
from .common import Row, fmt_s, say
from .peer_venvs import PEER_REQUIREMENTS, PeerEnv, ensure_all, ensure_inprocess
from .servers import MessagesAPIServer, OTLPSink

CALLS = 3  # model calls per conversation (2 tool calls, then end_turn)
MAX_TOKENS = 1024
GOAL_FILE = 1.0  # goal 1: looptrace file export / raw SDK, null exporter
GOAL_OTLP = 1.5  # goal 2: looptrace OTLP export / raw SDK, OTLP exporter
GOAL_INPROCESS_FILE = 1.2  # issue 29 (1.0 under issue 23, when looptrace had an encoder of its own): looptrace
# file / raw SDK file floor with content, in one process; both paths now go through the SDK's encoders
GOAL_INPROCESS_OTLP = 1.2  # issues 23 and 29: looptrace OTLP / raw SDK OTLP floor with content, in one process
GOAL_FLOORS = {"looptrace-file": "raw-file", "looptrace-otlp": "raw-otlp"}  # each in-process goal's divisor
_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Variant:
    key: str  # peer_worker.VARIANTS key
    label: str  # what the row says
    exporter: str  # where its spans go
    peer: str | None = None  # the peer venv it runs in; None: this environment
    env: PeerEnv | None = None
    versions: dict[str, str] = field(default_factory=dict)
    spans: int | None = None  # per conversation
    attributes: int | None = None
    extras: list[float] = field(default_factory=list)  # per run: extra CPU seconds per turn over bare


def variants() -> list[Variant]:
    sink = "OTLP/HTTP to a discarding sink"
    return [
        Variant("looptrace-file", "looptrace, file export (default)", "OTLP/JSON file"),
        Variant("looptrace-otlp", "looptrace, OTLP export", sink),
        Variant("openllmetry", "OpenLLMetry anthropic instrumentation", sink, "openllmetry"),
        Variant("otel-genai", "OpenTelemetry's genai-anthropic instrumentation", sink, "otel-genai"),
        Variant("openinference", "OpenInference anthropic instrumentation", sink, "openinference"),
        Variant("langfuse", "Langfuse SDK @observe", "Langfuse's OTLP/HTTP exporter to the sink", "langfuse"),
        Variant("logfire", "Logfire instrument_anthropic", sink, "logfire"),
        Variant("looptrace-off", "context: looptrace, telemetry and detector off (the runtime alone)", "nothing"),
        Variant("raw-null", "raw OTel SDK, looptrace's spans and attributes, null exporter", "null exporter (BSP)"),
        Variant("raw-otlp", "raw OTel SDK, looptrace's spans and attributes, OTLP exporter", sink),
    ]


class Worker:
    """A peer_worker process; one JSON line per command and per answer."""

    def __init__(self, key: str, python: str, env: dict[str, str]) -> None:
        self.key = key
        self.process = subprocess.Popen([python, "-m", "benchmarks.peer_worker", key], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT)
        self.ready: dict | None = None

    def wait_ready(self) -> dict:
        self.ready = self._read()
        return self.ready

    def ask(self, **command) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            raise RuntimeError(f"worker {self.key} exited ({self.process.returncode}); see stderr")
        return json.loads(line)

    def stop(self) -> None:
        try:
            self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()


def _config() -> dict:
    return {"model": scenario.MODEL, "system": scenario.SYSTEM, "task": scenario.task("run-0"),
            "tools": [scenario.lookup.definition()], "max_tokens": MAX_TOKENS, "calls": CALLS}


def _start(keys_pythons: dict[str, str], env: dict[str, str]) -> dict[str, Worker]:
    workers = {key: Worker(key, python, env) for key, python in keys_pythons.items()}
    for worker in workers.values():  # they set up in parallel; wait for each in turn
        worker.wait_ready()
    return workers


def _one_run(workers: dict[str, Worker], reps: int, conversations: int) -> dict[str, list[float]]:
    names = list(workers)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            cpu[name].append(workers[name].ask(sample=conversations)["cpu_s"])
    return cpu


def run(quick: bool = False) -> list[Row]:
    rows, inprocess = run_inprocess(quick)
    if os.environ.get("LOOPTRACE_BENCH_PEERS_SEPARATE", "1") == "0":
        return rows
    separate_rows = run_separate(quick)
    table = inprocess_table(inprocess)
    say("\n" + table)
    say("\n" + disagreement(inprocess, _last_separate))
    return rows + separate_rows


INPROCESS_LABELS = {
    "looptrace-file": "looptrace, an Agent given no provider (its own pipeline: the trace file)",
    "raw-file": "raw SDK floor for the file, with content: the SDK's OTLP/JSON encoder, a line per span appended",
    "looptrace-otlp": 'looptrace, configure(exporters="otlp")',
    "looptrace-file-timed": "looptrace file, with the default 60 s per-tool limit (each call on a tool thread)",
    "looptrace-otlp-timed": "looptrace OTLP, with the default 60 s per-tool limit (each call on a tool thread)",
    "raw-otlp": "raw SDK floor for OTLP, with content: BatchSpanProcessor + the SDK's OTLP/HTTP exporter",
    "raw-file-burst": "reference: the file floor's spans all made after the conversation, in one burst",
    "raw-otlp-burst": "reference: the OTLP floor's spans all made after the conversation, in one burst",
    "openllmetry": "OpenLLMetry (opentelemetry-instrumentation-anthropic), OTLP/HTTP",
    "openinference": "OpenInference (openinference-instrumentation-anthropic), OTLP/HTTP",
}


def run_inprocess(quick: bool) -> tuple[list[Row], dict]:
    """The in-process set (``b10_inprocess``), each run in a worker process of its own; the extras per turn over the
    bare loop are the median over runs, and each goal's ratio is taken per run, then the median.

    Several processes rather than one long one: a process's memory layout (where the allocator put the SDK's objects
    and the recorded values) moves every variant's figure by up to a fifth, the same way for the whole run, and more
    repetitions in one process cannot average that out."""
    chosen = os.environ.get("LOOPTRACE_BENCH_INPROCESS_PYTHON")  # an interpreter of one's own choosing
    env_info = PeerEnv("inprocess", chosen) if chosen else ensure_inprocess()
    python = env_info.python or sys.executable
    if env_info.python is None:
        say(f"  10 in-process: no venv with the peers' current releases ({env_info.problem}); running in this "
            "environment with the peers it has")
    runs = int(os.environ.get("LOOPTRACE_BENCH_INPROCESS_RUNS") or (1 if quick else 3))
    reps = int(os.environ.get("LOOPTRACE_BENCH_INPROCESS_REPS") or (6 if quick else 20))
    conversations = 2 if quick else 5
    results = []
    with MessagesAPIServer(turns=CALLS) as api, OTLPSink() as sink:
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
               "BENCH_PEERS_CONFIG": json.dumps(_config()), "BENCH_PEERS_API_URL": api.url,
               "BENCH_PEERS_API_KEY": api.api_key, "BENCH_PEERS_SINK_URL": sink.url,
               "BENCH_INPROCESS_REPS": str(reps), "BENCH_INPROCESS_CONVERSATIONS": str(conversations),
               "PYTHONWARNINGS": "ignore::DeprecationWarning"}
        for number in range(runs):
            say(f"  10 in-process: run {number + 1}/{runs}, {reps} rotated repetitions of {conversations} "
                f"conversations, one process ({python})")
            done = subprocess.run([python, "-m", "benchmarks.b10_inprocess"], env=env, cwd=_ROOT,
                                  stdout=subprocess.PIPE, text=True, check=True)
            results.append(_extras_per_turn(json.loads(done.stdout.strip().splitlines()[-1])))
    result = {"runs": results, "reps": reps, "conversations": conversations, "versions": results[0]["versions"],
              "extras": {name: statistics.median(r["extras"][name] for r in results) for name in results[0]["extras"]},
              "bare_turn": statistics.median(r["bare_turn"] for r in results)}
    # Drawn once here: the table is printed again beside the separate-process one.
    result["intervals"] = {lt: goal_interval(result, lt, floor) for lt, floor in GOAL_FLOORS.items()}
    say("\n" + inprocess_table(result))
    extras = result["extras"]
    how = (f"median of {runs} processes x {reps} rotated repetitions of {conversations} conversations of {CALLS} "
           "calls")
    rows = [Row("10 in-process", f"{INPROCESS_LABELS.get(name, name)}: extra CPU per turn over a bare loop",
                f"{extra * 1e6:,.0f} µs", "", None, how) for name, extra in extras.items()]
    for label, lt, floor, goal in (("looptrace file / raw SDK file floor with content", "looptrace-file", "raw-file",
                                    GOAL_INPROCESS_FILE),
                                   ("looptrace OTLP / raw SDK OTLP floor with content", "looptrace-otlp", "raw-otlp",
                                    GOAL_INPROCESS_OTLP)):
        ratios = _run_ratios(result, lt, floor)
        low, high = result["intervals"][lt]
        rows.append(Row("10 in-process", label, f"{statistics.median(ratios):.2f}x", f"<= {goal}x",
                        statistics.median(ratios) <= goal,
                        f"runs {min(ratios):.2f}-{max(ratios):.2f}x; 95% interval {low:.2f}-{high:.2f}x "
                        f"({verdict(low, high, goal)}); {how}"))
    return rows, result


def _extras_per_turn(measured: dict) -> dict:
    """One in-process run's samples as each variant's extra CPU seconds per turn over the bare loop (the median of
    its differences to the bare sample of the same repetition)."""
    turns = measured["conversations"] * CALLS
    bare = measured["samples"]["bare"]
    measured["extras"] = {name: statistics.median([a - b for a, b in zip(samples, bare)]) / turns
                          for name, samples in measured["samples"].items() if name != "bare"}
    measured["bare_turn"] = statistics.median(bare) / turns
    return measured


def _run_ratios(result: dict, variant: str, floor: str) -> list[float]:
    return [run["extras"][variant] / run["extras"][floor] for run in result["runs"]]


def goal_interval(result: dict, variant: str, floor: str, draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval for a goal's ratio as the run reports it (the median over processes of each
    process's ratio of median extras): each process's repetitions are drawn again with replacement, a repetition's
    samples kept together (they were taken side by side, so they share the machine's state of the moment).

    On a quiet machine the interval is narrow and the verdict the same as the point figure's. On a busy one the bare
    loop's own samples spread by a fifth or more, and a ratio of two differences of such samples can move by as much
    between runs: the interval then says whether the run could tell the ratio from the goal at all."""
    chance = random.Random(10)  # the same interval for the same samples
    turns = result["conversations"] * CALLS
    processes = [(run["samples"]["bare"], run["samples"][variant], run["samples"][floor]) for run in result["runs"]]
    statistic = []
    for _ in range(draws):
        ratios = []
        for bare, mine, theirs in processes:
            picks = [chance.randrange(len(bare)) for _ in bare]
            extra = statistics.median(mine[i] - bare[i] for i in picks) / turns
            floor_extra = statistics.median(theirs[i] - bare[i] for i in picks) / turns
            ratios.append(extra / floor_extra if floor_extra > 0 else float("inf"))
        statistic.append(statistics.median(ratios))
    cuts = statistics.quantiles(statistic, n=40)  # 2.5% steps: the first and last cut bound 95%
    return cuts[0], cuts[-1]


def verdict(low: float, high: float, goal: float) -> str:
    if high <= goal:
        return "met"
    if low > goal:
        return "not met"
    return "undecided: the interval spans the goal"


def bare_spread(result: dict) -> float:
    """How much the bare loop's own samples spread in the run: the median over processes of the interquartile range
    over the median (the machine's noise, which every extra inherits)."""
    spreads = []
    for run in result["runs"]:
        q1, q2, q3 = statistics.quantiles(run["samples"]["bare"], n=4)
        spreads.append((q3 - q1) / q2)
    return statistics.median(spreads)


def inprocess_table(result: dict) -> str:
    """The in-process table: extra CPU per turn over the bare loop (median over runs, and the range), ratios to the
    floors, goals beside them."""
    extras, versions, runs = result["extras"], result["versions"], result["runs"]
    lines = [f"In one process at a time ({len(runs)} processes x {result['reps']} rotated repetitions of "
             f"{result['conversations']} conversations; bare loop {fmt_s(result['bare_turn'])} CPU/turn; "
             + ", ".join(f"{k} {v}" for k, v in versions.items()) + ")",
             "| variant | extra CPU µs/turn (range over processes) | vs its floor | vs looptrace file "
             "| vs looptrace OTLP |",
             "| --- | ---: | ---: | ---: | ---: |"]
    floors = {"looptrace-file": "raw-file", "looptrace-otlp": "raw-otlp", "looptrace-file-timed": "raw-file",
              "looptrace-otlp-timed": "raw-otlp"}
    for name, extra in extras.items():
        floor = floors.get(name)
        versus = f"{statistics.median(_run_ratios(result, name, floor)):.2f}" if floor else ""
        band = [run["extras"][name] * 1e6 for run in runs]
        lines.append(f"| {INPROCESS_LABELS.get(name, name)} | {extra * 1e6:,.0f} ({min(band):,.0f}-{max(band):,.0f}) "
                     f"| {versus} | {statistics.median(_run_ratios(result, name, 'looptrace-file')):.2f} | "
                     f"{statistics.median(_run_ratios(result, name, 'looptrace-otlp')):.2f} |")
    goals = []
    for what, lt, floor, goal in (("looptrace OTLP", "looptrace-otlp", "raw-otlp", GOAL_INPROCESS_OTLP),
                                  ("file path", "looptrace-file", "raw-file", GOAL_INPROCESS_FILE)):
        ratios = _run_ratios(result, lt, floor)
        ratio = statistics.median(ratios)
        low, high = result["intervals"][lt]
        goals.append(f"{what} <= {goal}x its floor: {ratio:.2f}x, runs {min(ratios):.2f}-{max(ratios):.2f}x, "
                     f"95% interval {low:.2f}-{high:.2f}x ({verdict(low, high, goal)})")
    lines.append("Goals (printed, never asserted): " + "; ".join(goals))
    lines.append(f"The machine's noise: the bare loop's samples spread {bare_spread(result):.0%} (interquartile range "
                 "over the median, per process)")
    if "raw-file-burst" in extras and "raw-otlp-burst" in extras:
        lines.append("Against the burst references instead (spans made after the conversation): file "
                     f"{statistics.median(_run_ratios(result, 'looptrace-file', 'raw-file-burst')):.2f}x, OTLP "
                     f"{statistics.median(_run_ratios(result, 'looptrace-otlp', 'raw-otlp-burst')):.2f}x")
    return "\n".join(lines)


def disagreement(inprocess: dict, separate: list[Variant] | None) -> str:
    """Where the two methods disagree, variant by variant, and the reasons that follow from how each measures."""
    if not separate:
        return "No separate-process figures to compare."
    by_key = {v.key: v for v in separate if v.extras}
    extras = inprocess["extras"]
    lines = ["Both methods (extra CPU µs/turn; ratio to looptrace file in each):",
             "| variant | in one process | separate processes | ratio in one | ratio separate | disagree | releases |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    mine = inprocess["versions"]
    for name, extra in extras.items():
        other = by_key.get(name) or (by_key.get("raw-null") if name == "raw-file" else None)
        if other is None or "looptrace-file" not in by_key:
            continue
        separate_extra = statistics.median(other.extras)
        separate_file = statistics.median(by_key["looptrace-file"].extras)
        ratio_one, ratio_separate = extra / extras["looptrace-file"], separate_extra / separate_file
        # More than a quarter apart is beyond what repeated runs of either method move by.
        apart = "yes" if abs(ratio_one / ratio_separate - 1) > 0.25 else "no"
        packages = [p for p in other.versions if p not in ("anthropic", "opentelemetry-sdk", "looptrace")]
        releases = ", ".join(f"{p} {mine.get(p, '?')} here, {other.versions[p]} there" for p in packages
                             if mine.get(p) != other.versions[p]) or "same"
        lines.append(f"| {name}{' (separate: raw-null)' if name == 'raw-file' else ''} | {extra * 1e6:,.0f} | "
                     f"{separate_extra * 1e6:,.0f} | {ratio_one:.2f} | {ratio_separate:.2f} | {apart} | {releases} |")
    lines.append("Why they differ: the separate-process peers run the releases pinned in peer_venvs.py, in venvs of "
                 "their own (the in-process set the current ones: 'releases' above); the separate-process file floor (raw-null) exports to a "
                 "null exporter, the in-process one encodes content to a file; and a process of its own per variant "
                 "pays its own warm caches and allocator, where one process shares them and pays the others' "
                 "garbage on the same clock (a gc.collect before each sample keeps that small).")
    return "\n".join(lines)


_last_separate: list[Variant] | None = None


def run_separate(quick: bool = False) -> list[Row]:
    """The separate-process table: every variant in a process of its own, the peers in venvs of their own."""
    global _last_separate
    # The protocol by default; LOOPTRACE_BENCH_PEERS_RUNS / _REPS trade precision for time on a busy machine.
    runs = int(os.environ.get("LOOPTRACE_BENCH_PEERS_RUNS") or (2 if quick else 5))
    reps = int(os.environ.get("LOOPTRACE_BENCH_PEERS_REPS") or (5 if quick else 30))
    # One export request per sample and variant (the flush), as a real agent's slow turns get about one per turn.
    conversations = 2 if quick else 3
    turns_per_sample = conversations * CALLS
    table = variants()
    peers = [v.peer for v in table if v.peer]
    where = os.environ.get("LOOPTRACE_BENCH_PEERS_DIR") or "~/.cache/looptrace-bench-peers"
    say(f"  10: preparing the peers' venvs ({', '.join(peers)}) in {where}")
    envs = ensure_all(peers)
    for variant in table:
        if variant.peer:
            variant.env = envs[variant.peer]
            if variant.env.python is None:
                say(f"  10: {variant.peer}: {variant.env.problem}")
    measured = [v for v in table if v.env is None or v.env.python is not None]
    pythons = {"bare": sys.executable, **{v.key: (v.env.python if v.env else sys.executable) for v in measured}}

    with MessagesAPIServer(turns=CALLS) as api, OTLPSink() as sink:
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
               "BENCH_PEERS_CONFIG": json.dumps(_config()), "BENCH_PEERS_API_URL": api.url,
               "BENCH_PEERS_API_KEY": api.api_key, "BENCH_PEERS_SINK_URL": sink.url,
               # The benchmark's model name is deprecated in newer SDKs; the warning is the same in every variant.
               "PYTHONWARNINGS": "ignore::DeprecationWarning"}
        say(f"  10: {runs} runs x {reps} rotated repetitions of {len(pythons)} workers, {conversations} conversations "
            f"({turns_per_sample} turns) per sample")
        for number in range(runs):
            workers = _start(pythons, env)
            try:
                if number == 0:
                    _describe(measured, workers, sink)
                cpu = _one_run(workers, reps, conversations)
            finally:
                for worker in workers.values():
                    worker.stop()
            for variant in measured:
                paired = [a - b for a, b in zip(cpu[variant.key], cpu["bare"])]
                variant.extras.append(statistics.median(paired) / turns_per_sample)
            bare_turn = statistics.median(cpu["bare"]) / turns_per_sample
            say(f"  10: run {number + 1}/{runs}: bare {fmt_s(bare_turn)} CPU/turn; "
                + ", ".join(f"{v.key} +{v.extras[-1] * 1e6:,.0f} µs" for v in measured))
    rows = _rows(table, runs, reps, conversations)
    say("\n" + side_by_side(table))
    _last_separate = table
    return rows


def _describe(measured: list[Variant], workers: dict[str, Worker], sink: OTLPSink) -> None:
    """What each variant records for one conversation, counted where it ends up (file, null exporter or sink)."""
    for variant in measured:
        worker = workers[variant.key]
        variant.versions = worker.ready["versions"] if worker.ready else {}
        sink.count_start()
        counted = worker.ask(count=True)
        at_sink = sink.count_stop()
        if counted.get("spans") is None:
            counted = at_sink
        variant.spans, variant.attributes = counted["spans"], counted["attributes"]


def _band(values: list[float]) -> str:
    return f"{min(values) * 1e6:,.0f}–{max(values) * 1e6:,.0f} µs"


def _ratios(variant: Variant, base: Variant) -> list[float]:
    return [a / b for a, b in zip(variant.extras, base.extras)]


def _rows(table: list[Variant], runs: int, reps: int, conversations: int) -> list[Row]:
    by_key = {v.key: v for v in table}
    lt_file, lt_otlp = by_key["looptrace-file"], by_key["looptrace-otlp"]
    rows = []
    for variant in table:
        if not variant.extras:
            reason = variant.env.problem if variant.env else "not measured"
            rows.append(Row("10 peers", variant.label, "not measured", "", None, reason))
            continue
        per_turn = lambda n: "?" if n is None else f"{n / CALLS:.1f}"  # noqa: E731
        versions = ", ".join(f"{k} {v}" for k, v in variant.versions.items())
        rows.append(Row(
            "10 peers", f"{variant.label}: extra CPU per turn over a bare loop",
            f"{statistics.median(variant.extras) * 1e6:,.0f} µs", "", None,
            f"{per_turn(variant.spans)} spans and {per_turn(variant.attributes)} span attributes per turn; "
            f"{statistics.median(_ratios(variant, lt_file)):.2f}x looptrace file, "
            f"{statistics.median(_ratios(variant, lt_otlp)):.2f}x looptrace OTLP; runs {_band(variant.extras)}; "
            f"export: {variant.exporter}; {versions}"))
    goal1 = _ratios(lt_file, by_key["raw-null"])
    goal2 = _ratios(lt_otlp, by_key["raw-otlp"])
    how = f"median of {runs} runs x {reps} rotated repetitions of {conversations} conversations of {CALLS} calls"
    rows.append(Row("10 peers", "goal 1: looptrace file export / raw SDK with looptrace's spans, null exporter "
                    "(extra CPU per turn each)", f"{statistics.median(goal1):.2f}x", f"<= {GOAL_FILE}x",
                    statistics.median(goal1) <= GOAL_FILE,
                    f"runs {min(goal1):.2f}–{max(goal1):.2f}x; {how}"))
    off = by_key["looptrace-off"]
    if off.extras:
        telemetry1 = [(a - o) / r for a, o, r in zip(lt_file.extras, off.extras, by_key["raw-null"].extras)]
        rows.append(Row("10 peers", "context for goal 1: telemetry only, (looptrace file - looptrace telemetry off) "
                        "/ raw SDK null exporter", f"{statistics.median(telemetry1):.2f}x", "", None,
                        f"runs {min(telemetry1):.2f}–{max(telemetry1):.2f}x; the runtime alone (telemetry and "
                        f"detector off) costs {statistics.median(off.extras) * 1e6:,.0f} µs/turn over the bare loop"))
    rows.append(Row("10 peers", "goal 2: looptrace OTLP export / raw SDK with looptrace's spans, same OTLP exporter "
                    "(extra CPU per turn each)", f"{statistics.median(goal2):.2f}x", f"<= {GOAL_OTLP}x",
                    statistics.median(goal2) <= GOAL_OTLP,
                    f"runs {min(goal2):.2f}–{max(goal2):.2f}x; {how}"))
    if off.extras:
        telemetry2 = [(a - o) / r for a, o, r in zip(lt_otlp.extras, off.extras, by_key["raw-otlp"].extras)]
        rows.append(Row("10 peers", "context for goal 2: telemetry only, (looptrace OTLP - looptrace telemetry off) "
                        "/ raw SDK OTLP exporter", f"{statistics.median(telemetry2):.2f}x", "", None,
                        f"runs {min(telemetry2):.2f}–{max(telemetry2):.2f}x"))
    return rows


def side_by_side(table: list[Variant]) -> str:
    """The issue's table: system, spans/turn, extra CPU µs/turn, vs looptrace (file export)."""
    base = next(v for v in table if v.key == "looptrace-file")
    lines = ["| system | exports to | spans/turn | attributes/turn | extra CPU µs/turn (range over runs) "
             "| vs looptrace file | vs looptrace OTLP |", "| --- | --- | --- | --- | --- | --- | --- |"]
    otlp = next(v for v in table if v.key == "looptrace-otlp")
    for v in table:
        if not v.extras:
            lines.append(f"| {v.label} | {v.exporter} | | | not measured: "
                         f"{v.env.problem if v.env else 'failed'} | | |")
            continue
        spans = "?" if v.spans is None else f"{v.spans / CALLS:.1f}"
        attributes = "?" if v.attributes is None else f"{v.attributes / CALLS:.1f}"
        lines.append(f"| {v.label} | {v.exporter} | {spans} | {attributes} | "
                     f"{statistics.median(v.extras) * 1e6:,.0f} ({_band(v.extras)}) | "
                     f"{statistics.median(_ratios(v, base)):.2f} | {statistics.median(_ratios(v, otlp)):.2f} |")
    return "\n".join(lines)


assert set(PEER_REQUIREMENTS) == {v.peer for v in variants() if v.peer}
