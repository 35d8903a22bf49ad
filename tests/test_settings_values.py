"""Values that cannot work are said, naming their variable, instead of being silently wrong: an endpoint that is no
URL is a configuration error when the exporter is built; a number the SDK could not read, an exporter looptrace does
not have and a cap that is no number are each one warning; the CLI says why it wrote no trace and blames a bad
TRACEPARENT on the variable, not on a flag nobody passed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fakes.messages_api import FakeMessagesAPI
from fakes.otlp_receiver import unused_port

from looptrace.instrumentation.export.setup import configure
from looptrace.instrumentation.settings import ConfigurationError, Settings

CLI = [sys.executable, "-m", "looptrace"]


@pytest.mark.parametrize("environ, variable", [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "garbage"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "localhost:4318/v1/traces"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "garbage", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
])
def test_an_endpoint_that_is_no_url_is_a_configuration_error_naming_its_variable(environ, variable, tmp_path):
    settings = Settings.from_env(environ=environ)
    with pytest.raises(ConfigurationError, match=f"^{variable} is not an endpoint URL"):
        configure(settings, exporters="otlp", set_global=False, trace_file=tmp_path / "t.jsonl")


@pytest.mark.parametrize("endpoint, protocol", [("http://collector:4318", "http/protobuf"),
                                                ("https://collector.example.com", "http/protobuf"),
                                                ("collector:4317", "grpc"), ("http://[::1]:4317", "grpc")])
def test_endpoints_the_exporters_take_are_accepted(endpoint, protocol):
    settings = Settings.from_env(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                          "OTEL_EXPORTER_OTLP_PROTOCOL": protocol})
    assert settings.otlp.problem is None and settings.otlp_metrics.problem is None


def test_values_that_cannot_be_read_are_ignored_with_their_variable_named_and_the_sdk_never_reads_them():
    settings = Settings.from_env(environ={"OTEL_BSP_SCHEDULE_DELAY": "abc", "OTEL_BSP_EXPORT_TIMEOUT": "0",
                                          "OTEL_TRACES_EXPORTER": "zipkin", "LOOPTRACE_MAX_ATTRIBUTE_CHARS": "lots",
                                          "LOOPTRACE_MAX_LINE_BYTES": "garbage"})
    said = " | ".join(settings.ignored)
    for variable in ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_TRACES_EXPORTER",
                     "LOOPTRACE_MAX_ATTRIBUTE_CHARS", "LOOPTRACE_MAX_LINE_BYTES"):
        assert variable in said
    assert len(settings.ignored) == 5
    # Given to the SDK as its defaults, so it does not read the variables again (a traceback, or a refused 0).
    assert settings.batch.arguments() == {"schedule_delay_millis": 5_000, "export_timeout_millis": 30_000}
    assert settings.exporters is None and settings.chosen_exporters() == ["file"]
    assert Settings.from_env(environ={"OTEL_TRACES_EXPORTER": "otlp"}).ignored == ()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "ANTHROPIC_", "TRACEPARENT"))}
    return {**env, **extra}


def _demo(tmp_path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "demo"], env=_env(**extra), cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_cli_refuses_an_endpoint_that_is_no_url_before_the_run_in_one_line(tmp_path):
    done = _demo(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="garbage")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "looptrace: error: OTEL_EXPORTER_OTLP_ENDPOINT is not an endpoint URL; "
        "write it as http://host:4318 (https:// for TLS)"]


@pytest.mark.slow
@pytest.mark.parametrize("variable, value", [("OTEL_BSP_SCHEDULE_DELAY", "abc"), ("OTEL_TRACES_EXPORTER", "zipkin"),
                                             ("LOOPTRACE_MAX_ATTRIBUTE_CHARS", "garbage"),
                                             ("LOOPTRACE_MAX_LINE_BYTES", "garbage")])
def test_the_cli_says_a_value_it_ignores_in_one_line_naming_the_variable(tmp_path, variable, value):
    # A collector that is down, so that the batch processor the BSP variables are for is built.
    done = _demo(tmp_path, **{variable: value, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{unused_port()}",
                              "OTEL_METRICS_EXPORTER": "none"})
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "setting_ignored" in line]
    # The variable is named, its value never said: a mistyped value may hold a secret (a key in the wrong variable).
    assert len(said) == 1 and variable in said[0] and value not in said[0]
    assert "Traceback" not in done.stderr and "Unable to parse" not in done.stderr


@pytest.mark.slow
def test_a_reading_command_says_a_longest_line_that_is_no_number(tmp_path):
    (tmp_path / "traces.jsonl").write_text("")
    done = subprocess.run([*CLI, "traces", "list", "--file", str(tmp_path / "traces.jsonl")], cwd=tmp_path,
                          env=_env(LOOPTRACE_MAX_LINE_BYTES="garbage"), capture_output=True, text=True, timeout=60)
    said = [line for line in done.stderr.splitlines() if "setting_ignored" in line]
    assert len(said) == 1 and "LOOPTRACE_MAX_LINE_BYTES" in said[0] and "garbage" not in said[0], done.stderr


@pytest.mark.slow
def test_demo_with_telemetry_disabled_says_so_rather_than_blaming_a_flag(tmp_path):
    done = _demo(tmp_path, OTEL_SDK_DISABLED="true")
    assert done.returncode == 0, done.stderr
    assert "(no trace file: telemetry is disabled by OTEL_SDK_DISABLED)" in done.stdout
    assert "--exporter" not in done.stdout
    chosen = _demo(tmp_path, LOOPTRACE_EXPORTER="none")
    assert "(no trace file: the file exporter is not among LOOPTRACE_EXPORTER)" in chosen.stdout


@pytest.mark.slow
def test_a_bad_traceparent_variable_is_named_as_the_variable_and_the_run_goes_ahead(tmp_path):
    script = [{"stop_reason": "end_turn", "content": [{"type": "text", "text": "Hello."}]}]
    with FakeMessagesAPI(script) as api:
        done = subprocess.run([*CLI, "run", "say hello"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=_env(TRACEPARENT="not-a-traceparent", ANTHROPIC_BASE_URL=api.url,
                                       ANTHROPIC_API_KEY="test-key"))
    assert done.returncode == 0, done.stderr
    assert "--traceparent" not in done.stderr
    [warning] = [line for line in done.stderr.splitlines() if "traceparent_ignored" in line]
    assert "variable=TRACEPARENT" in warning and "not-a-traceparent" in warning
