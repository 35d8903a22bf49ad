"""The trace file is the one durable copy of a span: what a backend could not take is listed by id and pushed from
the trace file later, exactly once, secrets nowhere; the trace file rotates within bounds and every reader follows it.

The end-to-end tests run looptrace in processes of their own against the OTLP receiver and the Langfuse stand-in of
tests/fakes/, both bound to port 0 on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.otlp_receiver import OTLPReceiver, unused_port

from looptrace.instrumentation.tracefile.read import read_spans, trace_files

PUBLIC_KEY, SECRET_KEY = "pk-lf-test", "sk-lf-test-secret-never-written"
OTLP_TOKEN = "collector-token-never-written"
CLI = [sys.executable, "-m", "looptrace"]

# Runs through the library, many per process, as an application makes them: an equipment run, and every tenth a
# runaway one (whose anomaly becomes a Langfuse score).
_MANY_RUNS = """
import sys
from looptrace.cli.demo import Inventory, equipment_script, runaway_script
from looptrace.instrumentation.export.setup import configure
from looptrace.runtime import Agent, ScriptedModel

telemetry = configure(set_global=False)
for n in range(int(sys.argv[1])):
    script = runaway_script() if n % 10 == 9 else equipment_script()
    Agent("claude-sonnet-5-5", tools=Inventory().tools(), client=ScriptedModel(script), on_anomaly="warn",
          tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider).run(f"run {n}")
