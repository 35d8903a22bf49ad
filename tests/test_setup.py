"""configure(): which exporters the environment picks, how they combine, metrics, the time bounds of flush and
shutdown, and joining a caller's trace. Private providers only (set_global=False); receivers are local."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from fakes.otlp_receiver import Delay, OTLPReceiver, unused_port
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace.instrumentation.export.setup import (
    ConfigurationError,
    choose_exporters,
    configure,
    context_from_traceparent,
)
from looptrace.instrumentation.recording.metrics import LoopMetrics
from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.instrumentation.tracefile.undelivered import UndeliveredList
from looptrace.testing import capture_logs

PUBLIC_KEY, SECRET_KEY = "pk-lf-setup", "sk-lf-setup"
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
ISOLATED_ENV = (
    "LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_BASE_URL", "LANGFUSE_HOST", "LANGFUSE_TIMEOUT",
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "LOOPTRACE_EXPORTER",
    "LOOPTRACE_UNDELIVERED_FILE", "LOOPTRACE_PROMETHEUS_PORT", "LOOPTRACE_TRACE_FILE", "TRACEPARENT", "TRACESTATE",
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    for name in ISOLATED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def run_agent(provider):
    from looptrace.cli.demo import Inventory, equipment_script
    from looptrace.runtime import Agent, ScriptedModel

    return Agent("claude-sonnet-5-5", tools=Inventory().tools(), client=ScriptedModel(equipment_script()),
                 tracer_provider=provider).run("Reserve a projector for 2026-10-08")


def with_memory(telemetry):
    memory = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


def ids(spans) -> set[str]:
    return {format(s.context.span_id, "016x") for s in spans}


# --- choosing exporters -------------------------------------------------------------------------------------------

LANGFUSE_KEYS = {"LANGFUSE_PUBLIC_KEY": PUBLIC_KEY, "LANGFUSE_SECRET_KEY": SECRET_KEY}


@pytest.mark.parametrize("env, expected", [
    ({}, ["file"]),
    (LANGFUSE_KEYS, ["file", "langfuse"]),  # the local file stays on beside a backend the environment sets up
    ({"LANGFUSE_PUBLIC_KEY": PUBLIC_KEY}, ["file"]),  # one key is not a Langfuse set-up
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["file", "otlp"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["file", "otlp"]),
    ({**LANGFUSE_KEYS, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["file", "langfuse", "otlp"]),
    ({**LANGFUSE_KEYS, "LOOPTRACE_EXPORTER": "file"}, ["file"]),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, ["file"]),  # not ours to interpret
    ({**LANGFUSE_KEYS, "LOOPTRACE_EXPORTER": "none"}, []),
])
def test_exporters_are_picked_from_the_environment(monkeypatch, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert choose_exporters() == expected


def test_exporters_combine_and_unknown_names_are_refused(monkeypatch):
    monkeypatch.setenv("LOOPTRACE_EXPORTER", "console")
    assert choose_exporters("file, langfuse ,otlp,file") == ["file", "langfuse", "otlp"]
    with pytest.raises(ConfigurationError, match="choose from file, console, otlp, langfuse, none"):
        choose_exporters("jaeger")


def test_file_langfuse_and_otlp_together(monkeypatch, tmp_path):
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix="/api/public/otel") as langfuse, \
            OTLPReceiver() as collector:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC_KEY)
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET_KEY)
        monkeypatch.setenv("LANGFUSE_BASE_URL", langfuse.base_url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "booking-service")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        telemetry = configure(exporters="file,langfuse,otlp", trace_file=tmp_path / "traces.jsonl",
                              set_global=False)
        memory = with_memory(telemetry)
        run_agent(telemetry.tracer_provider)
        LoopMetrics(telemetry.meter_provider).record_run(agent="booking", status="done", turns=4)
        telemetry.shutdown()
        made = ids(memory.get_finished_spans())
        assert {s.span_id for s in langfuse.wait_for_spans(len(made))} == made
        assert {s.span_id for s in collector.wait_for_spans(len(made))} == made
        (runs,) = collector.wait_for_metrics(1) and collector.metrics_named("looptrace.runs")
    assert {s.span_id for s in read_spans(tmp_path / "traces.jsonl")} == made
    assert telemetry.exporters == ["file", "langfuse", "otlp"] and telemetry.scores is not None
    assert runs.data_points[0].value == 1 and runs.resource["service.name"] == "booking-service"
    assert collector.spans[0].resource["deployment.environment"] == "test"
    assert all(r.path == "/v1/metrics" for r in collector.requests if r.metrics)
    assert telemetry.undelivered_notice() is None and not (tmp_path / ".looptrace").exists()  # nothing undelivered, no lock files


def test_metrics_on_a_prometheus_endpoint(monkeypatch):
    port = unused_port()
    monkeypatch.setenv("LOOPTRACE_PROMETHEUS_PORT", str(port))
    telemetry = configure(exporters="none", set_global=False)
    try:
        LoopMetrics(telemetry.meter_provider).record_run(agent="booking", status="done", turns=4)
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        telemetry.shutdown()
    assert 'looptrace_runs_total{' in page and 'gen_ai_agent_name="booking"' in page


def test_sdk_disabled_exports_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    telemetry = configure(exporters="file,otlp", trace_file=tmp_path / "t.jsonl", set_global=False)
    run_agent(telemetry.tracer_provider)
    telemetry.shutdown()
    assert telemetry.exporters == [] and not (tmp_path / "t.jsonl").exists()


def test_set_global_false_leaves_the_global_providers_alone():
    before = trace.get_tracer_provider()
    telemetry = configure(exporters="none", set_global=False)
    telemetry.shutdown()
    assert trace.get_tracer_provider() is before


GLOBAL_METER_PROVIDER = """
import logging, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from looptrace.instrumentation.export.setup import configure

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
application = MeterProvider() if sys.argv[1] == "set" else None
if application is not None:
    metrics.set_meter_provider(application)
