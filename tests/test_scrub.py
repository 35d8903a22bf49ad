"""A secret argument stays secret when the tool's own text quotes it back: once an argument is redacted, its value is
scrubbed from that call's result and error wherever it reappears (as it is, URL-encoded or JSON-escaped), on every
span, in the next model call's input messages, in anomaly messages, events and ``--json``. The model's own history
keeps the text it was sent: it sent the value itself, and the RunResult's messages stay a history one can continue.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from urllib.parse import quote

import pytest
from fakes.messages_api import FakeMessagesAPI
from fakes.otlp_receiver import OTLPReceiver, unused_port

from looptrace.instrumentation.recording.content import REDACTED, redact_with_secrets, redacted_history, scrub
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.runtime import Agent, ScriptedModel, ToolFinished, tool

MODEL = "claude-sonnet-5-5"
TOKEN = "tok/SECRET+4242"  # a value whose URL-encoded form differs from it


@tool
def fetch(url: str, access_token: str) -> str:
    """Fetch a page with a token."""
    raise PermissionError(f"GET {url}?access_token={quote(access_token, safe='')} was refused: "
                          f"token {access_token} expired")


def _calls(count: int) -> list[dict]:
    call = {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "", "name": "fetch",
                                                    "input": {"url": "https://api.example.com/items",
                                                              "access_token": TOKEN}}]}
    script = []
    for n in range(count):
        script.append({**call, "content": [{**call["content"][0], "id": f"toolu_{n}"}]})
    return script + [{"stop_reason": "end_turn", "content": [{"type": "text", "text": "All done."}]}]


def _everything(spans) -> str:
    return json.dumps([[s.name, dict(s.attributes), s.status.description,
                        [[e.name, dict(e.attributes)] for e in s.events]] for s in spans.all], default=str)


def test_a_token_quoted_in_the_tools_error_is_scrubbed_from_every_span_event_and_anomaly(spans):
    seen: list[ToolFinished] = []
    model = ScriptedModel(_calls(3))
    result = Agent(MODEL, tools=[fetch], client=model, tracer_provider=spans.provider, on_anomaly="warn",
                   on_event=lambda event: seen.append(event) if isinstance(event, ToolFinished) else None).run("go")
    recorded = _everything(spans) + json.dumps([a.to_dict() for a in result.anomalies]) + repr(seen)
    assert TOKEN not in recorded and quote(TOKEN, safe="") not in recorded
    tool_span = spans.named("execute_tool")[0]
    assert tool_span.status.description.count(REDACTED) == 2  # both quotes, the URL-encoded one too
    assert "was refused" in tool_span.attributes["gen_ai.tool.call.result"]  # the rest of the error is kept
    assert result.anomalies and all(REDACTED in a.message for a in result.anomalies if "refused" in a.message)
    # The model was told the real error: it sent the token, and it may need the exact text to correct itself.
    told = model.requests[1]["messages"][-1]["content"][0]["content"]
    assert TOKEN in told
    assert TOKEN in json.dumps(result.messages)  # the history as the model had it, valid to continue


def test_with_telemetry_off_events_still_get_the_scrubbed_result():
    seen: list[ToolFinished] = []
    Agent(MODEL, tools=[fetch], client=ScriptedModel(_calls(1)), telemetry=False,
          on_event=lambda event: seen.append(event) if isinstance(event, ToolFinished) else None).run("go")
    assert seen and TOKEN not in seen[0].result and REDACTED in seen[0].result


def test_a_continued_conversation_scrubs_the_results_of_its_earlier_calls(spans):
    history = [{"role": "user", "content": "go"}, *[
        {"role": role, "content": content} for role, content in (
            ("assistant", [{"type": "tool_use", "id": "toolu_old", "name": "fetch",
                            "input": {"url": "u", "access_token": TOKEN}}]),
            ("user", [{"type": "tool_result", "tool_use_id": "toolu_old", "is_error": True,
                       "content": [{"type": "text", "text": f"token {TOKEN} expired"}]}]))],
        {"role": "user", "content": "try again"}]
    Agent(MODEL, tools=[fetch], client=ScriptedModel(_calls(0)), tracer_provider=spans.provider).run(history)
    assert TOKEN not in _everything(spans)


def test_short_values_are_not_hunted_in_text_and_other_calls_keep_their_text():
    _, hidden = redact_with_secrets({"pin": "1", "password": "abc"})
    assert hidden == ()  # "abc" would mangle every text that happens to contain it
    _, hidden = redact_with_secrets({"auth": {"user": "anabel", "password": "hunter22"}})  # all of it
    assert scrub("anabel logged in with hunter22", hidden) == f"{REDACTED} logged in with {REDACTED}"
    messages = [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "login", "input": {"password": "hunter22"}},
        {"type": "tool_use", "id": "b", "name": "echo", "input": {"text": "hunter22"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "bad hunter22"},
                                     {"type": "tool_result", "tool_use_id": "b", "content": "hunter22"}]}]
    shown = redacted_history(messages)
    assert [b["content"] for b in shown[1]["content"]] == [f"bad {REDACTED}", "hunter22"]  # per call, as said
    assert messages[1]["content"][0]["content"] == "bad hunter22"  # the history given is left as it was


TOOLS = '''
from urllib.parse import quote
from looptrace import tool

@tool
def fetch(url: str, access_token: str) -> str:
    """Fetch a page with a token."""
    raise PermissionError(f"GET {url}?access_token={quote(access_token, safe='')} was refused: "
                          f"token {access_token} expired")
'''


@pytest.mark.slow
def test_the_cli_keeps_the_token_out_of_the_trace_file_langfuse_the_undelivered_list_and_json(tmp_path):
    (tmp_path / "tools.py").write_text(textwrap.dedent(TOOLS))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "ANTHROPIC_", "TRACEPARENT"))}
    with OTLPReceiver(basic_auth=("pk", "sk"), path_prefix="/api/public/otel") as langfuse, \
            FakeMessagesAPI(_calls(1)) as api:
        env.update(LANGFUSE_PUBLIC_KEY="pk", LANGFUSE_SECRET_KEY="sk", LANGFUSE_BASE_URL=langfuse.base_url,
                   XDG_CACHE_HOME=str(tmp_path / "cache"), ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key",
                   # a collector that is down: its spans are listed for push
                   OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{unused_port()}", OTEL_METRICS_EXPORTER="none")
        done = subprocess.run([sys.executable, "-m", "looptrace", "run", "fetch the items", "--tools",
                               str(tmp_path / "tools.py"), "--json"], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        received = langfuse.wait_for_spans(6)
    trace_file, undelivered = tmp_path / ".looptrace" / "traces.jsonl", tmp_path / ".looptrace" / "undelivered.jsonl"
    assert len(list(read_spans(trace_file))) == 6 and undelivered.exists()
    places = {"trace file": trace_file.read_text(), "undelivered list": undelivered.read_text(), "stdout": done.stdout,
              "stderr": done.stderr,
              "langfuse": json.dumps([[dict(s.attributes), s.status_message] for s in received], default=str)}
    for place, text in places.items():
        for form in (TOKEN, quote(TOKEN, safe=""), json.dumps(TOKEN)[1:-1]):
            assert form not in text, f"{form} reached the {place}"
    assert REDACTED in places["langfuse"] and places["undelivered list"].strip()
    printed = json.loads(done.stdout)
    assert printed["messages"][1]["content"][0]["input"]["access_token"] == REDACTED
    assert REDACTED in printed["messages"][2]["content"][0]["content"]
    # The model itself was sent the real error: scrubbing is for what is recorded and shown.
    assert TOKEN in json.dumps(api.requests[1]["messages"])
