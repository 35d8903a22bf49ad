"""The spill file keeps every span a backend could not take, and nothing in it blocks the rest: issue 22, items 2-4.

* item 2: a batch that parses but cannot be encoded for the wire is quarantined like an unreadable line;
* item 3: a push reads and compacts the spill file in memory bounded by the longest line it may read;
* item 4: spans still queued for a backend when the process is killed are pushed later (the journal).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes.otlp_receiver import OTLPReceiver
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.tracefile.spill import SpillFile, push

NETWORK_VARIABLES = ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT",
                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "LOOPTRACE_EXPORTER", "OTEL_TRACES_EXPORTER")


def three_spans(name: str = "step") -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("looptrace")
    with tracer.start_as_current_span(f"invoke_agent {name}"):
        for index in range(2):
            with tracer.start_as_current_span(f"{name} {index}"):
                pass
    return list(memory.get_finished_spans())


def otlp_settings(monkeypatch, receiver: OTLPReceiver, spill_path: Path) -> Settings:
    for name in NETWORK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("LOOPTRACE_SPILL_FILE", str(spill_path))
    return Settings.from_env()


# --- item 2: a batch the wire encoder refuses is set aside, once, and blocks nothing -----------------------------


def _unsendable_line(spill: SpillFile) -> str:
    """A spill line that parses as a batch but whose span name is a JSON list."""
    scratch = SpillFile(spill.path.with_name("scratch.jsonl"))
    scratch.append("otlp", three_spans("bad"))
    document = json.loads(scratch.path.read_text())
    document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] = ["a", "list"]
    return json.dumps(document) + "\n"


def test_a_batch_that_cannot_be_encoded_is_quarantined_and_the_batches_behind_it_are_delivered(tmp_path, monkeypatch):
    spill = SpillFile(tmp_path / "spill.jsonl")
    spill.append("otlp", three_spans("first"))
    bad_line = _unsendable_line(spill)
    with open(spill.path, "a") as handle:
        handle.write(bad_line)
    spill.append("otlp", three_spans("second"))
    spill.append("otlp", three_spans("third"))
    with OTLPReceiver() as receiver:
        settings = otlp_settings(monkeypatch, receiver, spill.path)
        report = push(settings=settings)
        receiver.wait_for_spans(9)
        again = push(settings=settings)
        names = sorted(span.name for span in receiver.spans)
    assert report.sent == {"otlp": 9} and not report.failed  # all three good batches, in one push
    assert len(report.quarantined) == 1 and "span name is a list" in report.quarantined[0].reason
    assert spill.quarantine.read_text() == bad_line and not spill.path.exists()  # kept, out of the way
    assert again.summary().startswith("nothing to push")  # said once
    assert names.count("invoke_agent third") == 1 and len(names) == 9  # each span once


# --- item 3: a huge line costs neither its size in memory nor the batches around it ------------------------------

_MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(done.stderr)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_rss_kib(tmp_path: Path, spill_path: Path, env: dict[str, str]) -> tuple[int, int]:
    """(exit code, peak resident memory in KiB) of `looptrace traces push --file spill_path`, run in a fresh
    process so that no other child counts."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "looptrace", "traces", "push",
                           "--file", str(spill_path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    code, peak = done.stdout.split()
    return int(code), int(peak)


@pytest.mark.slow
def test_pushing_a_spill_file_with_a_huge_line_holds_at_most_the_longest_line_read(tmp_path):
    limit, huge = 1 << 20, 64 << 20
    env = {key: value for key, value in os.environ.items() if key not in NETWORK_VARIABLES}
    env.update(LOOPTRACE_MAX_LINE_BYTES=str(limit), LOOPTRACE_EXPORTER="file")
    baseline = SpillFile(tmp_path / "baseline.jsonl")
    baseline.append("otlp", three_spans())
    with open(baseline.path, "a") as handle:  # a line just within the limit, in the baseline too
        handle.write('{"looptrace":{"backend":"otlp","batch":"small"},"resourceSpans":[],"x":"'
                     + "y" * (limit - 100) + '"}\n')
    baseline.append("otlp", three_spans())
    spill = SpillFile(tmp_path / "spill.jsonl")
    spill.append("otlp", three_spans())
    with open(spill.path, "a") as handle:
        handle.write('{"looptrace":{"backend":"otlp","batch":"huge"},"resourceSpans":[],"x":"')
        for _ in range(huge >> 20):
            handle.write("y" * (1 << 20))
        handle.write('"}\n')
    spill.append("otlp", three_spans())
    base_code, base_peak = _peak_rss_kib(tmp_path, baseline.path, env)
    code, peak = _peak_rss_kib(tmp_path, spill.path, env)
    assert base_code == 0 and code == 1  # batches left pending for a backend not configured; the huge line set aside
    assert spill.quarantine.stat().st_size > huge  # kept whole, in the quarantine
    assert SpillFile(spill.path, max_line_bytes=limit).pending_spans() == 6  # both batches still there
    growth_kib = peak - base_peak
    assert growth_kib < (huge >> 10) // 8, f"peak RSS grew by {growth_kib} KiB over the baseline's {base_peak} KiB"


# --- item 4: kill -9 with the backend down: every span of the trace file can still be pushed ---------------------

PUBLIC_KEY, SECRET_KEY = "pk-lf-test", "sk-lf-test"

_KILLED_RUN = """
import pathlib, sys, time
from looptrace.runtime import Agent, ScriptedModel, tool

ready = pathlib.Path(sys.argv[1])

@tool
def lookup(key: str) -> str:
    "Look a key up."
    return "value of " + key

@tool
def wait_for_the_kill() -> str:
    "Wait."
    ready.write_text("in the tool")
    time.sleep(600)
    return "never"

def tool_use(n, name, arguments):
    return {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": name,
            "input": arguments}], "usage": {"input_tokens": 10, "output_tokens": 5}}

script = [tool_use(n, "lookup", {"key": f"k{n}"}) for n in range(6)] + [tool_use(9, "wait_for_the_kill", {})]
Agent("claude-sonnet-4-5", tools=[lookup, wait_for_the_kill], client=ScriptedModel(script)).run("go")
"""


def _isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "TRACE"))}
    env.update(LOOPTRACE_TRACE_FILE=str(tmp_path / "traces.jsonl"), LOOPTRACE_SPILL_FILE=str(tmp_path / "spill.jsonl"),
               LANGFUSE_PUBLIC_KEY=PUBLIC_KEY, LANGFUSE_SECRET_KEY=SECRET_KEY, **extra)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", ["512", "4"], ids=["all still queued", "some spilled, the rest queued"])