telemetry = configure(exporters="none")
installed = metrics.get_meter_provider()
print("looptrace's" if installed is telemetry.meter_provider else "the application's" if installed is application
      else "another")
telemetry.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("application", "expected"), [("unset", "looptrace's"), ("set", "the application's")])
def test_configure_installs_its_meter_provider_only_where_none_was_set(application, expected):
    done = subprocess.run([sys.executable, "-c", GLOBAL_METER_PROVIDER, application], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [expected]  # and no "Overriding of current MeterProvider" warning


# --- bounded flush and shutdown -----------------------------------------------------------------------------------


def listed(path, backend: str = "otlp") -> set[str]:
    """The span ids the undelivered list at ``path`` holds for ``backend``."""
    waiting = UndeliveredList(path).pending().get(backend)
    return {key[32:] for keys in waiting.spans.values() for key in keys} if waiting else set()


def slow_collector(monkeypatch, receiver, seconds: float) -> None:
    receiver.fail_next(*[Delay(seconds)] * 10)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "60000")  # the exporter would wait 60 s


def test_flush_keeps_its_timeout_with_a_slow_backend(monkeypatch, tmp_path):
    with OTLPReceiver() as collector:
        slow_collector(monkeypatch, collector, 60.0)  # the receiver's stop ends the delay
        telemetry = configure(exporters="file,otlp", undelivered_file=tmp_path / "undelivered.jsonl",
                              trace_file=tmp_path / "traces.jsonl", set_global=False)
        memory = with_memory(telemetry)
        run_agent(telemetry.tracer_provider)
        with capture_logs() as logs:
            started = time.monotonic()
            delivered = telemetry.flush(timeout_ms=300)
            flush_s = time.monotonic() - started
            # The agent's own flush on Ctrl-C goes straight to the provider: bounded the same way.
            started = time.monotonic()
            telemetry.tracer_provider.force_flush(300)
            provider_flush_s = time.monotonic() - started
            started = time.monotonic()
            telemetry.shutdown(timeout_ms=300)
            shutdown_s = time.monotonic() - started
        made = ids(memory.get_finished_spans())
        assert listed(tmp_path / "undelivered.jsonl") == made  # nothing dropped: what missed the deadline is listed
    # Stopping the receiver ends its delay: the request still on the wire is answered 200 after all, and its batch
    # is marked delivered, so a push will not send it a second time.
    waited_until = time.monotonic() + 30
    while listed(tmp_path / "undelivered.jsonl") and time.monotonic() < waited_until:
        time.sleep(0.02)
    assert listed(tmp_path / "undelivered.jsonl") == set() and {s.span_id for s in collector.spans} == made
    # Each kept its 0.3 s deadline rather than the backend's 60 s delay or the exporter's 60 s timeout: half of that
    # is a margin no busy machine eats.
    assert (delivered, flush_s < 30, provider_flush_s < 30, shutdown_s < 30) == (False, True, True, True), \
        (flush_s, provider_flush_s, shutdown_s)
    assert [(w["backend"], w["cause"]) for w in logs if w["event"] == "export_failed"] == [("otlp", "timeout")]