telemetry.shutdown()
print(telemetry.undelivered_notice())
"""


def isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "TRACE", "ANTHROPIC_"))}
    env.update(LOOPTRACE_TRACE_FILE=str(tmp_path / "traces.jsonl"), OTEL_METRICS_EXPORTER="none",
               LANGFUSE_PUBLIC_KEY=PUBLIC_KEY, LANGFUSE_SECRET_KEY=SECRET_KEY,
               OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer {OTLP_TOKEN}", **extra)
    return env


def down(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Both backends configured and refusing connections."""
    return isolated_env(tmp_path, LANGFUSE_BASE_URL=f"http://127.0.0.1:{unused_port()}",
                        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{unused_port()}", **extra)


def looptrace(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def many_runs(tmp_path: Path, runs: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", _MANY_RUNS, str(runs)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def stored_spans(tmp_path: Path) -> list[str]:
    return [span.span_id for span in read_spans(tmp_path / "traces.jsonl")]


def assert_no_secret_in_files(tmp_path: Path) -> None:
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in (SECRET_KEY, OTLP_TOKEN, "Basic ", "Bearer "):
                assert secret.encode() not in data, (secret, path)


@pytest.mark.slow
def test_1000_runs_with_both_backends_down_reach_each_exactly_once_after_push_with_their_scores(tmp_path):
    done = many_runs(tmp_path, 1000, down(tmp_path))
    stored = stored_spans(tmp_path)
    assert len(stored) == len(set(stored)) > 1000 * 10
    assert f"{2 * len(stored)} spans could not be delivered" in done.stdout
    assert_no_secret_in_files(tmp_path)

    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix="/api/public/otel") as langfuse, \
            OTLPReceiver(required_headers={"authorization": f"Bearer {OTLP_TOKEN}"}) as collector:
        env = isolated_env(tmp_path, LANGFUSE_BASE_URL=langfuse.base_url, OTEL_EXPORTER_OTLP_ENDPOINT=collector.url)
        pushed = looptrace(["traces", "push"], env, tmp_path)
        again = looptrace(["traces", "push"], env, tmp_path)
        to_langfuse = [span.span_id for span in langfuse.spans]
        to_collector = [span.span_id for span in collector.spans]
        scores = list(langfuse.scores)
        bodies = [request.body or b"" for request in [*langfuse.requests, *collector.requests]]
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    assert sorted(to_langfuse) == sorted(stored) and sorted(to_collector) == sorted(stored)  # each exactly once
    # Kept while Langfuse was down: every run's looped flag (1,000), and each runaway run's anomaly and loop cost (100
    # each).
    assert f"sent {len(stored)} spans to langfuse" in pushed.stdout and "sent 1200 scores to langfuse" in pushed.stdout
    assert len({score["id"] for score in scores}) == len(scores) == 1200
    assert sum(score["name"] == "loop_anomaly" for score in scores) == 100
    assert again.returncode == 0 and again.stdout.startswith("nothing to push")
    assert not any(secret.encode() in body for body in bodies for secret in (SECRET_KEY, OTLP_TOKEN))
    assert_no_secret_in_files(tmp_path)


@pytest.mark.slow
def test_rotation_keeps_a_bounded_number_of_files_and_every_reader_sees_every_run_in_them(tmp_path):
    env = down(tmp_path, LOOPTRACE_TRACE_FILE_MAX_BYTES="200000", LOOPTRACE_TRACE_FILE_BACKUPS="3")
    del env["OTEL_EXPORTER_OTLP_ENDPOINT"]  # Langfuse only
    many_runs(tmp_path, 200, env)
    files = trace_files(tmp_path / "traces.jsonl")
    assert [Path(f).name for f in files] == ["traces.jsonl.3", "traces.jsonl.2", "traces.jsonl.1", "traces.jsonl"]
    assert all(os.path.getsize(f) < 200_000 + 64_000 for f in files)  # at most one span past the limit
    roots = {span.trace_id for span in read_spans(tmp_path / "traces.jsonl") if span.parent_span_id is None}
    kept = sum(1 for f in files for line in Path(f).read_text().splitlines() if '"parentSpanId"' not in line)
    assert 10 < len(roots) == kept < 200  # the oldest runs rotated away; the rest are read, oldest first

    listed = looptrace(["traces", "list", "--file", str(tmp_path / "traces.jsonl")], env, tmp_path)
    assert listed.returncode == 0 and sum(trace_id in listed.stdout for trace_id in roots) == len(roots)
    detected = looptrace(["detect", str(tmp_path / "traces.jsonl"), "--json"], env, tmp_path)
    flagged = {line for line in detected.stdout.splitlines() if line.strip()}
    assert detected.returncode == 1 and flagged  # the runaway runs still in the files are found
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix="/api/public/otel") as langfuse:
        pushed = looptrace(["traces", "push"], {**env, "LANGFUSE_BASE_URL": langfuse.base_url}, tmp_path)
        received = {span.trace_id for span in langfuse.spans if span.parent_span_id is None}
    assert received == roots  # every run still in the files, once
    assert "lost: no trace file holds them any more" in pushed.stdout and pushed.returncode == 1  # said, not silent


# --- kill -9: what the trace file holds, and what push can and cannot send -----------------------------------------

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


@pytest.mark.slow
def test_kill_9_with_the_backend_down_keeps_every_ended_span_in_the_trace_file_and_push_sends_what_was_listed(
        tmp_path):
    ready = tmp_path / "ready"
    env = down(tmp_path, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4", OTEL_BSP_SCHEDULE_DELAY="50")
    del env["OTEL_EXPORTER_OTLP_ENDPOINT"]
    agent = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(ready)], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the run never reached its tool"
        listing = tmp_path / ".looptrace" / "undelivered.jsonl"
        while not listing.exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # the export thread has had its chance at the batches already full
        time.sleep(0.3)
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30)
    finished = stored_spans(tmp_path)
    assert len(finished) == 19  # six turns of three spans, and the last turn's model call: all in the trace file
    listed = {key[32:] for line in listing.read_text().splitlines() for key in json.loads(line)["undelivered"]}
    assert listed and listed <= set(finished)
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix="/api/public/otel") as langfuse:
        push_env = {**env, "LANGFUSE_BASE_URL": langfuse.base_url}
        pushed = looptrace(["traces", "push"], push_env, tmp_path)
        again = looptrace(["traces", "push"], push_env, tmp_path)
        received = [span.span_id for span in langfuse.spans]
    assert pushed.returncode == 0, pushed.stderr
    # What the killed process had listed, once; what was still in its memory queue is only in the trace file, as
    # with every OpenTelemetry exporter (docs/reliability.md).
    assert sorted(received) == sorted(listed)
    assert again.stdout.startswith("nothing to push")
