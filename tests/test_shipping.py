"""Runs shipping their spans to a Langfuse stand-in and a collector, as those backends show them, and losing none
when they are down.

What Langfuse shows is asserted through ``langfuse_view`` (tests/fakes/otlp_receiver.py), which follows the mapping
of Langfuse's OTel ingestion, so a test says "every observation is in session S-42" rather than naming attributes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.messages_api import FakeMessagesAPI
from fakes.otlp_receiver import OTLPGrpcReceiver, OTLPReceiver, langfuse_view, phoenix_view, unused_port

from looptrace.cli.demo import DEMO_SYSTEM, DEMO_TASK, Inventory, equipment_script, runaway_script
from looptrace.instrumentation.export.setup import configure, context_from_traceparent
from looptrace.instrumentation.langfuse.api import TraceLinks
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.runtime import Agent, ScriptedModel, tool

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


def langfuse_stand_in() -> OTLPReceiver:
    return OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel")


def looptrace(args, env, cwd, timeout=60):
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_run_arrives_in_langfuse_whole_with_its_session_and_generations(tmp_path):
    with langfuse_stand_in() as langfuse, FakeMessagesAPI(equipment_script()) as api:
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json", "--exporter",
                          "file,langfuse", "--session-id", "S-42", "--user-id", "ana", "--tag", "demo"],
                         langfuse_env(langfuse, api, XDG_CACHE_HOME=str(tmp_path / "cache")), tmp_path)
        assert done.returncode == 0, done.stderr
        received = langfuse.wait_for_spans(12)

    stored = list(read_spans(tmp_path / ".looptrace" / "traces.jsonl"))
    assert {s.span_id for s in received} == {s.span_id for s in stored}  # every span in the file, and no more
    assert all(r.headers.get("x-langfuse-ingestion-version") == "4" for r in langfuse.requests
               if r.path.startswith("/api/public/otel"))  # the span exports (the run's scores go to the public API)
    assert SECRET not in done.stderr + done.stdout

    ids = {s.span_id for s in received}
    root = next(s for s in received if s.name.startswith("invoke_agent"))
    assert all(s.parent_span_id in ids for s in received if s is not root)  # parent links intact
    observations = [langfuse_view(s) for s in received]
    for seen in observations:  # what Langfuse shows on every observation of the run
        assert (seen.trace_name, seen.session_id, seen.user_id, seen.tags) == ("agent", "S-42", "ana", ["demo"])
    assert sorted(o.type for o in observations) == ["AGENT"] + ["CHAIN"] * 4 + ["GENERATION"] * 4 + ["TOOL"] * 3
    assert langfuse_view(root).is_trace_root and langfuse_view(root).trace_input == "Reserve a projector"

    generations = [s for s in received if langfuse_view(s).type == "GENERATION"]
    for generation in generations:
        assert generation.attributes[sc.GEN_AI_REQUEST_MODEL] == "claude-sonnet-5-5"
        usage = langfuse_view(generation).usage_details
        assert usage["input"] > 0 and usage["output"] > 0
    usage_elsewhere = [s.name for s in received if s not in generations
                       and any(k.startswith(("gen_ai.usage.", "langfuse.observation.usage")) for k in s.attributes)]
    assert usage_elsewhere == []  # tokens are counted once, on the generations

    tools = [s for s in received if langfuse_view(s).type == "TOOL"]
    assert sorted(s.attributes[sc.GEN_AI_TOOL_NAME] for s in tools) == ["reserve_equipment", "reserve_equipment",
                                                                         "search_equipment"]
    assert all(langfuse_view(s).input and langfuse_view(s).output for s in tools)
    assert json.loads(done.stdout)["trace_url"] == (
        f"{langfuse.base_url}/project/{langfuse.project_id}/traces/{root.trace_id}")


@pytest.mark.slow
def test_the_end_of_a_run_links_to_its_trace_in_langfuse_and_traces_show_renders_it(tmp_path):
    with langfuse_stand_in() as langfuse, FakeMessagesAPI(equipment_script()) as api:
        env = langfuse_env(langfuse, api, XDG_CACHE_HOME=str(tmp_path / "cache"))
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--exporter", "file,langfuse"],
                         env, tmp_path)
        assert done.returncode == 0, done.stderr
        trace_id = next(s.trace_id for s in langfuse.wait_for_spans(12))
    link = f"{langfuse.base_url}/project/{langfuse.project_id}/traces/{trace_id}"
    assert f"trace in Langfuse: {link}" in done.stderr.splitlines()
    assert f"trace {trace_id} written to" in done.stderr
    assert langfuse.project_lookups == [200]

    shown = looptrace(["traces", "show", "--trace-id", trace_id[:12]], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith("invoke_agent agent")
    assert shown.stdout.count("execute_tool ") == 3 and shown.stdout.count("chat claude-sonnet-5-5") == 4


@pytest.mark.slow
def test_an_anomaly_is_a_warning_observation_and_a_score_in_langfuse(tmp_path):
    with langfuse_stand_in() as langfuse, FakeMessagesAPI(runaway_script()) as api:
        done = looptrace(["run", "Find a projector", "--tools", str(TOOLS_FILE), "--json", "--exporter", "langfuse"],
                         langfuse_env(langfuse, api, XDG_CACHE_HOME=str(tmp_path / "cache")), tmp_path)
        assert done.returncode == 30, done.stderr  # nudged at 3, stopped at 4
        received = langfuse.wait_for_spans(1 + 4 + 4 + 4)
    flagged = [s for s in received if langfuse_view(s).level == "WARNING"]
    assert {s.name for s in flagged} >= {"execute_tool search_equipment", "turn"}
    assert 3 in {s.attributes.get(sc.TURN_INDEX) for s in flagged}
    assert all("repeated_call" in langfuse_view(s).status_message for s in flagged)
    trace_id = json.loads(done.stdout)["trace_id"]
    # Two firings of one streak (nudge, then stop) carry the same score id: Langfuse keeps one score, updated.
    scores = {s["id"]: (s["traceId"], s["name"], s["value"], s["dataType"]) for s in langfuse.scores}
    assert [score for score in scores.values() if score[1] == "loop_anomaly"] == [
        (trace_id, "loop_anomaly", "repeated_call", "CATEGORICAL")]
    # and what the loop cost, beside the run's looped flag (what a Langfuse alert sums and averages)
    assert {score[1]: score[3] for score in scores.values() if score[1] != "loop_anomaly"} == {
        "looped": "BOOLEAN", "loop_cost_usd": "NUMERIC"}


@pytest.mark.slow
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
    # The local file stays on beside the backend the environment set up, so the run can be looked at here too.
    stored = {s.span_id for s in read_spans(tmp_path / ".looptrace" / "traces.jsonl")}
    assert stored == {s.span_id for s in spans}
    metric_names = {m.name for m in collector.metrics}
    assert {"looptrace.runs", "gen_ai.client.token.usage", "looptrace.tool.calls"} <= metric_names


@pytest.mark.slow
def test_otlp_over_grpc(tmp_path):
    with OTLPGrpcReceiver() as collector, FakeMessagesAPI(equipment_script()) as api:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{collector.endpoint}",
                        OTEL_EXPORTER_OTLP_PROTOCOL="grpc", ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key")
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json"], env, tmp_path)
        assert done.returncode == 0, done.stderr
        assert len(collector.wait_for_spans(12)) == 12


@pytest.mark.slow
def test_a_traceparent_hands_the_run_an_outside_trace(tmp_path):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with FakeMessagesAPI(equipment_script()) as api:
        env = clean_env(TRACEPARENT=parent, ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key")
        done = looptrace(["run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    root = next(s for s in read_spans(tmp_path / ".looptrace" / "traces.jsonl") if s.name.startswith("invoke_agent"))
    assert root.parent_span_id == "b7ad6b7169203331"


@pytest.mark.slow
def test_a_bad_traceparent_is_a_usage_error(tmp_path):
    done = looptrace(["run", "x", "--traceparent", "not-a-traceparent"], clean_env(ANTHROPIC_API_KEY="k"), tmp_path)
    assert done.returncode == 2 and "--traceparent" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
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
    listing = (tmp_path / ".looptrace" / "undelivered.jsonl").read_text()
    listed = {key[32:] for line in listing.splitlines() for key in json.loads(line).get("undelivered", [])}
    assert listed == stored  # exactly the undelivered spans, by id: the trace file holds them
    assert keys[1] not in listing and "Basic" not in listing

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


# --- in-process runs into the Langfuse stand-in: what each observation, score and link looks like ----------------

@pytest.fixture
def langfuse(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "TRACEPARENT")):
            monkeypatch.delenv(name)
    with langfuse_stand_in() as receiver:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC)
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET)
        monkeypatch.setenv("LANGFUSE_BASE_URL", receiver.base_url)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the project id cache of this test alone
        yield receiver


def run_into_langfuse(tmp_path, script, *, task=DEMO_TASK, tools=None, parent=None, **labels):
    """One run exported to Langfuse as the CLI does it: spans, anomaly scores, then everything flushed."""
    from opentelemetry import context

    telemetry = configure(exporters="langfuse", set_global=False, undelivered_file=tmp_path / "undelivered.jsonl")
    agent = Agent("claude-sonnet-5-5", tools=Inventory().tools() if tools is None else tools, system=DEMO_SYSTEM,
                  client=ScriptedModel(script), tracer_provider=telemetry.tracer_provider,
                  meter_provider=telemetry.meter_provider, on_anomaly="warn")
    token = context.attach(parent) if parent is not None else None
    try:
        result = agent.run(task, **labels)
    finally:
        if token is not None:
            context.detach(token)
    telemetry.shutdown()
    return result


def test_every_observation_shows_the_runs_trace_name_session_user_tags_and_metadata(langfuse, tmp_path):
    result = run_into_langfuse(tmp_path, equipment_script(), session_id="S-42", user_id="ana",
                               tags=["demo", "nightly"], metadata={"ticket": "T-9", "attempt": 2})
    received = langfuse.wait_for_spans(12)
    for span in received:
        seen = langfuse_view(span)
        assert (seen.trace_name, seen.session_id, seen.user_id) == ("agent", "S-42", "ana"), span.name
        # The root adds the run's own fact: the tool errors it left unresolved (the demo's EQ-001), filterable too.
        facts = {"unresolved_tool_errors": "1"} if span.parent_span_id is None else {}
        assert seen.tags == ["demo", "nightly"] and seen.trace_metadata == {"ticket": "T-9", "attempt": "2", **facts}
        # Said once per span, in the attribute both Langfuse and the conventions read; no Langfuse-only duplicate.
        assert "session.id" not in span.attributes and "langfuse.observation.type" not in span.attributes
    root = next(s for s in received if s.parent_span_id is None)
    assert (langfuse_view(root).trace_input, langfuse_view(root).trace_output) == (DEMO_TASK, result.final_text)


def test_openinference_kinds_arrive_on_every_span(langfuse, tmp_path):  # item 17: Phoenix's and Arize's view
    run_into_langfuse(tmp_path, equipment_script())
    kinds = sorted(s.attributes[sc.OPENINFERENCE_SPAN_KIND] for s in langfuse.wait_for_spans(12))
    assert kinds == ["AGENT"] + ["CHAIN"] * 4 + ["LLM"] * 4 + ["TOOL"] * 3


def _json(value):
    """A shown value as data when it is JSON (Langfuse renders it so), else the text itself."""
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value


def test_phoenix_shows_each_model_call_and_tool_call_with_its_input_and_output(langfuse, tmp_path):
    run_into_langfuse(tmp_path, equipment_script())
    received = langfuse.wait_for_spans(12)
    chats = [s for s in received if s.name.startswith("chat ")]
    tools = [s for s in received if s.name.startswith("execute_tool ")]
    assert len(chats) == 4 and len(tools) == 3
    for chat in chats:
        shown = phoenix_view(chat)
        assert shown.kind == "LLM" and shown.input is not None and shown.output is not None
        mime, value = shown.input
        assert mime == "application/json"
        # The system prompt first, then the history: the view Langfuse makes of the same call.
        assert json.loads(value) == [{"role": "system", "content": DEMO_SYSTEM},
                                     *json.loads(chat.attributes[sc.GEN_AI_INPUT_MESSAGES])]
        assert shown.output == ("application/json", chat.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
        assert json.loads(shown.output[1])[0]["role"] == "assistant"  # the answer, not the response's id and model
    for call in tools:
        shown = phoenix_view(call)
        assert shown.kind == "TOOL"
        assert shown.input == ("application/json", call.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS])
        assert shown.output == ("text/plain", call.attributes[sc.GEN_AI_TOOL_CALL_RESULT])


def test_langfuse_shows_model_and_tool_calls_as_it_did_from_the_gen_ai_attributes(langfuse, tmp_path):
    """input.value/output.value come first in Langfuse's ingestion: they must say exactly what Langfuse makes of the
    gen_ai.* attributes without them, the system prompt included."""
    run_into_langfuse(tmp_path, equipment_script())
    openinference = {sc.INPUT_VALUE, sc.OUTPUT_VALUE, sc.INPUT_MIME_TYPE, sc.OUTPUT_MIME_TYPE}
    calls = [s for s in langfuse.wait_for_spans(12) if s.name.startswith(("chat ", "execute_tool "))]
    for span in calls:
        without = dataclasses.replace(span, attributes={k: v for k, v in span.attributes.items()
                                                        if k not in openinference})
        seen, from_gen_ai = langfuse_view(span), langfuse_view(without)
        assert (_json(seen.input), _json(seen.output)) == (_json(from_gen_ai.input), _json(from_gen_ai.output))
        assert seen.input and seen.output, span.name
        if span.name.startswith("chat "):
            assert _json(seen.input)[0] == {"role": "system", "content": DEMO_SYSTEM}


def test_a_run_joining_an_outer_trace_is_its_root_in_langfuse_with_input_and_output(langfuse, tmp_path):  # item 1
    parent = context_from_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    result = run_into_langfuse(tmp_path, equipment_script(), parent=parent)
    root = next(s for s in langfuse.wait_for_spans(12) if s.name.startswith("invoke_agent"))
    assert root.parent_span_id == "b7ad6b7169203331"  # a parent Langfuse never receives
    seen = langfuse_view(root)
    assert seen.is_trace_root and seen.is_events_root  # a root by both of Langfuse's ingestion paths
    assert (seen.trace_input, seen.trace_output) == (DEMO_TASK, result.final_text)


@pytest.mark.parametrize("settings, environment", [
    ({"LANGFUSE_TRACING_ENVIRONMENT": "staging", "LANGFUSE_RELEASE": "v1.2.0"}, "staging"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"}, "prod"),
])
def test_scores_land_in_the_runs_environment(langfuse, tmp_path, monkeypatch, settings, environment):  # item 2
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    run_into_langfuse(tmp_path, runaway_script()[:5])
    observations = [langfuse_view(s) for s in langfuse.wait_for_spans(13)]
    assert {o.environment for o in observations} == {environment}
    if "LANGFUSE_RELEASE" in settings:
        assert {o.release for o in observations} == {"v1.2.0"}
    assert langfuse.scores and {score["environment"] for score in langfuse.scores} == {environment}


def test_scores_send_only_fields_of_the_scores_api(langfuse, tmp_path):  # item 3
    run_into_langfuse(tmp_path, runaway_script()[:5])
    create_score_request = {"id", "traceId", "sessionId", "observationId", "datasetRunId", "name", "value",
                            "comment", "metadata", "environment", "dataType", "configId"}
    assert langfuse.scores and all(set(score) <= create_score_request for score in langfuse.scores)


def test_generations_show_the_system_prompt_and_the_tools_the_model_got(langfuse, tmp_path):  # item 4
    run_into_langfuse(tmp_path, equipment_script())
    generations = [s for s in langfuse.wait_for_spans(12) if langfuse_view(s).type == "GENERATION"]
    assert len(generations) == 4
    for generation in generations:
        assert json.loads(generation.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS]) == [
            {"type": "text", "content": DEMO_SYSTEM}]
        assert [t["name"] for t in json.loads(generation.attributes[sc.GEN_AI_TOOL_DEFINITIONS])] == [
            "search_equipment", "reserve_equipment"]


def test_a_failing_call_in_an_anomaly_keeps_its_own_error_as_the_status_message(langfuse, tmp_path):  # item 5
    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        raise ConnectionError("upstream refused the connection")

    call = {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t", "name": "fetch",
                                                    "input": {"url": "https://example.com"}}]}
    run_into_langfuse(tmp_path, [call] * 3 + [{"content": [{"type": "text", "text": "It failed."}]}],
                      tools=[fetch])
    failed = [s for s in langfuse.wait_for_spans(12) if s.name == "execute_tool fetch"]
    in_anomaly = [s for s in failed if any(name == sc.EVALUATION_RESULT_EVENT for name, _ in s.events)]
    assert in_anomaly, "the third failing call is part of a repeated_call anomaly"
    for span in in_anomaly:
        seen = langfuse_view(span)
        assert seen.level == "ERROR" and "upstream refused the connection" in seen.status_message
        anomaly = next(a for name, a in span.events if name == sc.EVALUATION_RESULT_EVENT)
        assert anomaly["gen_ai.evaluation.score.label"] == "repeated_call"  # beside the error, not instead of it


def test_5_minute_and_1_hour_cache_writes_arrive_under_the_keys_langfuse_prices(langfuse, tmp_path):  # item 6
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 50,
             "cache_creation_input_tokens": 300,
             "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200}}
    run_into_langfuse(tmp_path, [{"content": [{"type": "text", "text": "ok"}], "usage": usage}], tools=[])
    [generation] = [s for s in langfuse.wait_for_spans(3) if langfuse_view(s).type == "GENERATION"]
    assert langfuse_view(generation).usage_details == {"input": 10, "output": 5, "input_cache_read": 50,
                                                       "input_cache_creation_5m": 100,
                                                       "input_cache_creation_1h": 200}


def test_long_trace_attributes_are_cut_and_marked_not_refused(langfuse, tmp_path):  # item 7
    result = run_into_langfuse(tmp_path, [{"content": []}], tools=[], user_id="u" * 300, session_id="s" * 250,
                               tags=["t" * 201])
    assert result.ok
    for span in langfuse.wait_for_spans(3):
        seen = langfuse_view(span)
        assert seen.user_id == "u" * 199 + "…" and seen.session_id == "s" * 199 + "…"
        assert seen.tags == ["t" * 199 + "…"]


def test_the_trace_link_uses_the_project_looked_up_once(langfuse, tmp_path):  # item 18
    first = run_into_langfuse(tmp_path, [{"content": []}], tools=[])
    assert first.trace_url == f"{langfuse.base_url}/project/{langfuse.project_id}/traces/{first.trace_id}"
    second = run_into_langfuse(tmp_path, [{"content": []}], tools=[])
    TraceLinks._known.clear()  # as a new process would start: only the file cache is left
    third = run_into_langfuse(tmp_path, [{"content": []}], tools=[])
    assert second.trace_url.endswith(second.trace_id) and third.trace_url.endswith(third.trace_id)
    assert langfuse.project_lookups == [200]  # one look-up for three runs, two "processes"
    assert SECRET not in (tmp_path / "cache" / "looptrace" / "langfuse-projects.json").read_text()


@pytest.mark.parametrize("failure", ["wrong keys", "refused"])
def test_no_link_when_the_project_cannot_be_looked_up(langfuse, tmp_path, monkeypatch, failure):
    if failure == "wrong keys":
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-wrong")
    else:
        monkeypatch.setenv("LANGFUSE_BASE_URL", f"http://127.0.0.1:{unused_port()}")
    result = run_into_langfuse(tmp_path, [{"content": []}], tools=[])
    assert result.trace_url is None and result.to_dict()["trace_url"] is None
    assert langfuse.project_lookups == ([401] if failure == "wrong keys" else [])


def test_an_environment_langfuse_would_refuse_is_left_out_with_a_warning(langfuse, tmp_path, monkeypatch):
    from looptrace.testing import capture_logs

    monkeypatch.setenv("LANGFUSE_TRACING_ENVIRONMENT", "Production!")  # Langfuse: lower-case, digits, - and _ only
    with capture_logs() as logs:
        run_into_langfuse(tmp_path, runaway_script()[:5])
    assert {langfuse_view(s).environment for s in langfuse.wait_for_spans(13)} == {"default"}
    assert langfuse.scores and all("environment" not in score for score in langfuse.scores)
    assert any(entry["event"] == "langfuse_environment_ignored" for entry in logs)
