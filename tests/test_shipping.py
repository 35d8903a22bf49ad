"""`looptrace run` shipping its spans to a Langfuse stand-in and a collector, and losing none when they are down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.messages_api import FakeMessagesAPI
from fakes.otlp_receiver import OTLPGrpcReceiver, OTLPReceiver, unused_port

from looptrace.instrumentation import semconv as sc
from looptrace.instrumentation.otlp_file import read_spans
from looptrace.runtime.demo import equipment_script, runaway_script

TOOLS_FILE = Path(__file__).parent / "data" / "equipment_tools.py"
PUBLIC, SECRET = "pk-lf-test", "sk-lf-test-secret"
CLI = [sys.executable, "-m", "looptrace"]

pytestmark = pytest.mark.slow  # every test here runs `looptrace` as a process


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "ANTHROPIC_", "TRACEPARENT"))}
    return {**env, **extra}


def langfuse_env(receiver: OTLPReceiver, api: FakeMessagesAPI, **extra: str) -> dict[str, str]:
    return clean_env(LANGFUSE_PUBLIC_KEY=PUBLIC, LANGFUSE_SECRET_KEY=SECRET, LANGFUSE_BASE_URL=receiver.base_url,
                     ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key", **extra)


def looptrace(args, env, cwd, timeout=60):
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_a_run_arrives_in_langfuse_whole_with_its_session_and_generations(tmp_path):
    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse, \
            FakeMessagesAPI(equipment_script()) as api:
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json", "--exporter",
                          "file,langfuse", "--session-id", "S-42", "--user-id", "ana", "--tag", "demo"],
                         langfuse_env(langfuse, api), tmp_path)
        assert done.returncode == 0, done.stderr
        received = langfuse.wait_for_spans(12)

    stored = list(read_spans(tmp_path / ".looptrace" / "traces.jsonl"))
    assert {s.span_id for s in received} == {s.span_id for s in stored}  # every span in the file, and no more
    assert all(r.headers.get("x-langfuse-ingestion-version") == "4" for r in langfuse.requests)
    assert SECRET not in done.stderr + done.stdout

    ids = {s.span_id for s in received}
    root = next(s for s in received if s.name.startswith("invoke_agent"))
    assert all(s.parent_span_id in ids for s in received if s is not root)  # parent links intact
    for span in received:
        assert span.attributes["session.id"] == "S-42", span.name
        assert span.attributes["user.id"] == "ana"
        assert span.attributes["langfuse.trace.name"] == "agent"
        assert list(span.attributes["langfuse.trace.tags"]) == ["demo"]
    assert root.attributes["langfuse.observation.type"] == "agent"

    generations = [s for s in received if s.attributes.get("langfuse.observation.type") == "generation"]
    assert len(generations) == 4
    for generation in generations:
        assert generation.attributes[sc.GEN_AI_REQUEST_MODEL] == "claude-sonnet-5-5"
        usage = json.loads(generation.attributes["langfuse.observation.usage_details"])
        assert usage["input"] > 0 and usage["output"] > 0
    usage_elsewhere = [s.name for s in received if s not in generations
                       and any(k.startswith(("gen_ai.usage.", "langfuse.observation.usage")) for k in s.attributes)]
    assert usage_elsewhere == []  # tokens are counted once, on the generations

    tools = [s for s in received if s.attributes.get("langfuse.observation.type") == "tool"]
    assert sorted(s.attributes[sc.GEN_AI_TOOL_NAME] for s in tools) == ["reserve_equipment", "reserve_equipment",
                                                                         "search_equipment"]
    assert all(sc.GEN_AI_TOOL_CALL_ARGUMENTS in s.attributes and sc.GEN_AI_TOOL_CALL_RESULT in s.attributes
               for s in tools)


def test_an_anomaly_is_a_warning_observation_and_a_score_in_langfuse(tmp_path):
    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse, \
            FakeMessagesAPI(runaway_script()) as api:
        done = looptrace(["run", "Find a projector", "--tools", str(TOOLS_FILE), "--json", "--exporter", "langfuse"],
                         langfuse_env(langfuse, api), tmp_path)
        assert done.returncode == 30, done.stderr  # nudged at 3, stopped at 4
        received = langfuse.wait_for_spans(1 + 4 + 4 + 4)
    flagged = [s for s in received if s.attributes.get("langfuse.observation.level") == "WARNING"]
    assert {s.name for s in flagged} >= {"execute_tool search_equipment", "turn 3"}
    assert all("repeated_call" in s.attributes["langfuse.observation.status_message"] for s in flagged)
    trace_id = json.loads(done.stdout)["trace_id"]
    # Two firings of one streak (nudge, then stop) carry the same score id: Langfuse keeps one score, updated.
    scores = {s["id"]: (s["traceId"], s["name"], s["value"], s["dataType"]) for s in langfuse.scores}
    assert list(scores.values()) == [(trace_id, "loop_anomaly", "repeated_call", "CATEGORICAL")]


def test_otlp_to_a_collector_from_the_standard_variables(tmp_path):
    with OTLPReceiver(required_headers={"x-team": "agents"}) as collector, \
            FakeMessagesAPI(equipment_script()) as api:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_EXPORTER_OTLP_HEADERS="x-team=agents",
                        OTEL_SERVICE_NAME="booking-service", OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
                        ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key")
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json"], env, tmp_path)
        assert done.returncode == 0, done.stderr
        spans = collector.wait_for_spans(12)
        collector.wait_for_metrics(1)
    assert spans[0].resource["service.name"] == "booking-service"
    assert spans[0].resource["deployment.environment"] == "test"
    assert not (tmp_path / ".looptrace" / "traces.jsonl").exists()  # otlp alone was picked from the environment
    metric_names = {m.name for m in collector.metrics}
    assert {"looptrace.runs", "gen_ai.client.token.usage", "looptrace.tool.calls"} <= metric_names


def test_otlp_over_grpc(tmp_path):
    with OTLPGrpcReceiver() as collector, FakeMessagesAPI(equipment_script()) as api:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{collector.endpoint}",
                        OTEL_EXPORTER_OTLP_PROTOCOL="grpc", ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key")
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json"], env, tmp_path)
        assert done.returncode == 0, done.stderr
        assert len(collector.wait_for_spans(12)) == 12


def test_a_traceparent_hands_the_run_an_outside_trace(tmp_path):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with FakeMessagesAPI(equipment_script()) as api:
        env = clean_env(TRACEPARENT=parent, ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key")
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    root = next(s for s in read_spans(tmp_path / ".looptrace" / "traces.jsonl") if s.name.startswith("invoke_agent"))
    assert root.parent_span_id == "b7ad6b7169203331"


def test_a_bad_traceparent_is_a_usage_error(tmp_path):
    done = looptrace(["run", "x", "--traceparent", "not-a-traceparent"], clean_env(ANTHROPIC_API_KEY="k"), tmp_path)
    assert done.returncode == 2 and "--traceparent" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("backend_down", ["refused", "wrong keys"])
def test_with_the_backend_down_the_run_is_as_fast_and_push_delivers_later_exactly_once(tmp_path, backend_down):
    with FakeMessagesAPI(equipment_script() * 2) as api:
        # A baseline with no backend at all, then the same run with Langfuse down.
        (tmp_path / "a").mkdir()
        started = time.monotonic()
        baseline = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json", "--exporter", "file"],
                             clean_env(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key"), tmp_path / "a")
        baseline_s = time.monotonic() - started
        if backend_down == "refused":
            base_url, keys = f"http://127.0.0.1:{unused_port()}", (PUBLIC, SECRET)
        else:
            stand_in = OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel")
            base_url, keys = stand_in.base_url, (PUBLIC, "sk-lf-wrong")
        env = clean_env(LANGFUSE_PUBLIC_KEY=keys[0], LANGFUSE_SECRET_KEY=keys[1], LANGFUSE_BASE_URL=base_url,
                        ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key")
        started = time.monotonic()
        down = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json",
                          "--exporter", "file,langfuse"], env, tmp_path)
        elapsed = time.monotonic() - started
    assert baseline.returncode == 0 and down.returncode == 0, down.stderr
    result, base_result = json.loads(down.stdout), json.loads(baseline.stdout)
    assert (result["status"], result["turns"]) == (base_result["status"], base_result["turns"])
    # Against the baseline measured above: the exit flush gives up after 5 s at the most, so twice the baseline plus
    # twice that bound is a margin a busy machine (which slows both runs) does not eat.
    assert elapsed < 2 * baseline_s + 10, (elapsed, baseline_s)
    assert down.stderr.count("export_failed") <= 1 and "Traceback" not in down.stderr
    assert keys[1] not in down.stderr
    assert "12 spans could not be delivered" in down.stderr and "looptrace traces push" in down.stderr

    stored = {s.span_id for s in read_spans(tmp_path / ".looptrace" / "traces.jsonl")}
    spilled = {s.span_id for s in read_spans(tmp_path / ".looptrace" / "spill.jsonl")}
    assert spilled == stored  # exactly the undelivered spans

    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse:
        env.update(LANGFUSE_BASE_URL=langfuse.base_url, LANGFUSE_SECRET_KEY=SECRET)
        pushed = looptrace(["traces", "push"], env, tmp_path)
        assert pushed.returncode == 0, pushed.stderr
        assert "sent 12 spans to langfuse" in pushed.stdout
        again = looptrace(["traces", "push"], env, tmp_path)
        assert again.returncode == 0 and "nothing to push" in again.stdout
        assert sorted(s.span_id for s in langfuse.spans) == sorted(stored)  # each span once
    if backend_down == "wrong keys":
        stand_in.stop()
