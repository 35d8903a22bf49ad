"""Runs rebuilt from the history: model calls with no parent span and no session id, tied by their input messages.

An SDK loop under an instrumentation makes one trace per model call. Each call's `gen_ai.input.messages` holds the
conversation so far, so `looptrace detect` and `looptrace watch` join the calls whose histories extend one another
into one run. The spans here are made with the OpenTelemetry SDK the way such a loop makes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace.cli.app import main
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.offline.conversations import ConversationIndex
from looptrace.instrumentation.offline.trace_detect import detect_spans
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.tracefile import OTLPJsonFileExporter
from looptrace.instrumentation.watch import RunWatcher, WatchMetrics, spans_of_request

NO_PARENT = trace.set_span_in_context(trace.INVALID_SPAN)
QUESTION = {"role": "user", "parts": [{"type": "text", "content": "What happened to order A-1?"}]}


def tool_call(n: int, tool: str = "get_order", arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": f"toolu_{n}", "name": tool,
                                            "arguments": arguments or {"order_id": "A-1"}}]}


def tool_result(n: int, text: str = '{"status": "shipped"}') -> dict[str, Any]:
    return {"role": "user", "parts": [{"type": "tool_call_response", "id": f"toolu_{n}", "response": text}]}


def answer(text: str = "Order A-1 has shipped.") -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "text", "content": text}]}


class BareLoop:
    """Model calls as an instrumented SDK loop records them: one trace each, no parent, no session id."""

    def __init__(self, sdk_twin: str | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("instrumentation")
        self.sdk = self.provider.get_tracer("com.anthropic.sdk.python")
        self.sdk_twin = sdk_twin  # "first" / "after": the SDK's own messageless span of each call ends before / after
        self.responses = 0

    def call(self, history: list[dict[str, Any]], output: dict[str, Any]) -> None:
        self.responses += 1
        response_id = f"msg_{self.responses}"
        finish = "tool_call" if any(p["type"] == "tool_call" for p in output["parts"]) else "stop"
        chat = self.tracer.start_span("anthropic.chat", context=NO_PARENT, attributes={
            sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: response_id,
            sc.GEN_AI_INPUT_MESSAGES: json.dumps(history), sc.GEN_AI_OUTPUT_MESSAGES: json.dumps([output]),
            sc.GEN_AI_RESPONSE_FINISH_REASONS: [finish]})
        twin = None
        if self.sdk_twin:
            twin = self.sdk.start_span("anthropic.messages.create", context=NO_PARENT, attributes={
                sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: response_id, "http.route": "/v1/messages",
                "gen_ai.usage.input_tokens": 10})
        if twin is not None and self.sdk_twin == "first":
            twin.end()
        chat.end()
        if twin is not None and self.sdk_twin == "after":
            twin.end()

    def conversation(self, results: list[str], final: str = "Order A-1 has shipped.",
                     start: list[dict[str, Any]] | None = None, first: int = 1) -> list[dict[str, Any]]:
        """A loop calling get_order(A-1) once per result, then answering; the history it ended with."""
        history = list(start or [QUESTION])
        for n, text in enumerate(results, start=first):
            self.call(history, tool_call(n))
            history += [tool_call(n), tool_result(n, text)]
        self.call(history, answer(final))
        return history

    @property
    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())


def verdicts_of(spans: list[Any], tmp_path: Path, capsys) -> list[dict[str, Any]]:
    """`looptrace detect --json --all` over the spans written to a trace file."""
    path = tmp_path / "spans.jsonl"
    exporter = OTLPJsonFileExporter(path)
    exporter.export(spans)
    exporter.shutdown()
    main(["detect", "--json", "--all", str(path)])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_a_bare_loop_repeating_a_call_is_one_run_with_a_repeated_call(tmp_path, capsys):
    loop = BareLoop()
    loop.conversation(['{"status": "shipped"}'] * 8)
    assert len({span.context.trace_id for span in loop.spans}) == 9  # nine traces, nothing tying them but the history
    [verdict] = verdicts_of(loop.spans, tmp_path, capsys)
    assert verdict["turns"] == 9 and verdict["tool_calls"] == 8
    assert [(a["type"], a["count"]) for a in verdict["anomalies"]] == [("repeated_call", 8)]
    assert verdict["name"] == "anthropic.chat"
    # What the messages did not record stays unknown, and says so.
    assert "no error flag" in verdict["rules_not_run"]["ignored_error"]


def test_a_bare_clean_loop_raises_nothing(tmp_path, capsys):
    loop = BareLoop()
    loop.conversation(['{"status": "shipped"}'])
    [verdict] = verdicts_of(loop.spans, tmp_path, capsys)
    assert verdict["turns"] == 2 and verdict["tool_calls"] == 1 and verdict["anomalies"] == []


@pytest.mark.parametrize("sdk_twin", ["first", "after"])
def test_the_sdks_own_span_of_a_call_counts_once(tmp_path, capsys, sdk_twin):
    loop = BareLoop(sdk_twin=sdk_twin)
    loop.conversation(['{"status": "shipped"}'] * 3)
    assert len(loop.spans) == 8  # four calls, two spans each
    [verdict] = verdicts_of(loop.spans, tmp_path, capsys)
    assert verdict["turns"] == 4 and verdict["tool_calls"] == 3
    assert [a["type"] for a in verdict["anomalies"]] == ["repeated_call"]


def test_the_sdks_own_spans_alone_are_runs_of_their_own():
    # Without an instrumentation beside it the SDK's span is all there is of a call: it is not lost.
    loop = BareLoop(sdk_twin="first")
    loop.conversation([])
    sdk_only = [span for span in loop.spans if span.name == "anthropic.messages.create"]
    assert [(v.name, v.turns) for v in detect_spans(spans_of_request(encode_spans(sdk_only)))] == [
        ("anthropic.messages.create", 1)]


def test_two_messageless_spans_of_one_call_are_one_run():
    # Content capture off: the instrumentation's span records no messages either; the call still counts once.
    loop = BareLoop(sdk_twin="first")
    loop.conversation([])
    spans = [span for span in loop.spans if span.name == "anthropic.messages.create"] * 2
    assert [v.turns for v in detect_spans(spans_of_request(encode_spans(spans)))] == [1]


def test_two_continuations_of_one_prefix_are_two_runs(tmp_path, capsys):
    loop = BareLoop()
    prefix = [QUESTION, tool_call(1), tool_result(1)]
    loop.call([QUESTION], tool_call(1))
    # One branch asks again and again; the other answers at once. Both begin with the same first exchange.
    loop.conversation(['{"status": "shipped"}'] * 4, start=prefix, first=2)
    loop.call(prefix, answer("Shipped, as the first look-up said."))
    verdicts = verdicts_of(loop.spans, tmp_path, capsys)
    assert sorted((v["turns"], [a["type"] for a in v["anomalies"]]) for v in verdicts) == [
        (1, []), (6, ["repeated_call"])]


def test_two_runs_that_begin_alike_are_not_one_looping_run(tmp_path, capsys):
    loop = BareLoop()
    for _ in range(2):  # the same question asked twice, each answered after one look-up: no loop in either
        loop.call([QUESTION], tool_call(1))
    for history in ([QUESTION, tool_call(1), tool_result(1)], [QUESTION, tool_call(1), tool_result(1, "late")]):
        loop.call(history, answer())
    verdicts = verdicts_of(loop.spans, tmp_path, capsys)
    assert all(v["anomalies"] == [] for v in verdicts)
    assert sum(v["tool_calls"] for v in verdicts) <= 3


def test_a_call_that_arrives_late_still_joins_its_conversation(tmp_path, capsys):
    loop = BareLoop()
    loop.conversation(['{"status": "shipped"}'] * 4)
    spans = loop.spans
    spans[1], spans[2] = spans[2], spans[1]  # the second call's span comes after the third's
    [verdict] = verdicts_of(spans, tmp_path, capsys)
    assert verdict["turns"] == 5 and [a["type"] for a in verdict["anomalies"]] == ["repeated_call"]


def test_openllmetrys_indexed_prompts_are_a_history_too(tmp_path, capsys):
    # OpenLLMetry up to 0.53: gen_ai.prompt.N.*, with Anthropic's tool_result blocks (and their is_error flag).
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("opentelemetry.instrumentation.anthropic")
    prompts: dict[str, Any] = {"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Where is A-1?"}
    for n in range(1, 6):
        attributes = dict(prompts)
        if n < 5:
            attributes.update({"gen_ai.completion.0.finish_reason": "tool_use", "gen_ai.completion.0.role": "assistant",
                               "gen_ai.completion.0.tool_calls.0.id": f"toolu_{n}",
                               "gen_ai.completion.0.tool_calls.0.name": "get_order",
                               "gen_ai.completion.0.tool_calls.0.arguments": '{"order_id": "A-1"}'})
        else:
            attributes.update({"gen_ai.completion.0.finish_reason": "end_turn",
                               "gen_ai.completion.0.content": "It failed each time."})
        with tracer.start_as_current_span("anthropic.chat", context=NO_PARENT, attributes=attributes):
            pass
        index = 2 * n - 1
        prompts.update({
            f"gen_ai.prompt.{index}.role": "assistant",
            f"gen_ai.prompt.{index}.tool_calls.0.id": f"toolu_{n}",
            f"gen_ai.prompt.{index}.tool_calls.0.name": "get_order",
            f"gen_ai.prompt.{index}.tool_calls.0.arguments": '{"order_id": "A-1"}',
            f"gen_ai.prompt.{index + 1}.role": "user",
            f"gen_ai.prompt.{index + 1}.content": json.dumps([{"type": "tool_result", "tool_use_id": f"toolu_{n}",
                                                                "content": "Error: unavailable", "is_error": True}]),
        })
    [verdict] = verdicts_of(list(exporter.get_finished_spans()), tmp_path, capsys)
    assert verdict["turns"] == 5 and verdict["tool_calls"] == 4
    assert "repeated_call" in {a["type"] for a in verdict["anomalies"]}
    assert "ignored_error" not in verdict["rules_not_run"]  # this history carries the error flag


def test_tool_calls_whose_own_spans_were_lost_come_from_the_history(tmp_path, capsys):
    loop = BareLoop()
    loop.conversation(['{"status": "shipped"}'] * 4)
    last_two = loop.spans[-2:]  # the first three calls' spans never arrived; the fourth's history shows their calls
    [verdict] = verdicts_of(last_two, tmp_path, capsys)
    assert verdict["tool_calls"] == 4


# --- watch --------------------------------------------------------------------------------------------------------

class Recorded:
    def __init__(self) -> None:
        self.alerts: list[tuple[Any, Any]] = []

    def __call__(self, anomaly, context) -> None:
        self.alerts.append((anomaly, context))


def watched(spans: list[Any]) -> tuple[RunWatcher, Recorded, list[float]]:
    recorded, now = Recorded(), [0.0]
    watcher = RunWatcher(Alerts(callback=recorded), WatchMetrics(), idle_timeout_s=60, clock=lambda: now[0])
    for span in spans:  # one export per span, as a SimpleSpanProcessor sends them
        watcher.ingest(spans_of_request(encode_spans([span])))
    return watcher, recorded, now


def test_watch_flags_a_bare_loop_live_and_judges_the_conversation_when_idle():
    loop = BareLoop(sdk_twin="first")
    loop.conversation(['{"status": "shipped"}'] * 8)
    watcher, recorded, now = watched(loop.spans)
    assert [a.type for a, _ in recorded.alerts] == ["repeated_call"]  # before the conversation ended
    assert recorded.alerts[0][1].conversation.startswith("conversation:")
    metrics = watcher.metrics.render().decode()
    # (no agent name: the producer recorded none)
    assert 'looptrace_anomalies_total{agent="unknown",anomaly_type="repeated_call",service="shop"} 1.0' in metrics
    assert watcher.open_runs == 1  # one conversation, its messageless twin spans counted in it
    now[0] = 61.0
    watcher.sweep()
    assert watcher.open_runs == 0 and len(recorded.alerts) == 1
    assert 'looptrace_watch_runs_judged_total{reason="idle"} 1.0' in watcher.metrics.render().decode()


def test_watch_raises_nothing_for_a_bare_clean_loop():
    loop = BareLoop(sdk_twin="first")
    loop.conversation(['{"status": "shipped"}'])
    watcher, recorded, now = watched(loop.spans)
    now[0] = 61.0
    watcher.sweep()
    assert recorded.alerts == [] and watcher.open_runs == 0
    assert "looptrace_anomalies_total{" not in watcher.metrics.render().decode()


# --- the index itself -----------------------------------------------------------------------------------------------

def test_the_index_keeps_a_bounded_number_of_conversations():
    index = ConversationIndex(max_open=3)
    keys = [index.place(f"t{n}", [f"question {n}"]) for n in range(5)]
    assert len(index) == 3 and len(set(keys)) == 5
    # The oldest was forgotten: its continuation starts a run of its own; a kept one is continued.
    assert index.place("late", ["question 0", "an answer"]) == "conversation:late"
    assert index.place("next", ["question 4", "an answer"]) == keys[4]


def test_a_forgotten_conversation_keeps_no_fingerprint():
    index = ConversationIndex()
    key = index.place("t1", ["a", "b", "c"])
    index.forget(key)
    assert len(index) == 0 and index.place("t2", ["a", "b", "c", "d"]) == "conversation:t2"