def test_spans_queued_for_a_dead_backend_when_the_process_is_killed_are_pushed_once(tmp_path, batch_size):
    import signal
    import time

    from fakes.otlp_receiver import unused_port

    from looptrace.instrumentation.tracefile.read import read_spans

    ready = tmp_path / "ready"
    env = _isolated_env(tmp_path, LANGFUSE_BASE_URL=f"http://127.0.0.1:{unused_port()}",
                        OTEL_BSP_MAX_EXPORT_BATCH_SIZE=batch_size)
    agent = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(ready)], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the run never reached its tool"
        time.sleep(0.3)  # the export thread has had its chance at the batches already full
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30)
    finished = [span.span_id for span in read_spans(tmp_path / "traces.jsonl")]
    assert len(finished) == 19  # six turns of three spans, and the last turn's model call
    assert list(tmp_path.glob("spill.jsonl.journal-langfuse-*"))  # left behind by the killed process
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix="/api/public/otel") as langfuse:
        push_env = _isolated_env(tmp_path, LANGFUSE_BASE_URL=langfuse.base_url)
        pushed = subprocess.run([sys.executable, "-m", "looptrace", "traces", "push"], env=push_env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        again = subprocess.run([sys.executable, "-m", "looptrace", "traces", "push"], env=push_env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
        received = [span.span_id for span in langfuse.spans]
    assert pushed.returncode == 0, pushed.stderr
    assert sorted(received) == sorted(finished)  # every finished span, each exactly once
    assert "sent 19 spans to langfuse" in pushed.stdout
    assert again.stdout.startswith("nothing to push") and not list(tmp_path.glob("spill.jsonl.journal-*"))
