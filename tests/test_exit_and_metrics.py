"""The way out and the metrics: one deadline for the exit's flush and shutdown, the metric part given what is left of
it beside the spans, a word when the final metrics were not delivered, and an endpoint without a metrics service
(``looptrace watch``) warned about once and sent no metrics again."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from fakes.otlp_receiver import OTLPGrpcReceiver, OTLPReceiver, Reject
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from looptrace.instrumentation.export import deadline as deadline_module
from looptrace.instrumentation.export.exporters import network_metric_exporter
from looptrace.instrumentation.export.setup import Telemetry
from looptrace.instrumentation.settings import Settings
from looptrace.testing import capture_logs

README = Path(__file__).parent.parent / "README.md"


class _FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class _SlowFirstFlush(SpanProcessor):
    """A processor whose first flush takes 4 s of the fake clock, as an export to a silent backend does."""

    def __init__(self, clock: _FakeClock) -> None:
        self.clock = clock
        self.asked: list[int] = []

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self.asked.append(timeout_millis)
        if len(self.asked) == 1:
            self.clock.now += 4.0
            return False
        return True


class _Meter:
    """A meter provider that records the time each call was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        self.calls.append(("force_flush", timeout_millis))
        return True

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        self.calls.append(("shutdown", timeout_millis))


def test_the_exits_flush_and_shutdown_share_one_deadline_and_the_metrics_get_what_is_left(monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(deadline_module, "_clock", clock)
    processor, meter = _SlowFirstFlush(clock), _Meter()
    telemetry = Telemetry(tracer_provider=TracerProvider(), exporters=["otlp"], owns_provider=False,
                          processors=[processor], meter_provider=meter)  # type: ignore[arg-type]
    deadline = telemetry.leaving(5_000)
    assert telemetry.leaving(60_000) is deadline  # the way out has one deadline, set once

    telemetry.flush()  # the spans take 4 s of the 5
    telemetry.shutdown()
    assert processor.asked == [5_000, 1_000]  # the shutdown gets what the flush left, not 5 s more
    assert meter.calls == [("force_flush", 1_000), ("shutdown", 1_000)]
    assert telemetry.exit_deadline is deadline


def test_without_an_exit_deadline_each_flush_has_its_own_timeout(monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(deadline_module, "_clock", clock)
    processor = _SlowFirstFlush(clock)
    telemetry = Telemetry(tracer_provider=TracerProvider(), exporters=["otlp"], owns_provider=False,
                          processors=[processor])
    telemetry.flush(2_000)
    telemetry.flush(2_000)  # a long-lived service flushing now and then: no shared deadline
    assert processor.asked == [2_000, 2_000]


@pytest.fixture
def silent_backend():
    """An endpoint that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for connection in held:
        connection.close()
    listener.close()


@pytest.mark.slow
def test_the_cli_says_when_its_metrics_were_not_delivered(tmp_path, silent_backend):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "TRACEPARENT"))}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = silent_backend
    done = subprocess.run([sys.executable, "-m", "looptrace", "demo"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "12 spans could not be delivered" in done.stderr
    assert re.search(r"the metrics could not be delivered to \S+/v1/metrics \(no answer in time\)", done.stderr)
    assert "Traceback" not in done.stderr


def _two_exports(settings: Settings) -> None:
    """Metrics exported twice through looptrace's guarded exporter, as two periodic exports would."""
    provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(network_metric_exporter(settings),
                                                                           export_interval_millis=3_600_000)])
    counter = provider.get_meter("test").create_counter("looptrace.runs")
    for _ in range(2):
        counter.add(1)
        provider.force_flush(5_000)
    provider.shutdown(5_000)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_an_endpoint_without_metrics_is_warned_about_once_and_sent_no_more(protocol):
    if protocol == "grpc":
        receiver: OTLPReceiver | OTLPGrpcReceiver = OTLPGrpcReceiver()
        receiver.fail_next(Reject(grpc.StatusCode.UNIMPLEMENTED, message="unknown service"))
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    else:
        receiver = OTLPReceiver()  # answers 404 where it has no OTLP endpoint, as `looptrace watch` does for metrics
        environ = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{receiver.base_url}/traces-only/v1/metrics"}
    with receiver, capture_logs() as logs:
        _two_exports(Settings.from_env(environ=environ))
    assert [entry["event"] for entry in logs] == ["metrics_not_accepted"]
    assert len(receiver.requests) == 1  # the first export found out; nothing was sent there again
    assert "OTEL_METRICS_EXPORTER=none" in logs[0]["hint"]


def test_the_readmes_watch_recipe_sends_no_metrics_to_watch():
    match = re.search(r"^## Watch any agent\n.*?```bash\n(.*?)```", README.read_text(), re.M | re.S)
    assert match, "the README has no watch recipe"
    agent_line = next(line for line in match.group(1).splitlines() if "my_agent.py" in line)
    assert "OTEL_METRICS_EXPORTER=none" in agent_line