def test_shutdown_lists_what_is_still_queued_as_undelivered(monkeypatch, tmp_path):
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC_KEY)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv("LANGFUSE_BASE_URL", f"http://127.0.0.1:{unused_port()}")
    monkeypatch.setenv("LANGFUSE_TIMEOUT", "60")  # what an exporter retrying the refused connection would take
    monkeypatch.setenv("LOOPTRACE_UNDELIVERED_FILE", str(tmp_path / "elsewhere.jsonl"))
    telemetry = configure(set_global=False)
    memory = with_memory(telemetry)
    for _ in range(3):
        run_agent(telemetry.tracer_provider)
    started = time.monotonic()
    telemetry.shutdown(timeout_ms=1000)
    assert time.monotonic() - started < 30
    made = ids(memory.get_finished_spans())
    assert telemetry.undelivered_spans == len(made) == UndeliveredList(tmp_path / "elsewhere.jsonl").pending_spans("langfuse")
    assert str(tmp_path / "elsewhere.jsonl") in telemetry.undelivered_notice()
    telemetry.shutdown()  # idempotent


def test_the_undelivered_lists_old_names_still_work_and_say_they_are_deprecated(monkeypatch, tmp_path):
    monkeypatch.delenv("LOOPTRACE_UNDELIVERED_FILE", raising=False)
    monkeypatch.setenv("LOOPTRACE_SPILL_FILE", str(tmp_path / "old-variable.jsonl"))
    with pytest.warns(FutureWarning, match="LOOPTRACE_UNDELIVERED_FILE"):
        assert Settings.from_env().undelivered_file == tmp_path / "old-variable.jsonl"
    monkeypatch.setenv("LOOPTRACE_UNDELIVERED_FILE", str(tmp_path / "new-variable.jsonl"))
    assert Settings.from_env().undelivered_file == tmp_path / "new-variable.jsonl"  # the new name wins
    with pytest.warns(DeprecationWarning, match="undelivered_file"):
        telemetry = configure(exporters="none", set_global=False, spill_file=tmp_path / "old-parameter.jsonl")
    assert telemetry.settings.undelivered_file == tmp_path / "old-parameter.jsonl"
    telemetry.shutdown()


def test_a_full_export_queue_counts_every_dropped_span_and_says_so(monkeypatch, tmp_path):
    with OTLPReceiver() as collector:
        slow_collector(monkeypatch, collector, 60.0)  # the first batch hangs on the wire: the queue cannot drain
        monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
        monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
        telemetry = configure(exporters="file,otlp", undelivered_file=tmp_path / "undelivered.jsonl",
                              trace_file=tmp_path / "traces.jsonl", set_global=False)
        tracer = telemetry.tracer_provider.get_tracer("test")
        with capture_logs() as logs:
            for n in range(10):
                tracer.start_span(f"span {n}").end()
        # Whenever the worker took its batch, at most 4 + 4 of the 10 fit: the rest were turned away, and counted.
        dropped = telemetry.dropped_spans
        assert 2 <= dropped <= 6
        assert [entry["event"] for entry in logs].count("export_queue_full") == 1  # one warning, not one per span
        assert f"{dropped} spans were dropped" in telemetry.undelivered_notice()
        telemetry.shutdown(timeout_ms=300)
        undelivered = listed(tmp_path / "undelivered.jsonl")
    assert len(undelivered) + dropped == 10  # every span is either kept for a push or counted as lost


# --- joining a caller's trace -------------------------------------------------------------------------------------


def root_of(memory):
    return next(s for s in memory.get_finished_spans() if s.name.startswith("invoke_agent"))


def test_a_traceparent_hands_its_trace_to_the_run():
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    token = otel_context.attach(context_from_traceparent(f"00-{TRACE_ID}-{PARENT_ID}-01"))
    try:
        run_agent(provider)
    finally:
        otel_context.detach(token)
    root = root_of(memory)
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_ID and root.parent.is_remote


def test_traceparent_from_the_environment(monkeypatch):
    assert context_from_traceparent() is None
    monkeypatch.setenv("TRACEPARENT", f"00-{TRACE_ID}-{PARENT_ID}-01")
    monkeypatch.setenv("TRACESTATE", "vendor=abc")
    span_context = trace.get_current_span(context_from_traceparent()).get_span_context()
    assert format(span_context.trace_id, "032x") == TRACE_ID and span_context.trace_state.get("vendor") == "abc"
    monkeypatch.setenv("TRACEPARENT", "garbage")
    with capture_logs() as logs:
        assert context_from_traceparent() is None
    assert logs[0]["event"] == "traceparent_ignored"
    with pytest.raises(ValueError, match="W3C traceparent"):
        context_from_traceparent("00-not-a-trace-01")


def test_a_run_started_inside_a_span_joins_its_trace():
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("web").start_as_current_span("POST /book") as request:
        run_agent(provider)
    root = root_of(memory)
    assert root.context.trace_id == request.get_span_context().trace_id
    assert root.parent.span_id == request.get_span_context().span_id
