"""An alert from a producer with no agent span (a bare SDK loop: one trace per model call) names the conversation
and its real trace ids, never a made-up trace id, in the log line, the webhook body and the callback's context."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from test_conversations import BareLoop

from looptrace.instrumentation.alerts import AlertContext, Alerts, webhook_payload
from looptrace.instrumentation.watch import RunWatcher, WatchMetrics, spans_of_request
from looptrace.testing import capture_logs


def test_a_conversation_alert_names_the_conversation_and_its_real_traces():
    loop = BareLoop(sdk_twin="first")
    loop.conversation(['{"status": "shipped"}'] * 8)
    real = {format(span.context.trace_id, "032x") for span in loop.spans}
    seen: list[tuple[object, AlertContext]] = []
    watcher = RunWatcher(Alerts(callback=lambda a, c: seen.append((a, c))), WatchMetrics(), idle_timeout_s=60,
                         clock=lambda: 0.0)
    with capture_logs() as logs:
        for span in loop.spans:
            watcher.ingest(spans_of_request(encode_spans([span])))
    [(anomaly, context)] = seen
    assert context.trace_id in real  # the trace of the call where it was seen, a real one
    assert context.conversation is not None and context.conversation.startswith("conversation:")
    assert context.trace_ids and set(context.trace_ids) <= real and context.trace_ids[-1] == context.trace_id
    [line] = [e for e in logs if e["event"] == "loop_anomaly"]
    assert line["trace_id"] in real and line["conversation"] == context.conversation
    assert line["trace_ids"] == list(context.trace_ids)
    body = webhook_payload(anomaly, context)
    assert body["trace_id"] in real and body["conversation"] == context.conversation
    assert body["trace_ids"] == list(context.trace_ids)
    assert "conversation:" not in body["text"].split("— trace ")[-1].split(" ")[0]
